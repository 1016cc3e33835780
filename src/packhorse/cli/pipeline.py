"""Pipeline commands: create the ops database (``init``), run the embedded mode (``run``,
``run-operation``), the ``demo``, and look at and check the archive (``status``, ``verify``),
request staging (``stage``)."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from packhorse import __version__, logs
from packhorse.cli.app import (
    EXIT_BLOCKED,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_INCOMPLETE,
    EXIT_OK,
    EXIT_PROBLEM,
    ConfigOpt,
    InstanceOpt,
    JsonOpt,
    KindArg,
    OperationIdArg,
    check_read_only_sources,
    check_storage,
    command_set,
    context,
    database,
    err,
    fail,
    heartbeat,
    log_level,
    parse_kind,
    print_json,
    require_routes,
    settings,
    shown,
    table_console,
)
from packhorse.db.session import Database
from packhorse.domain import CopyStatus, LocationRole
from packhorse.errors import ConfigError, NothingToStageError, StorageServiceError, UnknownOperationError
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from packhorse.time_text import utc_text

#: this module's commands (loaded by packhorse.cli when one of them runs)
commands = command_set()


def _mark(ctx: ProcessContext, **kwargs: Any) -> list[Any]:
    """:func:`~packhorse.rules.availability.mark_locations` for ``init`` and ``demo``: a root that is
    missing, marked as another location or refused by its store exits 2 (``EXIT_CONFIG``)
    naming it, as any other setup error."""
    from packhorse.rules.availability import mark_locations  # deferred: start-up time

    check_read_only_sources(ctx)
    try:
        return mark_locations(ctx, **kwargs)
    except (ConfigError, StorageServiceError, OSError) as e:
        raise fail(str(e), EXIT_CONFIG) from None


def _refuse_unreachable(db: Database, refused: list[str], *, remove_file: str | None) -> None:
    """``init``'s check before it creates anything: the storage of every data location it will
    mark must answer (``refused``: :func:`~packhorse.rules.availability.unreachable_stores`,
    credentials, reachability, a disk root that can be created). If one does not, ``init`` exits
    2 naming every such location, having created nothing: no tables, no root, no marker, and the
    empty SQLite file the connection made (``remove_file``, with its ``-wal``/``-shm`` files) is
    removed, so that a re-run starts as the first one."""
    if not refused:
        return
    db.dispose()
    if remove_file is not None:
        for path in (remove_file, remove_file + "-wal", remove_file + "-shm", remove_file + "-journal",
                     remove_file + ".writer-lock"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
    created = "no database created, " if remove_file is not None else "database left as it was, "
    raise fail(f"packhorse init: the storage of {len(refused)} data location(s) cannot be reached; nothing done "
               f"({created}no location marked); fix it, then run `packhorse init` again:\n  " + "\n  ".join(refused),
               EXIT_CONFIG)


@commands.command()
def version() -> None:
    """Print the packhorse version."""
    print(__version__)


@commands.command()
def init(config: ConfigOpt = None,
         replace: Annotated[list[str] | None, typer.Option(
             "--replace", metavar="LOCATION",
             help="new, empty storage replaces the lost storage of LOCATION: mark it, and record the copies "
                  "the database holds there as missing (made again from good sources); repeatable")] = None,
         site: Annotated[list[str] | None, typer.Option(
             "--site", metavar="SITE",
             help="mark only the data locations of SITE (distributed: run on a host of each site, where its "
                  "folders are); repeatable; default every site")] = None,
         adopt: Annotated[list[str] | None, typer.Option(
             "--adopt", metavar="LOCATION",
             help="take over the root of LOCATION although another packhorse installation marked it (this "
                  "database replaces that installation's lost one); repeatable")] = None,
         ) -> None:
    """Create or upgrade the ops database (Alembic migrations), register sites and locations,
    and create and mark every location's root with its identity marker.

    An existing root with data and no marker (a deployment from before markers) is marked and
    keeps its data; a root marked as another location is refused (exit 2), and so is an empty
    unmarked root where the database records copies (an unmounted disk), unless --replace
    names it, and a root marked by another packhorse installation (exit 2), unless --adopt
    names it. --site marks the locations of those sites only (in a distributed deployment
    each site's folders are on its own hosts); the database is created or upgraded either way."""
    from packhorse.rules.availability import root_of, unreachable_stores  # deferred: start-up time

    logs.configure(log_level("WARNING"))  # what init did is printed below; log lines only for trouble
    s = settings(config)
    db_file = s.database_url[len("sqlite:///"):] if s.database_url.startswith("sqlite:///") else None
    new_file = db_file is not None and ":memory:" not in db_file and not os.path.exists(db_file)
    db = database(s, migrate_check=False)  # connects: a new SQLite file exists from here, still empty
    _refuse_unreachable(db, unreachable_stores(s, db, site or None), remove_file=db_file if new_file else None)
    before = db.current_revision()
    db.upgrade()
    topo = sync_topology(db, s)
    after = db.current_revision()
    state = "created" if before is None else ("upgraded" if before != after else "already up to date")
    # what init did is its result: on stdout (warnings and errors go to stderr)
    print(f"database {db.engine.url.render_as_string(hide_password=True)}: {state} (migration {after})")
    ctx = ProcessContext(settings=s, db=db, topology=topo)
    marked = _mark(ctx, replace=replace or (), sites=site or None, adopt=adopt or ())
    for m in marked:
        if m.action not in ("already marked", "already identified"):
            extra = (f" ({m.objects} object(s) kept as they are)" if m.action in ("adopted", "taken over") else
                     f" (holds {m.objects} file(s) to archive)" if m.action == "initialised" else "")
            done = {"created": "created and marked", "adopted": "adopted and marked",
                    "initialised": "initialised and marked",
                    "taken over": "taken over from the other installation and marked anew (its marker is kept in "
                                  "_packhorse/quarantine/; its database no longer finds this root)",
                    "identified": "read-only source: nothing written there; its identity (a uuid and a fingerprint "
                                  "of the root) is kept in the ops database",
                    "already identified": "read-only source, identity checked (nothing written there)"}.get(m.action,
                                                                                                      m.action)
            if m.location in (replace or ()):
                done += " (replacing lost storage: its recorded copies are now missing and will be made again)"
            print(f"location {m.location}: {done} at {root_of(ctx, m.location)}{extra}")


def exit_code_after_run(ctx: ProcessContext, *, quiet: bool = False) -> int:
    """The exit code of a finished ``run --until-idle`` / ``demo`` from the ops database:
    :data:`EXIT_FAILED` (3) if any operation is FAILED (each listed on stderr with its error),
    :data:`EXIT_BLOCKED` (4) if work is blocked and may resume by itself or on one command (the
    items of :mod:`packhorse.status.blocked_work`, each printed with its releasing command: an open circuit
    breaker, …), else :data:`EXIT_OK`. Skipped
    source paths are counted on stderr even when ``quiet``: they are files not archived (I1,
    nothing silently skipped). A run stopped by a signal before it
    was idle exits ``128 + signal`` whatever this says (the callers decide that first)."""
    from sqlalchemy import func, select

    from packhorse.db.models import SkippedFile, WithdrawnFile  # deferred: start-up time
    from packhorse.status.reporting import failed_operations  # deferred: start-up time

    skipped = ctx.db.read(lambda s: (s.scalar(select(func.count()).select_from(SkippedFile)) or 0)
                          + (s.scalar(select(func.count()).select_from(WithdrawnFile)
                                      .where(WithdrawnFile.listed())) or 0))
    if skipped:
        # not a failure (the rest was archived), but nothing a user should miss either
        print(f"packhorse run: {skipped} source path(s) skipped and not archived (unreadable, symbolic links, "
              "names not allowed, gone before they were packaged); see `packhorse status`", file=sys.stderr)

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
    from packhorse.status.blocked_work import EXIT_NEEDS_HUMAN, blocked_items  # deferred: start-up time

    items = ctx.db.read(lambda s: blocked_items(s, ctx))
    for b in items:
        print(f"blocked: {b.subject}: {b.reason}; release: {b.release}", file=sys.stderr)
    if any(b.exit_code == EXIT_NEEDS_HUMAN for b in items):
        return EXIT_FAILED
    if items:
        return EXIT_BLOCKED
    return EXIT_OK


#: Default seconds between summary lines off a terminal (``run --progress-interval``).
PROGRESS_INTERVAL_SECONDS = 30.0


def _queued_notifications_line(queued: int, deliverable: bool) -> str:
    """The line ``run --until-idle`` ends with when notifications are left in the outbox: what
    delivers them, or that nothing can (``deliverable`` false: notifications disabled, or no
    channel configured)."""
    if not deliverable:
        return (f"packhorse run: {queued} notification(s) in the outbox, not sent: notifications are disabled or no "
                "channel is configured ([notifications] enabled, [notifications.smtp] or apprise_urls, "
                "docs/notifications.md); `packhorse notifications` lists them")
    return (f"packhorse run: {queued} notification(s) still queued in the outbox (`packhorse notifications` "
            "shows why); `packhorse notifier` or the next `packhorse run` delivers them")


def _run(ctx: ProcessContext, *, until_idle: bool, quiet: bool,
         progress_interval: float = PROGRESS_INTERVAL_SECONDS, label: str = "packhorse run",
         instance: str | None = None, verbose: bool = False) -> tuple[float, int | None]:
    """Run the embedded mode; returns (seconds, the signal that stopped it or ``None``).

    Progress (:mod:`packhorse.cli.progress`): bars on a terminal; off one a summary line every
    ``progress_interval`` seconds and warnings and errors, one JSON log line per operation only
    with ``--log-format json``; with ``quiet`` errors only; with ``verbose`` INFO log lines too
    (every operation started, completed, deferred). Health: the run records itself as
    service ``runner`` (with ``instance``: :func:`packhorse.recovery.health.service_identity`)."""
    from packhorse.cli.progress import SummaryLines, TerminalProgress  # deferred: start-up time
    from packhorse.executors.local import LocalRunner  # deferred: start-up time

    on_terminal = sys.stderr.isatty()
    json_asked = logs.chosen_format() == "json"
    level = "ERROR" if quiet else ("INFO" if verbose or (json_asked and not on_terminal) else "WARNING")
    logs.configure(log_level(level))
    bars: TerminalProgress | SummaryLines | None = None
    if not quiet:
        bars = (TerminalProgress(ctx.db.read, console=err) if on_terminal
                else SummaryLines(ctx.db.read, interval=progress_interval, as_log=json_asked, label=label))
    runner = LocalRunner(ctx, on_tick=bars.tick if bars else None)

    stopped_by: list[int] = []
    from packhorse.executors.services import start_background  # deferred: start-up time

    background = start_background(ctx, lifecycle=not until_idle)

    def stop(signum: int, _frame: object) -> None:
        print(f"packhorse: signal {signum}: finishing running operations, then stopping", file=sys.stderr)
        stopped_by.append(signum)
        runner.stop_requested.set()
        runner.wake.set()
        background.interrupt_drain.set()

    health = heartbeat(ctx, "runner", instance=instance)
    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    start = time.monotonic()
    reason = "finished"
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
        queued = background.stop(reason, drain=until_idle and not stopped_by)
        if until_idle and queued and not quiet:
            cfg = ctx.settings.notifications
            print(_queued_notifications_line(queued, cfg.enabled and cfg.channels_configured), file=sys.stderr)
        health.stop(remove=True)
        for s, h in old.items():
            signal.signal(s, h)
    return time.monotonic() - start, (stopped_by[0] if stopped_by else None)


@commands.command()
def run(
    config: ConfigOpt = None,
    until_idle: Annotated[bool, typer.Option("--until-idle", help="Stop when no work can become runnable by itself")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars; errors only")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log lines at INFO too (every operation); with "
                                          "--dry-run: every file with its decision")] = False,
    progress_interval: Annotated[float, typer.Option(
        "--progress-interval", min=0.1, envvar="PACKHORSE_PROGRESS_INTERVAL",
        help="Off a terminal: seconds between progress summary lines")] = PROGRESS_INTERVAL_SECONDS,
    dry_run: Annotated[bool, typer.Option("--dry-run", "-n", help="Show what would be registered, packaged, shipped, "
                                          "archived and deleted; write nothing")] = False,
    with_api: Annotated[bool, typer.Option("--api", help="also serve the HTTP API and dashboard (embedded)")] = False,
    api_host: Annotated[Optional[str], typer.Option("--api-host", help="API address [default: api.host]")] = None,
    api_port: Annotated[Optional[int], typer.Option("--api-port", help="API port [default: api.port]")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="with --dry-run: the plan as JSON on stdout (with -v: "
                                          "the decision of every file too)")] = False,
    instance: InstanceOpt = None,
) -> None:
    """Run managers, workers and lease recovery (embedded mode); with --api also the HTTP API."""
    if dry_run:
        _dry_run(config, as_json, per_file=verbose)
        return
    if as_json:
        raise fail("--json: only with --dry-run (a run reports on stderr; `packhorse status --json` after it)",
                   EXIT_CONFIG)
    ctx = context(config)
    if ctx.settings.executor.kind != "local":
        raise fail(f"{ctx.settings.config_file}: executor.kind: is {ctx.settings.executor.kind!r}, but packhorse "
                   "run is the embedded mode (worker processes on this machine). For the distributed mode start "
                   "`packhorse manager`, `packhorse monitor` and one `packhorse worker --site NAME` per site "
                   "(see docs/deployment.md), or set executor.kind = \"local\"", EXIT_CONFIG)
    require_routes(ctx.settings)
    check_storage(ctx)
    server = None
    if with_api:
        from packhorse.cli.distributed import serve_api  # deferred: start-up time

        server = serve_api(ctx, api_host or ctx.settings.api.host,
                           ctx.settings.api.port if api_port is None else api_port)
    try:
        elapsed, signum = _run(ctx, until_idle=until_idle, quiet=quiet, progress_interval=progress_interval,
                               instance=instance, verbose=verbose and not quiet)
    finally:
        if server is not None:
            server.should_exit = True
    code = exit_code_after_run(ctx, quiet=quiet)
    if until_idle and signum is not None:
        # stopped before it was idle: a cron job must not take that for "all done", nor for
        # "done but some failed" (an older FAILED operation would have made it exit 3)
        print(f"packhorse run: interrupted by signal {signum} after {elapsed:.1f} s, before the work was done",
              file=sys.stderr)
        raise typer.Exit(128 + signum)
    if not quiet:
        print(f"packhorse run: finished in {elapsed:.1f} s", file=sys.stderr)
    if not until_idle and signum is not None:
        # a service stopped (systemd's SIGTERM, Ctrl-C): what is FAILED or blocked was printed
        # above; the exit code says the stop went well, or the unit would look crashed
        raise typer.Exit(EXIT_OK)
    raise typer.Exit(code)


