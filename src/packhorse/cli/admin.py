"""Administration: service ``health``, API tokens (``token create|list|revoke``), runtime
settings (``config set|unset|show``), the ``audit`` log and disk ``usage``. The ops database's
migrations are applied by ``packhorse init`` (packhorse.cli.pipeline)."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer
from rich.table import Table

from packhorse.cli.app import (
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_PROBLEM,
    ConfigOpt,
    JsonOpt,
    command_set,
    context,
    fail,
    print_json,
    printable,
    table_console,
)
from packhorse.errors import RuntimeSettingError, ServiceHealthError, TokenError
from packhorse.runtime import audit
from packhorse.runtime.settings import describe, set_setting, unset_setting
from packhorse.time_text import utc_text

#: this module's commands (loaded by packhorse.cli when one of them runs)
commands = command_set()


@commands.command()
def health(
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    forget: Annotated[Optional[str], typer.Option(
        "--forget", metavar="NAME", help="forget a dead service (one taken out of the installation)")] = None,
) -> None:
    """List services and workers with their last heartbeat; exit 1 if one is dead now, if workers
    or managers run but no monitor does, if an expired lease has not been taken back within two
    recovery passes (no monitor reclaims it), if a site's workers are all dead (cut off), or if a
    source location's scan has not completed for longer than recovery.scan_overdue_seconds.

    A service is listed by what it is (kind, site, instance, host): a restarted one replaces its
    dead predecessor, a dead one is forgotten after recovery.service_forget_after_seconds (a day)
    or by --forget NAME. Each service shows how far its host's clock is from the database
    server's (clock offset, s, database minus host; packhorse times everything by the
    database's clock); one beyond database.clock_offset_warn_seconds is named on stderr."""
    from packhorse.recovery.breakers import jsonable  # deferred: start-up time
    from packhorse.recovery.health import forget_service  # deferred: start-up time
    from packhorse.status.health import health_report  # deferred: start-up time

    ctx = context(config)
    rec = ctx.settings.recovery
    if forget is not None:
        try:
            gone = forget_service(ctx.db, forget, dead_after_seconds=rec.service_dead_after_seconds)
        except ServiceHealthError as e:
            audit.record(ctx.db, actor=audit.cli_actor(), action="service.forget", target=forget, result="refused",
                         message=str(e))
            raise fail(str(e), EXIT_PROBLEM) from None
        audit.record(ctx.db, actor=audit.cli_actor(), action="service.forget", target=forget,
                     details={"last_seen": gone["last_seen"].isoformat(), "pid": gone["pid"]})
        if as_json:
            print_json({"forgotten": jsonable(gone)})
        else:
            print(f"forgot {forget} (last heartbeat {utc_text(gone['last_seen'])} UTC)", file=sys.stderr)
        return
    report = health_report(ctx)
    rows, dead = report.services, report.dead
    warn_above = ctx.settings.database.clock_offset_warn_seconds
    clock_off = {r["service"] for r in rows
                 if r["clock_offset_seconds"] is not None and abs(r["clock_offset_seconds"]) > warn_above}
    scans, unreclaimed, cut_off, no_monitor = (report.scans_overdue, report.leases_not_reclaimed,
                                               report.sites_unreachable, report.no_monitor)
    if as_json:
        print_json(report.as_json())
    else:
        if not rows:
            print("no packhorse service is running: none has a heartbeat (each service records one while it runs "
                  "and removes it when it stops cleanly; a killed one is listed DEAD)")
        else:
            t = Table("service", "kind", "host", "pid", "state", "last seen (UTC)", "age (s)", "restarts",
                      "clock offset (s)", title="services")
            for r in rows:
                off = r["clock_offset_seconds"]
                off_text = "" if off is None else f"{off:+.1f}"
                if r["service"] in clock_off:
                    off_text = f"[yellow]{off_text}[/]"
                t.add_row(r["service"], r["kind"], r["host"], str(r["pid"]), "alive" if r["alive"] else "[red]DEAD[/]",
                          utc_text(r["last_seen"]), f"{r['age_seconds']:.0f}", str(r["restarts"]),
                          off_text)
            table_console().print(t)
        for r in rows:
            if r["service"] in clock_off:
                off = r["clock_offset_seconds"]
                print(f"clock: {r['service']}: the clock of host {r['host']} is {abs(off):.1f} s "
                      f"{'behind' if off > 0 else 'ahead of'} the database server's (more than "
                      f"database.clock_offset_warn_seconds = {warn_above:g} s): "
                      "packhorse times leases and heartbeats by the database's clock, but synchronize that host's "
                      "(NTP, chrony): its logs and file times are off", file=sys.stderr)
        for r in dead:
            # the centre cannot tell a stopped service from one whose host or link is cut off
            print(f"dead: {r['service']}: no heartbeat for {r['age_seconds']:.0f} s: it stopped, or its host or "
                  "link is cut off from the database; if it stopped, restart it; if it was taken out: "
                  f"packhorse health --forget {r['service']} "
                  f"(forgotten by itself {rec.service_forget_after_seconds:g} s after its last heartbeat)",
                  file=sys.stderr)
        for sc in scans:
            print(f"scan overdue: {sc['location']}: no scan completed for {sc['overdue_seconds']} s "
                  f"(last completed {utc_text(sc['completed_at']) + ' UTC' if sc['completed_at'] else 'never'}; lease holder {sc['holder'] or 'none'}): "
                  "check the site's workers (a paused or hung holder loses its lease by itself)", file=sys.stderr)
        if no_monitor:
            print("no monitor is running: workers and managers are, but nothing hands expired leases back, "
                  "half-opens circuit breakers or re-dispatches lost messages: start packhorse monitor "
                  "(two on different hosts for high availability)", file=sys.stderr)
        for item in unreclaimed:
            print(f"lease not reclaimed: {item.subject}: {item.reason}; {item.release}", file=sys.stderr)
        for item in cut_off:
            print(f"{item.subject} unreachable since {utc_text(item.since)} UTC: {item.reason}",
                  file=sys.stderr)
    raise typer.Exit(EXIT_PROBLEM if dead or scans or no_monitor or unreclaimed or cut_off else EXIT_OK)


