"""Response headers that keep the dashboard and the API docs from being framed, sniffed or
fed scripts from elsewhere (DESIGN.md "Operator surface": nothing served loads from the
internet; observatory sites are often offline).

:class:`SecurityHeadersMiddleware` adds to every HTTP response, errors included:

* ``Content-Security-Policy`` — :data:`DASHBOARD_CSP` (scripts, styles, images and requests
  from this origin only; no inline script, no framing) for every path, except the Swagger UI
  and ReDoc pages (:data:`DOCS_CSP`), whose renderers set inline styles and ReDoc's search
  runs in a ``blob:`` worker;
* ``X-Content-Type-Options: nosniff``, ``X-Frame-Options: DENY``, ``Referrer-Policy: no-referrer``.

TLS is not terminated here: behind a reverse proxy (docs/operator-guide.md "Serving over TLS").
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

DASHBOARD_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                 "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
                 "form-action 'self'; frame-ancestors 'none'")
DOCS_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "connect-src 'self'; font-src 'self' data:; worker-src 'self' blob:; object-src 'none'; "
            "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
#: Paths served under :data:`DOCS_CSP`.
DOCS_PATHS = frozenset({"/docs", "/redoc"})


class SecurityHeadersMiddleware:
    """Pure ASGI middleware adding the headers above to every ``http`` response (headers an
    inner app already set are left as they are)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        csp = DOCS_CSP if scope["path"] in DOCS_PATHS else DASHBOARD_CSP
        extra = ((b"content-security-policy", csp.encode()), (b"x-content-type-options", b"nosniff"),
                 (b"x-frame-options", b"DENY"), (b"referrer-policy", b"no-referrer"))

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                have = {k.lower() for k, _v in headers}
                headers.extend((k, v) for k, v in extra if k not in have)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)