def _dry_run(config: Path | None, as_json: bool, *, per_file: bool = False) -> None:
    """``run --dry-run``: print :func:`packhorse.status.dry_run.plan_run`; write nothing (no database is
    created, no topology registered, nothing in any data location). ``per_file`` (``-v``): every
    listed file with its decision (registered into which package, excluded by which pattern,
    skipped and why, settling, unchanged) instead of the skipped ones only."""
    from packhorse.status.dry_run import database_exists, plan_run  # deferred: start-up time

    logs.configure(log_level("WARNING"))
    s = settings(config)
    require_routes(s)
    db = database(s, migrate_check=True) if database_exists(s) else None
    plan = plan_run(s, db, per_file=per_file)
    if as_json:
        print_json(plan)
        return
    out = table_console(highlight=False)
    out.print(f"dry run: nothing was written (ops database: {plan['database']})")
    for r in plan["register"]:
        if r.get("unavailable"):
            out.print(f"{r['location']} is unavailable: {r['unavailable']}; a run would register nothing there "
                      "and wait for it (exit 4)")
            continue
        out.print(f"would register {r['location']}: {r['files']} file(s), {r['bytes']:,} bytes"
                  + (f"; {r['settling']} still settling" if r["settling"] else ""))
        if per_file:
            for d in r["decisions"]:
                why = f"package {d['package']}" if d["package"] else ""
                if d["reason"]:
                    why = f"{why}; {d['reason']}" if why else d["reason"]
                out.print(f"  {d['decision']:<10} {r['location']}:{d['path']}" + (f"  ({why})" if why else ""),
                          markup=False)
            continue
        for k in r["skipped"]:
            out.print(f"  would skip {r['location']}:{k['path']}: {k['reason']}")
    t = Table("raw data package", "source", "files", "bytes", "ship to", "archive at",
              title=f"would package {len(plan['package'])} raw data package(s)")
    for x in plan["package"]:
        t.add_row(x["name"], x["location"], str(x["files"]), f"{x['bytes']:,}", ", ".join(x["ship_to"]),
                  ", ".join(x["archive_at"]))
    if plan["package"]:
        out.print(t)
    waiting = [c for c in plan["continue"] if c["missing_at"]]
    if waiting:
        c = Table("raw data package", "not yet archived at", title="registered packages not archived yet")
        for x in waiting:
            c.add_row(x["name"], ", ".join(x["missing_at"]))
        out.print(c)
    if plan["delete"]:
        d = Table("location", "package", "path", "bytes", "when", title="buffer copies that would be deleted")
        for x in plan["delete"]:
            d.add_row(x["location"], x["package"], x["path"], f"{x['bytes']:,}", x["when"])
        out.print(d)
    n = plan["totals"]
    out.print(f"total: {n['files']} file(s) ({n['bytes']:,} bytes) to register, {n['packages']} package(s), "
              f"{n['shipments']} package shipment(s) to destination buffers (bundled into transfers at run time), {n['archive_copies']} archive copies, {n['deletions']} deletion(s)")


