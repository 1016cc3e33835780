"""Run moto's S3 server on 127.0.0.1:PORT with mutating requests serialised (see s3_support)."""

from __future__ import annotations

import sys
import threading
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

_write_lock = threading.Lock()


class SerialisedWrites:
    """WSGI middleware: PUT/POST/DELETE run one at a time (S3 makes conditional creates atomic)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("REQUEST_METHOD") in ("PUT", "POST", "DELETE"):
            with _write_lock:
                return list(self.app(environ, start_response))
        return self.app(environ, start_response)


def main() -> None:
    port = int(sys.argv[1])
    app = DomainDispatcherApplication(create_backend_app)
    run_simple("127.0.0.1", port, SerialisedWrites(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
