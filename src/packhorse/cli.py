"""The ``packhorse`` command line (typer). Exit codes: 0 ok, 1 a check found a problem,
2 configuration error, 3 an operation FAILED, 4 work is blocked waiting for a human.

Machine-readable output (``--json``) goes to stdout alone; logs and progress go to stderr.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from sqlalchemy.exc import SQLAlchemyError
from rich.console import Console
from rich.table import Table

from . import __version__
from .config import Settings, load_config
from .db.session import Database
from .errors import ConfigError, DatabaseNotInitializedError, PackhorseError
from .context import ProcessContext
from .topology import sync_topology

EXIT_OK, EXIT_PROBLEM, EXIT_CONFIG, EXIT_FAILED, EXIT_BLOCKED = 0, 1, 2, 3, 4

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="packhorse: pack raw data into BagIt bags, ship, verify and archive it exactly once.")
err = Console(stderr=True)
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="TOML configuration file [default: ./packhorse.toml]")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout")]


def _fail(message: str, code: int) -> typer.Exit:
    """Print ``error: message`` on stderr and return the exit to raise."""
    print(f"error: {message}", file=sys.stderr)
    return typer.Exit(code)


def _log_level(default: str) -> str:
    """The log level: ``PACKHORSE_LOG_LEVEL`` if set (checked: a typo must not silently log at
    another level), else ``default``."""
    from .runtime_settings import LOG_LEVELS

    value = os.environ.get("PACKHORSE_LOG_LEVEL")
    if value is None:
        return default
    if value.strip().upper() not in LOG_LEVELS:
        raise _fail(f"PACKHORSE_LOG_LEVEL: {value!r} is not a log level; one of {', '.join(LOG_LEVELS)}",
                    EXIT_CONFIG)
    return value.strip().upper()


def _settings(config: Path | None) -> Settings:
    try:
        return load_config(config)
    except ConfigError as e:
        raise _fail(str(e), EXIT_CONFIG) from None


def _database(settings: Settings, *, migrate_check: bool) -> Database:
    """Open the ops database; an unusable URL or an un-migrated schema exits 2."""
    url = settings.database_url
    if migrate_check and url.startswith("sqlite:///") and not os.path.exists(url[len("sqlite:///"):]):
        # do not leave an empty database file behind: only `init` creates it
        raise _fail(f"database.url: the database file {url[len('sqlite:///'):]} does not exist; "
                    "run `packhorse init` to create it",
                    EXIT_CONFIG)
    try:
        db = Database.from_settings(settings)
        if migrate_check:
            db.ensure_migrated()
        else:
            db.current_revision()  # connects: a wrong URL fails here, not half-way through
        return db
    except DatabaseNotInitializedError as e:
        raise _fail(str(e), EXIT_CONFIG) from None
    except (SQLAlchemyError, ImportError, ValueError) as e:
        reason = getattr(e, "orig", None) or e
        raise _fail(f"database.url: cannot open {settings.database.url!r}: {reason}", EXIT_CONFIG) from None


def _context(config: Path | None, *, migrate_check: bool = True) -> ProcessContext:
    from . import logs

    logs.configure(_log_level("WARNING"))
    settings = _settings(config)
    db = _database(settings, migrate_check=migrate_check)
    return ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


@app.command()
def version() -> None:
    """Print the packhorse version."""
    print(__version__)


@app.command()
def init(config: ConfigOpt = None) -> None:
    """Create or upgrade the ops database (Alembic migrations) and register sites and locations."""
    settings = _settings(config)
    db = _database(settings, migrate_check=False)
    before = db.current_revision()
    db.upgrade()
    sync_topology(db, settings)
    after = db.current_revision()
    state = "created" if before is None else ("upgraded" if before != after else "already up to date")
    print(f"database {db.engine.url.render_as_string(hide_password=True)}: {state} (migration {after})",
          file=sys.stderr)


def _exit_code_after_run(ctx: ProcessContext) -> int:
    from sqlalchemy import func, select

    from .db.models import SkippedFile
    from .reporting import failed_operations

    skipped = ctx.db.read(lambda s: s.scalar(select(func.count()).select_from(SkippedFile))) or 0
    if skipped:
        # not a failure (the rest was archived), but nothing a user should miss either
        print(f"packhorse run: {skipped} source path(s) skipped and not archived (unreadable, symbolic links, "
              "names not allowed, changed after registration); see `packhorse status`", file=sys.stderr)

    failed = ctx.db.read(failed_operations)
    if failed:
        print(f"{len(failed)} operation(s) FAILED:", file=sys.stderr)
        for f in failed:
            line = f"  {f['kind']} {f['id']}: {f['error_type']}: {f['message']}"
            if f.get("diagnosis"):
                line += f" — {f['diagnosis']}"
            print(line, file=sys.stderr)
        print("  see `packhorse status`; fix the cause, then `packhorse reset KIND ID` (or KIND --all-failed)",
              file=sys.stderr)
        return EXIT_FAILED
    from .recovery.breakers import open_breaker_count

    blocked = ctx.db.read(open_breaker_count)
    if blocked:
        print(f"{blocked} operation(s) blocked: circuit breaker open after repeated stalls; "
              "see `packhorse breaker list`, then `packhorse retry KIND ID --reason ...`", file=sys.stderr)
        return EXIT_BLOCKED
    return EXIT_OK


class _Progress:
    """Rich progress bars on stderr (files registered, bytes archived, packages archived)."""

    def __init__(self, ctx: ProcessContext) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.ctx = ctx
        self.progress = Progress(TextColumn("{task.description:<20}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[extra]}"), TimeElapsedColumn(), console=err, transient=False)
        self.files = self.progress.add_task("files registered", total=None, extra="")
        self.pkgs = self.progress.add_task("packages archived", total=None, extra="")
        self.arch = self.progress.add_task("bytes archived", total=None, extra="")
        self._last = 0.0

    def __enter__(self) -> "_Progress":
        self.progress.start()
        return self

    def __exit__(self, *a: object) -> None:
        self.tick(force=True)
        self.progress.stop()

    def tick(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._last < 2.0:  # counts over every row: not too often
            return
        self._last = time.monotonic()
        from .domain import LocationRole
        from .reporting import status_report

        r = status_report(self.ctx)
        lta = [l.name for l in self.ctx.settings.locations if l.role is LocationRole.LONG_TERM_ARCHIVE]
        archived_bytes = sum(r["copies"].get(n, {}).get("bytes", 0) for n in lta)
        self.progress.update(self.files, completed=r["files"]["registered"], total=r["files"]["registered"] or None)
        self.progress.update(self.pkgs, completed=r["packages"]["archived"], total=r["packages"]["total"] or None)
        self.progress.update(self.arch, completed=archived_bytes // (1 << 20),
                             total=(r["files"]["bytes"] * len(lta)) // (1 << 20) or None, extra="MiB")


def _run(ctx: ProcessContext, *, until_idle: bool, quiet: bool) -> tuple[float, int | None]:
    """Run the embedded mode; returns (seconds, the signal that stopped it or ``None``)."""
    from . import logs
    from .executors.local import LocalRunner

    show_bars = sys.stderr.isatty() and not quiet
    logs.configure(_log_level("ERROR" if quiet else ("WARNING" if show_bars else "INFO")))
    bars = _Progress(ctx) if show_bars else None
    runner = LocalRunner(ctx, on_tick=bars.tick if bars else None)

    stopped_by: list[int] = []
    from .services import start_background

    background = start_background(ctx, lifecycle=not until_idle)

    def stop(signum: int, _frame: object) -> None:
        print(f"packhorse: signal {signum}: finishing running operations, then stopping", file=sys.stderr)
        stopped_by.append(signum)
        runner.stop_requested.set()
        runner.wake.set()
        background.interrupt_drain.set()

    from .recovery.health import HeartbeatThread

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    start = time.monotonic()
    reason = "finished"
    health = HeartbeatThread(ctx.db, "runner",
                             interval_seconds=ctx.settings.recovery.service_heartbeat_interval_seconds).start()
    try:
        if bars:
            with bars:
                runner.run(until_idle=until_idle)
        else:
            runner.run(until_idle=until_idle)
        if stopped_by:
            reason = f"signal {stopped_by[0]}"
    except BaseException as e:
        reason = f"error: {type(e).__name__}: {e}"
        raise
    finally:
        background.stop(reason, drain=until_idle and not stopped_by)
        health.stop(remove=True)
        for s, h in old.items():
            signal.signal(s, h)
    return time.monotonic() - start, (stopped_by[0] if stopped_by else None)


@app.command()
def run(
    config: ConfigOpt = None,
    until_idle: Annotated[bool, typer.Option("--until-idle", help="Stop when no work can become runnable by itself")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars; errors only")] = False,
    with_api: Annotated[bool, typer.Option("--api", help="also serve the HTTP API and dashboard (embedded)")] = False,
    api_host: Annotated[Optional[str], typer.Option("--api-host", help="API address [default: api.host]")] = None,
    api_port: Annotated[Optional[int], typer.Option("--api-port", help="API port [default: api.port]")] = None,
) -> None:
    """Run managers, workers and lease recovery (embedded mode); with --api also the HTTP API."""
    ctx = _context(config)
    if ctx.settings.executor.kind != "local":
        raise _fail(f"executor.kind: is {ctx.settings.executor.kind!r}, but packhorse run is the embedded "
                    "mode (worker processes on this machine). For the distributed mode start "
                    "`packhorse manager`, `packhorse monitor` and one `packhorse worker --site NAME` per site "
                    "(see docs/deployment.md), or set executor.kind = \"local\"", EXIT_CONFIG)
    _check_storage(ctx)
    server = None
    if with_api:
        server = serve_api(ctx, api_host or ctx.settings.api.host,
                           ctx.settings.api.port if api_port is None else api_port)
    try:
        elapsed, signum = _run(ctx, until_idle=until_idle, quiet=quiet)
    finally:
        if server is not None:
            server.should_exit = True
    code = _exit_code_after_run(ctx)
    if until_idle and signum is not None and code == EXIT_OK:
        # stopped before it was idle: a cron job must not take that for "all done"
        print(f"packhorse run: interrupted by signal {signum} after {elapsed:.1f} s, before the work was done",
              file=sys.stderr)
        raise typer.Exit(128 + signum)
    if not quiet:
        print(f"packhorse run: finished in {elapsed:.1f} s", file=sys.stderr)
    raise typer.Exit(code)


@app.command("run-operation")
def run_operation(
    kind: Annotated[str, typer.Argument(help="operation kind, e.g. long_term_archive")],
    operation_id: Annotated[int, typer.Argument(help="operation id")],
    config: ConfigOpt = None,
) -> None:
    """Claim and run one operation in the foreground (as a worker would); print the outcome."""
    from .domain import OperationKind
    from .operations import worker_identity
    from .worker import execute_operation

    try:
        OperationKind(kind)
    except ValueError:
        raise _fail(f"unknown operation kind {kind!r}; one of {', '.join(k.value for k in OperationKind)}",
                    EXIT_CONFIG) from None
    ctx = _context(config)
    from .db.models import Operation

    op = ctx.db.read(lambda s: s.get(Operation, operation_id))
    if op is None or op.kind != kind:
        raise _fail(f"no {kind} operation with id {operation_id}", EXIT_PROBLEM)
    outcome = execute_operation(ctx, operation_id, worker_identity("cli"))
    print(outcome.value)
    raise typer.Exit({"completed": 0, "skipped": 0, "deferred": 0, "retry": 1, "stale": 1,
                      "failed": EXIT_FAILED}[outcome.value])


@app.command()
def reset(
    kind: Annotated[str, typer.Argument(help="operation kind, e.g. long_term_archive")],
    operation_id: Annotated[Optional[int], typer.Argument(help="operation id (or use --all-failed)")] = None,
    all_failed: Annotated[bool, typer.Option("--all-failed", help="every FAILED operation of KIND")] = False,
    reason: Annotated[Optional[str], typer.Option("--reason", help="why (logged)")] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Reset FAILED operations to PENDING after fixing the cause (failure history is kept)."""
    from . import audit
    from .actions import reset_all_failed, reset_operation
    from .domain import OperationKind
    from .errors import UnknownOperationError
    from .operations import ResetRefusedError

    try:
        k = OperationKind(kind)
    except ValueError:
        raise _fail(f"unknown operation kind {kind!r}; one of {', '.join(x.value for x in OperationKind)}",
                    EXIT_CONFIG) from None
    if (operation_id is None) == (not all_failed):
        raise _fail("give either an operation id or --all-failed", EXIT_CONFIG)
    ctx = _context(config)
    try:
        ids = (reset_all_failed(ctx, k, actor=audit.cli_actor(), reason=reason) if operation_id is None
               else reset_operation(ctx, k, operation_id, actor=audit.cli_actor(), reason=reason))
    except (ResetRefusedError, UnknownOperationError) as e:
        raise _fail(str(e), EXIT_PROBLEM) from None
    import structlog

    structlog.get_logger(__name__).warning("operations_reset", kind=k.value, operation_ids=ids, reason=reason)
    if as_json:
        _print_json({"kind": k.value, "reset": ids})
    else:
        print(f"reset {len(ids)} {k.value} operation(s) to PENDING: {', '.join(map(str, ids)) or '-'}; "
              "`packhorse run` picks them up")


