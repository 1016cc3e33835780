"""Fixity audit manager: creates ``fixity_check`` operations.

* Every ``present`` copy at a long-term archive is re-verified when its last verification
  (``verified_at``, else ``created_at``) is older than its location's
  ``fixity_interval_seconds`` (default 30 days). The dedup key carries that time, so each
  cadence cycle gets one operation and a FAILED one is not silently recreated.
* A copy marked ``corrupt``/``missing`` at a long-term archive (by ``packhorse verify`` or an
  audit whose repair did not finish) with no live copy at its location gets one repair
  operation per good source: a present copy at a long-term archive or at the same site
  (a package re-shipped to that site's buffer included; :mod:`packhorse.rules.convergence`).
* Every cycle also clears stale ``archived_at`` marks and notifies the packages with no good
  source left (:func:`converge`).
* A copy marked ``missing`` or ``corrupt`` with no live copy at its location and nothing to
  repair it from (a package with no good source left) is looked at again once per
  :data:`RECHECK_SECONDS`, and once per start of the embedded runner (``packhorse run``): its
  bytes may be back (a remounted disk, a copy put back by hand with the recorded sha256), and
  are then recognised after a read-back (:mod:`packhorse.stages.fixity`), never rewritten.
  Copies on a location with an open outage (:mod:`packhorse.rules.availability`) get no operation
  meanwhile.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from packhorse.db.models import LocationOutage, Operation, PhysicalCopy, utcnow
from packhorse.domain import (
    ACTIVE_STATUSES,
    LIVE_COPY_STATUSES,
    CopyStatus,
    LocationRole,
    NotificationLevel,
    OperationKind,
    Status,
)
from packhorse.managers.wanted import create_missing, new_only
from packhorse.notify.outbox import enqueue
from packhorse.operations.lifecycle import dedup_key
from packhorse.rules.convergence import Plan, dead_end_release, plan, repair_sources
from packhorse.rules.fixity import live_copy_at, repair_key
from packhorse.rules.policy import refresh_archived
from packhorse.runtime.context import ProcessContext

#: How often a bad copy with nothing to repair it from is looked at again (seconds; the dedup
#: key carries the period).
RECHECK_SECONDS = 3600.0


def recheck_key(copy_id: int, now: float, started_at: float | None = None) -> str:
    """The subject of the dedup key of a look at bad copy ``copy_id`` whose bytes may be back:
    one per :data:`RECHECK_SECONDS` period of ``now`` (epoch seconds), and one per runner start
    ``started_at`` (epoch seconds; ``None`` for the distributed managers, which run for good)."""
    period = int(now // RECHECK_SECONDS)
    return f"recheck-copy{copy_id}@{period}" + (f"-run{started_at:.6f}" if started_at is not None else "")


def manage(ctx: ProcessContext, repairs: "Plan | None" = None, *, started_at: float | None = None) -> int:
    """Create due ``fixity_check`` operations and repairs, and keep derived state and dead
    ends true (:func:`converge`); returns how many operations it created. ``repairs``: the
    cycle's repair plan (:func:`packhorse.managers.wanted.planned`). ``started_at``: when the
    embedded runner started (epoch seconds): a bad copy with nothing to repair it from is read
    back once per start too (:func:`recheck_key`), so a plain ``packhorse run`` recognises bytes
    put back (the release of a package with no good source left)."""
    converge(ctx, repairs)
    archives = {ctx.topology.location_ids[l.name]: l for l in ctx.settings.locations
                if l.role is LocationRole.LONG_TERM_ARCHIVE and l.active}
    if not archives:
        return 0

    def find(s: Session) -> dict[str, dict[str, Any]]:
        now = utcnow()
        # only rows that may be due: present copies older than the shortest interval, bad copies
        oldest = now - dt.timedelta(seconds=min(l.fixity_interval_seconds for l in archives.values()))
        last_checked = func.coalesce(PhysicalCopy.verified_at, PhysicalCopy.created_at)
        rows = s.execute(select(PhysicalCopy.id, PhysicalCopy.location_id, PhysicalCopy.status,
                                PhysicalCopy.verified_at, PhysicalCopy.created_at, PhysicalCopy.raw_data_package_id,
                                PhysicalCopy.data_transfer_package_id)
                         .where(PhysicalCopy.location_id.in_(list(archives)),
                                ((PhysicalCopy.status == CopyStatus.PRESENT.value) & (last_checked <= oldest))
                                | PhysicalCopy.status.in_([CopyStatus.CORRUPT.value, CopyStatus.MISSING.value]))
                         ).all()
        if not rows:
            return {}
        busy = set(s.scalars(select(Operation.physical_copy_id).where(
            Operation.kind == OperationKind.FIXITY_CHECK.value,
            Operation.status.in_([x.value for x in ACTIVE_STATUSES]))))
        failed = set(s.scalars(select(Operation.physical_copy_id).where(
            Operation.kind == OperationKind.FIXITY_CHECK.value, Operation.status == Status.FAILED.value)))
        out = set(s.scalars(select(LocationOutage.location_id)))  # absent is not empty: judge nothing there
        wanted: dict[str, dict[str, Any]] = {}
        for cid, loc_id, status, verified_at, created_at, rdp, dtp in rows:
            if cid in busy or loc_id in out:
                continue
            loc = archives[loc_id]
            if status == CopyStatus.PRESENT.value:
                last = verified_at or created_at
                if last > now - dt.timedelta(seconds=loc.fixity_interval_seconds):
                    continue
                key = dedup_key(OperationKind.FIXITY_CHECK, f"copy{cid}@{last.timestamp():.6f}", loc.name)
            else:
                source = _repair_source(ctx, s, loc_id, rdp, dtp)
                if source is not None:
                    # one repair per (bad copy, source copy): a repair whose source turned out bad
                    # too is followed by one from the next good source (DESIGN.md "Converging");
                    # a missing copy's repair reads the copy itself back first (bytes back?)
                    key = repair_key(cid, source, loc.name)
                elif cid not in failed and live_copy_at(s, loc_id, rdp, dtp) is None:
                    # nothing to repair from: look again now and then (and once per run), its
                    # bytes may come back (a remounted disk, a good copy put back by hand)
                    key = dedup_key(OperationKind.FIXITY_CHECK, recheck_key(cid, now.timestamp(), started_at),
                                    loc.name)
                else:
                    continue
            wanted[key] = dict(physical_copy_id=cid, raw_data_package_id=rdp, data_transfer_package_id=dtp,
                               destination_location_id=loc_id,
                               site_id=ctx.topology.site_ids[ctx.topology.location_site[loc.name]])
        return new_only(s, wanted)

    return create_missing(ctx, OperationKind.FIXITY_CHECK, ctx.db.read(find))


def _repair_source(ctx: ProcessContext, s: Session, loc_id: int, rdp: int | None, dtp: int | None) -> int | None:
    """The copy a bad copy at ``loc_id`` can be repaired from (lowest id), or ``None``: no
    live copy at ``loc_id`` yet, and a present copy at a long-term archive or at the same site
    (:func:`packhorse.rules.convergence.repair_sources`)."""
    col = PhysicalCopy.raw_data_package_id if rdp is not None else PhysicalCopy.data_transfer_package_id
    subject = rdp if rdp is not None else dtp
    copies = s.execute(select(PhysicalCopy.id, PhysicalCopy.location_id, PhysicalCopy.status).where(
        col == subject)).all()
    if any(c.location_id == loc_id and c.status in [x.value for x in LIVE_COPY_STATUSES] for c in copies):
        return None
    sources = repair_sources(ctx, ctx.location_name(loc_id), copies)
    return min((c.id for c in sources), default=None)


def converge(ctx: ProcessContext, repairs: "Plan | None" = None) -> int:
    """Keep the derived state true and the one dead end loud (:mod:`packhorse.rules.convergence`):
    clear ``archived_at`` of packages whose required archive copies are no longer all present
    and verified (a cache that must never outlive its copies, I1), and queue one CRITICAL
    notification per cooldown window for every package with no good source of its bytes left.
    Returns how many packages it changed or notified about (0 on an idle cycle: one query)."""
    p = ctx.db.read(lambda s: plan(s, ctx)) if repairs is None else repairs
    if not p.stale_archived and not p.dead_ends:
        return 0

    def tx(s: Session) -> int:
        n = refresh_archived(s, ctx, p.stale_archived)
        for d in p.dead_ends:
            lines = [f"{c['status'].upper()} {c['location']}:{c['path']}" for c in d.bad_copies]
            enqueue(s, level=NotificationLevel.CRITICAL, event="no_good_source",
                    subject=f"No good source left for package {d.name}",
                    body="\n".join([f"Raw data package {d.name} has no good copy of its bytes anywhere, and "
                                    "packhorse cannot rebuild it. Copies that failed:", *(f"  {x}" for x in lines),
                                    "Tried:", *(f"  - {x}" for x in d.tried), "",
                                    f"Next: {dead_end_release(d)}"]),
                    context={"package": d.name, "package_id": d.package_id, "bad_copies": d.bad_copies,
                             "tried": d.tried},
                    cooldown_seconds=ctx.settings.recovery.notification_cooldown_seconds,
                    key=f"no_good_source:rdp{d.package_id}")
            n += 1
        return n

    return ctx.db.transact(tx)


