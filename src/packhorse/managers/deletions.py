"""Deletion manager: create ``deletion`` operations for copies that may go (rules in :mod:`.policy`).

Only copies without a deletion operation yet are considered, so each copy's rule is
evaluated until its operation exists, not on every cycle after. Returns, besides the count,
how long until the next copy's retention passes, so ``run --until-idle`` knows that the only
work left waits on a retention period.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from ..db.models import DataTransferPackage, Operation, PhysicalCopy, RawDataFile, RawDataPackage, utcnow
from ..domain import CopyStatus, LocationRole, OperationKind
from ..operations import dedup_key
from ..stages.base import StageContext
from .common import create_missing, new_only
from .policy import may_delete_bundle_copy, may_delete_raw_copy


def manage(ctx: StageContext) -> tuple[int, float | None]:
    """Create deletion operations; returns ``(created, seconds until the next retention ends)``."""

    def find(s: Session) -> tuple[dict[str, dict[str, Any]], float | None]:
        now = utcnow()
        waits: list[float] = []
        wanted: dict[str, dict[str, Any]] = {}
        no_deletion_yet = ~exists().where(Operation.physical_copy_id == PhysicalCopy.id)

        def consider(copy: PhysicalCopy, since: dt.datetime) -> None:
            loc = ctx.settings.location(ctx.location_name(copy.location_id))
            due = since + dt.timedelta(seconds=loc.retention_seconds)
            if now < due:
                waits.append((due - now).total_seconds())
                return
            wanted[dedup_key(OperationKind.DELETION, f"copy{copy.id}")] = dict(
                physical_copy_id=copy.id, source_location_id=copy.location_id,
                site_id=ctx.topology.site_ids[loc.site], raw_data_package_id=copy.raw_data_package_id,
                data_transfer_package_id=copy.data_transfer_package_id)

        buffer_ids = [i for n, i in ctx.topology.location_ids.items()
                      if ctx.topology.location_role.get(n) is LocationRole.BUFFER]
        raw = s.execute(
            select(PhysicalCopy, RawDataPackage.archived_at)
            .join(RawDataPackage, RawDataPackage.id == PhysicalCopy.raw_data_package_id)
            .where(RawDataPackage.archived_at.is_not(None), PhysicalCopy.status == CopyStatus.PRESENT.value,
                   PhysicalCopy.location_id.in_(buffer_ids), no_deletion_yet)
        ).all()
        for copy, archived_at in raw:
            if may_delete_raw_copy(s, ctx, copy):
                consider(copy, archived_at)
        bundles = s.execute(
            select(PhysicalCopy, DataTransferPackage.source_site_id)
            .join(DataTransferPackage, DataTransferPackage.id == PhysicalCopy.data_transfer_package_id)
            .where(PhysicalCopy.status == CopyStatus.PRESENT.value, no_deletion_yet)
        ).all()
        verdict: dict[int, bool] = {}
        for copy, site_id in bundles:
            dtp_id = copy.data_transfer_package_id
            if dtp_id not in verdict:
                verdict[dtp_id] = may_delete_bundle_copy(s, ctx, dtp_id, ctx.topology.site_name(site_id))
            if verdict[dtp_id]:
                consider(copy, copy.created_at)
        if ctx.settings.deletion.delete_source_files:
            keep = dt.timedelta(seconds=ctx.settings.deletion.source_retention_seconds)
            pkgs = s.execute(
                select(RawDataPackage.id, RawDataPackage.source_location_id, RawDataPackage.archived_at)
                .where(RawDataPackage.archived_at.is_not(None),
                       RawDataPackage.id.in_(select(RawDataFile.raw_data_package_id)
                                             .where(RawDataFile.source_deleted_at.is_(None))))
            ).all()
            for pkg_id, loc_id, archived_at in pkgs:
                if now < archived_at + keep:
                    waits.append((archived_at + keep - now).total_seconds())
                    continue
                site = ctx.topology.location_site[ctx.location_name(loc_id)]
                wanted[dedup_key(OperationKind.DELETION, f"rdp{pkg_id}", "source")] = dict(
                    physical_copy_id=None, source_location_id=loc_id, site_id=ctx.topology.site_ids[site],
                    raw_data_package_id=pkg_id, data_transfer_package_id=None)
        return new_only(s, wanted), (min(waits) if waits else None)

    wanted, wait = ctx.db.read(find)
    return create_missing(ctx, OperationKind.DELETION, wanted), wait
