"""``deletion``: free a buffer copy (or, if configured, the source files) once it is safe.

The safety rules of :func:`packhorse.rules.policy.deletion_blockers` are checked again when
the operation runs, in the transaction that marks the copy, not only when the operation was
created (I1): if one fails nothing is deleted and the deletion waits
(:class:`~packhorse.errors.DeletionNotSafeError`: handed back ``PENDING`` with a backoff, never
FAILED, made due again by the deletion manager once the rule holds). The manager planned it
when the rule held, so a rule that fails here is a precondition that changed since (a copy lost
and being made again, an archive copy found corrupt and being repaired, an operation still in
flight on the copy): waiting is right, deleting is not, and a human has nothing to do. The copy
is marked ``deletion_pending`` before its bytes go and ``deleted`` after, so a crash in
between is finished by the retry. The lease is renewed by the worker's heartbeat while the
bytes go, and the claim's fencing token makes sure one attempt alone records the deletion.
"""

from __future__ import annotations

import time

import structlog
from sqlalchemy import select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from packhorse.db.models import PhysicalCopy, RawDataFile, RawDataPackage, utcnow
from packhorse.domain import CopyStatus
from packhorse.errors import DeletionDeferredError, DeletionNotSafeError
from packhorse.rules import policy
from packhorse.runtime.context import ProcessContext
from packhorse.stages.base import Recorder, Work

log = structlog.get_logger(__name__)
#: ``confirmed_mtime_ns`` given to the registration of a source file found rewritten in place
#: (other bytes, the same size and mtime) when its archived package's source files were to be
#: deleted: no file has it, so the scan's next full listing sees the file differ from its
#: registration and registers its bytes as a new version (README "Versions").
SOURCE_REWRITTEN_MTIME_NS = -1


def mark_copy(s: Session, ctx: ProcessContext, copy_id: int) -> PhysicalCopy:
    """In the caller's write transaction: check the deletion rules for buffer copy ``copy_id``
    and mark it ``deletion_pending`` (a copy already ``deleted`` is returned as is).

    Raises:
        DeletionDeferredError: only operations still in flight on the copy block it.
        DeletionNotSafeError: any other rule blocks it (I1); nothing was changed. Both make
            the operation wait (:func:`packhorse.engine.worker._wait_for_deletion_rule`).
    """
    copy = s.get(PhysicalCopy, copy_id)
    assert copy is not None
    if copy.status == CopyStatus.DELETED.value:
        return copy
    blockers = policy.deletion_blockers(s, ctx, copy)
    if blockers:
        raise _blocked(s, ctx, copy, blockers, len(policy.operations_in_flight(s, copy)))
    copy.status = CopyStatus.DELETION_PENDING.value
    return copy


def mark_copies(s: Session, ctx: ProcessContext, copy_ids: list[int]) -> dict[int, PhysicalCopy | Exception]:
    """:func:`mark_copy` of each of ``copy_ids`` in the caller's write transaction, with the
    rules of all the raw package copies among them checked in one pass
    (:func:`~packhorse.rules.policy.deletion_blockers_many` with ``leaving``: each decided
    as if the copies before it were marked already), then each bundle copy by
    :func:`mark_copy`. Returns, by copy id, the copy (marked ``deletion_pending``, or already
    ``deleted``) or the exception that keeps it (:class:`~packhorse.errors.DeletionDeferredError`,
    :class:`~packhorse.errors.DeletionNotSafeError`: nothing of that copy changed).

    A fault of one copy (anything but the database's trouble) is that copy's verdict alone:
    when the one pass meets one, each copy is checked by :func:`mark_copy` in a savepoint of
    its own instead, as a single deletion would be.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database's trouble (nothing is marked).
    """
    copies = {c.id: c for c in s.scalars(select(PhysicalCopy).where(PhysicalCopy.id.in_(copy_ids)))}
    out: dict[int, PhysicalCopy | Exception] = {}
    raw = [copies[i] for i in copy_ids if i in copies and copies[i].raw_data_package_id is not None
           and copies[i].status != CopyStatus.DELETED.value]
    try:
        blockers = policy.deletion_blockers_many(s, ctx, raw, leaving=set()) if raw else {}
    except SQLAlchemyError:
        raise
    except Exception as exc:  # noqa: BLE001 - one copy's fault: each is checked on its own below
        log.warning("deletion_batch_checked_one_by_one", error=repr(exc))
        raw, blockers = [], {}
    for copy in raw:  # nothing was changed before this loop: the verdicts are the one pass's
        if blockers[copy.id]:
            out[copy.id] = _blocked(s, ctx, copy, blockers[copy.id], len(policy.operations_in_flight(s, copy)))
        else:
            copy.status = CopyStatus.DELETION_PENDING.value
            out[copy.id] = copy
    for i in copy_ids:  # bundle copies, already deleted ones, and all of them after a fault
        if i in out:
            continue
        if i not in copies:
            out[i] = LookupError(f"copy {i} is not in the database")
            continue
        try:
            with s.begin_nested():  # a blocked copy changes nothing; the others go on
                out[i] = mark_copy(s, ctx, i)
        except SQLAlchemyError:
            raise  # the database's trouble, not this copy's: every operation of the batch
        except Exception as exc:  # noqa: BLE001 - the rules block it (or a fault of this copy alone)
            out[i] = exc
    return out


