"""Fixity audit manager: creates ``fixity_check`` operations.

* Every ``present`` copy at a long-term archive is re-verified when its last verification
  (``verified_at``, else ``created_at``) is older than its location's
  ``fixity_interval_seconds`` (default 30 days). The dedup key carries that time, so each
  cadence cycle gets one operation and a FAILED one is not silently recreated.
* A copy marked ``corrupt``/``missing`` at a long-term archive (by ``packhorse verify`` or an
  audit whose repair did not finish) with no live copy at its location and a ``present`` copy
  elsewhere gets one repair operation.
* A copy marked ``missing`` with no live copy at its location is looked at again once per
  :data:`RECHECK_SECONDS` even with nothing to repair from: its bytes may be back (a remounted
  disk), and are then recognised after a read-back (:mod:`packhorse.stages.fixity`). Copies on
  a location with an open outage (:mod:`packhorse.availability`) get no operation meanwhile.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..db.models import LocationOutage, Operation, PhysicalCopy, utcnow
from ..domain import ACTIVE_STATUSES, LIVE_COPY_STATUSES, CopyStatus, LocationRole, OperationKind, Status
from ..operations import dedup_key
from ..context import ProcessContext
from .common import create_missing, new_only


#: How often a ``missing`` copy is looked at again (seconds; the dedup key carries the period).
RECHECK_SECONDS = 3600.0


def manage(ctx: ProcessContext) -> int:
    """Create due ``fixity_check`` operations; returns how many."""
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
            elif status == CopyStatus.MISSING.value and cid not in failed and _live_here(s, loc_id, rdp, dtp) is None:
                period = int(now.timestamp() // RECHECK_SECONDS)
                key = dedup_key(OperationKind.FIXITY_CHECK, f"recheck-copy{cid}@{period}", loc.name)
            else:
                if not _repairable(s, loc_id, rdp, dtp):
                    continue
                key = dedup_key(OperationKind.FIXITY_CHECK, f"repair-copy{cid}", loc.name)
            wanted[key] = dict(physical_copy_id=cid, raw_data_package_id=rdp, data_transfer_package_id=dtp,
                               destination_location_id=loc_id,
                               site_id=ctx.topology.site_ids[ctx.topology.location_site[loc.name]])
        return new_only(s, wanted)

    return create_missing(ctx, OperationKind.FIXITY_CHECK, ctx.db.read(find))


def _live_here(s: Session, loc_id: int, rdp: int | None, dtp: int | None) -> int | None:
    """The id of a live copy of the artifact at ``loc_id``, or ``None``."""
    col = PhysicalCopy.raw_data_package_id if rdp is not None else PhysicalCopy.data_transfer_package_id
    subject = rdp if rdp is not None else dtp
    return s.scalar(select(PhysicalCopy.id).where(
        col == subject, PhysicalCopy.location_id == loc_id,
        PhysicalCopy.status.in_([x.value for x in LIVE_COPY_STATUSES])).limit(1))


def _repairable(s: Session, loc_id: int, rdp: int | None, dtp: int | None) -> bool:
    """No live copy at ``loc_id`` yet, and a present copy elsewhere to repair from."""
    col = PhysicalCopy.raw_data_package_id if rdp is not None else PhysicalCopy.data_transfer_package_id
    subject = rdp if rdp is not None else dtp
    live_here = _live_here(s, loc_id, rdp, dtp)
    elsewhere = s.scalar(select(PhysicalCopy.id).where(
        col == subject, PhysicalCopy.location_id != loc_id,
        PhysicalCopy.status == CopyStatus.PRESENT.value).limit(1))
    return live_here is None and elsewhere is not None
