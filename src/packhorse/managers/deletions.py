"""Deletion manager: create ``deletion`` operations for copies that may go (rules in :mod:`.policy`).

Returns, besides the count, how long until the next copy's retention passes, so ``run
--until-idle`` knows that the only work left waits on a retention period.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..db.models import DataTransferPackage, PhysicalCopy, RawDataFile, RawDataPackage, utcnow
from ..domain import CopyStatus, LocationRole, OperationKind
from ..operations import create_operation, dedup_key
from ..stages.base import StageContext
from .common import existing_keys
from .policy import may_delete_bundle_copy, may_delete_raw_copy


def manage(ctx: StageContext) -> tuple[int, float | None]:
    """Create deletion operations; returns ``(created, seconds until the next retention ends)``."""

    def tx(s: Session) -> tuple[int, float | None]:
        now = utcnow()
        waits: list[float] = []
        wanted: dict[str, dict[str, int | None]] = {}

        def consider(copy: PhysicalCopy, since: dt.datetime, subject: str) -> None:
            loc = ctx.settings.location(ctx.location_name(copy.location_id))
            due = since + dt.timedelta(seconds=loc.retention_seconds)
            if now < due:
                waits.append((due - now).total_seconds())
                return
            wanted[dedup_key(OperationKind.DELETION, f"copy{copy.id}")] = dict(
                copy=copy.id, loc=copy.location_id, site=ctx.topology.site_ids[loc.site],
                rdp=copy.raw_data_package_id, dtp=copy.data_transfer_package_id)

        buffer_ids = [i for n, i in ctx.topology.location_ids.items()
                      if ctx.topology.location_role.get(n) is LocationRole.BUFFER]
        raw = s.execute(
            select(PhysicalCopy, RawDataPackage.archived_at)
            .join(RawDataPackage, RawDataPackage.id == PhysicalCopy.raw_data_package_id)
            .where(RawDataPackage.archived_at.is_not(None), PhysicalCopy.status == CopyStatus.PRESENT.value,
                   PhysicalCopy.location_id.in_(buffer_ids))
        ).all()
        for copy, archived_at in raw:
            if may_delete_raw_copy(s, ctx, copy):
                consider(copy, archived_at, f"rdp{copy.raw_data_package_id}")
        bundles = s.execute(
            select(PhysicalCopy, DataTransferPackage.source_site_id)
            .join(DataTransferPackage, DataTransferPackage.id == PhysicalCopy.data_transfer_package_id)
            .where(PhysicalCopy.status == CopyStatus.PRESENT.value)
        ).all()
        verdict: dict[int, bool] = {}
        for copy, site_id in bundles:
            dtp_id = copy.data_transfer_package_id
            if dtp_id not in verdict:
                verdict[dtp_id] = may_delete_bundle_copy(s, ctx, dtp_id, ctx.topology.site_name(site_id))
            if verdict[dtp_id]:
                consider(copy, copy.created_at, f"dtp{dtp_id}")
        if ctx.settings.deletion.delete_source_files:
            pkgs = s.execute(
                select(RawDataPackage.id, RawDataPackage.source_location_id)
                .where(RawDataPackage.archived_at.is_not(None),
                       RawDataPackage.id.in_(select(RawDataFile.raw_data_package_id)
                                             .where(RawDataFile.source_deleted_at.is_(None))))
            ).all()
            for pkg_id, loc_id in pkgs:
                site = ctx.topology.location_site[ctx.location_name(loc_id)]
                wanted[dedup_key(OperationKind.DELETION, f"rdp{pkg_id}", "source")] = dict(
                    copy=None, loc=loc_id, site=ctx.topology.site_ids[site], rdp=pkg_id, dtp=None)
        n = 0
        have = existing_keys(s, wanted)
        for key, w in wanted.items():
            if key not in have and create_operation(
                    s, kind=OperationKind.DELETION, dedup_key=key, site_id=int(w["site"] or 0),
                    max_retries=ctx.settings.recovery.max_retries, physical_copy_id=w["copy"],
                    raw_data_package_id=w["rdp"], data_transfer_package_id=w["dtp"],
                    source_location_id=w["loc"]):
                n += 1
        return n, (min(waits) if waits else None)

    return ctx.db.transact(tx)
