"""Operator actions on operations and packages: ``reset``, ``retry``, ``breaker list|reset``,
``diagnose``, ``skipped list|forget``, ``locate``, ``reconcile``, and the notification outbox
(``notifications``). Every action is audited (see packhorse.runtime.audit)."""

from __future__ import annotations

import sys
from typing import Annotated, Any, Optional

import structlog
import typer
from rich.table import Table

from packhorse.cli.app import (
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_PROBLEM,
    ConfigOpt,
    JsonOpt,
    KindArg,
    OperationIdArg,
    ReasonOpt,
    command_set,
    context,
    fail,
    operation_action,
    parse_kind,
    print_json,
    printable,
    shown,
    table_console,
)
from packhorse.domain import OperationKind
from packhorse.errors import (
    EmptyReasonError,
    LocateQueryError,
    NotSkippedError,
    ResetRefusedError,
    UnknownOperationError,
    UnknownPackageError,
)
from packhorse.runtime.audit import cli_actor
from packhorse.runtime.context import ProcessContext
from packhorse.time_text import utc_text

#: this module's commands (loaded by packhorse.cli when one of them runs)
commands = command_set()


@commands.command()
def reset(
    kind: KindArg,
    operation_id: Annotated[Optional[int], typer.Argument(help="operation id (or use --all-failed)", min=1, max=2**63 - 1)] = None,
    all_failed: Annotated[bool, typer.Option("--all-failed", help="every FAILED operation of KIND")] = False,
    reason: Annotated[Optional[str], typer.Option("--reason", help="why (logged)")] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Reset FAILED operations to PENDING after fixing the cause (failure history is kept)."""
    from packhorse.actions.operator import reset_all_failed, reset_operation  # deferred: start-up time

    def precheck() -> None:
        if (operation_id is None) == (not all_failed):
            raise fail("give either an operation id or --all-failed", EXIT_CONFIG)

    def act(ctx: ProcessContext, k: OperationKind) -> dict[str, Any]:
        ids = (reset_all_failed(ctx, k, actor=cli_actor(), reason=reason) if operation_id is None
               else reset_operation(ctx, k, operation_id, actor=cli_actor(), reason=reason))
        structlog.get_logger(__name__).warning("operations_reset", kind=k.value, operation_ids=ids, reason=reason)
        return {"kind": k.value, "reset": ids}

    operation_action(kind, config, as_json, act,
                     lambda k, out: (f"reset {len(out['reset'])} {k.value} operation(s) to PENDING: "
                                     f"{', '.join(map(str, out['reset']))}; the running services pick them up "
                                     "(`packhorse run`, or the managers and workers)"
                                     if out["reset"] else f"no FAILED {k.value} operation: nothing reset"),
                     refused=(ResetRefusedError,), precheck=precheck)


@commands.command()
def notifications(
    config: ConfigOpt = None,
    dead: Annotated[bool, typer.Option("--dead", help="only dead letters (delivery gave up)")] = False,
    requeue_dead: Annotated[bool, typer.Option("--requeue-dead", help="queue dead letters again (after fixing a channel)")] = False,
    limit: Annotated[int, typer.Option("--limit", help="at most this many sent notifications")] = 20,
    show: Annotated[Optional[int], typer.Option("--show", metavar="ID", min=1, max=2**63 - 1,
                                                help="one notification in full: the message as delivered")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the notification outbox: waiting and retrying first, then recent sent ones (or --dead);
    --show ID prints one message in full."""
    from packhorse.notify.report import (  # deferred: start-up time
        list_notifications,
        requeue_dead_letters,
        show_notification,
    )

    ctx = context(config)
    if show is not None:
        one = show_notification(ctx.db, show, ctx.settings.notifications)
        if one is None:
            raise fail(f"no notification with id {show} (packhorse notifications lists them)", EXIT_PROBLEM)
        if as_json:
            print_json(one)
            return
        print(printable(f"notification {one['id']}: {one['level']} {one['event']}, created {one['created_at']}, "
                        f"{one['status']} after {one['attempts']} attempt(s)"
                        + (f", delivered to {', '.join(one['delivered_to'])}" if one["delivered_to"] else "")
                        + (f", repeated {one['repeat_count']} time(s)" if one["repeat_count"] else "")))
        if one["last_error"]:
            print(printable(f"last error: {one['last_error']}"))
        print(printable(f"subject: {one['subject']}"))
        print()
        print("\n".join(printable(line) for line in one["body"].splitlines()))
        return
    if requeue_dead:
        ids = requeue_dead_letters(ctx.db)
        print(f"queued {len(ids)} dead letter(s) again: {', '.join(map(str, ids)) or '-'}", file=sys.stderr)
    rows = list_notifications(ctx.db, dead=dead, sent_limit=limit, cfg=ctx.settings.notifications)
    if as_json:
        print_json(rows)
        return
    kept = [r for r in rows if r["kept_because"]]
    if kept:
        # not "pending, next attempt at ...": no attempt is made while nothing can deliver
        print(f"{kept[0]['kept_because']}: the {len(kept)} waiting notification(s) are kept in the outbox, not "
              "sent; once a channel is configured (docs/notifications.md) `packhorse notifier` or the next "
              "`packhorse run` sends them")
    t = Table("id", "created (UTC)", "level", "status", "attempts", "next attempt", "delivered to", "repeats",
              "subject", "last error", title="dead letters" if dead else "notifications")
    for r in rows:
        t.add_row(str(r["id"]), utc_text(r["created_at"]), r["level"], "kept" if r["kept_because"] else r["status"],
                  str(r["attempts"]), utc_text(r["next_attempt_at"], "") if r["status"] == "pending" else "",
                  ", ".join(r["delivered_to"]), str(r["repeat_count"]), r["subject"], r["last_error"] or "")
    table_console().print(t)


breaker_app = command_set(help="Circuit breakers of stalled operations: list, reset.", no_args_is_help=True)
commands.add_typer(breaker_app, name="breaker")


@breaker_app.command("list")
def breaker_list(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """List circuit breakers that counted stalls (open ones first, then half-open), with when an
    open one lets the next attempt through by itself."""
    from packhorse.recovery.breakers import jsonable, list_breakers  # deferred: start-up time

    ctx = context(config)
    rows = ctx.db.read(list_breakers)
    if as_json:
        print_json([jsonable(r) for r in rows])
        return
    t = Table("kind", "operation", "state", "stalls", "opened (UTC)", "next automatic attempt (UTC)",
              title="circuit breakers")
    for r in rows:
        nxt = utc_text(r["next_attempt_at"]) if r["state"] == "open" else (
            f"running since {utc_text(r['half_open_at'])}" if r["state"] == "half_open" else "-")
        t.add_row(r["kind"], str(r["operation_id"]), r["state"].replace("_", "-"), str(r["stall_count"]),
                  utc_text(r["opened_at"]), nxt)
    table_console().print(t)


@breaker_app.command("reset")
def breaker_reset(kind: KindArg, operation_id: OperationIdArg, reason: ReasonOpt = "not given",
                  config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Close the circuit breaker of one operation (the monitor then recovers it)."""
    from packhorse.actions.operator import reset_circuit_breaker  # deferred: start-up time
    from packhorse.recovery.breakers import jsonable  # deferred: start-up time

    operation_action(
        kind, config, as_json,
        lambda ctx, k: jsonable(reset_circuit_breaker(ctx, k, operation_id, reason=reason, actor=cli_actor())),
        lambda k, out: (f"circuit breaker of {k.value} {operation_id} closed "
                        f"(had {out['previous_stall_count']} stall(s))"))


@commands.command()
def retry(kind: KindArg, operation_id: OperationIdArg, reason: ReasonOpt = "not given",
          config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Force a retry: reset the circuit breaker, set the operation PENDING, dispatch it now."""
    from packhorse.actions.operator import force_retry_operation  # deferred: start-up time

    operation_action(
        kind, config, as_json,
        lambda ctx, k: force_retry_operation(ctx, k, operation_id, reason=reason, actor=cli_actor()),
        lambda k, out: f"{k.value} {operation_id}: {out['previous_status']} -> PENDING; a running `packhorse run` or `packhorse manager` dispatches it at once",
        refused=(ResetRefusedError,))


@commands.command()
def diagnose(
    kind: Annotated[Optional[str], typer.Argument(help="operation kind, e.g. transfer")] = None,
    operation_id: Annotated[Optional[int], typer.Argument(help="operation id", min=1, max=2**63 - 1)] = None,
    package: Annotated[Optional[str], typer.Option("--package", help="every operation of this package (by name)")] = None,
    live: Annotated[bool, typer.Option("--live", help="also check now whether the bytes are on disk")] = False,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The diagnostic report of an operation: row, failure events (newest first), copies per
    location and the diagnosis. Exit 1 if the operation (or one of the package's) is FAILED."""
    from packhorse.runtime.audit import record  # deferred: start-up time
    from packhorse.status.diagnose import diagnose_operation, diagnose_package, live_check  # deferred: start-up time

    if package is not None and (kind is not None or operation_id is not None):
        raise fail("give KIND ID or --package NAME, not both", EXIT_CONFIG)
    if package is None and (kind is None or operation_id is None):
        raise fail("give KIND ID, or --package NAME", EXIT_CONFIG)
    k = parse_kind(kind) if kind else None
    ctx = context(config)
    try:
        dead_after = ctx.settings.recovery.service_dead_after_seconds
        if package is not None:
            reports = ctx.db.read(lambda s: diagnose_package(s, package, dead_after_seconds=dead_after))["reports"]
        else:
            reports = [ctx.db.read(lambda s: diagnose_operation(s, k, operation_id, dead_after_seconds=dead_after))]
    except (UnknownOperationError, UnknownPackageError) as e:
        raise fail(str(e), EXIT_PROBLEM) from None
    if live:
        for r in reports:
            r["live_check"] = live_check(ctx, parse_kind(r["operation"]["kind"]), r["operation"]["id"])
    record(ctx.db, actor=cli_actor(), action="package.diagnose" if package else "operation.diagnose",
           target=package or f"{kind}/{operation_id}")
    desired = None
    if package is not None:
        from packhorse.rules.convergence import describe  # deferred: start-up time

        desired = ctx.db.read(lambda s: describe(s, ctx, package))
    if as_json:
        print_json(reports if package else reports[0])
    elif package is not None:
        _print_package(package, reports)
        if desired is not None:
            _print_desired(desired)
    else:
        _print_report(reports[0])
    dead = bool(desired and desired["dead_end"])
    raise typer.Exit(EXIT_PROBLEM if dead or any(r["operation"]["status"] == "FAILED" for r in reports) else EXIT_OK)


def _print_desired(d: dict[str, Any]) -> None:
    """The desired state of a raw data package against its copies (:func:`packhorse.rules.convergence.describe`)."""
    out = table_console(highlight=False, soft_wrap=True)
    out.print(f"[bold]desired state[/] of {d['package']}: {'archived' if d['archived'] else 'NOT archived'} "
              "(as the database records it; packhorse verify records what is on the disks now)")
    for loc, state in d["archives"].items():
        out.print(f"  {loc}: {state}")
    for key in d["repairs"]:
        out.print(f"  next repair: {key}")
    if d["dead_end"]:
        out.print("  [bold red]no good source left[/]: every copy is bad and it cannot be rebuilt")
        for c in d["dead_end"]["bad_copies"]:
            out.print(f"    {c['status']}: {c['location']}:{c['path']}")
        out.print("  tried:")
        for t in d["dead_end"]["tried"]:
            out.print(f"    - {t}")
        out.print(f"  next: {d['dead_end']['release']}")


def _print_package(name: str, reports: list[dict[str, Any]]) -> None:
    """``diagnose --package`` in text: one line per operation, each artifact's copies once,
    the full report (:func:`_print_report`) of every operation not completed, and the live
    check of every object once. ``--json`` has every report in full."""
    out = table_console(highlight=False, soft_wrap=True)
    t = Table("id", "kind", "status", "claims", "retries", "diagnosis", title=f"operations of {name}")
    for r in reports:
        op = r["operation"]
        events = len(r["failure_events"])
        said = r["diagnosis"] + (f" ({events} failure event(s): packhorse diagnose {op['kind']} {op['id']})"
                                 if events and op["status"] == "COMPLETED" else "")
        t.add_row(str(op["id"]), op["kind"], op["status"] + (" (stalled)" if op["stalled"] else ""),
                  str(op["attempt"]), f"{op['retry_count']}/{op['max_retries']}", said)
    out.print(t)
    once = {(c["artifact"], c["name"], c["location"]): c for r in reports for c in r["copies"]}
    out.print(_copies_table(list(once.values())))
    for r in reports:
        if r["operation"]["status"] != "COMPLETED":
            _print_report({**r, "copies": [], "live_check": None})
    if any(r.get("live_check") for r in reports):
        _print_live(out, _merged_live_checks([r["live_check"] for r in reports if r.get("live_check")]))


def _merged_live_checks(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """The live checks of several operations (:func:`packhorse.status.diagnose.live_check`) as one:
    each location once, each object once (the one in question, if one check found it so)."""
    locations: dict[str, dict[str, Any]] = {}
    skipped: dict[str, dict[str, Any]] = {}
    for check in checks:
        for c in check["checked"]:
            into = locations.setdefault(c["location"], {**c, "objects": [], "_by_path": {}})
            into["ok"] = into["ok"] and c["ok"]
            into["error"] = into["error"] or c["error"]
            for o in c["objects"]:
                mine = into["_by_path"].get(o["path"])
                if mine is None or (mine["ok"] and not o["ok"]):
                    into["_by_path"][o["path"]] = o
        for c in check["skipped"]:
            skipped.setdefault(c["location"], c)
    for c in locations.values():
        c["objects"] = list(c.pop("_by_path").values())
    return {"checked": [locations[k] for k in sorted(locations)], "skipped": [skipped[k] for k in sorted(skipped)],
            "host": checks[0].get("host") if checks else None}


def _print_report(r: dict[str, Any]) -> None:
    out = table_console(highlight=False, soft_wrap=True)
    op = r["operation"]
    out.print(f"[bold]{op['kind']} {op['id']}[/]: {op['status']}{' (stalled)' if op['stalled'] else ''}, "
              f"{op['attempt_words']}, retries {op['retry_count']}/{op['max_retries']}, stalls {op['stall_count']}")
    out.print(f"  package: {op['raw_data_package'] or op['data_transfer_package'] or '-'}; "
              f"{op['source_location'] or '-'} -> {op['destination_location'] or '-'}")
    out.print(f"  diagnosis: {r['diagnosis']}  [{r['diagnosis_source']}]")
    for e in r["failure_events"]:
        out.print(f"  {e['created_at']} {e['failure']}: {e['error_type']}: {e['message']}"
                  f"{' (retried)' if e['will_retry'] else ''}")
    if r["copies"]:
        out.print(_copies_table(r["copies"]))
    _print_live(out, r.get("live_check") or {})


def _copies_table(copies: list[dict[str, Any]]) -> Table:
    """The physical copies of a diagnostic report (:func:`packhorse.status.diagnose.copy_presence` rows)."""
    t = Table("artifact", "location", "role", "status", "path", "last verified / deleted", title="physical copies")
    for c in copies:
        # a deleted copy's last verification is history: when it went is what matters
        when = f"deleted {c['deleted_at']}" if c.get("deleted_at") else (c["verified_at"] or "-")
        t.add_row(c["name"], c["location"], c["role"], c["status"], c["path"] or "-", when)
    return t


def _print_live(out: Any, live: dict[str, Any]) -> None:
    """A live check (:func:`packhorse.status.diagnose.live_check`) in words, location by location."""
    for c in live.get("checked", []):
        out.print(f"  live {c['location']}: {'ok' if c['ok'] else 'PROBLEM'}" + (f": {c['error']}" if c["error"] else ""))
        objects = c["objects"]
        if len(objects) > LIVE_OBJECTS_SHOWN:  # a package's source files: the ones in question, then a count
            wrong = [o for o in objects if not o["ok"]]
            objects = wrong[:LIVE_OBJECTS_SHOWN]
        for o in objects:
            out.print(f"    {o['path']}: {_live_object_text(o)}")
        if len(objects) < len(c["objects"]):
            wrong = sum(1 for o in c["objects"] if not o["ok"])
            more = len(c["objects"]) - len(objects)
            out.print(f"    {'… ' if objects else ''}{more} {'more ' if objects else ''}object(s): "
                      + (f"{wrong - len(objects)} more in question, " if wrong > len(objects) else "")
                      + f"{len(c['objects']) - wrong} as required" + (" (--json lists each)" if wrong > len(objects) else ""))
    for c in live.get("skipped", []):
        out.print(f"  live {c['location']}: skipped ({c['reason']})")
    if live.get("checked"):
        out.print(f"  (looked at on {live.get('host', 'this host')}: each object's existence and size, not its "
                  "bytes; packhorse verify re-reads them and compares their sha256)")


#: objects of one location a live check prints one by one (more: those in question, then a count)
LIVE_OBJECTS_SHOWN = 10


def _live_object_text(o: dict[str, Any]) -> str:
    """One object of a live check (:func:`packhorse.status.diagnose.live_check`) in words."""
    note = f" ({o['note']})" if o.get("note") else ""
    if o["expect"] == "folder":
        return ("bag folder present" if o["ok"] else ("not a bag folder" if o["exists"] else "MISSING")) + note
    if o["expect"] == "not_required":
        return ("present, " if o["exists"] else "absent, ") + "not required" + note
    if not o["exists"]:
        return "MISSING" + note
    if o["expected_size"] is not None and o["size"] != o["expected_size"]:
        return f"{o['size']:,} bytes, recorded {o['expected_size']:,}: DIFFERENT SIZE" + note
    return f"present, {o['size']:,} bytes" + (" as recorded" if o["expected_size"] is not None else "") + note


skipped_app = command_set(help="Source files not archived: list them, forget one gone for good.", no_args_is_help=True)
commands.add_typer(skipped_app, name="skipped")


@skipped_app.command("list")
def skipped_list(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """The source paths not archived, with why (what 'packhorse status' lists as skipped)."""
    from packhorse.status.reporting import status_report  # deferred: start-up time

    rows = status_report(context(config))["skipped"]
    if as_json:
        print_json(rows)
        return
    if not rows:
        print("none: every source file found is archived or on its way")
        return
    t = Table("location", "path", "reason", title="skipped source paths (not archived)")
    for r in rows:
        t.add_row(r["location"], shown(r["path"]), r["reason"])
    table_console().print(t)


@skipped_app.command("forget")
def skipped_forget(
    path: Annotated[str, typer.Argument(help="LOCATION:PATH, an absolute path, or a path relative to the source")],
    reason: Annotated[str, typer.Option("--reason", help="why it is gone for good (kept, audited)")],
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Stop listing a source file that went away before it was packaged: it is gone for good
    (deleted on purpose, never to be archived). Kept with who, when and why (`packhorse locate`
    shows it); if the file comes back it is archived as ever. Exit 1 if no such file is listed."""
    from packhorse.actions.operator import forget_skipped  # deferred: start-up time

    ctx = context(config)
    try:
        done = forget_skipped(ctx, path, reason=reason, actor=cli_actor())
    except EmptyReasonError as e:
        raise fail(str(e), EXIT_CONFIG) from None
    except NotSkippedError as e:
        raise fail(str(e), EXIT_PROBLEM) from None
    if as_json:
        print_json({"forgotten": done})
        return
    for d in done:
        print(f"forgot {d['location']}:{shown(d['path'])} ({d['reason']}); no longer listed as skipped")


@commands.command()
def locate(
    query: Annotated[str, typer.Argument(help="a source path (relative, LOCATION:PATH or absolute) or a package name")],
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Where is my file: every version of a source path or package, its package, every copy
    with its location and when it was last verified, and its history. Exit 1 if nothing matches
    or the path is one the scan skipped (never archived; the reason is printed)."""
    from packhorse.status.locate import locate as find  # deferred: start-up time

    ctx = context(config)
    try:
        found = ctx.db.read(lambda s: find(s, query, include_errors=True, settings=ctx.settings))
    except LocateQueryError as e:
        raise fail(str(e), EXIT_CONFIG) from None
    if as_json:
        print_json(found)
    else:
        _print_located(found)
    raise typer.Exit(EXIT_OK if found["matched"] not in (None, "skipped") else EXIT_PROBLEM)


def _print_located(r: dict[str, Any]) -> None:
    out = table_console()
    for k in r.get("skipped", []):  # before anything else: this path is not archived
        out.print(f"SKIPPED {k['location']}:{shown(k['path'])}: {shown(k['reason'])} (seen by the scan since "
                  f"{utc_text(k['first_seen_at'])}, last {utc_text(k['last_seen_at'])} UTC; never archived while it stays so; "
                  f"`packhorse skipped forget` when it is gone for good)", highlight=False, markup=False)
    if not r["matched"]:
        out.print(f"nothing registered or packaged matches {shown(repr(r['query']))}", highlight=False)
        return
    if r["versions"]:
        t = Table("location", "path", "version", "size", "sha256", "registered (UTC)", "package", title="versions")
        for v in r["versions"]:
            t.add_row(v["location"], shown(v["path"]), str(v["version"]), str(v["size"]), v["sha256"][:12],
                      utc_text(v["registered_at"]),
                      f"(taken out: {v['withdrawn']})" if v.get("withdrawn") else v["package"] or "(not packaged yet)")
        out.print(t)
        for v in r["versions"]:
            if v.get("why"):
                out.print(f"version {v['version']} of {shown(v['location'] + ':' + v['path'])}: {v['why']}, "
                          f"registered {utc_text(v['registered_at'])} UTC", highlight=False, markup=False)
    for p in r["packages"]:
        label = "bundle" if p["type"] == "data_transfer_package" else "package"
        state = f"archived {utc_text(p['archived_at'])} UTC" if p["archived_at"] else "not archived yet"
        version = f"version {p['version']}, " if p.get("version") else ""
        out.print(f"[bold]{label} {shown(p['name'])}[/] ({version}{p['size'] if p['size'] is not None else '?'} bytes"
                  f"{', bundle ' + p['bundle'] if p['bundle'] else ''}; {state})", highlight=False)
        t = Table("of", "location", "site", "role", "status", "path", "last verified (UTC)", title="physical copies")
        for c in p["copies"] + p["bundle_copies"]:
            t.add_row("bundle" if c["artifact"] == "data_transfer_package" else "package", c["location"], c["site"],
                      c["role"], c["status"], shown(c["path"]), utc_text(c["verified_at"]))
        out.print(t)
        for c in p["copies"] + p["bundle_copies"]:
            if c.get("quarantined_as"):
                out.print(f"the {c['status']} copy {c['location']}:{shown(c['path'])} was moved aside to "
                          f"{c['location']}:{shown(c['quarantined_as'])} at {utc_text(c['quarantined_at'])} UTC",
                          highlight=False, markup=False)
        t = Table("at (UTC)", "event", "location", "operation", "detail", title="history")
        for e in p["timeline"]:
            why = f": {e['error_type']}: {e['message']}" if e["error_type"] else ""
            t.add_row(utc_text(e["at"]), e["event"], e["location"] or "-",
                      f"{e['kind']} {e['operation_id']}" if e["operation_id"] else "-", (e["detail"] or "") + why)
        out.print(t)
    if r["truncated"]:
        out.print("(more matches than listed)")
    if r.get("also_folder"):
        out.print(f"{shown(r['query'])} is also a source folder holding other packages' files: packhorse locate "
                  f"{shown(r['query'].rstrip('/') + '/')} lists them", highlight=False)


@commands.command()
def reconcile(
    package_id: Annotated[Optional[int], typer.Argument(help="raw data package id (default: every package)",
                                                        min=1, max=2**63 - 1)] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Recompute raw data packages' archived state from their verified archive copies."""
    from packhorse.actions.operator import reconcile_inconsistent, reconcile_package  # deferred: start-up time

    ctx = context(config)
    try:
        out = (reconcile_package(ctx, package_id, actor=cli_actor()) if package_id is not None
               else reconcile_inconsistent(ctx, actor=cli_actor()))
    except UnknownPackageError as e:
        raise fail(str(e), EXIT_PROBLEM) from None
    if as_json:
        print_json(out)
    elif package_id is not None:
        print(f"{out['name']}: {out['change'] or 'consistent'} (archived: {'yes' if out['archived'] else 'no'})")
    else:
        print(f"checked {out['checked']} package(s), changed {len(out['changed'])}")
        for c in out["changed"]:
            print(f"  {c['name']}: {c['change']}")
