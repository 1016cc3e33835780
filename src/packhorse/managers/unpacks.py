"""Unpack manager: a bundle that arrived at a destination buffer is unpacked there."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..db.models import DataTransferPackage, PhysicalCopy
from ..domain import CopyStatus, OperationKind
from ..operations import create_operation, dedup_key
from ..stages.base import StageContext
from .common import existing_keys


def manage(ctx: StageContext) -> int:
    """Create missing ``unpack`` operations; returns how many."""

    def tx(s: Session) -> int:
        rows = s.execute(
            select(DataTransferPackage.id, DataTransferPackage.source_site_id, PhysicalCopy.location_id)
            .join(PhysicalCopy, PhysicalCopy.data_transfer_package_id == DataTransferPackage.id)
            .where(PhysicalCopy.status == CopyStatus.PRESENT.value)
        ).all()
        wanted: dict[str, tuple[int, int, int]] = {}
        for dtp_id, site_id, loc_id in rows:
            loc = ctx.location_name(loc_id)
            loc_site = ctx.topology.location_site[loc]
            if loc_site == ctx.topology.site_name(site_id):
                continue  # the source buffer: nothing to unpack there
            wanted[dedup_key(OperationKind.UNPACK, f"dtp{dtp_id}", loc)] = (dtp_id, loc_id,
                                                                              ctx.topology.site_ids[loc_site])
        n = 0
        have = existing_keys(s, wanted)
        for key, (dtp_id, loc_id, site_id) in wanted.items():
            if key not in have and create_operation(
                    s, kind=OperationKind.UNPACK, dedup_key=key, site_id=site_id,
                    max_retries=ctx.settings.recovery.max_retries, data_transfer_package_id=dtp_id,
                    source_location_id=loc_id, destination_location_id=loc_id):
                n += 1
        return n

    return ctx.db.transact(tx)