@commands.command("run-operation")
def run_operation(
    kind: KindArg,
    operation_id: OperationIdArg,
    config: ConfigOpt = None,
) -> None:
    """Claim and run one operation in the foreground (as a worker would); print the outcome."""
    from packhorse.engine.worker import execute_operation  # deferred: start-up time
    from packhorse.operations.identity import worker_identity  # deferred: start-up time
    from packhorse.operations.lifecycle import get_operation  # deferred: start-up time

    k = parse_kind(kind)
    ctx = context(config)
    try:
        ctx.db.read(lambda s: get_operation(s, k, operation_id))
    except UnknownOperationError as e:
        raise fail(str(e), EXIT_PROBLEM) from None
    outcome = execute_operation(ctx, operation_id, worker_identity("cli"))
    print(outcome.value)
    raise typer.Exit({"completed": 0, "skipped": 0, "deferred": 0, "retry": 1, "stale": 1,
                      "failed": EXIT_FAILED}[outcome.value])


@commands.command()
def status(config: ConfigOpt = None, as_json: JsonOpt = False,
           list_skipped: Annotated[bool, typer.Option(
               "--skipped", help="list every skipped source path (by default a count per reason)")] = False) -> None:
    """Show operations by kind and status, packages, copies per location, skipped files (a count
    per reason; --skipped lists them), FAILED and BLOCKED work."""
    from rich.markup import escape

    from packhorse.status.reporting import status_report  # deferred: start-up time

    ctx = context(config)
    r = status_report(ctx)
    if as_json:
        print_json(r)
        return
    out = table_console()
    # problems first: one line per kind, red where a human is needed, before any table
    for line in r["problems"]:
        colour = "red" if line["needs_human"] else "yellow"
        out.print(f"[{colour}]{escape(line['text'])}[/]", highlight=False)
    if not r["problems"]:
        out.print("[green]no problems:[/] nothing FAILED, nothing blocked, every data location available",
                  highlight=False)
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
        if loc in r["source_files"]:  # raw files, not package copies
            f = r["source_files"][loc]
            c.add_row(loc, f"source: {f['count']} files registered", f"{f['bytes']:,}")
        else:
            c.add_row(loc, str(v["count"]), f"{v['bytes']:,}")
    out.print(c)
    q = r["quarantine"]
    if q["bytes"]:  # kept until purged (I2): it counts in disk usage
        where = ", ".join(f"{loc} {v['bytes']:,}" for loc, v in q["locations"].items() if v["bytes"])
        out.print(f"quarantined: {q['bytes']:,} bytes ({where}; at the latest disk usage measurement): "
                  "`packhorse quarantine list` / `purge --older-than DAYS`", highlight=False, markup=False)
    for loc, a in r["source_audits"].items():
        state = (f"completed {utc_text(a['completed_at'])}" if a["completed_at"]
                 else f"under way since {utc_text(a['started_at'], '?')}")
        out.print(f"source audit {loc}: last pass {state} UTC: {a['files_checked']} files checked "
                  f"({a['bytes_checked']:,} bytes), {a['changed']} changed behind an unchanged size and mtime "
                  f"(new versions), {a['gone']} gone; {a['changed_total']} changed found in all",
                  highlight=False, markup=False)
    if r["source_filters"]:
        f = Table("source location", "include", "exclude", title="scan filters (glob patterns)")
        for loc, v in r["source_filters"].items():
            f.add_row(loc, ", ".join(v["include"]) or "(everything)", ", ".join(v["exclude"]) or "-")
        out.print(f)
    if r["skipped"] and list_skipped:
        s = Table("location", "path", "reason", title="skipped files")
        for row in r["skipped"]:
            s.add_row(row["location"], shown(row["path"]), shown(row["reason"]))
        out.print(s)
    elif r["skipped"]:  # a count per reason: 82 symlinks must not push FAILED and BLOCKED off the screen
        per: dict[tuple[str, str], int] = {}
        for row in r["skipped"]:
            per[(row["location"], row["reason"])] = per.get((row["location"], row["reason"]), 0) + 1
        out.print(f"skipped: {len(r['skipped'])} source path(s) not archived (`packhorse status --skipped` lists "
                  "them):", highlight=False, markup=False)
        for (loc, reason), n in sorted(per.items(), key=lambda x: (-x[1], x[0])):
            out.print(f"  {n} at {loc}: {shown(reason)}", highlight=False, markup=False)
    if r["blocked"] and out.is_terminal:  # off one the BLOCKED lines below say it all, unpadded
        b = Table("blocked", "cause", "why", "releases it", title="blocked work (waits until released)")
        for x in r["blocked"]:  # plain text: "[recovery] …" in a release is no markup
            b.add_row(*(escape(str(x[k])) for k in ("subject", "cause", "reason", "release")))
        out.print(b)
    for f in r["failed_operations"]:
        out.print(f"[red]FAILED[/] {f['kind']} {f['id']}: {f['error_type']}: {f['message']}", highlight=False)
    shown_orphans = r["orphaned"][:10]
    for o in shown_orphans:  # a killed run's work: it looks IN_PROGRESS, nobody runs it
        # only `run` and `monitor` hand leases back (managers never do): say which must run
        when = ("at the next recovery pass of a `packhorse run` or `packhorse monitor` running on this host"
                if o["taken_over"] == "next_recovery_pass"
                else f"by a running `packhorse monitor` once its lease expires ({utc_text(o['lease_expires_at'])} UTC)")
        out.print(f"[yellow]ORPHANED[/] {o['kind']} {o['id']}: IN_PROGRESS, but its holder {escape(o['owner'])} no "
                  f"longer runs; handed out again {when}", highlight=False)
    if len(r["orphaned"]) > len(shown_orphans):
        out.print(f"… {len(r['orphaned']) - len(shown_orphans)} more orphaned operation(s) (--json lists them)",
                  highlight=False)
    if r["failed_superseded"]:
        out.print(f"{r['failed_superseded']} more FAILED operation(s) in the table above were superseded by a "
                  "later repair that completed: history, nothing to do (packhorse diagnose --package NAME "
                  "shows them)", highlight=False)
    for b in r["blocked"]:  # every cause of status/blocked_work.py, with what releases it
        since = f" since {utc_text(b['since'])} UTC" if b.get("since") else ""
        out.print(f"[yellow]BLOCKED[/] {escape(b['subject'] + ' (' + b['cause'] + ')' + since + ': ' + b['reason'])}",
                  highlight=False)
        out.print(f"  release: {b['release']}", highlight=False, markup=False)


