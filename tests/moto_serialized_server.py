"""Run moto's S3 server on 127.0.0.1:PORT with mutating requests serialised (see s3_support).

``--ignore-if-none-match`` drops the ``If-None-Match`` header before moto sees it: a store
that ignores conditional creates (as some S3-compatible stores did), for the probe tests.

``--real-initiated-times``: moto reports every multipart upload as initiated in 2010; with
this flag the listing reports the time the server really created it (same text length), so
the partial sweep's age rule sees uploads as a real store shows them.

``--upload-log PATH`` appends one line ``<path> <part number> <bytes>`` to PATH for every
``UploadPart`` request the store receives: the store's own count of what clients sent (the
resumed multipart upload tests).
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

    def __init__(self, app: Any, *, ignore_if_none_match: bool = False, upload_log: str | None = None,
                 real_initiated_times: bool = False) -> None:
        self.app = app
        self.ignore_if_none_match = ignore_if_none_match
        self.upload_log = upload_log
        self.real_initiated_times = real_initiated_times
        self._initiated: dict[str, str] = {}  # upload id -> ISO time the server created it

    def _initiated_times(self, environ: dict[str, Any], body: list[bytes]) -> list[bytes]:
        import re
        import time

        query = environ.get("QUERY_STRING", "")
        if not re.search(r"(^|&)uploads(=|&|$)", query):
            return body
        text = b"".join(body).decode()
        if environ.get("REQUEST_METHOD") == "POST":
            for upload_id in re.findall(r"<UploadId>(.*?)</UploadId>", text):
                self._initiated[upload_id] = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
            return body

        def fix(m: "re.Match[str]") -> str:
            block = m.group(0)
            found = re.search(r"<UploadId>(.*?)</UploadId>", block)
            when = self._initiated.get(found.group(1)) if found else None
            return re.sub(r"<Initiated>.*?</Initiated>", f"<Initiated>{when}</Initiated>", block) if when else block

        return [re.sub(r"<Upload>.*?</Upload>", fix, text, flags=re.S).encode()]

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if self.ignore_if_none_match:
            environ.pop("HTTP_IF_NONE_MATCH", None)
        if self.upload_log and environ.get("REQUEST_METHOD") == "PUT":
            from urllib.parse import parse_qs

            query = parse_qs(environ.get("QUERY_STRING", ""))
            if "partNumber" in query and "uploadId" in query:
                with open(self.upload_log, "a", encoding="utf-8") as f:
                    f.write(f"{environ.get('PATH_INFO')} {query['partNumber'][0]} "
                            f"{int(environ.get('CONTENT_LENGTH') or 0)}\n")
        if environ.get("REQUEST_METHOD") in ("PUT", "POST", "DELETE"):
            with _write_lock:
                body = list(self.app(environ, start_response))
            return self._initiated_times(environ, body) if self.real_initiated_times else body
        if self.real_initiated_times:
            return self._initiated_times(environ, list(self.app(environ, start_response)))
        return self.app(environ, start_response)


def main() -> None:
    port = int(sys.argv[1])
    args = sys.argv[2:]
    upload_log = args[args.index("--upload-log") + 1] if "--upload-log" in args else None
    app = SerialisedWrites(DomainDispatcherApplication(create_backend_app),
                           ignore_if_none_match="--ignore-if-none-match" in args, upload_log=upload_log,
                           real_initiated_times="--real-initiated-times" in args)
    run_simple("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