@app.command()
def status(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Show operations by kind and status, packages, copies per location and skipped files."""
    from .reporting import status_report

    ctx = _context(config)
    r = status_report(ctx)
    if as_json:
        _print_json(r)
        return
    out = Console()
    p = r["packages"]
    out.print(f"packages: {p['total']} total, {p['archived']} archived, {p['failed']} failed; "
              f"files: {r['files']['registered']} registered ({r['files']['bytes']:,} bytes)", highlight=False)
    t = Table("operation kind", *[s for s in ("PENDING", "SCHEDULED", "IN_PROGRESS", "COMPLETED", "FAILED")],
              title="operations")
    for kind, counts in sorted(r["operations"].items()):
        t.add_row(kind, *[str(counts.get(s, 0)) for s in ("PENDING", "SCHEDULED", "IN_PROGRESS", "COMPLETED", "FAILED")])
    out.print(t)
    c = Table("location", "copies", "bytes", title="physical copies (present)")
    for loc, v in r["copies"].items():
        c.add_row(loc, str(v["count"]), f"{v['bytes']:,}")
    out.print(c)
    if r["skipped"]:
        s = Table("location", "path", "reason", title="skipped files")
        for row in r["skipped"]:
            s.add_row(row["location"], row["path"], row["reason"])
        out.print(s)
    for f in r["failed_operations"]:
        out.print(f"[red]FAILED[/] {f['kind']} {f['id']}: {f['error_type']}: {f['message']}", highlight=False)


@app.command()
def verify(
    config: ConfigOpt = None,
    location: Annotated[Optional[str], typer.Option("--location", help="only copies at this data location")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-read every live copy and compare it with its recorded sha256. Exit 1 on any problem."""
    from .reporting import verify_copies

    ctx = _context(config)
    if location is not None and location not in ctx.topology.location_ids:
        raise _fail(f"--location: unknown data location {location!r}", EXIT_CONFIG)
    r = verify_copies(ctx, location)
    if as_json:
        _print_json(r)
    else:
        print(f"checked {r['checked']}, ok {r['ok']}, missing {len(r['missing'])}, corrupt {len(r['corrupt'])}")
        for m in r["missing"]:
            print(f"MISSING {m['location']}:{m['path']}")
        for c in r["corrupt"]:
            print(f"CORRUPT {c['location']}:{c['path']} (expected {c['expected']}, read {c['actual']})")
        for a in r["awaiting_restore"]:
            print(f"AWAITING RESTORE {a['location']}:{a['path']} (cold storage: restore requested, not verified now)")
        for u in r["unrepaired"]:
            print(f"UNREPAIRED {u['location']}:{u['path']} (recorded {u['status']}; `packhorse run` repairs it "
                  "from another verified copy if one exists)")
    raise typer.Exit(EXIT_PROBLEM if r["missing"] or r["corrupt"] or r["unrepaired"] else EXIT_OK)


@app.command()
def demo(
    source: Annotated[Optional[Path], typer.Option("--source", help="archive this folder instead of generated data")] = None,
    workdir: Annotated[Path, typer.Option("--workdir", help="where the demo's config, database and sites go")] = Path("packhorse-demo"),
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
) -> None:
    """Archive a data set from fyst to cologne and cornell, verify it, and print a summary."""
    from .demo import generate_observatory_data, write_demo_config
    from .reporting import status_report, verify_copies

    workdir = workdir.resolve()
    if (workdir / "packhorse.db").exists():
        raise _fail(f"{workdir} already holds a demo; remove it or choose another --workdir", EXIT_CONFIG)
    if source is not None:  # checked before anything is created
        src_dir = source.resolve()
        if not src_dir.is_dir():
            raise _fail(f"--source: {source} is not a folder", EXIT_CONFIG)
        if workdir == src_dir or src_dir in workdir.parents:
            raise _fail(f"--workdir {workdir} may not be inside --source {src_dir}", EXIT_CONFIG)
        src_value = str(src_dir)
    workdir.mkdir(parents=True, exist_ok=True)
    if source is None:
        src_dir = workdir / "data" / "fyst" / "source"
        nfiles, nbytes = generate_observatory_data(src_dir)
        print(f"generated {nfiles} files ({nbytes:,} bytes) in {src_dir}", file=sys.stderr)
        src_value = "data/fyst/source"
    cfg = write_demo_config(workdir, src_value, workers=max(2, min(4, os.cpu_count() or 2)))
    print(f"configuration: {cfg}", file=sys.stderr)
    ctx_settings = _settings(cfg)
    db = Database.from_settings(ctx_settings)
    db.upgrade()
    ctx = ProcessContext(settings=ctx_settings, db=db, topology=sync_topology(db, ctx_settings))
    elapsed, signum = _run(ctx, until_idle=True, quiet=quiet)
    code = _exit_code_after_run(ctx)
    if signum is not None and code == EXIT_OK:
        print(f"packhorse demo: interrupted by signal {signum}", file=sys.stderr)
        raise typer.Exit(128 + signum)
    v = verify_copies(ctx)
    r = status_report(ctx)
    mb = r["files"]["bytes"] / 1e6
    print(f"\npackhorse demo summary ({workdir})")
    print(f"  files:    {r['files']['registered']} ({r['files']['bytes']:,} bytes)")
    print(f"  packages: {r['packages']['total']} total, {r['packages']['archived']} archived, "
          f"{r['packages']['failed']} failed")
    from .domain import LocationRole

    for loc, c in r["copies"].items():
        if ctx.topology.location_role.get(loc) is LocationRole.SOURCE:
            continue  # raw files, not package copies
        print(f"  {loc:<16} {c['count']:>4} copies {c['bytes']:>14,} bytes")
    if r["skipped"]:
        print(f"  skipped:  {len(r['skipped'])} file(s) (see `packhorse status -c {cfg}`)")
    print(f"  verify:   {v['ok']}/{v['checked']} copies ok")
    print(f"  time:     {elapsed:.1f} s ({mb / elapsed if elapsed else 0:.1f} MB/s of source data)")
    print(f"  try:      packhorse status -c {cfg}")
    if v["missing"] or v["corrupt"]:
        code = code or EXIT_PROBLEM
    raise typer.Exit(code)


# --- issue 4: distributed mode (Celery workers per site, manager) -------------------------------


def _celery_settings(config: Path | None) -> ProcessContext:
    ctx = _context(config)
    if ctx.settings.executor.kind != "celery" or not ctx.settings.executor.broker_url:
        raise _fail("executor.kind: the distributed services need executor.kind = \"celery\" and "
                    "executor.broker_url (redis://… or amqp://…); `packhorse run` is the embedded mode",
                    EXIT_CONFIG)
    return ctx


@app.command()
def worker(
    site: Annotated[str, typer.Option("--site", help="the site whose queues this worker consumes")],
    kinds: Annotated[Optional[str], typer.Option("--kinds", help="only these kinds, comma separated "
                                                 "(operation kinds and 'scan'); default all")] = None,
    concurrency: Annotated[Optional[int], typer.Option("--concurrency", min=1, help="pool processes "
                                                       "[default: executor.workers]")] = None,
    loglevel: Annotated[str, typer.Option("--loglevel", help="Celery log level")] = "INFO",
    config: ConfigOpt = None,
) -> None:
    """Run a Celery worker of one site: it consumes exactly that site's queues (distributed mode)."""
    from .executors.celery_app import run_worker

    ctx = _celery_settings(config)
    ctx.db.dispose()  # pool children open their own connections
    wanted = [k.strip() for k in kinds.split(",") if k.strip()] if kinds else None
    try:
        run_worker(ctx.settings, site, kinds=wanted, concurrency=concurrency, loglevel=loglevel)
    except ConfigError as e:
        raise _fail(str(e), EXIT_CONFIG) from None


@app.command()
def manager(
    config: ConfigOpt = None,
    max_seconds: Annotated[Optional[float], typer.Option("--max-seconds", help="stop after this long")] = None,
) -> None:
    """Run the managers and the dispatcher to Celery (distributed mode; one per deployment)."""
    from . import logs
    from .executors.celery_app import Manager

    ctx = _celery_settings(config)
    logs.configure(_log_level("INFO"))
    mgr = Manager(ctx.settings)

    def stop(signum: int, _frame: object) -> None:
        print(f"packhorse manager: signal {signum}: stopping", file=sys.stderr)
        mgr.stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    mgr.run(max_seconds=max_seconds)


# --- issue 7: notifications, disk usage


def _serve(ctx: ProcessContext, service: str, body: Any) -> None:
    """Run ``body(stop_event, lifecycle)`` as a service until SIGINT/SIGTERM, with its
    started / still-alive / stopped notifications."""
    import threading

    from .notify.lifecycle import ServiceLifecycle

    stop_event = threading.Event()
    reason: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        reason.append(f"signal {signum}")
        stop_event.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    life = ServiceLifecycle(ctx.db, service,
                            still_alive_interval_seconds=ctx.settings.notifications.still_alive_interval_seconds)
    life.started()
    why = "stopped"
    try:
        body(stop_event, life)
        why = reason[0] if reason else "stopped"
    except BaseException as e:
        why = f"error: {type(e).__name__}: {e}"
        raise
    finally:
        life.stopped(why)
        for s, h in old.items():
            signal.signal(s, h)


@app.command()
def notifier(config: ConfigOpt = None) -> None:
    """Deliver the notification outbox (SMTP, apprise) until stopped: retries with backoff, dead letters."""
    from .notify.notifier import Notifier

    ctx = _context(config)
    cfg = ctx.settings.notifications
    if not cfg.enabled or not cfg.channels_configured:
        raise _fail("notifications: no channel configured (set [notifications.smtp] or apprise_urls) "
                    "or notifications.enabled = false", EXIT_CONFIG)
    try:
        n = Notifier(cfg, ctx.db)
    except ConfigError as e:
        raise _fail(str(e), EXIT_CONFIG) from None
    print(f"packhorse notifier: delivering through {', '.join(c.name for c in n.channels)}", file=sys.stderr)

    def body(stop_event: Any, life: Any) -> None:
        n.serve(stop_event, on_cycle=life.tick)

    _serve(ctx, "notifier", body)
    n.run_once()  # its own "stopped" message


@app.command()
def notifications(
    config: ConfigOpt = None,
    dead: Annotated[bool, typer.Option("--dead", help="only dead letters (delivery gave up)")] = False,
    requeue_dead: Annotated[bool, typer.Option("--requeue-dead", help="queue dead letters again (after fixing a channel)")] = False,
    limit: Annotated[int, typer.Option("--limit", help="at most this many sent notifications")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """List the notification outbox: waiting and retrying first, then recent sent ones (or --dead)."""
    from .notify.report import list_notifications, requeue_dead_letters

    ctx = _context(config)
    if requeue_dead:
        ids = requeue_dead_letters(ctx.db)
        print(f"queued {len(ids)} dead letter(s) again: {', '.join(map(str, ids)) or '-'}", file=sys.stderr)
    rows = list_notifications(ctx.db, dead=dead, sent_limit=limit)
    if as_json:
        _print_json(rows)
        return
    t = Table("id", "created (UTC)", "level", "status", "attempts", "next attempt", "delivered to", "repeats",
              "subject", "last error", title="dead letters" if dead else "notifications")
    for r in rows:
        t.add_row(str(r["id"]), r["created_at"][:19], r["level"], r["status"], str(r["attempts"]),
                  (r["next_attempt_at"] or "")[:19] if r["status"] == "pending" else "",
                  ", ".join(r["delivered_to"]), str(r["repeat_count"]), r["subject"], r["last_error"] or "")
    Console().print(t)


@app.command()
def usage(
    config: ConfigOpt = None,
    measure: Annotated[bool, typer.Option("--measure", help="measure every disk location now (and record it)")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Disk usage per data location (latest measurement): total, used, free, percent, level."""
    from .diskusage import latest_usage, measure_all, sample_dict

    ctx = _context(config)
    if measure:
        measure_all(ctx.db, ctx.settings, ctx.topology.location_ids)
    rows = ctx.db.read(lambda s: [sample_dict(n, x) for n, x in sorted(latest_usage(s).items())])
    if as_json:
        _print_json(rows)
        return
    if not rows:
        print("no disk usage recorded yet: `packhorse run` (or disk-monitor) measures every "
              f"{ctx.settings.disk_usage.interval_seconds:g} s; `packhorse usage --measure` measures now", file=sys.stderr)
        return
    t = Table("location", "measured (UTC)", "total", "used", "free", "used %", "level", "alert", title="disk usage")
    for r in rows:
        t.add_row(r["location"], r["measured_at"][:19], f"{r['total_bytes']:,}", f"{r['used_bytes']:,}",
                  f"{r['free_bytes']:,}", f"{r['percent']:.1f}", r["level"], r["alert_level"])
    Console().print(t)


@app.command("disk-monitor")
def disk_monitor(config: ConfigOpt = None) -> None:
    """Measure every active disk location every disk_usage.interval_seconds (60 s) until stopped."""
    from .diskusage import DiskMonitor

    ctx = _context(config)
    monitor = DiskMonitor(ctx.db, ctx.settings, ctx.topology.location_ids)

    def body(stop_event: Any, life: Any) -> None:
        import threading

        t = threading.Thread(target=monitor.serve, args=(stop_event,), daemon=True)
        t.start()
        while not stop_event.wait(1.0):
            life.tick()
        t.join(timeout=30)

    _serve(ctx, "disk-monitor", body)
# --- issue 3: failure recovery (monitor, circuit breakers, retry, health, log format)

@app.callback()
def _global_options(
    log_format: Annotated[Optional[str], typer.Option(
        "--log-format", help="Log lines on stderr: json or console [default: console on a terminal, else json]",
        envvar="PACKHORSE_LOG_FORMAT")] = None,
) -> None:
    """packhorse: pack raw data into BagIt bags, ship, verify and archive it exactly once."""
    from . import logs

    if log_format is not None:
        if log_format not in ("json", "console"):
            raise _fail(f"--log-format: {log_format!r} is not one of json, console", EXIT_CONFIG)
        logs.set_format(log_format)


def _kind(kind: str):  # type: ignore[no-untyped-def]
    from .domain import OperationKind

    try:
        return OperationKind(kind)
    except ValueError:
        raise _fail(f"unknown operation kind {kind!r}; one of {', '.join(k.value for k in OperationKind)}",
                    EXIT_CONFIG) from None


def _actor() -> str:
    from .audit import cli_actor

    return cli_actor()


@app.command()
def monitor(
    config: ConfigOpt = None,
    once: Annotated[bool, typer.Option("--once", help="Run one cycle, print what it did, exit")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run the stalled-task monitor (circuit breakers) and the reconciler as a service."""
    from .recovery.health import HeartbeatThread
    from .pipeline import recover
    from .recovery.loop import ServiceLoop

    ctx = _context(config)
    rec = ctx.settings.recovery
    if once:
        report = recover(ctx)
        data = {"reset": report.reset, "blocked": report.blocked, "unhandled": report.unhandled,
                "breakers_closed": report.breakers_closed}
        if as_json:
            _print_json(data)
        else:
            print(" ".join(f"{k}={','.join(map(str, v)) or '-'}" for k, v in data.items()))
        raise typer.Exit(EXIT_OK)
    loop = ServiceLoop(ctx.db, "monitor", lambda _session: recover(ctx),
                       interval_seconds=rec.monitor_interval_seconds,
                       max_consecutive_errors=ctx.settings.managers.max_consecutive_errors,
                       notification_cooldown_seconds=rec.notification_cooldown_seconds)

    def stop(signum: int, _frame: object) -> None:
        loop.stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    health = HeartbeatThread(ctx.db, "monitor", interval_seconds=rec.service_heartbeat_interval_seconds).start()
    try:
        loop.run()
    finally:
        health.stop(remove=True)


breaker_app = typer.Typer(help="Circuit breakers of stalled operations: list, reset.", no_args_is_help=True)
app.add_typer(breaker_app, name="breaker")


@breaker_app.command("list")
def breaker_list(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """List circuit breakers that counted stalls (open ones first)."""
    from .recovery.breakers import jsonable, list_breakers

    ctx = _context(config)
    rows = ctx.db.read(list_breakers)
    if as_json:
        _print_json([jsonable(r) for r in rows])
        return
    t = Table("kind", "operation", "state", "stalls", "opened (UTC)", "closes (UTC)", title="circuit breakers")
    for r in rows:
        t.add_row(r["kind"], str(r["operation_id"]), r["state"], str(r["stall_count"]),
                  r["opened_at"].strftime("%Y-%m-%d %H:%M:%S") if r["opened_at"] else "-",
                  r["closes_at"].strftime("%Y-%m-%d %H:%M:%S") if r["closes_at"] else "-")
    Console().print(t)


@breaker_app.command("reset")
def breaker_reset(
    kind: Annotated[str, typer.Argument(help="operation kind, e.g. long_term_archive")],
    operation_id: Annotated[int, typer.Argument(help="operation id")],
    reason: Annotated[str, typer.Option("--reason", help="why (logged and notified)")] = "not given",
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Close the circuit breaker of one operation (the monitor then recovers it)."""
    from .actions import reset_circuit_breaker
    from .errors import UnknownOperationError
    from .recovery.breakers import jsonable

    k = _kind(kind)
    ctx = _context(config)
    try:
        out = reset_circuit_breaker(ctx, k, operation_id, reason=reason, actor=_actor())
    except UnknownOperationError as e:
        raise _fail(str(e), EXIT_PROBLEM) from None
    if as_json:
        _print_json(jsonable(out))
    else:
        print(f"circuit breaker of {k.value} {operation_id} closed (had {out['previous_stall_count']} stall(s))")


@app.command()
def retry(
    kind: Annotated[str, typer.Argument(help="operation kind, e.g. long_term_archive")],
    operation_id: Annotated[int, typer.Argument(help="operation id")],
    reason: Annotated[str, typer.Option("--reason", help="why (logged and notified)")] = "not given",
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Force a retry: reset the circuit breaker, set the operation PENDING, dispatch it now."""
    from .actions import force_retry_operation
    from .errors import UnknownOperationError
    from .operations import ResetRefusedError

    k = _kind(kind)
    ctx = _context(config)
    try:
        out = force_retry_operation(ctx, k, operation_id, reason=reason, actor=_actor())
    except (UnknownOperationError, ResetRefusedError) as e:
        raise _fail(str(e), EXIT_PROBLEM) from None
    if as_json:
        _print_json(out)
    else:
        print(f"{k.value} {operation_id}: {out['previous_status']} -> PENDING; `packhorse run` dispatches it now")


@app.command()
def health(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """List services and workers with their last heartbeat; exit 1 if one is dead."""
    from .recovery.breakers import jsonable
    from .recovery.health import list_services

    ctx = _context(config)
    rows = ctx.db.read(lambda s: list_services(s, dead_after_seconds=ctx.settings.recovery.service_dead_after_seconds))
    dead = [r for r in rows if not r["alive"]]
    if as_json:
        _print_json({"services": [jsonable(r) for r in rows], "dead": len(dead)})
    else:
        t = Table("service", "kind", "host", "pid", "state", "last seen (UTC)", "age (s)", title="services")
        for r in rows:
            t.add_row(r["service"], r["kind"], r["host"], str(r["pid"]), "alive" if r["alive"] else "[red]DEAD[/]",
                      r["last_seen"].strftime("%Y-%m-%d %H:%M:%S"), f"{r['age_seconds']:.0f}")
        Console().print(t)
        if not rows:
            print("no service has recorded a heartbeat")
    raise typer.Exit(EXIT_PROBLEM if dead else EXIT_OK)


# --- issue 6: operator surface (API, diagnose, tokens, runtime settings, reconcile) ---------
token_app = typer.Typer(no_args_is_help=True, help="API tokens: create (shown once), list, revoke.")
config_app = typer.Typer(no_args_is_help=True, help="Runtime settings stored in the database (picked up within 60 s).")
app.add_typer(token_app, name="token")
app.add_typer(config_app, name="config")


def serve_api(ctx: ProcessContext, host: str, port: int) -> "Any":
    """Start the HTTP API in a background thread; returns the uvicorn server (``should_exit``
    stops it). Prints ``packhorse api: serving on http://HOST:PORT`` on stderr once listening."""
    import threading

    import uvicorn

    from .api.app import create_app

    server = uvicorn.Server(uvicorn.Config(create_app(ctx.settings, ctx=ctx), host=host, port=port,
                                          log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.05)
    if not server.started:
        raise _fail(f"api: cannot listen on {host}:{port}", EXIT_CONFIG)
    bound = server.servers[0].sockets[0].getsockname()[1] if server.servers else port
    print(f"packhorse api: serving on http://{host}:{bound}", file=sys.stderr, flush=True)
    return server


@app.command()
def api(
    config: ConfigOpt = None,
    host: Annotated[Optional[str], typer.Option("--host", help="address to listen on [default: api.host]")] = None,
    port: Annotated[Optional[int], typer.Option("--port", help="port (0: any free port) [default: api.port]")] = None,
) -> None:
    """Serve the HTTP API, /metrics and the web dashboard until stopped."""
    ctx = _context(config)
    server = serve_api(ctx, host or ctx.settings.api.host, ctx.settings.api.port if port is None else port)
    stop = {"now": False}

    def on_signal(signum: int, _frame: object) -> None:
        stop["now"] = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    while not stop["now"] and not server.should_exit:
        time.sleep(0.2)
    server.should_exit = True


@app.command()
def diagnose(
    kind: Annotated[Optional[str], typer.Argument(help="operation kind, e.g. transfer")] = None,
    operation_id: Annotated[Optional[int], typer.Argument(help="operation id")] = None,
    package: Annotated[Optional[str], typer.Option("--package", help="every operation of this package (by name)")] = None,
    live: Annotated[bool, typer.Option("--live", help="also check now whether the bytes are on disk")] = False,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The diagnostic report of an operation: row, failure events (newest first), copies per
    location and the diagnosis. Exit 1 if the operation (or one of the package's) is FAILED."""
    from . import audit
    from .actions import UnknownPackageError
    from .diagnose import diagnose_operation, diagnose_package, live_check
    from .errors import UnknownOperationError

    if (package is None) == (kind is None or operation_id is None):
        raise _fail("give KIND ID, or --package NAME", EXIT_CONFIG)
    k = _kind(kind) if kind else None
    ctx = _context(config)
    try:
        if package is not None:
            reports = ctx.db.read(lambda s: diagnose_package(s, package))["reports"]
        else:
            reports = [ctx.db.read(lambda s: diagnose_operation(s, k, operation_id))]
    except (UnknownOperationError, UnknownPackageError) as e:
        raise _fail(str(e), EXIT_PROBLEM) from None
    if live:
        for r in reports:
            r["live_check"] = live_check(ctx, _kind(r["operation"]["kind"]), r["operation"]["id"])
    audit.record(ctx.db, actor=audit.cli_actor(), action="package.diagnose" if package else "operation.diagnose",
                 target=package or f"{kind}/{operation_id}")
    if as_json:
        _print_json(reports if package else reports[0])
    else:
        for r in reports:
            _print_report(r)
    raise typer.Exit(EXIT_PROBLEM if any(r["operation"]["status"] == "FAILED" for r in reports) else EXIT_OK)


def _print_report(r: dict[str, Any]) -> None:
    out = Console(highlight=False, soft_wrap=True)
    op = r["operation"]
    out.print(f"[bold]{op['kind']} {op['id']}[/]: {op['status']}{' (stalled)' if op['stalled'] else ''}, "
              f"attempt {op['attempt']}, retries {op['retry_count']}/{op['max_retries']}, stalls {op['stall_count']}")
    out.print(f"  package: {op['raw_data_package'] or op['data_transfer_package'] or '-'}; "
              f"{op['source_location'] or '-'} -> {op['destination_location'] or '-'}")
    out.print(f"  diagnosis: {r['diagnosis']}  [{r['diagnosis_source']}]")
    for e in r["failure_events"]:
        out.print(f"  {e['created_at']} attempt {e['attempt']}: {e['error_type']}: {e['message']}"
                  f"{' (retried)' if e['will_retry'] else ''}")
    t = Table("artifact", "location", "role", "status", "path", "verified", title="physical copies")
    for c in r["copies"]:
        t.add_row(c["name"], c["location"], c["role"], c["status"], c["path"] or "-", c["verified_at"] or "-")
    out.print(t)
    for c in r.get("live_check", {}).get("checked", []):
        state = "ok" if c["ok"] else (c["error"] or "; ".join(
            f"{o['path']}: {'size ' + str(o['size']) if o['exists'] else 'MISSING'}" for o in c["objects"] if not o["ok"]))
        out.print(f"  live {c['location']}: {state}")
    for c in r.get("live_check", {}).get("skipped", []):
        out.print(f"  live {c['location']}: skipped ({c['reason']})")


@app.command()
def reconcile(
    package_id: Annotated[Optional[int], typer.Argument(help="raw data package id (default: every package)")] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Recompute raw data packages' archived state from their verified archive copies."""
    from . import audit
    from .actions import UnknownPackageError, reconcile_inconsistent, reconcile_package

    ctx = _context(config)
    try:
        out = (reconcile_package(ctx, package_id, actor=audit.cli_actor()) if package_id is not None
               else reconcile_inconsistent(ctx, actor=audit.cli_actor()))
    except UnknownPackageError as e:
        raise _fail(str(e), EXIT_PROBLEM) from None
    if as_json:
        _print_json(out)
    elif package_id is not None:
        print(f"{out['name']}: {out['change'] or 'consistent'} (archived: {'yes' if out['archived'] else 'no'})")
    else:
        print(f"checked {out['checked']} package(s), changed {len(out['changed'])}")
        for c in out["changed"]:
            print(f"  {c['name']}: {c['change']}")


@token_app.command("create")
def token_create(
    role: Annotated[str, typer.Option("--role", help="observer or admin")],
    name: Annotated[str, typer.Option("--name", help="who or what uses it")],
    config: ConfigOpt = None,
) -> None:
    """Create an API token; it is printed once, alone on the last line of stdout."""
    from . import audit
    from .api.tokens import TokenError, create_token

    ctx = _context(config)
    try:
        tok = create_token(ctx.db, name=name, role=role, created_by=audit.cli_actor())
    except TokenError as e:
        audit.record(ctx.db, actor=audit.cli_actor(), action="token.create", target=name, details={"role": role},
                     result="refused", message=str(e))
        raise _fail(str(e), EXIT_CONFIG) from None
    audit.record(ctx.db, actor=audit.cli_actor(), action="token.create", target=name, details={"role": role})
    print(f"created {role} token {name!r}; it is shown only now (packhorse stores only its hash):")
    print(tok)


@token_app.command("list")
def token_list(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """List tokens (never their secret)."""
    from .api.tokens import list_tokens

    ctx = _context(config)
    rows = ctx.db.read(list_tokens)
    if as_json:
        _print_json(rows)
        return
    t = Table("name", "role", "created", "by", "last used", "revoked", title="API tokens")
    for r in rows:
        t.add_row(r["name"], r["role"], r["created_at"], r["created_by"], r["last_used_at"] or "-", r["revoked_at"] or "-")
    Console().print(t)


@token_app.command("revoke")
def token_revoke(name: Annotated[str, typer.Argument(help="the token's name")], config: ConfigOpt = None,
                 as_json: JsonOpt = False) -> None:
    """Revoke a token: it is refused from the next request on."""
    from . import audit
    from .api.tokens import TokenError, revoke_token

    ctx = _context(config)
    try:
        revoke_token(ctx.db, name)
    except TokenError as e:
        audit.record(ctx.db, actor=audit.cli_actor(), action="token.revoke", target=name, result="refused",
                     message=str(e))
        raise _fail(str(e), EXIT_PROBLEM) from None
    audit.record(ctx.db, actor=audit.cli_actor(), action="token.revoke", target=name)
    if as_json:
        _print_json({"revoked": name})
    else:
        print(f"revoked token {name!r}")


@config_app.command("set")
def config_set(key: Annotated[str, typer.Argument(help="e.g. managers.poll_interval_seconds, log_level")],
               value: Annotated[str, typer.Argument()], config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Change a runtime setting; running services pick it up within a minute (audited)."""
    from . import audit
    from .runtime_settings import RuntimeSettingError, set_setting

    ctx = _context(config)
    try:
        v = set_setting(ctx.db, key, value, actor=audit.cli_actor())
    except RuntimeSettingError as e:
        raise _fail(str(e), EXIT_CONFIG) from None
    if as_json:
        _print_json({"key": key, "value": v})
        return
    print(f"{key} = {v} (running services pick it up within "
          f"{ctx.settings.managers.runtime_settings_refresh_seconds:g} s)")


@config_app.command("unset")
def config_unset(key: Annotated[str, typer.Argument()], config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Drop a runtime override: the configuration file's value applies again (audited)."""
    from . import audit
    from .runtime_settings import RuntimeSettingError, unset_setting

    ctx = _context(config)
    try:
        existed = unset_setting(ctx.db, key, actor=audit.cli_actor())
    except RuntimeSettingError as e:
        raise _fail(str(e), EXIT_CONFIG) from None
    if as_json:
        _print_json({"key": key, "removed": existed})
        return
    print(f"{key}: {'override removed' if existed else 'had no override'}; the configuration file's value applies")


@config_app.command("show")
def config_show(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Runtime settings: effective value, file default and where the value comes from."""
    from .runtime_settings import describe

    ctx = _context(config)
    rows = ctx.db.read(lambda s: describe(s, ctx.settings))
    if as_json:
        _print_json(rows)
        return
    t = Table("key", "value", "source", "default", "changed", title="runtime settings")
    for r in rows:
        t.add_row(r["key"], str(r["value"]), r["source"], str(r["default"]),
                  f"{r['updated_at']} by {r['updated_by']}" if r["updated_at"] else "-")
    Console().print(t)


@app.command("audit")
def audit_cmd(limit: Annotated[int, typer.Option("--limit", help="newest N entries")] = 50,
              config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """The audit log of admin actions, newest first."""
    from . import audit

    ctx = _context(config)
    rows = ctx.db.read(lambda s: audit.entries(s, limit=limit))
    if as_json:
        _print_json(rows)
        return
    for r in rows:
        print(f"{r['at']} {r['actor']} {r['action']} {r['target'] or ''} {r['result']}"
              f"{': ' + r['message'] if r['message'] else ''}")


# --- issue 5: object storage, staging, fixity audit
def _check_storage(ctx: ProcessContext) -> None:
    """Build every active location's backend (S3 write-once probe, Object Lock check) before
    any work runs; a refused store exits 2 naming the location (issue #5)."""
    from .errors import StorageServiceError

    from .domain import StorageType

    try:
        for loc in ctx.settings.locations:
            # disk backends need no probe, and building one creates its folder: a source
            # folder with a typo must stay missing and be reported, not appear empty
            if loc.active and loc.storage is not StorageType.DISK:
                ctx.backend(loc.name)
    except (ConfigError, StorageServiceError) as e:
        raise _fail(str(e), EXIT_CONFIG) from None


@app.command()
def stage(
    name: Annotated[str, typer.Argument(help="raw data package name or observation unit")],
    to: Annotated[str, typer.Option("--to", help="processing location to extract into")],
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Request staging: extract archived packages into a processing location, verified against
    their bag manifests (`packhorse run` does the work; cold archives are restored first)."""
    from .managers.staging import NothingToStageError, request_staging

    ctx = _context(config)
    try:
        rows = request_staging(ctx, name, to)
    except ConfigError as e:
        raise _fail(str(e), EXIT_CONFIG) from None
    except NothingToStageError as e:
        raise _fail(str(e), EXIT_PROBLEM) from None
    if as_json:
        _print_json(rows)
        return
    for r in rows:
        if r["operation_id"] is None:
            print(f"{r['package']}: not archived yet; not staged")
        elif r["created"]:
            print(f"{r['package']}: staging operation {r['operation_id']} created; `packhorse run` stages it")
        else:
            print(f"{r['package']}: already requested (staging operation {r['operation_id']}, {r['status']})")


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except PackhorseError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_PROBLEM)