@commands.command()
def verify(
    config: ConfigOpt = None,
    location: Annotated[Optional[str], typer.Option(
        "--location", help="only copies at this data location; a source location: audit its files")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-read every live copy and compare it with its recorded sha256, and check every staged
    copy in processing locations against its bag manifests. With --location SOURCE, re-hash the
    registered files still at that source location: content changed behind an unchanged size
    and mtime is registered as a new version (and archived by the next run); files gone are
    listed. Without --location the source locations are not re-hashed (a pass over every
    source file; the scheduled source audit, source_audit_interval_seconds, does it): the
    output names each with its last audit pass and the command that audits it.
    Exit 1 on any problem (a changed or gone source file is none: nothing is lost);
    else exit 5 (incomplete) when copies in cold storage could not be read: their restore
    (Azure: a rehydration) is requested, run verify again once it is done."""
    from packhorse.rules.staged_copies import verify_staged  # deferred: start-up time
    from packhorse.status.reporting import (  # deferred: start-up time
        audit_source_location,
        sources_not_audited,
        verify_copies,
    )

    ctx = context(config)
    if location is not None and location not in ctx.topology.location_ids:
        raise fail(f"--location: unknown data location {location!r}", EXIT_CONFIG)
    r = verify_copies(ctx, location)
    r["staged"] = verify_staged(ctx, location)
    staged_bad = [x for x in r["staged"] if x["status"] != "ok"]
    source = None
    if location is not None and ctx.settings.location(location).role is LocationRole.SOURCE:
        source = audit_source_location(ctx, location).as_json()
        r["source_audit"] = source
    source_bad = source is not None and bool(source["unavailable"] or source["unreadable"])
    if location is None:
        r["sources_not_audited"] = sources_not_audited(ctx)
    if as_json:
        print_json(r)
    elif source is not None:  # a source location holds raw files, not copies
        _print_source_audit(source)
    else:
        # the line says everything the exit code counts: copies recorded bad earlier and not
        # repaired yet, locations that could not be looked at
        found_now = {(c["location"], c["path"]) for c in r["missing"] + r["corrupt"]}
        earlier = [u for u in r["unrepaired"] if (u["location"], u["path"]) not in found_now]
        more = [f"{n} {what}" for n, what in ((len(earlier), "recorded bad earlier, not repaired yet"),
                                              (len(r["unavailable"]), "location(s) unavailable, not checked"),
                                              (len(r["awaiting_restore"]), "in cold storage, not restored: restore "
                                                                          "requested, not checked"),
                                              (len(r["recognised"]), "recorded bad, found back"))
                if n]
        print(f"checked {r['checked']}, ok {r['ok']}, missing {len(r['missing'])}, corrupt {len(r['corrupt'])}"
              + (f"; {'; '.join(more)}" if more else ""))
        for m in r["missing"]:
            print(f"MISSING {m['location']}:{m['path']}")
        for c in r["corrupt"]:
            print(f"CORRUPT {c['location']}:{c['path']} (expected {c['expected']}, read {c['actual']})")
        for b in r["recognised"]:
            print(f"BACK {b['location']}:{b['path']} (recorded {b['recorded'] or 'bad'}; its bytes are there again "
                  "and verified)")
        for u in r["unavailable"]:
            print(f"UNAVAILABLE {u['location']}: {u['reason']}; {u['copies']} copies not checked "
                  f"(release: {u['release']})")
        for a in r["awaiting_restore"]:
            print(f"AWAITING RESTORE {a['location']}:{a['path']} (cold storage: restore requested, not verified now; "
                  "run `packhorse verify` again once it is restored)")
        for u in r["unrepaired"]:
            print(f"UNREPAIRED {u['location']}:{u['path']} (recorded {u['status']}; `packhorse run` repairs it "
                  "from another verified copy (waiting for its location if that is unavailable), or rebuilds the "
                  "package from its source files when no good copy is left; `packhorse status` says when neither "
                  "is possible)")
        print(f"staged copies: checked {len(r['staged'])}, ok {len(r['staged']) - len(staged_bad)}")
        for x in staged_bad:
            print(f"STAGED {x['status'].upper()} {x['location']}:{x['path']}: {x['error']} "
                  f"(`packhorse stage {x['package']} --to {x['location']} --again` stages it again)")
        for n in r.get("sources_not_audited", []):
            last = (f"last audit pass completed {utc_text(n['last_completed_at'])} UTC" if n["last_completed_at"]
                    else "never audited")
            cadence = (f"scheduled every {n['interval_seconds']:g} s" if n["interval_seconds"]
                       else "no scheduled audit (source_audit_interval_seconds)")
            print(f"SOURCE {n['location']}: its files are not re-hashed by this verify ({last}; {cadence}); "
                  f"`packhorse verify --location {n['location']}` audits them")
    if r["missing"] or r["corrupt"] or r["unrepaired"] or r["unavailable"] or staged_bad or source_bad:
        raise typer.Exit(EXIT_PROBLEM)
    # copies that could not be read are not verified: never a silent success
    raise typer.Exit(EXIT_INCOMPLETE if r["awaiting_restore"] else EXIT_OK)


def _print_source_audit(a: dict[str, Any]) -> None:
    """The text of ``verify --location SOURCE`` (:meth:`packhorse.managers.source_audit.AuditResult.as_json`)."""
    if a["unavailable"]:
        print(f"UNAVAILABLE {a['location']}: {a['unavailable']}; no source file checked")
        return
    print(f"source {a['location']}: checked {a['checked']} files ({a['bytes_checked']:,} bytes), "
          f"changed {len(a['changed'])}, gone {len(a['gone'])}, unreadable {len(a['unreadable'])}, "
          f"left to the scan {len(a['left_to_scan'])}")
    for c in a["changed"]:
        what = {"version": f"registered as version {c['version']}, archived by the next run",
                "update": "registered again in place (not packaged yet)",
                "left_to_package_stage": "its package is being built: the package stage takes it out"}[c["action"]]
        print(f"CHANGED {a['location']}:{shown(c['path'])}: other bytes behind the same size and mtime "
              f"(registered {c['registered_sha256'][:12]}, read {c['sha256'][:12]}); {what}")
    for p in a["gone"]:
        print(f"GONE {a['location']}:{shown(p)} (registered, no longer at the source; its archived copies stay)")
    for u in a["unreadable"]:
        print(f"UNREADABLE {a['location']}:{shown(u['path'])}: {u['reason']}")


@commands.command()
def demo(
    source: Annotated[Optional[Path], typer.Option("--source", help="archive this folder instead of generated data")] = None,
    workdir: Annotated[Path, typer.Option("--workdir", help="where the demo's config, database and sites go")] = Path("packhorse-demo"),
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
) -> None:
    """Archive a data set from fyst to cologne and cornell, verify it, and print a summary."""
    from packhorse.cli.demo import generate_observatory_data, write_demo_config  # deferred: start-up time
    from packhorse.status.reporting import status_report, verify_copies  # deferred: start-up time

    workdir = workdir.resolve()
    if (workdir / "packhorse.db").exists():
        raise fail(f"{workdir} already holds a demo; remove it or choose another --workdir", EXIT_CONFIG)
    if source is not None:  # checked before anything is created
        src_dir = source.resolve()
        if not src_dir.is_dir():
            raise fail(f"--source: {source} is not a folder", EXIT_CONFIG)
        if workdir == src_dir or src_dir in workdir.parents:
            raise fail(f"--workdir {workdir} may not be inside --source {src_dir}", EXIT_CONFIG)
        src_value = str(src_dir)
    workdir.mkdir(parents=True, exist_ok=True)
    if source is None:
        src_dir = workdir / "data" / "fyst" / "source"
        nfiles, nbytes = generate_observatory_data(src_dir)
        print(f"generated {nfiles} files ({nbytes:,} bytes) in {src_dir}", file=sys.stderr)
        src_value = "data/fyst/source"
    cfg = write_demo_config(workdir, src_value, workers=max(2, min(4, os.cpu_count() or 2)))
    print(f"configuration: {cfg}", file=sys.stderr)
    ctx_settings = settings(cfg)
    db = Database.from_settings(ctx_settings)
    db.upgrade()
    ctx = ProcessContext(settings=ctx_settings, db=db, topology=sync_topology(db, ctx_settings))

    logs.configure(log_level("WARNING"))  # the run below sets its own level
    _mark(ctx)
    elapsed, signum = _run(ctx, until_idle=True, quiet=quiet, label="packhorse demo")
    code = exit_code_after_run(ctx, quiet=quiet)
    if signum is not None:
        print(f"packhorse demo: interrupted by signal {signum}", file=sys.stderr)
        raise typer.Exit(128 + signum)
    v = verify_copies(ctx)
    r = status_report(ctx)
    mib = r["files"]["bytes"] / 2**20  # MiB, as the progress line counts
    print(f"\npackhorse demo summary ({workdir})")
    print(f"  files:    {r['files']['registered']} ({r['files']['bytes']:,} bytes)")
    print(f"  packages: {r['packages']['total']} total, {r['packages']['archived']} archived, "
          f"{r['packages']['failed']} failed")

    for loc, c in r["copies"].items():
        if ctx.topology.location_role.get(loc) is LocationRole.SOURCE:
            continue  # raw files, not package copies
        print(f"  {loc:<16} {c['count']:>4} copies {c['bytes']:>14,} bytes")
    for loc in ctx.settings.locations:
        if loc.role is LocationRole.LONG_TERM_ARCHIVE:
            where = (ctx.settings.location_path(loc.name) if loc.path
                     else str(loc.object_store_uri).rstrip("/"))
            print(f"  archive:  {loc.name} ({loc.site}): {where}")
    if r["skipped"]:
        print(f"  skipped:  {len(r['skipped'])} file(s) (see `packhorse status -c {cfg}`)")
    print(f"  verify:   {v['ok']}/{v['checked']} copies ok")
    print(f"  time:     {elapsed:.1f} s ({mib / elapsed if elapsed else 0:.1f} MiB/s of source data)")
    bag = _an_archived_bag(ctx)
    if bag is not None:
        print(f"  a bag:    {bag} (one package as archived: a BagIt tar)")
    print(f"  try:      packhorse status -c {shlex.quote(str(cfg))}")
    if bag is not None:
        print(f"            packhorse validate {shlex.quote(str(bag))}")
    if v["missing"] or v["corrupt"]:
        code = code or EXIT_PROBLEM
    raise typer.Exit(code)


def _an_archived_bag(ctx: ProcessContext) -> Path | None:
    """The file of one package archived on a disk long-term archive (the largest: one that
    shows a bag's layout, not a one-file package), for the demo to name: ``None`` if there is
    none."""
    from sqlalchemy import select

    from packhorse.db.models import PhysicalCopy  # deferred: start-up time

    disks = {ctx.topology.location_ids[loc.name]: loc.name for loc in ctx.settings.locations
             if loc.role is LocationRole.LONG_TERM_ARCHIVE and loc.path}
    if not disks:
        return None
    row = ctx.db.read(lambda s: s.execute(
        select(PhysicalCopy.location_id, PhysicalCopy.path).where(
            PhysicalCopy.location_id.in_(disks), PhysicalCopy.status == CopyStatus.PRESENT.value,
            PhysicalCopy.raw_data_package_id.is_not(None))
        .order_by(PhysicalCopy.size.desc(), PhysicalCopy.id).limit(1)).first())
    return None if row is None else ctx.settings.location_path(disks[row.location_id]) / row.path


@commands.command()
def stage(
    name: Annotated[str, typer.Argument(help="raw data package name or observation unit")],
    to: Annotated[str, typer.Option("--to", help="processing location to extract into")],
    again: Annotated[bool, typer.Option("--again", help="stage again a package whose staged folder was "
                                        "removed or no longer verifies")] = False,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Request staging: extract archived packages into a processing location, verified against
    their bag manifests (`packhorse run` does the work; cold archives are restored first)."""
    from packhorse.managers.staging import request_staging  # deferred: start-up time

    ctx = context(config)
    try:
        rows = request_staging(ctx, name, to, again=again)
    except ConfigError as e:
        raise fail(str(e), EXIT_CONFIG) from None
    except NothingToStageError as e:
        raise fail(str(e), EXIT_PROBLEM) from None
    if as_json:
        print_json(rows)
        return
    for r in rows:
        if r["operation_id"] is None:
            print(f"{r['package']}: not archived yet; not staged")
        elif r["created"]:
            print(f"{r['package']}: staging operation {r['operation_id']} created; `packhorse run` stages it")
        else:
            print(f"{r['package']}: already requested (staging operation {r['operation_id']}, {r['status']})"
                  + ("; if its staged folder was removed or damaged, add --again" if r["status"] == "COMPLETED" else ""))