token_app = command_set(no_args_is_help=True, help="API tokens: create (shown once), list, revoke.")
config_app = command_set(no_args_is_help=True, help="Runtime settings stored in the database (picked up within 60 s).")
commands.add_typer(token_app, name="token")
commands.add_typer(config_app, name="config")


@token_app.command("create")
def token_create(
    role: Annotated[str, typer.Option("--role", help="admin, observer (read-only) or kiosk (the problem summary only, for a wallboard's /kiosk page)")],
    name: Annotated[str, typer.Option("--name", help="who or what uses it")],
    config: ConfigOpt = None,
) -> None:
    """Create an API token; it is printed once, alone on the last line of stdout."""
    from packhorse.api.tokens import create_token  # deferred: start-up time

    ctx = context(config)
    try:
        tok = create_token(ctx.db, name=name, role=role, created_by=audit.cli_actor())
    except TokenError as e:
        audit.record(ctx.db, actor=audit.cli_actor(), action="token.create", target=name, details={"role": role},
                     result="refused", message=str(e))
        raise fail(str(e), EXIT_CONFIG) from None
    audit.record(ctx.db, actor=audit.cli_actor(), action="token.create", target=name, details={"role": role})
    print(f"created {role} token {name!r}; it is shown only now (packhorse stores only its hash):")
    print(tok)


