"""``packhorse quarantine list|purge``: what repairs moved aside (``_packhorse/quarantine/`` of
every disk data location), and removing what is older than the configured minimum retention
(:mod:`packhorse.actions.quarantine`)."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer
from rich.table import Table

from packhorse.actions.quarantine import DAY_SECONDS, purge_quarantine, quarantine_listing
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
    shown,
    table_console,
)
from packhorse.errors import EmptyReasonError, QuarantineRetentionError
from packhorse.runtime.audit import cli_actor
from packhorse.runtime.context import ProcessContext
from packhorse.time_text import utc_text

#: this module's commands (loaded by packhorse.cli when one of them runs)
commands = command_set()

quarantine_app = command_set(no_args_is_help=True,
                             help="What repairs moved aside instead of overwriting it: list it, purge what is old enough.")
commands.add_typer(quarantine_app, name="quarantine")

LocationOpt = Annotated[Optional[str], typer.Option("--location", help="only this data location")]
SiteOpt = Annotated[Optional[str], typer.Option(
    "--site", help="only the data locations of this site (on a host of it: other sites' disks are not here)")]


def _check_location(ctx: ProcessContext, location: str | None, site: str | None) -> None:
    if location is not None and location not in ctx.topology.location_ids:
        raise fail(f"--location {location!r}: no such data location in the configuration", EXIT_CONFIG)
    if site is not None and site not in {s.name for s in ctx.settings.sites}:
        raise fail(f"--site {site!r}: no such site in the configuration", EXIT_CONFIG)


def _age(seconds: float | None) -> str:
    return "unknown" if seconds is None else f"{seconds / DAY_SECONDS:.1f} d"


@quarantine_app.command("list")
def quarantine_list(config: ConfigOpt = None, location: LocationOpt = None, site: SiteOpt = None,
                    as_json: JsonOpt = False) -> None:
    """Every entry of every disk location's quarantine (read from the disks now): location, key,
    the key it had, when it was moved aside (UTC), age, bytes. Exit 1 if a location could not
    be looked at (unavailable, unreadable)."""
    ctx = context(config)
    _check_location(ctx, location, site)
    r = quarantine_listing(ctx, location=location, site=site)
    if as_json:
        print_json(r)
    else:
        if r["entries"]:
            t = Table("location", "quarantined as", "was", "moved aside (UTC)", "age", "kind", "bytes",
                      title="quarantine (kept until purged)")
            for e in r["entries"]:
                t.add_row(e["location"], shown(e["key"]), shown(e["original_key"] or "-"),
                          utc_text(e["quarantined_at"], "unknown"), _age(e["age_seconds"]), e["kind"],
                          f"{e['size_bytes']:,}")
            table_console().print(t)
        total = sum(v["bytes"] for v in r["locations"].values())
        print(f"{len(r['entries'])} quarantined entr{'y' if len(r['entries']) == 1 else 'ies'}, {total:,} bytes; "
              f"purge with: packhorse quarantine purge --older-than DAYS --reason TEXT (at least "
              f"{r['min_retention_seconds'] / DAY_SECONDS:g} days: [quarantine] min_retention_seconds)")
        for n in r["not_listed"]:
            print(f"not listed: {n['location']}: {n['cause']}: {n['reason']}", file=sys.stderr)
    unavailable = [n for n in r["not_listed"] if n["cause"] != "object_storage"]
    raise typer.Exit(EXIT_PROBLEM if unavailable else EXIT_OK)


@quarantine_app.command("purge")
def quarantine_purge(
    older_than: Annotated[float, typer.Option("--older-than", metavar="DAYS", min=0,
                                              help="remove entries moved aside more than DAYS days ago")],
    reason: Annotated[str, typer.Option("--reason", help="why they may go (kept in the audit log)")],
    config: ConfigOpt = None,
    location: LocationOpt = None,
    site: SiteOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", "-n", help="say what would go; remove nothing")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Remove quarantined entries moved aside more than DAYS days ago (never fewer days than
    [quarantine] min_retention_seconds: refused, exit 2), then measure disk usage again.
    Audited. Exit 1 if an entry could not be removed or a location could not be looked at."""
    ctx = context(config)
    _check_location(ctx, location, site)
    try:
        r = purge_quarantine(ctx, older_than_seconds=older_than * DAY_SECONDS, reason=reason, actor=cli_actor(),
                             location=location, site=site, dry_run=dry_run)
    except (EmptyReasonError, QuarantineRetentionError) as e:
        raise fail(str(e), EXIT_CONFIG) from None
    if as_json:
        print_json(r)
    else:
        verb = "would remove" if dry_run else "removed"
        for e in r["removed"]:
            print(f"{verb} {e['location']}:{shown(e['key'])} ({e['size_bytes']:,} bytes, {_age(e['age_seconds'])})")
        print(f"{verb} {len(r['removed'])} entr{'y' if len(r['removed']) == 1 else 'ies'}, {r['removed_bytes']:,} "
              f"bytes; {r['kept']} kept (younger, or of unknown age)")
        for f in r["failed"]:
            print(f"not removed: {f['location']}:{shown(f['key'])}: {f['error']}", file=sys.stderr)
        for n in r["not_listed"]:
            print(f"not looked at: {n['location']}: {n['cause']}: {n['reason']}", file=sys.stderr)
    unavailable = [n for n in r["not_listed"] if n["cause"] != "object_storage"]
    raise typer.Exit(EXIT_PROBLEM if r["failed"] or unavailable else EXIT_OK)
