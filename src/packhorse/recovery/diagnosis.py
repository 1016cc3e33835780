"""Diagnoses from the ops database alone, for permanent failures raised without one (seed 002 "Diagnosing and Resetting a Stuck or Failed Operation").

:func:`diagnose` looks at what packhorse itself recorded — deletion operations, deleted or
missing physical copies, deleted source files, inactive locations — and returns one
cause-oriented line such as ``"source missing: deletion operation 41 removed
fyst-buffer:bundles/b1.tar at 2026-11-30T01:02:03+00:00"``. The failure path stores it with
``diagnosis_source = "auto-db"``. It never touches storage, and a diagnoser that fails must not
block recording the failure: :func:`safe_diagnose` swallows (and logs) any error.
"""

from __future__ import annotations

import datetime as dt

import structlog
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from packhorse.db.models import DataLocation, Operation, PhysicalCopy, RawDataFile
from packhorse.db.session import Database
from packhorse.domain import CopyStatus, OperationKind, Status
from packhorse.errors import SourceMissingError

log = structlog.get_logger(__name__)

#: The value of ``diagnosis_source`` for a diagnosis made here.
AUTO_DB = "auto-db"


def _when(t: dt.datetime | None) -> str:
    return t.isoformat(timespec="seconds") if t else "an unrecorded time"


def _deletion_of_copy(s: Session, copy: PhysicalCopy) -> Operation | None:
    return s.scalars(select(Operation).where(Operation.kind == OperationKind.DELETION.value,
                                            Operation.physical_copy_id == copy.id)
                     .order_by(Operation.id.desc())).first()


def _source_missing(s: Session, op: Operation, path: str | None) -> str:
    loc_names = {l.id: l.name for l in s.scalars(select(DataLocation))}
    # a copy of this operation's artifact that packhorse deleted or found missing
    artifact = []
    if op.raw_data_package_id is not None:
        artifact.append(PhysicalCopy.raw_data_package_id == op.raw_data_package_id)
    if op.data_transfer_package_id is not None:
        artifact.append(PhysicalCopy.data_transfer_package_id == op.data_transfer_package_id)
    if op.physical_copy_id is not None:
        artifact.append(PhysicalCopy.id == op.physical_copy_id)
    if artifact:
        stmt = select(PhysicalCopy).where(or_(*artifact), PhysicalCopy.status.in_(
            [CopyStatus.DELETED.value, CopyStatus.DELETION_PENDING.value, CopyStatus.MISSING.value]))
        if op.source_location_id is not None and op.physical_copy_id is None:
            stmt = stmt.where(PhysicalCopy.location_id == op.source_location_id)
        if path:
            stmt = stmt.where(PhysicalCopy.path == path)
        for copy in s.scalars(stmt.order_by(PhysicalCopy.id.desc())):
            where = f"{loc_names.get(copy.location_id, copy.location_id)}:{copy.path}"
            deletion = _deletion_of_copy(s, copy)
            if deletion is not None and deletion.id != op.id:
                verb = "removed" if deletion.status == Status.COMPLETED.value else f"is removing ({deletion.status})"
                return (f"source missing: deletion operation {deletion.id} {verb} {where} at "
                        f"{_when(deletion.finished_at or copy.deleted_at)}")
            if copy.status == CopyStatus.MISSING.value:
                return f"source missing: {where} was already recorded as missing (physical copy {copy.id})"
    # a raw source file that packhorse deleted after archiving
    if path:
        stmt = select(RawDataFile).where(RawDataFile.relative_path == path, RawDataFile.source_deleted_at.is_not(None))
        if op.source_location_id is not None:
            stmt = stmt.where(RawDataFile.location_id == op.source_location_id)
        f = s.scalars(stmt).first()
        if f is not None:
            deletion = s.scalars(select(Operation).where(
                Operation.kind == OperationKind.DELETION.value, Operation.raw_data_package_id == f.raw_data_package_id,
                Operation.physical_copy_id.is_(None)).order_by(Operation.id.desc())).first()
            who = f"deletion operation {deletion.id}" if deletion is not None else "source file deletion"
            return f"source missing: {who} removed source file {path} at {_when(f.source_deleted_at)}"
    if op.source_location_id is not None:
        loc = s.get(DataLocation, op.source_location_id)
        if loc is not None and not loc.active:
            return f"source missing: data location {loc.name} is marked inactive in the configuration"
    what = path or "the source"
    return (f"source missing: no packhorse operation removed {what}; it was deleted or moved outside "
            "packhorse, or its storage is not mounted")


def diagnose(session: Session, op: Operation, exc: BaseException) -> str | None:
    """A diagnosis of ``exc`` (a permanent failure of ``op``) from the database, or ``None``.

    Knows: missing sources (:class:`~packhorse.errors.SourceMissingError`,
    ``FileNotFoundError``). Other errors get ``None``.
    """
    if isinstance(exc, SourceMissingError) or (isinstance(exc, FileNotFoundError)):
        path = getattr(exc, "path", None) if isinstance(exc, SourceMissingError) else None
        return _source_missing(session, op, path)
    return None


def safe_diagnose(db: Database, operation_id: int, exc: BaseException) -> str | None:
    """:func:`diagnose` in its own read-only unit of work; any error is logged and gives ``None``
    (a failing diagnoser never blocks recording or notifying the failure)."""
    try:
        def q(s: Session) -> str | None:
            op = s.get(Operation, operation_id)
            return diagnose(s, op, exc) if op is not None else None

        return db.read(q, attempts=2)
    except Exception as e:
        log.warning("auto_diagnosis_failed", operation_id=operation_id, error=repr(e))
        return None