@token_app.command("list")
def token_list(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """List tokens (never their secret)."""
    from packhorse.api.tokens import list_tokens  # deferred: start-up time

    ctx = context(config)
    rows = ctx.db.read(list_tokens)
    if as_json:
        print_json(rows)
        return
    t = Table("name", "role", "created", "by", "last used", "revoked", title="API tokens")
    for r in rows:
        t.add_row(r["name"], r["role"], r["created_at"], r["created_by"], r["last_used_at"] or "-", r["revoked_at"] or "-")
    table_console().print(t)


@token_app.command("revoke")
def token_revoke(name: Annotated[str, typer.Argument(help="the token's name")], config: ConfigOpt = None,
                 as_json: JsonOpt = False) -> None:
    """Revoke a token: it is refused from the next request on."""
    from packhorse.api.tokens import revoke_token  # deferred: start-up time

    ctx = context(config)
    try:
        revoke_token(ctx.db, name)
    except TokenError as e:
        audit.record(ctx.db, actor=audit.cli_actor(), action="token.revoke", target=name, result="refused",
                     message=str(e))
        raise fail(str(e), EXIT_PROBLEM) from None
    audit.record(ctx.db, actor=audit.cli_actor(), action="token.revoke", target=name)
    if as_json:
        print_json({"revoked": name})
    else:
        print(f"revoked token {name!r}")


@config_app.command("set")
def config_set(key: Annotated[str, typer.Argument(help="e.g. managers.poll_interval_seconds, log_level")],
               value: Annotated[str, typer.Argument()], config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Change a runtime setting; running services pick it up within a minute (audited)."""

    ctx = context(config)
    try:
        v = set_setting(ctx.db, key, value, actor=audit.cli_actor())
    except RuntimeSettingError as e:
        raise fail(str(e), EXIT_CONFIG) from None
    if as_json:
        print_json({"key": key, "value": v})
        return
    print(f"{key} = {v} (running services pick it up within "
          f"{ctx.settings.managers.runtime_settings_refresh_seconds:g} s)")


@config_app.command("unset")
def config_unset(key: Annotated[str, typer.Argument()], config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Drop a runtime override: the configuration file's value applies again (audited)."""

    ctx = context(config)
    try:
        existed = unset_setting(ctx.db, key, actor=audit.cli_actor())
    except RuntimeSettingError as e:
        raise fail(str(e), EXIT_CONFIG) from None
    if as_json:
        print_json({"key": key, "removed": existed})
        return
    print(f"{key}: {'override removed' if existed else 'had no override'}; the configuration file's value applies")


@config_app.command("show")
def config_show(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Runtime settings: effective value, file default and where the value comes from."""

    ctx = context(config)
    rows = ctx.db.read(lambda s: describe(s, ctx.settings))
    if as_json:
        print_json(rows)
        return
    t = Table("key", "value", "source", "default", "changed", title="runtime settings")
    for r in rows:
        t.add_row(r["key"], str(r["value"]), r["source"], str(r["default"]),
                  f"{r['updated_at']} by {r['updated_by']}" if r["updated_at"] else "-")
    table_console().print(t)


@commands.command("audit")
def audit_cmd(limit: Annotated[int, typer.Option("--limit", help="newest N entries")] = 50,
              config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """The audit log of admin actions, newest first."""

    ctx = context(config)
    rows = ctx.db.read(lambda s: audit.entries(s, limit=limit))
    if as_json:
        print_json(rows)
        return
    for r in rows:
        reason = r["details"].get("reason") if isinstance(r["details"], dict) else None
        print(printable(f"{r['at']} {r['actor']} {r['action']} {r['target'] or ''} {r['result']}"
                        f"{': ' + r['message'] if r['message'] else ''}"
                        f"{f' (reason: {reason})' if reason else ''}"))


@commands.command()
def usage(
    config: ConfigOpt = None,
    measure: Annotated[bool, typer.Option("--measure", help="measure every disk location now (and record it)")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Disk usage per data location (latest measurement): total, used, free, percent, level."""
    from packhorse.rules.disk_usage import latest_usage, measure_all, sample_dict  # deferred: start-up time

    ctx = context(config)
    if measure:
        measure_all(ctx.db, ctx.settings, ctx.topology.location_ids, hooks=ctx.hooks)
    rows = ctx.db.read(lambda s: [sample_dict(n, x) for n, x in sorted(latest_usage(s).items())])
    if as_json:
        print_json(rows)
        return
    if not rows:
        print("no disk usage recorded yet: `packhorse run` (or disk-monitor) measures every "
              f"{ctx.settings.disk_usage.interval_seconds:g} s; `packhorse usage --measure` measures now", file=sys.stderr)
        return
    t = Table("location", "measured (UTC)", "age", "total", "used", "quarantined", "available", "used %", "level",
              "alert", title="disk usage (used % as df: used / (used + available); quarantined: part of used)")
    for r in rows:
        q = r["quarantined_bytes"]
        t.add_row(r["location"], utc_text(r["measured_at"]), f"{r['age_seconds']:.0f} s", f"{r['total_bytes']:,}",
                  f"{r['used_bytes']:,}", "-" if q is None else f"{q:,}", f"{r['free_bytes']:,}", f"{r['percent']:.1f}",
                  r["level"], r["alert_level"])
    table_console().print(t)
    if any(r["quarantined_bytes"] for r in rows):
        print("quarantined bytes are kept until purged: packhorse quarantine list / purge --older-than DAYS",
              file=sys.stderr)
