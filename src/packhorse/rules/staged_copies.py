"""Staged copies (packages extracted into ``processing`` locations by ``packhorse stage``):
checking them (``packhorse verify``) and finding the ones whose folder is gone.

A staged copy is a bag folder ``<processing location>/<package name>/``. It is checked the way
staging checked it before publishing (:func:`packhorse.bags.packaging.verify_bag_folder`: every
manifest, the tag manifests, the Payload-Oxum; RFC 8493). Staged copies are working copies for
processing, not archive copies: a bad one is reported (``verify`` exits 1) and never counts
for or against archiving or deletion (I1); ``packhorse stage NAME --to LOC --again`` makes a
fresh one.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.bags.packaging import verify_bag_folder
from packhorse.db.models import DataLocation, PhysicalCopy, RawDataPackage
from packhorse.domain import CopyStatus, LocationRole
from packhorse.errors import PackhorseError
from packhorse.runtime.context import ProcessContext


def staged_copies(session: Session, location: str | None = None) -> list[dict[str, Any]]:
    """Present copies at processing locations: ``[{"copy_id", "location", "package", "path"}]``."""
    q = (select(PhysicalCopy.id, DataLocation.name, RawDataPackage.name, PhysicalCopy.path)
         .join(DataLocation, DataLocation.id == PhysicalCopy.location_id)
         .join(RawDataPackage, RawDataPackage.id == PhysicalCopy.raw_data_package_id)
         .where(PhysicalCopy.status == CopyStatus.PRESENT.value, DataLocation.role == LocationRole.PROCESSING.value)
         .order_by(PhysicalCopy.id))
    if location:
        q = q.where(DataLocation.name == location)
    return [{"copy_id": i, "location": loc, "package": pkg, "path": path} for i, loc, pkg, path in session.execute(q)]


def check_staged(ctx: ProcessContext, copy: dict[str, Any]) -> dict[str, Any]:
    """Check one staged copy (a row of :func:`staged_copies`) on disk. Returns the row with
    ``"status"``: ``ok``, ``missing`` (no folder) or ``corrupt`` (not a valid bag, or other
    bytes than its manifests), and ``"error"`` (why) unless ok."""
    root = ctx.settings.location_path(copy["location"])
    folder = root / copy["path"]
    if not folder.resolve().is_relative_to(root.resolve()):
        return {**copy, "status": CopyStatus.CORRUPT.value, "error": "the path leaves the location root"}
    if not folder.is_dir():
        return {**copy, "status": CopyStatus.MISSING.value, "error": f"{folder} does not exist"}
    try:
        verify_bag_folder(folder, source=f"{copy['location']}:{copy['path']}")
    except (PackhorseError, OSError) as e:
        return {**copy, "status": CopyStatus.CORRUPT.value, "error": str(e)}
    return {**copy, "status": "ok"}


def verify_staged(ctx: ProcessContext, location: str | None = None) -> list[dict[str, Any]]:
    """:func:`check_staged` of every staged copy (optionally of one location); nothing is
    recorded (a staged folder is the processing team's to change)."""
    return [check_staged(ctx, c) for c in ctx.db.read(lambda s: staged_copies(s, location))]
