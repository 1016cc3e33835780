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
from .stages.base import StageContext
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
        db = Database(url)
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


def _context(config: Path | None, *, migrate_check: bool = True) -> StageContext:
    from . import logs

    logs.configure(os.environ.get("PACKHORSE_LOG_LEVEL", "WARNING"))
    settings = _settings(config)
    db = _database(settings, migrate_check=migrate_check)
    return StageContext(settings=settings, db=db, topology=sync_topology(db, settings))


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


def _exit_code_after_run(ctx: StageContext) -> int:
    from .reporting import failed_operations

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

    def __init__(self, ctx: StageContext) -> None:
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


def _run(ctx: StageContext, *, until_idle: bool, quiet: bool) -> float:
    from . import logs
    from .executors.local import LocalRunner

    show_bars = sys.stderr.isatty() and not quiet
    logs.configure(os.environ.get("PACKHORSE_LOG_LEVEL", "ERROR" if quiet else ("WARNING" if show_bars else "INFO")))
    bars = _Progress(ctx) if show_bars else None
    runner = LocalRunner(ctx, on_tick=bars.tick if bars else None)

    def stop(signum: int, _frame: object) -> None:
        print(f"packhorse: signal {signum}: finishing running operations, then stopping", file=sys.stderr)
        runner.stop_requested.set()
        runner.wake.set()

    from .recovery.health import HeartbeatThread

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    start = time.monotonic()
    health = HeartbeatThread(ctx.db, "runner",
                             interval_seconds=ctx.settings.recovery.service_heartbeat_interval_seconds).start()
    try:
        if bars:
            with bars:
                runner.run(until_idle=until_idle)
        else:
            runner.run(until_idle=until_idle)
    finally:
        health.stop(remove=True)
        for s, h in old.items():
            signal.signal(s, h)
    return time.monotonic() - start


@app.command()
def run(
    config: ConfigOpt = None,
    until_idle: Annotated[bool, typer.Option("--until-idle", help="Stop when no work can become runnable by itself")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars; errors only")] = False,
) -> None:
    """Run managers, workers and lease recovery (embedded mode)."""
    ctx = _context(config)
    if ctx.settings.executor.kind != "local":
        raise _fail(f"executor.kind: {ctx.settings.executor.kind!r} is not available in this version; "
                    "use \"local\" (packhorse run runs everything in one process)", EXIT_CONFIG)
    _check_storage(ctx)
    elapsed = _run(ctx, until_idle=until_idle, quiet=quiet)
    code = _exit_code_after_run(ctx)
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
    from .domain import OperationKind
    from .operations import ResetRefusedError, reset_failed

    try:
        k = OperationKind(kind)
    except ValueError:
        raise _fail(f"unknown operation kind {kind!r}; one of {', '.join(x.value for x in OperationKind)}",
                    EXIT_CONFIG) from None
    if (operation_id is None) == (not all_failed):
        raise _fail("give either an operation id or --all-failed", EXIT_CONFIG)
    ctx = _context(config)
    try:
        ids = reset_failed(ctx.db, k, operation_id)
    except ResetRefusedError as e:
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
    workdir.mkdir(parents=True, exist_ok=True)
    if source is None:
        src_dir = workdir / "data" / "fyst" / "source"
        nfiles, nbytes = generate_observatory_data(src_dir)
        print(f"generated {nfiles} files ({nbytes:,} bytes) in {src_dir}", file=sys.stderr)
        src_value = "data/fyst/source"
    else:
        src_dir = source.resolve()
        if not src_dir.is_dir():
            raise _fail(f"--source: {source} is not a folder", EXIT_CONFIG)
        if workdir == src_dir or src_dir in workdir.parents:
            raise _fail(f"--workdir {workdir} may not be inside --source {src_dir}", EXIT_CONFIG)
        src_value = str(src_dir)
    cfg = write_demo_config(workdir, src_value, workers=max(2, min(4, os.cpu_count() or 2)))
    print(f"configuration: {cfg}", file=sys.stderr)
    ctx_settings = _settings(cfg)
    db = Database(ctx_settings.database_url)
    db.upgrade()
    ctx = StageContext(settings=ctx_settings, db=db, topology=sync_topology(db, ctx_settings))
    elapsed = _run(ctx, until_idle=True, quiet=quiet)
    code = _exit_code_after_run(ctx)
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
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"


@app.command()
def monitor(
    config: ConfigOpt = None,
    once: Annotated[bool, typer.Option("--once", help="Run one cycle, print what it did, exit")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run the stalled-task monitor (circuit breakers) and the reconciler as a service."""
    from .recovery.health import HeartbeatThread
    from .recovery.loop import ServiceLoop
    from .recovery.monitor import recovery_cycle

    ctx = _context(config)
    rec = ctx.settings.recovery
    if once:
        report = recovery_cycle(ctx.db, ctx.settings)
        data = {"reset": report.reset, "blocked": report.blocked, "unhandled": report.unhandled,
                "breakers_closed": report.breakers_closed}
        if as_json:
            _print_json(data)
        else:
            print(" ".join(f"{k}={','.join(map(str, v)) or '-'}" for k, v in data.items()))
        raise typer.Exit(EXIT_OK)
    loop = ServiceLoop(ctx.db, "monitor", lambda _session: recovery_cycle(ctx.db, ctx.settings),
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
    from .errors import UnknownOperationError
    from .recovery.breakers import jsonable, reset_breaker

    k = _kind(kind)
    ctx = _context(config)
    try:
        out = reset_breaker(ctx.db, k, operation_id, reason=reason, actor=_actor())
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
    from .errors import UnknownOperationError
    from .operations import ResetRefusedError
    from .recovery.breakers import force_retry

    k = _kind(kind)
    ctx = _context(config)
    try:
        out = force_retry(ctx.db, k, operation_id, reason=reason, actor=_actor())
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


# --- issue 5: object storage, staging, fixity audit
def _check_storage(ctx: StageContext) -> None:
    """Build every active location's backend (S3 write-once probe, Object Lock check) before
    any work runs; a refused store exits 2 naming the location (issue #5)."""
    from .errors import StorageServiceError

    try:
        for loc in ctx.settings.locations:
            if loc.active:
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

