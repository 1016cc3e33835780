"""The HTTP API and web dashboard (FastAPI); build the app with :func:`packhorse.api.app.create_app`."""
