"""Long-term archive manager: a raw package unpacked at a destination site goes into every
long-term archive location of that site that holds no copy of it yet.

Which archives still need a copy is derived from the copy rows (DESIGN.md "Converging"), not
from a stored "archived" flag: a location with a live copy is done; a location whose copy went
bad (``corrupt`` / ``missing``) is repaired by the fixity manager (quarantine, then a verified
copy: I2). A repair from a buffer copy that arrived again after its first operation (a
generation) comes from :func:`packhorse.rules.convergence.plan`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.db.models import PhysicalCopy, RawDataPackage
from packhorse.domain import CopyStatus, LocationRole, OperationKind
from packhorse.managers.wanted import buffer_location_ids, create_missing, new_only, planned
from packhorse.operations.lifecycle import dedup_key
from packhorse.runtime.context import ProcessContext

if TYPE_CHECKING:
    from packhorse.rules.convergence import Plan


def manage(ctx: ProcessContext, repairs: "Plan | None" = None) -> int:
    """Create missing ``long_term_archive`` operations; returns how many. ``repairs``: the
    cycle's repair plan (:func:`packhorse.managers.wanted.planned`)."""
    archive_ids = [i for n, i in ctx.topology.location_ids.items()
                   if ctx.topology.location_role.get(n) is LocationRole.LONG_TERM_ARCHIVE]

    def find(s: Session) -> dict[str, dict[str, Any]]:
        rows = s.execute(
            select(RawDataPackage.id, RawDataPackage.source_location_id, PhysicalCopy.location_id)
            .join(PhysicalCopy, PhysicalCopy.raw_data_package_id == RawDataPackage.id)
            .where(PhysicalCopy.location_id.in_(buffer_location_ids(ctx)),
                   PhysicalCopy.status == CopyStatus.PRESENT.value,
                   # archived_at follows the copies in the same transaction as every archive
                   # copy's status change (policy.refresh_archived), so an archived package
                   # holds a live copy at every archive: none of its rows can want work
                   RawDataPackage.archived_at.is_(None))
        ).all()
        if not rows:
            return {}
        # every copy row (any status) of these packages at an archive: a location that has one
        # is done (live) or the fixity repair's (bad)
        pkg_ids = sorted({r[0] for r in rows})
        held: set[tuple[int, int]] = set()
        for k in range(0, len(pkg_ids), 500):
            held.update((r[0], r[1]) for r in s.execute(select(PhysicalCopy.raw_data_package_id, PhysicalCopy.location_id).where(
                PhysicalCopy.raw_data_package_id.in_(pkg_ids[k:k + 500]),
                PhysicalCopy.location_id.in_(archive_ids))).all())
        wanted: dict[str, dict[str, Any]] = {}
        for pkg_id, src_loc_id, loc_id in rows:
            loc = ctx.location_name(loc_id)
            site = ctx.topology.location_site[loc]
            if ctx.topology.location_role[loc] is not LocationRole.BUFFER:
                continue
            if site == ctx.topology.location_site[ctx.location_name(src_loc_id)]:
                continue  # the source site's buffer: it ships bundles, it does not archive
            for lta in ctx.settings.locations_at(site, LocationRole.LONG_TERM_ARCHIVE):
                lta_id = ctx.topology.location_ids[lta.name]
                if (pkg_id, lta_id) in held:
                    continue
                key = dedup_key(OperationKind.LONG_TERM_ARCHIVE, f"rdp{pkg_id}", lta.name)
                wanted[key] = dict(raw_data_package_id=pkg_id, source_location_id=loc_id,
                                   destination_location_id=lta_id, site_id=ctx.topology.site_ids[site])
        return new_only(s, wanted)

    return create_missing(ctx, OperationKind.LONG_TERM_ARCHIVE,
                          {**ctx.db.read(find), **planned(ctx, OperationKind.LONG_TERM_ARCHIVE, repairs)})
