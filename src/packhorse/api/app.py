"""The FastAPI application: HTTP API, ``/metrics`` and the web dashboard.

Access (checked by :class:`AuthMiddleware` *before* FastAPI parses or validates anything):

* every ``/api/…`` route needs ``Authorization: Bearer <token>``; none or an unknown/revoked
  token → 401;
* ``/api/admin/…`` routes and every state-changing method (anything but GET/HEAD/OPTIONS)
  need the ``admin`` role; an ``observer`` token gets 403;
* ``/`` (the dashboard page), ``/static/…``, ``/metrics`` and the OpenAPI schema and docs
  load without a token: they carry no error text.

Every response carries a Content-Security-Policy, ``X-Content-Type-Options: nosniff`` and
``X-Frame-Options: DENY`` (:mod:`packhorse.api.security`); ``/docs`` and ``/redoc`` load
their scripts from the package, never from a CDN, and ReDoc's footer logo from the package too
(:func:`redoc_script`).

The OpenAPI schema documents the runtime settings' keys and values, a 400 on every route
that reads a body (:data:`BAD_BODY`: one that cannot be decoded), and a 405 lists every method
of its path in ``Allow`` (:func:`allowed_methods`).

Build with :func:`create_app`; serve with ``packhorse api`` or ``packhorse run --api``.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from importlib import resources
from typing import Annotated, Any, AsyncIterator

from fastapi import APIRouter, Body, Depends, FastAPI, HTTPException, Path, Query, Request, Security
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from packhorse import __version__
from packhorse.actions.failure_groups import failure_groups, reset_group
from packhorse.actions.operator import (
    force_retry_operation,
    reconcile_inconsistent,
    reconcile_package,
    reset_all_failed,
    reset_circuit_breaker,
    reset_operation,
)
from packhorse.actions.quarantine import DAY_SECONDS, purge_quarantine, quarantine_listing
from packhorse.api import schemas as m
from packhorse.api.security import SecurityHeadersMiddleware
from packhorse.api.tokens import Principal, authenticate
from packhorse.config import Settings
from packhorse.db.session import Database
from packhorse.domain import OperationKind
from packhorse.errors import (
    EmptyReasonError,
    HistoryWindowError,
    LocateQueryError,
    QuarantineRetentionError,
    ResetRefusedError,
    RuntimeSettingError,
    TransientDatabaseError,
    UnknownOperationError,
    UnknownPackageError,
)
from packhorse.names import json_safe
from packhorse.recovery.breakers import jsonable, list_breakers
from packhorse.runtime import audit
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.settings import KEYS, RuntimeSettings, describe, set_setting, unset_setting
from packhorse.runtime.topology import sync_topology
from packhorse.status.diagnose import (
    diagnose_operation,
    diagnose_package,
    get_live_check,
    request_live_check,
    run_live_check,
)
from packhorse.status.health import health_report
from packhorse.status.history import BacklogSampler, history
from packhorse.status.locate import locate
from packhorse.status.metrics import registry_for, render
from packhorse.status.overview import location_usage, pipeline_overview

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
STATIC = resources.files("packhorse.api") / "static"
DOCS_ASSETS = resources.files("fastapi_offline") / "static"
#: The one resource ReDoc's script loads from the internet (the logo of its "API docs by
#: Redocly" footer, an ``<img>`` the Content-Security-Policy blocks), and the local file served
#: in its place by :func:`redoc_script`.
REDOC_REMOTE_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
REDOC_LOCAL_LOGO = "/static/redoc-logo.svg"


@functools.cache
def redoc_script() -> str:
    """ReDoc's standalone script as the fastapi-offline package ships it, with its one remote
    image (:data:`REDOC_REMOTE_LOGO`) pointed at :data:`REDOC_LOCAL_LOGO` (read once, ~1 MB)."""
    return (DOCS_ASSETS / "redoc.standalone.js").read_text(encoding="utf-8").replace(REDOC_REMOTE_LOGO,
                                                                                    REDOC_LOCAL_LOGO)


def required_role(method: str, path: str) -> str:
    """The role a request needs: ``admin`` for ``/api/admin/…`` and any state-changing method,
    ``kiosk`` (any token) to read ``/api/kiosk``, else ``observer``."""
    if path.startswith("/api/admin/") or method.upper() not in READ_METHODS:
        return "admin"
    if path == "/api/kiosk":
        return "kiosk"
    return "observer"


class AuthMiddleware:
    """Authenticate and authorize every ``/api/`` request before routing and validation.

    The principal is left in ``request.state.principal`` for the handlers (audit actor).
    """
    def __init__(self, app: ASGIApp, db: Database) -> None:
        self.app = app
        self.db = db

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not (scope["path"] == "/api" or scope["path"].startswith("/api/")):
            await self.app(scope, receive, send)
            return
        auth = Headers(scope=scope).get("authorization", "")
        scheme, _, token = auth.partition(" ")
        principal: Principal | None = None
        if scheme.lower() == "bearer" and token.strip():
            try:
                principal = await run_in_threadpool(authenticate, self.db, token.strip())
            except TransientDatabaseError:
                await JSONResponse({"detail": "the ops database is unavailable"}, 503)(scope, receive, send)
                return
        if principal is None:
            detail = "missing bearer token" if not auth else "unknown or revoked token"
            await JSONResponse({"detail": detail}, 401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        need = required_role(scope["method"], scope["path"])
        if not principal.may(need):
            await JSONResponse({"detail": f"this needs the {need} role; token {principal.name!r} is "
                                          f"{principal.role}"}, 403)(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


_bearer = HTTPBearer(auto_error=False, description="A packhorse API token (`packhorse token create`)")


def caller(request: Request, _cred: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)] = None) -> Principal:
    """The authenticated principal (set by :class:`AuthMiddleware`)."""
    return request.state.principal  # type: ignore[no-any-return]


Caller = Annotated[Principal, Depends(caller)]
KindPath = Annotated[OperationKind, Path(description="operation kind")]
IdPath = Annotated[int, Path(ge=1, le=2**63 - 1, description="operation id")]
Reason = Annotated[m.ActionRequest | None, Body()]

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": m.Problem, "description": "no token, or an unknown or revoked one"},
    403: {"model": m.Problem, "description": "the token's role may not do this"},
    503: {"model": m.Problem, "description": "the ops database is unavailable"},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": m.Problem, "description": "no such operation or package"}}
#: Documented on every route that reads a request body (FastAPI answers 400 to one it cannot decode).
BAD_BODY: dict[str, Any] = {"model": m.BodyProblem, "description": "a request body that cannot be read (not UTF-8 "
                                                                   "or not parsable)"}
#: The ``{key}`` of ``/api/admin/settings/{key}``: a plain string at run time (an unknown key is
#: answered 422 by :func:`set_setting`, and audited), the known keys in the schema.
SettingKey = Annotated[str, Path(max_length=100, description="a runtime setting key",
                                 json_schema_extra={"enum": list(KEYS)})]


def allowed_methods(routes: Iterable[Any], path: str) -> list[str]:
    """Every method one of ``routes`` answers at ``path``, sorted: what a 405's ``Allow``
    header lists. Routes with methods count (path operations, ``/openapi.json``); a mount of
    static files answers ``GET`` and ``HEAD`` under its prefix."""
    out: set[str] = set()
    for route in routes:
        if isinstance(route, Route) and route.methods and route.path_regex.match(path):
            out |= route.methods
        elif isinstance(route, Mount) and isinstance(route.app, StaticFiles) and route.path_regex.match(path):
            out |= {"GET", "HEAD"}
    return sorted(out)


def create_app(settings: Settings, db: Database | None = None, *, ctx: ProcessContext | None = None) -> FastAPI:
    """Build the API for one installation.

    Args:
        settings: the configuration.
        db: the ops database (default: opened from ``settings``).
        ctx: a process context to share (``packhorse run --api``); built if not given.
    """
    if ctx is None:
        db = db or Database.from_settings(settings)
        ctx = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    db = ctx.db
    checks = ThreadPoolExecutor(2, thread_name_prefix="live-check")
    runtime = RuntimeSettings(db, settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()

        def follow_runtime_settings() -> None:  # a changed log_level applies to this process too
            while not stop.is_set():
                runtime.refresh()
                stop.wait(runtime.seconds_until_refresh() + 0.01)

        threading.Thread(target=follow_runtime_settings, name="runtime-settings", daemon=True).start()
        # the charts' backlog history (``packhorse run`` samples too: one row per interval)
        threading.Thread(target=BacklogSampler(db, settings).serve, args=(stop,), name="backlog-sampler",
                         daemon=True).start()
        yield
        stop.set()
        checks.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="packhorse", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Operator API of packhorse: spot what is stuck, diagnose why, reset it.")
    app.state.ctx = ctx
    scrape = {"dead_after_seconds": settings.recovery.service_dead_after_seconds,
              "forget_after_seconds": settings.recovery.service_forget_after_seconds,
              "monitor_interval_seconds": settings.recovery.monitor_interval_seconds}
    registry = registry_for(db, **scrape)
    detailed = registry_for(db, **scrape, error_types=True)

    def on_error(status: int):  # type: ignore[no-untyped-def]
        async def handler(_request: Request, exc: Exception) -> JSONResponse:
            return JSONResponse({"detail": str(exc)}, status)
        return handler

    async def with_allow(request: Request, exc: StarletteHTTPException) -> Response:
        # Starlette's 405 names the methods of the first route whose path matched; ``Allow``
        # must list every method of that path (``PUT`` and ``DELETE`` on one settings key)
        if exc.status_code == 405:
            exc = StarletteHTTPException(405, exc.detail, headers={**(exc.headers or {}),
                                                                   "Allow": ", ".join(allowed_methods(
                                                                       [*api.routes, *app.router.routes],
                                                                       request.url.path))})
        return await http_exception_handler(request, exc)

    async def unprocessable(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler echoes each error's input: a body of bytes that are not UTF-8
        # (sent as text/plain, say) or a string holding a lone surrogate made that answer a 500
        return JSONResponse({"detail": jsonable_encoder(json_safe(list(exc.errors())))}, 422)

    app.add_exception_handler(StarletteHTTPException, with_allow)
    app.add_exception_handler(RequestValidationError, unprocessable)
    for exc_type, status in ((UnknownOperationError, 404), (UnknownPackageError, 404),
                             (ResetRefusedError, 409), (RuntimeSettingError, 422), (LocateQueryError, 422), (EmptyReasonError, 422),
                             (HistoryWindowError, 422), (QuarantineRetentionError, 422), (TransientDatabaseError, 503)):
        app.add_exception_handler(exc_type, on_error(status))

    api = APIRouter(prefix="/api", responses=ERRORS)

    @api.get("/whoami", response_model=m.WhoAmI, tags=["access"])
    def whoami(who: Caller) -> dict[str, Any]:
        """The name and role of the calling token."""
        return {"name": who.name, "role": who.role}

    @api.get("/transfer/overview", response_model=m.Overview, tags=["observe"])
    def overview(_who: Caller, limit: Annotated[int, Query(ge=1, le=10000)] = 500) -> dict[str, Any]:
        """Operations grouped by kind, location and status, and the unfinished ones (stuck
        first): what is stuck, never why. The same payload for every role."""
        return db.read(lambda s: pipeline_overview(s, limit=limit, ctx=ctx))

    @api.get("/kiosk", response_model=m.Kiosk, tags=["observe"])
    def kiosk(_who: Caller) -> dict[str, Any]:
        """What a wallboard shows (any token; a ``kiosk`` token reads only this): the problem
        lines, the operation totals and which data locations are unavailable. No error text,
        no paths."""
        ov = db.read(lambda s: pipeline_overview(s, limit=1, ctx=ctx))
        down = sorted({b["detail"]["location"] for b in ov["blocked"]
                       if b["cause"] == "location_unavailable" and b.get("detail")})
        return {"generated_at": ov["generated_at"], "problems": ov["problems"], "totals": ov["totals"],
                "unavailable_locations": down}

    @api.get("/transfer/locations", response_model=list[m.LocationOut], tags=["observe"])
    def locations(_who: Caller) -> list[dict[str, Any]]:
        """Per data location: present physical copies and their bytes."""
        return db.read(location_usage)

    @api.get("/transfer/locate", response_model=m.LocateResult, tags=["observe"],
             responses={422: {"model": m.Problem, "description": "empty or too long query"}})
    def locate_route(who: Caller, q: Annotated[str, Query(min_length=1, max_length=4096,
                                                          description="a source path or a package name")]) -> dict[str, Any]:
        """Where is my file: every version of a source path or package, its package, every
        physical copy with its location and when it was last verified, and its history as a
        timeline. Failures' error text only for an admin."""
        return db.read(lambda s: locate(s, q, include_errors=who.may("admin"), settings=settings))

    # specific paths first: Starlette takes the first route whose path matches
    # ``:path``: package names hold ``/`` (``instrument-00/obs-0003``); a plain parameter
    # stops at the first one and every raw data package answered 404
    @api.get("/admin/diagnose/by-package/{name:path}", response_model=m.PackageDiagnosis, tags=["diagnose"],
             responses=NOT_FOUND)
    def diagnose_by_package(name: Annotated[str, Path(min_length=1, max_length=1000)], who: Caller) -> dict[str, Any]:
        """The diagnostic reports of every operation on a package (raw data package or bundle),
        by its name (``/`` in it as it is, or encoded as ``%2F``)."""
        report = db.read(lambda s: diagnose_package(
            s, name, dead_after_seconds=settings.recovery.service_dead_after_seconds))
        audit.record(db, actor=who.actor, action="package.diagnose", target=name)
        return report

    @api.get("/admin/diagnose/live-check/{correlation_id}", response_model=m.LiveCheckState, tags=["diagnose"],
             responses={404: {"model": m.Problem, "description": "unknown or expired correlation id"}})
    def live_check_result(correlation_id: Annotated[str, Path(max_length=64)], _who: Caller) -> Any:
        """The state of a live check: ``pending``, ``done`` (with the result) or ``failed``."""
        found = db.read(lambda s: get_live_check(s, correlation_id))
        if found is None:
            return JSONResponse({"detail": f"no live check {correlation_id!r} (unknown or expired)"}, 404)
        return found

    @api.get("/admin/diagnose/{kind}/{operation_id}", response_model=m.DiagnosticReport, tags=["diagnose"],
             responses=NOT_FOUND)
    def diagnose(kind: KindPath, operation_id: IdPath, who: Caller,
                 opened: Annotated[bool, Query(description="false when a page refreshes a report it already "
                                                           "opened: not audited again")] = True) -> dict[str, Any]:
        """The diagnostic report of one operation (database only). Opening it is audited; a
        refresh of an open report (``opened=false``) is not."""
        report = db.read(lambda s: diagnose_operation(
            s, kind, operation_id, dead_after_seconds=settings.recovery.service_dead_after_seconds))
        if opened:
            audit.record(db, actor=who.actor, action="operation.diagnose", target=f"{kind.value}/{operation_id}")
        return report

    @api.post("/admin/diagnose/{kind}/{operation_id}/live-check", response_model=m.LiveCheckTicket,
              status_code=202, tags=["diagnose"], responses=NOT_FOUND)
    def live_check(kind: KindPath, operation_id: IdPath, who: Caller) -> dict[str, Any]:
        """Start a live filesystem check of the operation's bytes; poll its correlation id."""
        ticket = request_live_check(db, kind, operation_id, requested_by=who.actor,
                                    ttl_seconds=settings.api.live_check_ttl_seconds)
        checks.submit(run_live_check, ctx, ticket["correlation_id"])
        audit.record(db, actor=who.actor, action="operation.live_check", target=f"{kind.value}/{operation_id}",
                     details={"correlation_id": ticket["correlation_id"]})
        return ticket

    @api.post("/transfer/operation/{kind}/{operation_id}/reset", response_model=m.ResetResult, tags=["act"],
              responses={**NOT_FOUND, 409: {"model": m.Problem, "description": "the operation is not FAILED"}})
    def reset(kind: KindPath, operation_id: IdPath, who: Caller, body: Reason = None) -> dict[str, Any]:
        """Reset a FAILED operation: PENDING, retry count + 1, cached error context cleared,
        failure history kept."""
        ids = reset_operation(ctx, kind, operation_id, actor=who.actor, reason=body.reason if body else None)
        return {"kind": kind.value, "reset": ids, "count": len(ids)}

    @api.post("/transfer/operation/{kind}/reset-all-failed", response_model=m.ResetResult, tags=["act"])
    def reset_all(kind: KindPath, who: Caller, body: Reason = None) -> dict[str, Any]:
        """Reset every FAILED operation of a kind; returns how many."""
        ids = reset_all_failed(ctx, kind, actor=who.actor, reason=body.reason if body else None)
        return {"kind": kind.value, "reset": ids, "count": len(ids)}

    @api.post("/transfer/raw-data-package/{package_id}/reconcile", response_model=m.ReconcileResult, tags=["act"],
              responses=NOT_FOUND)
    def reconcile_one(package_id: Annotated[int, Path(ge=1, le=2**63 - 1)], who: Caller) -> dict[str, Any]:
        """Recompute a raw data package's derived (archived) state from its physical copies."""
        return reconcile_package(ctx, package_id, actor=who.actor)

    @api.post("/transfer/raw-data-package/reconcile-inconsistent", response_model=m.ReconcileAllResult, tags=["act"])
    def reconcile_all(who: Caller) -> dict[str, Any]:
        """Recompute the derived state of every raw data package; lists those that changed."""
        return reconcile_inconsistent(ctx, actor=who.actor)

    @api.get("/transfer/history", response_model=m.History, tags=["observe"],
             responses={422: {"model": m.Problem, "description": "window out of range"}})
    def pipeline_history(_who: Caller, minutes: Annotated[int, Query(ge=1, le=7 * 24 * 60)] = 60) -> dict[str, Any]:
        """The last ``minutes`` of throughput (bytes and files per minute) and backlog per
        stage, disk usage per location against its thresholds, and failures per stage, on one
        time grid (counts only: no error text)."""
        return db.read(lambda s: history(s, settings, minutes=minutes))

    @api.get("/admin/failures", response_model=m.FailureGroups, tags=["diagnose"])
    def failures(_who: Caller) -> dict[str, Any]:
        """FAILED operations grouped by cause (kind, location, error type) with a count, the
        operations of each group and a sample error message."""
        return db.read(failure_groups)

    @api.post("/admin/failures/reset", response_model=m.ResetResult, tags=["act"],
              responses={422: {"model": m.Problem, "description": "no reason given"}})
    def failures_reset(body: m.GroupResetRequest, who: Caller) -> dict[str, Any]:
        """Reset every operation of one failure group that is still FAILED (audited with the
        reason). Returns the ids reset: none if the group is gone."""
        kind = OperationKind(body.kind)
        ids = reset_group(ctx, kind, body.location, body.error_type, actor=who.actor, reason=body.reason)
        return {"kind": kind.value, "reset": ids, "count": len(ids)}

    @api.get("/health", response_model=m.Health, tags=["observe"])
    def health(_who: Caller) -> dict[str, Any]:
        """What ``packhorse health --json`` prints: services and workers with their last heartbeat
        (alive or dead), scans overdue, a missing monitor, leases not reclaimed and sites cut off
        from the centre (:func:`packhorse.status.health.health_report`)."""
        return health_report(ctx).as_json()

    @api.get("/admin/breakers", response_model=list[m.BreakerOut], tags=["breakers"])
    def breakers(_who: Caller) -> list[dict[str, Any]]:
        """Circuit breakers of operations that stalled, open ones first."""
        return [jsonable(r) for r in db.read(list_breakers)]

    @api.post("/admin/breakers/{kind}/{operation_id}/reset", response_model=m.BreakerOut, tags=["breakers"],
              responses=NOT_FOUND)
    def breaker_reset(kind: KindPath, operation_id: IdPath, who: Caller, body: Reason = None) -> dict[str, Any]:
        """Close an operation's circuit breaker; the monitor then recovers the operation (audited)."""
        out = reset_circuit_breaker(ctx, kind, operation_id, actor=who.actor, reason=body.reason if body else None)
        return {k: v for k, v in jsonable(out).items() if k in m.BreakerOut.model_fields}

    @api.post("/transfer/operation/{kind}/{operation_id}/force-retry", response_model=m.ForceRetryResult,
              tags=["breakers"], responses={**NOT_FOUND, 409: {"model": m.Problem, "description": "COMPLETED"}})
    def force_retry(kind: KindPath, operation_id: IdPath, who: Caller, body: Reason = None) -> dict[str, Any]:
        """Force a retry: close the breaker, set the operation PENDING, dispatchable now (audited)."""
        out = force_retry_operation(ctx, kind, operation_id, actor=who.actor, reason=body.reason if body else None)
        return {"kind": kind.value, "operation_id": operation_id, "previous_status": out["previous_status"],
                "status": out["status"]}

    @api.get("/admin/settings", response_model=list[m.SettingOut], tags=["settings"])
    def list_settings(_who: Caller) -> list[dict[str, Any]]:
        """Runtime settings with their effective values and where they come from."""
        return db.read(lambda s: describe(s, settings))

    @api.put("/admin/settings/{key}", response_model=list[m.SettingOut], tags=["settings"],
             responses={422: {"model": m.Problem, "description": "unknown key or bad value"}})
    def put_setting(key: SettingKey, body: m.SettingIn, who: Caller) -> list[dict[str, Any]]:
        """Change a runtime setting; running services pick it up within a minute (audited)."""
        set_setting(db, key, body.value, actor=who.actor)
        return db.read(lambda s: describe(s, settings))

    @api.delete("/admin/settings/{key}", response_model=list[m.SettingOut], tags=["settings"],
                responses={422: {"model": m.Problem, "description": "unknown key"}})
    def delete_setting(key: SettingKey, who: Caller) -> list[dict[str, Any]]:
        """Drop a runtime override: the configuration file's value applies again (audited)."""
        unset_setting(db, key, actor=who.actor)
        return db.read(lambda s: describe(s, settings))

    def known_location(location: str | None) -> None:
        if location is not None and location not in ctx.topology.location_ids:
            raise HTTPException(422, f"no data location {location!r} in the configuration")

    @api.get("/admin/quarantine", response_model=m.QuarantineListing, tags=["quarantine"],
             responses={422: {"model": m.Problem, "description": "no data location of that name"}})
    def quarantine(_who: Caller, location: Annotated[str | None, Query(max_length=200)] = None) -> dict[str, Any]:
        """What repairs moved aside into the disk locations' ``_packhorse/quarantine/``, read from
        this host's disks now (a location whose storage is not on this host is listed under
        ``not_listed``)."""
        known_location(location)
        return quarantine_listing(ctx, location=location)

    @api.post("/admin/quarantine/purge", response_model=m.QuarantinePurgeOut, tags=["quarantine"],
              responses={422: {"model": m.Problem, "description": "inside the minimum retention, or no reason"}})
    def quarantine_purge(body: m.QuarantinePurgeIn, who: Caller) -> dict[str, Any]:
        """Remove quarantined entries moved aside more than ``older_than_days`` ago, never inside
        ``[quarantine] min_retention_seconds`` (422); audited as ``quarantine.purge``."""
        known_location(body.location)
        return purge_quarantine(ctx, older_than_seconds=body.older_than_days * DAY_SECONDS, reason=body.reason,
                                actor=who.actor, location=body.location, dry_run=body.dry_run)

    @api.get("/admin/audit", response_model=list[m.AuditOut], tags=["access"])
    def audit_log(_who: Caller, limit: Annotated[int, Query(ge=1, le=10000)] = 100,
                  action: Annotated[str | None, Query(max_length=100)] = None) -> list[dict[str, Any]]:
        """The newest admin actions: who, what, when, result."""
        return db.read(lambda s: audit.entries(s, limit=limit, action=action))

    for route in api.routes:
        if isinstance(route, APIRoute) and route.body_field is not None:
            route.responses.setdefault(400, BAD_BODY)
    app.include_router(api)

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        """Prometheus text, without a token; a label that names what went wrong (``error_type``)
        only for a caller with a valid API token (any role), who may see failures in the API."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if not token.strip():
            return Response(render(registry), media_type=CONTENT_TYPE_LATEST)
        if scheme.lower() != "bearer" or authenticate(db, token.strip()) is None:
            return JSONResponse({"detail": "unknown or revoked token"}, 401, headers={"WWW-Authenticate": "Bearer"})
        return Response(render(detailed), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False, response_class=HTMLResponse)
    def dashboard() -> HTMLResponse:
        page = (STATIC / "index.html").read_text(encoding="utf-8")
        cfg = json.dumps({"refreshSeconds": settings.api.dashboard_refresh_seconds, "version": __version__})
        # a JSON data block, not a script: the Content-Security-Policy forbids inline scripts
        return HTMLResponse(page.replace("{/*PACKHORSE_CONFIG*/}", cfg.replace("<", "\\u003c")))

    @app.get("/kiosk", include_in_schema=False, response_class=HTMLResponse)
    def kiosk_page() -> HTMLResponse:
        # the token comes in the URL's fragment (#token=…), which browsers never send
        page = (STATIC / "kiosk.html").read_text(encoding="utf-8")
        cfg = json.dumps({"refreshSeconds": settings.api.dashboard_refresh_seconds, "version": __version__})
        return HTMLResponse(page.replace("{/*PACKHORSE_CONFIG*/}", cfg.replace("<", "\\u003c")))

    @app.get("/docs", include_in_schema=False, response_class=HTMLResponse)
    def swagger_ui() -> HTMLResponse:
        return HTMLResponse((STATIC / "docs.html").read_text(encoding="utf-8"))

    @app.get("/redoc", include_in_schema=False, response_class=HTMLResponse)
    def redoc() -> HTMLResponse:
        return HTMLResponse((STATIC / "redoc.html").read_text(encoding="utf-8"))

    @app.get("/static/docs-assets/redoc.standalone.js", include_in_schema=False)
    def redoc_js() -> Response:
        return Response(redoc_script(), media_type="text/javascript; charset=utf-8")

    # Swagger UI and ReDoc from the files the fastapi-offline package ships (no CDN); ReDoc's
    # script through the route above, which serves it with its footer logo local
    app.mount("/static/docs-assets", StaticFiles(directory=str(DOCS_ASSETS)), name="docs-assets")
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    app.add_middleware(AuthMiddleware, db=db)
    app.add_middleware(SecurityHeadersMiddleware)  # outermost: 401/403 answers carry the headers too
    return app
