"""Staging requests: ``packhorse stage NAME --to LOCATION`` creates ``staging``
operations; ``packhorse run`` (or a Celery worker) runs them like any other operation.

There is no periodic staging manager: staging happens on request only. A request is
idempotent: the dedup key is (package, processing location), so staging the same package to
the same place twice creates nothing new.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from packhorse.db.models import Operation, PhysicalCopy, RawDataPackage, utcnow
from packhorse.domain import CopyStatus, LocationRole, OperationKind, Status, StorageType
from packhorse.errors import ConfigError, NothingToStageError
from packhorse.operations.lifecycle import create_operation, dedup_key
from packhorse.rules.staged_copies import check_staged
from packhorse.runtime.context import ProcessContext


def request_staging(ctx: ProcessContext, name: str, location: str, *, again: bool = False) -> list[dict[str, Any]]:
    """Create ``staging`` operations for every archived raw data package called ``name`` or
    holding observation unit ``name`` (the last part of its group path, or the whole path).

    ``again``: stage a package whose staged folder was removed (or no longer verifies) once
    more: its staged copy is recorded ``missing`` or ``corrupt`` (as found) and a new
    staging operation is created, which moves a damaged folder aside into the location's
    quarantine before it extracts a verified archive copy (:mod:`packhorse.stages.staging`).
    A staged copy that still verifies is left as it is, and so is a staging operation still
    under way.

    Returns:
        ``[{"package", "operation_id", "created", "status"}]``, one per package.

    Raises:
        ConfigError: ``location`` is unknown, not a ``processing`` location, or not on disk.
        NothingToStageError: no package matches, or none has a present archive copy yet.
    """
    try:
        loc = ctx.settings.location(location)
    except KeyError:
        raise ConfigError(f"--to: unknown data location {location!r}") from None
    if loc.role is not LocationRole.PROCESSING:
        raise ConfigError(f"--to: {location!r} has role {loc.role.value!r}; staging goes to a 'processing' location")
    if loc.storage is not StorageType.DISK:
        raise ConfigError(f"--to: {location!r} is not on disk; staged packages are extracted into a folder")
    loc_id = ctx.topology.location_ids[location]
    site_id = ctx.topology.site_ids[loc.site]
    archives = [ctx.topology.location_ids[l.name] for l in ctx.settings.locations
                if l.role is LocationRole.LONG_TERM_ARCHIVE]

    def tx(s: Session) -> list[dict[str, Any]]:
        pkgs = list(s.scalars(select(RawDataPackage).where(or_(
            RawDataPackage.name == name, RawDataPackage.group_path == name,
            RawDataPackage.group_path.like(f"%/{name}"))).order_by(RawDataPackage.name)))
        if not pkgs:
            raise NothingToStageError(f"no raw data package or observation unit called {name!r}")
        out = []
        for p in pkgs:
            archived = s.scalar(select(PhysicalCopy.id).where(
                PhysicalCopy.raw_data_package_id == p.id, PhysicalCopy.location_id.in_(archives),
                PhysicalCopy.status == CopyStatus.PRESENT.value).limit(1))
            if archived is None:
                out.append({"package": p.name, "operation_id": None, "created": False,
                            "status": "not archived yet"})
                continue
            key = dedup_key(OperationKind.STAGING, f"rdp{p.id}", location)
            if again:
                key = _restage_key(s, ctx, p, loc_id, location, key)
            op = create_operation(s, kind=OperationKind.STAGING, dedup_key=key, site_id=site_id,
                                  max_retries=ctx.settings.recovery.max_retries, raw_data_package_id=p.id,
                                  destination_location_id=loc_id)
            existing = op or s.scalars(select(Operation).where(Operation.dedup_key == key)).one()
            out.append({"package": p.name, "operation_id": existing.id, "created": op is not None,
                        "status": existing.status})
        if all(o["operation_id"] is None for o in out):
            raise NothingToStageError(f"{name!r}: {len(out)} package(s), none archived yet; stage after archiving")
        return out

    return ctx.db.transact(tx)


def _restage_key(s: Session, ctx: ProcessContext, pkg: RawDataPackage, loc_id: int, location: str,
                 key: str) -> str:
    """The dedup key for staging ``pkg`` again: the latest staging operation's key while it is
    unfinished or its staged folder still verifies, else a new one (``…#2``, ``…#3``) after the
    gone or bad staged copy is recorded as found (``missing`` / ``corrupt``)."""
    keys = list(s.scalars(select(Operation.dedup_key).where(
        or_(Operation.dedup_key == key, Operation.dedup_key.startswith(f"{key}#", autoescape=True)))))
    if not keys:
        return key
    latest = max(keys, key=lambda k: int(k.rpartition("#")[2]) if "#" in k else 1)
    op = s.scalars(select(Operation).where(Operation.dedup_key == latest)).one()
    if op.status != Status.COMPLETED.value:
        return latest  # under way (or FAILED: `packhorse reset` it)
    copy = s.scalars(select(PhysicalCopy).where(
        PhysicalCopy.raw_data_package_id == pkg.id, PhysicalCopy.location_id == loc_id,
        PhysicalCopy.status == CopyStatus.PRESENT.value)).first()
    if copy is not None:
        found = check_staged(ctx, {"copy_id": copy.id, "location": location, "package": pkg.name, "path": copy.path})
        if found["status"] == "ok":
            return latest
        copy.status, copy.found_bad_at = found["status"], utcnow()
    n = max(int(k.rpartition("#")[2]) if "#" in k else 1 for k in keys) + 1
    return f"{key}#{n}"