def _blocked(s: Session, ctx: ProcessContext, copy: PhysicalCopy, blockers: list[str],
             in_flight: int) -> DeletionDeferredError | DeletionNotSafeError:
    """The error that keeps ``copy``: deferred when only operations in flight block it."""
    where = dict(step="deletion", path=copy.path, host=ctx.location_name(copy.location_id))
    message = f"copy {copy.id} at {ctx.location_name(copy.location_id)} may not be deleted: " + "; ".join(blockers)
    if in_flight == len(blockers):
        return DeletionDeferredError(message, **where)
    return DeletionNotSafeError(message, **where)


def delete_bytes(work: Work, copy: PhysicalCopy) -> None:
    """Delete a marked copy's bytes (nothing if it is already ``deleted``), checking the lease
    before and after the test-only fault point."""
    loc = work.ctx.location_name(copy.location_id)
    work.info.update(location=loc, key=copy.path)
    if copy.status != CopyStatus.DELETED.value:
        work.check()
        work.ctx.hooks.hit("deletion.delete")
        work.check()
        work.ctx.backend(loc).delete(copy.path)


def record_deleted(s: Session, copy_id: int) -> None:
    """In the fenced completion transaction: the copy is ``deleted`` (idempotent)."""
    s.execute(update(PhysicalCopy).where(PhysicalCopy.id == copy_id, PhysicalCopy.status != CopyStatus.DELETED.value)
              .values(status=CopyStatus.DELETED.value, deleted_at=utcnow()),
              execution_options={"synchronize_session": False})


def run(work: Work) -> Recorder:
    """Delete one buffer copy, or the source files of one archived package."""
    if work.op.physical_copy_id is None:
        return _delete_source_files(work)
    copy_id = work.op.physical_copy_id
    work.ctx.hooks.hit("deletion.start")  # hooks: claimed, the rules not checked yet
    delete_bytes(work, work.ctx.db.transact(lambda s: mark_copy(s, work.ctx, copy_id)))
    return lambda s: record_deleted(s, copy_id)


def _delete_source_files(work: Work) -> Recorder:
    ctx = work.ctx
    pkg_id = work.op.raw_data_package_id

    def load(s: Session) -> list[RawDataFile]:
        pkg = s.get(RawDataPackage, pkg_id)
        assert pkg is not None
        if pkg.archived_at is None:
            raise DeletionNotSafeError(f"package {pkg.name!r} is not archived; its source files stay",
                                       step="deletion", side="source")
        return list(s.scalars(select(RawDataFile).where(RawDataFile.raw_data_package_id == pkg_id,
                                                        RawDataFile.source_deleted_at.is_(None))))

    files = ctx.db.read(load)
    loc = ctx.location_name(work.op.source_location_id)
    backend = ctx.backend(loc)
    work.info.update(location=loc, files=len(files))
    quiet_for = ctx.settings.deletion.source_retention_seconds
    ids: list[int] = []
    rewritten: list[int] = []
    for f in files:
        work.check()
        info = backend.stat(f.relative_path)
        if info is None:
            ids.append(f.id)  # already gone
            continue
        unchanged = info.size == f.size and info.mtime_ns == f.mtime_ns
        quiet = time.time() - info.mtime >= quiet_for
        if unchanged and quiet:
            if backend.sha256(f.relative_path) == f.sha256:
                backend.delete(f.relative_path, prune=False)  # the instrument's folders stay
                ids.append(f.id)
                continue
            # other bytes under the same size and mtime (rewritten in place, its mtime put
            # back): not ours to delete, and not what was archived; the scan only compares size
            # and mtime, so its registration is made to differ (SOURCE_REWRITTEN_MTIME_NS): the
            # next full listing registers the new bytes as a new version, which is archived
            log.warning("source_file_rewritten_in_place", location=loc, path=f.relative_path,
                        registered_sha256=f.sha256)
            rewritten.append(f.id)
        # a file modified since registration (or too recently) is not ours to delete: it stays

    def record(s: Session) -> None:
        now = utcnow()
        for row in s.scalars(select(RawDataFile).where(RawDataFile.id.in_(ids))):
            row.source_deleted_at = now
        if rewritten:
            s.execute(update(RawDataFile).where(RawDataFile.id.in_(rewritten))
                      .values(confirmed_mtime_ns=SOURCE_REWRITTEN_MTIME_NS),
                      execution_options={"synchronize_session": False})

    return record
