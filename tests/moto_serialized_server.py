"""Run moto's S3 server on 127.0.0.1:PORT with mutating requests serialised (see s3_support).

``--ignore-if-none-match`` drops the ``If-None-Match`` header before moto sees it: a store
that ignores conditional creates (as some S3-compatible stores did), for the probe tests.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

_write_lock = threading.Lock()


class SerialisedWrites:
    """WSGI middleware: PUT/POST/DELETE run one at a time (S3 makes conditional creates atomic)."""

    def __init__(self, app: Any, *, ignore_if_none_match: bool = False) -> None:
        self.app = app
        self.ignore_if_none_match = ignore_if_none_match

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if self.ignore_if_none_match:
            environ.pop("HTTP_IF_NONE_MATCH", None)
        if environ.get("REQUEST_METHOD") in ("PUT", "POST", "DELETE"):
            with _write_lock:
                return list(self.app(environ, start_response))
        return self.app(environ, start_response)


def main() -> None:
    port = int(sys.argv[1])
    app = SerialisedWrites(DomainDispatcherApplication(create_backend_app),
                           ignore_if_none_match="--ignore-if-none-match" in sys.argv[2:])
    run_simple("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
