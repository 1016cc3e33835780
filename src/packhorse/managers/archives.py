"""Long-term archive manager: a raw package unpacked at a destination site goes into every
long-term archive location of that site."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..db.models import PhysicalCopy, RawDataPackage
from ..domain import CopyStatus, LocationRole, OperationKind
from ..operations import dedup_key
from ..context import ProcessContext
from .common import buffer_location_ids, create_missing, new_only


def manage(ctx: ProcessContext) -> int:
    """Create missing ``long_term_archive`` operations; returns how many."""

    def find(s: Session) -> dict[str, dict[str, Any]]:
        rows = s.execute(
            select(RawDataPackage.id, RawDataPackage.source_location_id, PhysicalCopy.location_id)
            .join(PhysicalCopy, PhysicalCopy.raw_data_package_id == RawDataPackage.id)
            .where(PhysicalCopy.location_id.in_(buffer_location_ids(ctx)),
                   PhysicalCopy.status == CopyStatus.PRESENT.value, RawDataPackage.archived_at.is_(None))
        ).all()
        wanted: dict[str, dict[str, Any]] = {}
        for pkg_id, src_loc_id, loc_id in rows:
            loc = ctx.location_name(loc_id)
            site = ctx.topology.location_site[loc]
            if ctx.topology.location_role[loc] is not LocationRole.BUFFER:
                continue
            if site == ctx.topology.location_site[ctx.location_name(src_loc_id)]:
                continue  # the source site's buffer: it ships bundles, it does not archive
            for lta in ctx.settings.locations_at(site, LocationRole.LONG_TERM_ARCHIVE):
                key = dedup_key(OperationKind.LONG_TERM_ARCHIVE, f"rdp{pkg_id}", lta.name)
                wanted[key] = dict(raw_data_package_id=pkg_id, source_location_id=loc_id,
                                   destination_location_id=ctx.topology.location_ids[lta.name],
                                   site_id=ctx.topology.site_ids[site])
        return new_only(s, wanted)

    return create_missing(ctx, OperationKind.LONG_TERM_ARCHIVE, ctx.db.read(find))
