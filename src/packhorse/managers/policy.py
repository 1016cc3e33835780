"""When is a package archived, and when may a copy go (DESIGN.md I1).

* A raw data package is *archived* when every active ``long_term_archive`` location of every
  destination site of its route holds a present, verified copy.
* A buffer copy of a raw data package may be deleted only when at least
  ``deletion.archive_copies_required`` (default: that same number of archives) verified
  archive copies exist elsewhere, and the buffer's ``retention_seconds`` has passed.
* A bundle copy may be deleted only when every destination site holds a present, verified
  copy of every raw data package the bundle carries (and, again, after retention).
* Source files go only with ``delete_source_files = true``, once the package is archived.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..db.models import DataLocation, PhysicalCopy, RawDataPackage, utcnow
from ..domain import CopyStatus, LocationRole
from ..stages.base import StageContext


def source_site_of_package(ctx: StageContext, pkg: RawDataPackage) -> str:
    """The site of the package's source location."""
    return ctx.topology.location_site[ctx.location_name(pkg.source_location_id)]


def archive_locations(ctx: StageContext, source_site: str) -> list[str]:
    """Names of every active long-term archive of every destination site of the route."""
    route = ctx.settings.route_from(source_site)
    if route is None:
        return []
    return [l.name for d in route.destination_sites for l in ctx.settings.locations_at(d, LocationRole.LONG_TERM_ARCHIVE)]


def archive_copies_required(ctx: StageContext, source_site: str) -> int:
    """Verified archive copies needed before buffer copies of the site's packages may go."""
    configured = ctx.settings.deletion.archive_copies_required
    return configured if configured is not None else len(archive_locations(ctx, source_site))


def verified_archive_copies(session: Session, pkg_id: int) -> int:
    """Present, verified copies of the package at long-term archive locations."""
    return session.scalar(
        select(func.count()).select_from(PhysicalCopy).join(DataLocation, DataLocation.id == PhysicalCopy.location_id)
        .where(PhysicalCopy.raw_data_package_id == pkg_id, PhysicalCopy.status == CopyStatus.PRESENT.value,
               PhysicalCopy.verified_at.is_not(None), DataLocation.role == LocationRole.LONG_TERM_ARCHIVE.value)
    ) or 0


def is_archived(session: Session, ctx: StageContext, pkg: RawDataPackage) -> bool:
    """True when every required archive location holds a present, verified copy."""
    needed = {ctx.topology.location_ids[n] for n in archive_locations(ctx, source_site_of_package(ctx, pkg))}
    if not needed:
        return False
    have = set(session.scalars(
        select(PhysicalCopy.location_id).where(
            PhysicalCopy.raw_data_package_id == pkg.id, PhysicalCopy.status == CopyStatus.PRESENT.value,
            PhysicalCopy.verified_at.is_not(None))
    ))
    return needed <= have


def mark_archived_if_complete(session: Session, ctx: StageContext, pkg_id: int) -> bool:
    """Set ``archived_at`` once the package is archived; returns whether it is.

    The package row is locked first (``SELECT … FOR NO KEY UPDATE`` on PostgreSQL, which does
    not conflict with the key-share lock the copy's foreign key took): two archive
    completions of one package at two sites commit concurrently, and without the lock neither
    would see the other's copy, so the package would never be marked archived (and its buffer
    copies never freed). The second waits for the first and then sees its copy.
    """
    pkg = session.get(RawDataPackage, pkg_id, with_for_update={"key_share": True})
    assert pkg is not None
    if pkg.archived_at is None and is_archived(session, ctx, pkg):
        pkg.archived_at = utcnow()
    return pkg.archived_at is not None


def retention_passed(ctx: StageContext, copy: PhysicalCopy, since: dt.datetime, now: dt.datetime) -> bool:
    """True when the copy's location retention has passed since ``since``."""
    loc = ctx.settings.location(ctx.location_name(copy.location_id))
    return now >= since + dt.timedelta(seconds=loc.retention_seconds)


def may_delete_raw_copy(session: Session, ctx: StageContext, copy: PhysicalCopy) -> bool:
    """Whether this (non-archive) raw package copy may go now (retention aside)."""
    if ctx.topology.location_role[ctx.location_name(copy.location_id)] is LocationRole.LONG_TERM_ARCHIVE:
        return False
    pkg = session.get(RawDataPackage, copy.raw_data_package_id)
    assert pkg is not None
    if not is_archived(session, ctx, pkg):
        return False
    return verified_archive_copies(session, pkg.id) >= archive_copies_required(ctx, source_site_of_package(ctx, pkg))


def may_delete_bundle_copy(session: Session, ctx: StageContext, dtp_id: int, source_site: str) -> bool:
    """Whether a bundle copy may go: every destination site holds a verified copy of every package."""
    route = ctx.settings.route_from(source_site)
    if route is None:
        return False
    pkg_ids = list(session.scalars(select(RawDataPackage.id).where(RawDataPackage.data_transfer_package_id == dtp_id)))
    if not pkg_ids:
        return False
    for dest in route.destination_sites:
        loc_ids = [i for n, i in ctx.topology.location_ids.items() if ctx.topology.location_site.get(n) == dest]
        covered = set(session.scalars(
            select(PhysicalCopy.raw_data_package_id).where(
                PhysicalCopy.raw_data_package_id.in_(pkg_ids), PhysicalCopy.location_id.in_(loc_ids),
                PhysicalCopy.status == CopyStatus.PRESENT.value, PhysicalCopy.verified_at.is_not(None))
        ))
        if covered != set(pkg_ids):
            return False
    return True
