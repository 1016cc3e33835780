"""Transfer manager: a bundle built at the source buffer goes to every destination site's buffer.

The operation belongs to the destination site (its workers pull the bundle).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..db.models import DataTransferPackage, PhysicalCopy
from ..domain import CopyStatus, OperationKind
from ..operations import create_operation, dedup_key
from ..stages.base import StageContext
from .common import existing_keys


def manage(ctx: StageContext) -> int:
    """Create missing ``transfer`` operations; returns how many."""

    def tx(s: Session) -> int:
        rows = s.execute(
            select(DataTransferPackage.id, DataTransferPackage.source_site_id, PhysicalCopy.location_id)
            .join(PhysicalCopy, PhysicalCopy.data_transfer_package_id == DataTransferPackage.id)
            .where(PhysicalCopy.status == CopyStatus.PRESENT.value)
        ).all()
        wanted: dict[str, dict[str, int]] = {}
        for dtp_id, site_id, loc_id in rows:
            site = ctx.topology.site_name(site_id)
            route = ctx.settings.route_from(site)
            if route is None or ctx.location_name(loc_id) != ctx.settings.buffer_of(site).name:
                continue
            for dest in route.destination_sites:
                dest_buf = ctx.settings.buffer_of(dest).name
                key = dedup_key(OperationKind.TRANSFER, f"dtp{dtp_id}", dest_buf)
                wanted[key] = dict(dtp=dtp_id, src=loc_id, dst=ctx.topology.location_ids[dest_buf],
                                   site=ctx.topology.site_ids[dest])
        n = 0
        have = existing_keys(s, wanted)
        for key, w in wanted.items():
            if key in have:
                continue
            if create_operation(s, kind=OperationKind.TRANSFER, dedup_key=key, site_id=w["site"],
                                max_retries=ctx.settings.recovery.max_retries, data_transfer_package_id=w["dtp"],
                                source_location_id=w["src"], destination_location_id=w["dst"]):
                n += 1
        return n

    return ctx.db.transact(tx)
