"""The quarantine's lifecycle: list what packhorse moved aside, purge what is old enough.

Repairs never overwrite or delete a bad object (I2): they move it into its location's
``_packhorse/quarantine/`` (:mod:`packhorse.storage.quarantine`), where it stays — counted in
the location's disk usage (``quarantined_bytes`` of every sample) — until an operator purges it.
:func:`purge_quarantine` removes entries older than a given age, never one younger than
``[quarantine] min_retention_seconds`` (30 days by default), never at an unavailable location,
and audits every purge (``quarantine.purge``), refused ones too. Disk locations only: an object
store's quarantine (same prefix in its bucket or container) is listed under ``not_listed``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from packhorse.db.models import utcnow
from packhorse.domain import StorageType
from packhorse.errors import (
    ConfigError,
    EmptyReasonError,
    QuarantineRetentionError,
    StorageServiceError,
    UnsafePathError,
)
from packhorse.rules.availability import probe
from packhorse.rules.disk_usage import measure_all
from packhorse.runtime import audit
from packhorse.runtime.context import ProcessContext
from packhorse.storage.quarantine import QuarantinedEntry, list_quarantine, remove_quarantined

DAY_SECONDS = 86400.0


def entry_dict(location: str, e: QuarantinedEntry, now: dt.datetime) -> dict[str, Any]:
    """An entry as plain data: ``{"location", "key", "original_key", "quarantined_at"`` (ISO
    8601 UTC or ``None``), ``"age_seconds"`` (or ``None``), ``"kind", "size_bytes"}``."""
    age = e.age_seconds(now)
    return {"location": location, "key": e.key, "original_key": e.original_key,
            "quarantined_at": e.quarantined_at.isoformat() if e.quarantined_at else None,
            "age_seconds": None if age is None else round(max(age, 0.0), 1), "kind": e.kind, "size_bytes": e.size}


def _scan(ctx: ProcessContext, location: str | None, site: str | None = None
          ) -> tuple[dict[str, list[QuarantinedEntry]], list[dict[str, str]]]:
    """The quarantine of every configured location (or ``location``, or those of ``site``): ``({location: entries},
    [{"location", "cause", "reason"}])`` — the second lists locations not looked at, with why
    (``cause``: ``object_storage``, ``unavailable`` or ``unreadable``)."""
    found: dict[str, list[QuarantinedEntry]] = {}
    not_listed: list[dict[str, str]] = []
    for loc in ctx.settings.locations:
        if (location is not None and loc.name != location) or (site is not None and loc.site != site):
            continue
        if loc.storage is not StorageType.DISK:
            not_listed.append({"location": loc.name, "cause": "object_storage", "reason": f"{loc.storage.value} storage: its quarantine is "
                               f"under _packhorse/quarantine/ in {loc.object_store_uri}; not listed by packhorse"})
            continue
        if loc.read_only or not loc.active:
            continue  # packhorse never writes there (or no longer): nothing of it is looked at
        try:
            err = probe(ctx, loc.name)
        except (ConfigError, StorageServiceError) as e:
            err = e  # type: ignore[assignment]
        if err is not None:
            not_listed.append({"location": loc.name, "cause": "unavailable", "reason": str(err)})
            continue
        try:
            found[loc.name] = list_quarantine(ctx.settings.location_path(loc.name))
        except OSError as e:
            not_listed.append({"location": loc.name, "cause": "unreadable", "reason": str(e)})
    return found, not_listed


def quarantine_listing(ctx: ProcessContext, *, location: str | None = None, site: str | None = None,
                       now: dt.datetime | None = None) -> dict[str, Any]:
    """What the quarantines hold now (read from the disks, read-only), of every location, of
    ``location``, or of the locations of ``site`` (on a host of that site).

    Returns ``{"entries": [entry_dict], "locations": {location: {"count", "bytes"}},
    "not_listed": [{"location", "cause", "reason"}], "min_retention_seconds": s}``; ``bytes`` in
    bytes; ``cause``: ``object_storage`` (not listed by packhorse), ``unavailable`` (root or
    identity marker missing) or ``unreadable``.

    Raises:
        KeyError: ``location`` is not configured.
    """
    if location is not None:
        ctx.settings.location(location)
    now = now or utcnow()
    found, not_listed = _scan(ctx, location, site)
    entries = [entry_dict(loc, e, now) for loc, es in sorted(found.items()) for e in es]
    return {"entries": entries,
            "locations": {loc: {"count": len(es), "bytes": sum(e.size for e in es)} for loc, es in sorted(found.items())},
            "not_listed": not_listed, "min_retention_seconds": ctx.settings.quarantine.min_retention_seconds}


def purge_quarantine(ctx: ProcessContext, *, older_than_seconds: float, reason: str, actor: str,
                     location: str | None = None, site: str | None = None, dry_run: bool = False,
                     now: dt.datetime | None = None) -> dict[str, Any]:
    """Remove the quarantine entries moved aside more than ``older_than_seconds`` ago (at every
    available disk location, or ``location``, or those of ``site``), then measure the disk usage of the locations
    that lost some (so ``status`` and ``usage`` show it). Entries whose name carries no stamp
    are kept. With ``dry_run`` nothing is removed, measured or audited: the same answer says
    what would go. Audited as ``quarantine.purge`` (its details list every key removed).

    Returns ``{"removed": [entry_dict], "removed_bytes": n, "kept": n (younger or of unknown
    age), "failed": [{"location", "key", "error"}], "not_listed": [...], "dry_run": bool}``.

    Raises:
        EmptyReasonError: ``reason`` is blank (nothing removed; audited as refused).
        QuarantineRetentionError: ``older_than_seconds`` is below ``[quarantine]
            min_retention_seconds`` (nothing removed; audited as refused).
        KeyError: ``location`` is not configured.
    """
    if location is not None:
        ctx.settings.location(location)
    floor = ctx.settings.quarantine.min_retention_seconds
    details: dict[str, Any] = {"reason": reason, "older_than_seconds": older_than_seconds, "location": location,
                               "site": site}
    if not reason.strip():
        msg = "--reason: say why the quarantined copies may go (kept in the audit log)"
        if not dry_run:  # every refused purge is in the audit log, as every refused change is
            audit.record(ctx.db, actor=actor, action="quarantine.purge", target=location or "*", details=details,
                         result="refused", message=msg)
        raise EmptyReasonError(msg)
    if older_than_seconds < floor:
        msg = (f"--older-than {older_than_seconds / DAY_SECONDS:g} days is inside the quarantine's minimum retention "
               f"of {floor / DAY_SECONDS:g} days ([quarantine] min_retention_seconds = {floor:.0f}): nothing removed")
        if not dry_run:
            audit.record(ctx.db, actor=actor, action="quarantine.purge", target=location or "*", details=details,
                         result="refused", message=msg)
        raise QuarantineRetentionError(msg)
    now = now or utcnow()
    found, not_listed = _scan(ctx, location, site)
    removed: list[dict[str, Any]] = []
    failed: list[dict[str, str]] = []
    kept = 0
    for loc, entries in sorted(found.items()):
        root = ctx.settings.location_path(loc)
        for e in entries:
            age = e.age_seconds(now)
            if age is None or age < older_than_seconds:
                kept += 1
                continue
            if not dry_run:
                try:
                    remove_quarantined(root, e.key)
                except (OSError, UnsafePathError) as x:
                    failed.append({"location": loc, "key": e.key, "error": str(x)})
                    continue
            removed.append(entry_dict(loc, e, now))
    out = {"removed": removed, "removed_bytes": sum(r["size_bytes"] for r in removed), "kept": kept,
           "failed": failed, "not_listed": not_listed, "dry_run": dry_run}
    if dry_run:
        return out
    if removed:
        measure_all(ctx.db, ctx.settings, ctx.topology.location_ids, hooks=ctx.hooks)
    audit.record(ctx.db, actor=actor, action="quarantine.purge", target=location or "*",
                 details={**details, "removed": [f"{r['location']}:{r['key']}" for r in removed],
                          "removed_bytes": out["removed_bytes"], "failed": failed},
                 result="error" if failed else "ok",
                 message=f"{len(failed)} entr{'y' if len(failed) == 1 else 'ies'} could not be removed" if failed else None)
    return out
