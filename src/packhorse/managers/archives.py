"""Long-term archive manager: a raw package unpacked at a destination site goes into every
long-term archive location of that site."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..db.models import PhysicalCopy, RawDataPackage
from ..domain import CopyStatus, LocationRole, OperationKind
from ..operations import create_operation, dedup_key
from ..stages.base import StageContext
from .common import existing_keys


def manage(ctx: StageContext) -> int:
    """Create missing ``long_term_archive`` operations; returns how many."""

    def tx(s: Session) -> int:
        rows = s.execute(
            select(RawDataPackage.id, RawDataPackage.source_location_id, PhysicalCopy.location_id)
            .join(PhysicalCopy, PhysicalCopy.raw_data_package_id == RawDataPackage.id)
            .where(RawDataPackage.archived_at.is_(None), PhysicalCopy.status == CopyStatus.PRESENT.value)
        ).all()
        wanted: dict[str, tuple[int, int, int, int]] = {}
        for pkg_id, src_loc_id, loc_id in rows:
            loc = ctx.location_name(loc_id)
            site = ctx.topology.location_site[loc]
            if ctx.topology.location_role[loc] is not LocationRole.BUFFER:
                continue
            if site == ctx.topology.location_site[ctx.location_name(src_loc_id)]:
                continue  # the source site's buffer: it ships bundles, it does not archive
            for lta in ctx.settings.locations_at(site, LocationRole.LONG_TERM_ARCHIVE):
                key = dedup_key(OperationKind.LONG_TERM_ARCHIVE, f"rdp{pkg_id}", lta.name)
                wanted[key] = (pkg_id, loc_id, ctx.topology.location_ids[lta.name], ctx.topology.site_ids[site])
        n = 0
        have = existing_keys(s, wanted)
        for key, (pkg_id, src, dst, site_id) in wanted.items():
            if key not in have and create_operation(
                    s, kind=OperationKind.LONG_TERM_ARCHIVE, dedup_key=key, site_id=site_id,
                    max_retries=ctx.settings.recovery.max_retries, raw_data_package_id=pkg_id,
                    source_location_id=src, destination_location_id=dst):
                n += 1
        return n

    return ctx.db.transact(tx)
