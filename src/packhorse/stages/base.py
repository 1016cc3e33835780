"""What every stage shares: the claimed work, byte copying with verification, copy records.

A stage function takes a :class:`Work` (a claimed operation with its lease keeper) and does
the bytes outside any database transaction. It returns a :data:`Recorder`: a function run
inside the fenced completion transaction to record its results (physical copies, package
sizes). If the attempt is stale the transaction rolls back and nothing is recorded (I3).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import structlog
from sqlalchemy import insert, literal, select, update
from sqlalchemy.orm import Session

from packhorse.db.models import Operation, PhysicalCopy, utcnow
from packhorse.domain import LIVE_COPY_STATUSES, CopyStatus
from packhorse.errors import DestinationConflictError, SourceMissingError, VerificationError
from packhorse.operations.lease import LeaseKeeper
from packhorse.operations.lifecycle import Claim
from packhorse.runtime.context import ProcessContext
from packhorse.storage.base import CHUNK_BYTES, PendingWrite, PublishResult, StorageBackend

log = structlog.get_logger(__name__)

Recorder = Callable[[Session], None]


@dataclass(frozen=True)
class Records:
    """A :data:`Recorder` that several operations of one kind can run as one: ``record_many``
    records every ``item`` given it (one an operation) with a few statements for them all, not
    a few each (a database across a long link pays each statement in a round trip;
    :func:`packhorse.engine.worker.execute_task` gathers the items of a task's operations whose
    completions are all accepted). Called alone, it records its own ``item``: the completion of
    an operation run alone, or one in its own savepoint.

    ``record_many(session, items)`` must raise (the caller's transaction is then rolled back,
    and each operation's completion tried again in its own savepoint) rather than record part
    of what one item asks."""

    record_many: Callable[[Session, list[Any]], None]
    item: Any

    def __call__(self, session: Session) -> None:
        self.record_many(session, [self.item])


@dataclass
class Work:
    """One claimed operation being run: the claim, a snapshot of its row, its lease keeper.

    ``preloaded``: what the stage's first read would return, read for every operation of its
    task at once (:data:`packhorse.stages.PRELOADS`); ``None`` when run alone.

    ``salvage``: what an attempt that fails still records, because it is true whatever the
    failure (e.g. the raw packages an unpack published and verified before it met a refused
    member). A stage sets it before it raises; the failure path runs it in the same fenced
    transaction as the failure (:func:`~packhorse.engine.outcome.record_failure`), so a stale
    attempt records nothing (I3), and no verified object is left without its copy row.
    """

    ctx: ProcessContext
    claim: Claim
    op: Operation
    lease: LeaseKeeper
    info: dict[str, Any] = field(default_factory=dict)
    salvage: Recorder | None = None
    #: Taken by the stage once; a later read (a further round) reads for itself.
    preloaded: Any = None

    def check(self) -> None:
        """Stop (raise :class:`~packhorse.errors.LeaseLostError`) if the lease is lost."""
        self.lease.check()

    def progress(self, nbytes: int) -> None:
        """Count ``nbytes`` more payload bytes done; also checks the lease."""
        self.lease.add_bytes(nbytes)
        self.lease.check()


def verify_object(backend: StorageBackend, key: str, sha256: str, *, step: str = "verify") -> None:
    """Re-read ``key`` through ``backend`` and compare with ``sha256`` (I4).

    Raises:
        VerificationError: naming the location and key.
    """
    actual = backend.sha256(key)
    if actual != sha256:
        raise VerificationError(
            f"{backend.location}:{key}: read back sha256 {actual}, expected {sha256}",
            step=step, side="destination", path=key, host=backend.location,
        )


def already_there(backend: StorageBackend, key: str, size: int | None, sha256: str | None) -> bool:
    """True if ``key`` already holds exactly ``size`` bytes with ``sha256``; ``False`` if there
    is no object or nothing is known to compare with. Decided by the backend's
    :meth:`~packhorse.storage.base.StorageBackend.holds` (reading the object back), the one
    place that decides it. When it is there it is kept as a new publication would be
    (:meth:`~packhorse.storage.base.StorageBackend.adopt_existing`: in an Azure cold location
    it goes to the Archive tier), and partial writes of ``key`` left by a crashed writer are
    removed.

    Raises:
        DestinationConflictError: the key holds different bytes (I2): never overwritten.
        OperationDeferred: the object is in cold storage and not restored: its restore is
            requested and the operation waits for it (``AWAITING RESTORE``), no retry counted.
    """
    if sha256 is None or size is None:
        return False
    if not backend.holds(key, size, sha256):
        return False
    backend.adopt_existing(key)
    # a writer killed between publishing (a link) and removing its partial file left the partial:
    # the object is there and verified, so the partial is garbage (one held by a live writer is
    # left alone); it held a whole object's space unexplained (found by a trial)
    backend.remove_partials_of(key)
    return True


def there_or_moved_aside(backend: StorageBackend, key: str, size: int | None, sha256: str | None,
                         ctx: ProcessContext | None = None) -> bool:
    """:func:`already_there` for a buffer, where the key belongs to one artifact whose bytes are
    recorded: other bytes under it are that artifact's copy damaged at rest (found by ``verify``
    or the audit, which recorded it ``corrupt``, or by nobody yet). They are moved into the
    location's quarantine (never overwritten or deleted, I2) and ``False`` is returned, so the
    caller writes the artifact again instead of meeting a conflict it cannot leave (DESIGN.md
    "Converging"). Archives keep :func:`already_there`'s loud conflict: their bad copies are the
    fixity repair's, which quarantines after its own read-back. With ``ctx``, where the bytes
    went is recorded at once on the newest copy row of that key at that location
    (:func:`note_key_quarantined`), for ``packhorse locate``.

    Raises:
        DestinationConflictError: the quarantine name is taken (nothing moved).
    """
    try:
        return already_there(backend, key, size, sha256)
    except DestinationConflictError:
        moved = backend.quarantine(key)
        log.warning("buffer_copy_damaged_quarantined", location=backend.location, key=key, quarantined_as=moved,
                    expected_sha256=sha256)
        if ctx is not None and moved is not None and backend.location in ctx.topology.location_ids:
            loc_id = ctx.topology.location_ids[backend.location]
            ctx.db.transact(lambda s: note_key_quarantined(s, loc_id, key, moved))
        return False


def publish_verified(work: Work, pending: Any, backend: StorageBackend, *, expected_sha256: str | None,
                     point: str) -> PublishResult:
    """Publish a finished :class:`~packhorse.storage.PendingWrite` and verify it by re-reading
    (I4): after publishing, unless the write read its bytes back from the medium before it
    published them (:meth:`~packhorse.storage.base.PendingWrite.defer_hash`).

    Checks the lease just before publishing; hits the fault points ``<point>.write`` (before
    the lease check), ``<point>.publishing`` (after it, just before publishing) and
    ``<point>.published`` (between publishing and verification) of the context's hooks
    (:mod:`packhorse.runtime.hooks`).
    :func:`copy_object` also hits ``<point>.writing`` after its first chunk.
    """
    hooks = work.ctx.hooks
    hooks.hit(f"{point}.write")
    work.check()
    hooks.hit(f"{point}.publishing")  # after the last lease check: a stuck worker publishes late
    result = pending.publish(expected_sha256)
    hooks.hit(f"{point}.published")
    if not result.read_back:  # else read back from the medium before it was published
        verify_object(backend, pending.key, result.sha256)
    return result


def clear_partials(backend: StorageBackend, key: str) -> None:
    """Remove partial writes an earlier, crashed attempt left for ``key`` (disk backends; S3
    keeps unpublished bytes off the bucket, and incomplete multipart uploads are aborted by
    ``cleanup_partials``)."""
    backend.remove_partials_of(key)


def resume_partial(work: Work, f: BinaryIO, w: PendingWrite, size: int) -> bytes:
    """Verify the bytes ``w`` took over from an earlier attempt's partial against the source
    and keep the longest equal prefix (docs/reliability.md "Resumable transfers"; I4).

    Both are read: the source ``f`` (from its start) and the partial, block by block
    (:data:`CHUNK_BYTES`), compared byte for byte; the first block that differs (a crash's
    garbage tail, another object's bytes) and everything after it is dropped
    (:meth:`~packhorse.storage.base.PendingWrite.keep_prefix`), as is anything beyond ``size``.
    The source is read sequentially only (it need not be seekable).

    Returns:
        the source bytes read past the kept prefix (the differing block; often empty): the
        caller writes them first, then copies the rest of ``f``.

    Raises:
        LeaseLostError: the lease was lost meanwhile (nothing is published).
    """
    hasher = hashlib.sha256()
    limit = min(w.resumed_bytes, size)
    kept = 0
    leftover = b""
    a, b = bytearray(CHUNK_BYTES), bytearray(CHUNK_BYTES)
    with w.open_resumed() as p:
        while kept < limit:
            want = min(CHUNK_BYTES, limit - kept)
            n, m = _read_exactly(f, a, want), _read_exactly(p, b, want)
            if n != m or a[:n] != b[:m] or n != want:
                leftover = bytes(a[:n])
                break
            hasher.update(memoryview(a)[:n])
            kept += n
            work.progress(n)
    w.keep_prefix(kept, hasher)
    work.info.update(resumed_bytes=kept, partial_bytes_dropped=w.resumed_bytes - kept)
    log.info("partial_resumed", key=w.key, taken_over_bytes=w.resumed_bytes, kept_bytes=kept,
             to_write_bytes=size - kept)
    return leftover


def _read_exactly(f: BinaryIO, buf: bytearray, n: int) -> int:
    """Read up to ``n`` bytes into ``buf`` (looping over short reads); returns how many."""
    view = memoryview(buf)
    got = 0
    while got < n:
        r = f.readinto(view[got:n])  # type: ignore[attr-defined]
        if not r:
            break
        got += r
    return got


def copy_object(work: Work, src: StorageBackend, src_key: str, dst: StorageBackend, dst_key: str, *,
                size: int, sha256: str, point: str, resume: bool = False,
                to_buffer: bool = False) -> PublishResult:
    """Copy one object between backends, write-once, verified (I2, I4).

    If the destination already holds the same bytes nothing is written ("already there").
    The bytes are compared with ``sha256`` *before* publishing, so a bad copy is never
    published: read back from the medium once they are durable (disk,
    :meth:`~packhorse.storage.base.PendingWrite.defer_hash`: one pass over them), or hashed
    while copied and re-read after publishing (S3).

    With ``resume`` the write is resumable under the attempt's fencing token
    (:meth:`~packhorse.storage.base.StorageBackend.open_resumable_write`): the partial an
    interrupted earlier attempt left is verified against the source (:func:`resume_partial`)
    and only the rest is written; the result is checked exactly as a fresh copy's.

    With ``to_buffer`` the destination is a buffer: other bytes under ``dst_key`` are moved
    aside first (:func:`there_or_moved_aside`) instead of raising.

    Raises:
        DestinationConflictError: the destination holds different bytes (not ``to_buffer``).
        VerificationError: the bytes read from the source or back from the destination differ.
        LeaseLostError: the lease was lost; nothing is published.
    """
    if (there_or_moved_aside(dst, dst_key, size, sha256, work.ctx) if to_buffer
            else already_there(dst, dst_key, size, sha256)):
        return PublishResult(dst_key, size, sha256, already_there=True)
    if not resume:
        clear_partials(dst, dst_key)
    buf = bytearray(CHUNK_BYTES)
    view = memoryview(buf)
    with src.open_read(src_key) as f, (dst.open_resumable_write(dst_key, work.claim.attempt) if resume
                                       else dst.open_write(dst_key)) as w:
        # the expected sha256 is known: a backend that can read its bytes back before it
        # publishes them does so instead of hashing them here and re-reading them afterwards
        w.defer_hash()
        if w.resumed_bytes:
            leftover = resume_partial(work, f, w, size)
            if leftover:
                w.write(leftover)
                work.progress(len(leftover))
        first = True
        while True:
            n = f.readinto(buf)  # type: ignore[attr-defined]
            if not n:
                break
            w.write(view[:n])
            if first:
                work.ctx.hooks.hit(f"{point}.writing")
                first = False
            work.progress(n)
        return publish_verified(work, w, dst, expected_sha256=sha256, point=point)


def record_copy(session: Session, *, location_id: int, key: str, size: int, sha256: str,
                raw_data_package_id: int | None = None, data_transfer_package_id: int | None = None,
                verified_at: dt.datetime | None = None) -> int:
    """Record a verified, present copy unless a live one exists (idempotent; I3); returns its id.

    Runs in fenced completion transactions, inside the database's write lock: plain Core
    statements, no ORM objects.

    Raises:
        DestinationConflictError: a live copy at the location has other bytes (sha256).
    """
    t = PhysicalCopy.__table__
    subject = (t.c.raw_data_package_id == raw_data_package_id if raw_data_package_id is not None
               else t.c.data_transfer_package_id == data_transfer_package_id)
    conn = session.connection()
    live = (t.c.location_id == location_id, t.c.status.in_([s.value for s in LIVE_COPY_STATUSES]), subject)
    when = verified_at or utcnow()
    if conn.dialect.insert_returning:
        # the usual case in one statement (one round trip, not two): insert unless a live copy is there
        values = dict(raw_data_package_id=raw_data_package_id, data_transfer_package_id=data_transfer_package_id,
                      location_id=location_id, path=key, size=size, sha256=sha256, status=CopyStatus.PRESENT.value,
                      created_at=utcnow(), verified_at=when)
        new_id = conn.execute(insert(t).from_select(
            list(values), select(*(literal(v, t.c[k].type) for k, v in values.items()))
            .where(~select(t.c.id).where(*live).exists())).returning(t.c.id)).scalar()
        if new_id is not None:
            return int(new_id)
    existing = conn.execute(select(t.c.id, t.c.sha256).where(*live)).first()
    if existing is not None:
        if existing.sha256 != sha256:
            raise DestinationConflictError(
                f"copy record at location {location_id} has sha256 {existing.sha256}, new copy {sha256}")
        conn.execute(update(t).where(t.c.id == existing.id).values(verified_at=when))
        return int(existing.id)
    return int(conn.execute(insert(t).values(
        raw_data_package_id=raw_data_package_id, data_transfer_package_id=data_transfer_package_id,
        location_id=location_id, path=key, size=size, sha256=sha256, status=CopyStatus.PRESENT.value,
        created_at=utcnow(), verified_at=when)).inserted_primary_key[0])


def record_copies(session: Session, *, location_id: int, copies: Sequence[tuple[int, str, int, str]],
                  verified_at: dt.datetime | None = None) -> dict[int, int]:
    """:func:`record_copy` for several raw data packages' copies at one data location, in three
    statements at most for every :data:`COPIES_AT_ONCE` of them, not one a copy (an unpack
    records every package of its bundle, a task of builds or archive copies each of its
    packages; a database across a long link pays each statement in a round trip; one copy:
    :func:`record_copy`'s one statement): each is recorded as present and verified unless a
    live copy of its package is there; a live one with the same bytes is verified again (I3: a
    completion run twice). Like :func:`record_copy`, it relies on the operation's lease for
    being the only writer of that package's copy at that location.

    Args:
        copies: ``(raw data package id, key, size in bytes, sha256)`` of each copy.

    Returns:
        ``{raw data package id: its copy's id}``.

    Raises:
        DestinationConflictError: a live copy at the location has other bytes than one of
            ``copies`` (I2); nothing of the batch it is in is recorded (the caller's transaction
            is rolled back).
        ValueError: a package appears twice in ``copies``.
    """
    t = PhysicalCopy.__table__
    conn = session.connection()
    when = verified_at or utcnow()
    out: dict[int, int] = {}
    todo = list(copies)
    if len({c[0] for c in todo}) != len(todo):
        raise ValueError("record_copies: a raw data package appears twice")
    if len(todo) == 1:  # one statement where the database can (record_copy)
        pkg_id, key, size, sha = todo[0]
        return {pkg_id: record_copy(session, location_id=location_id, key=key, size=size, sha256=sha,
                                    raw_data_package_id=pkg_id, verified_at=verified_at)}
    for i in range(0, len(todo), COPIES_AT_ONCE):
        part = todo[i:i + COPIES_AT_ONCE]
        live = {r.raw_data_package_id: r for r in conn.execute(select(
            t.c.id, t.c.raw_data_package_id, t.c.sha256).where(
            t.c.location_id == location_id, t.c.status.in_([s.value for s in LIVE_COPY_STATUSES]),
            t.c.raw_data_package_id.in_([c[0] for c in part])))}
        for pkg_id, _, _, sha in part:
            if pkg_id in live and live[pkg_id].sha256 != sha:
                raise DestinationConflictError(
                    f"copy record of raw data package {pkg_id} at location {location_id} has sha256 "
                    f"{live[pkg_id].sha256}, new copy {sha}")
        again = sorted(live[c[0]].id for c in part if c[0] in live)
        if again:
            conn.execute(update(t).where(t.c.id.in_(again)).values(verified_at=when))
        out.update((pkg_id, int(live[pkg_id].id)) for pkg_id in live)
        new = [dict(raw_data_package_id=pkg_id, data_transfer_package_id=None, location_id=location_id, path=key,
                    size=size, sha256=sha, status=CopyStatus.PRESENT.value, created_at=utcnow(), verified_at=when)
               for pkg_id, key, size, sha in part if pkg_id not in live]
        if not new:
            continue
        if conn.dialect.insert_executemany_returning:  # one statement (SQLAlchemy's "insertmanyvalues")
            out.update((int(r.raw_data_package_id), int(r.id)) for r in conn.execute(
                insert(t).returning(t.c.id, t.c.raw_data_package_id), new))
        else:
            for row in new:
                out[row["raw_data_package_id"]] = int(conn.execute(insert(t).values(**row)).inserted_primary_key[0])
    return out


def record_copies_at(session: Session, copies: Sequence[tuple[int, int, str, int, str]]) -> None:
    """:func:`record_copies` of ``(data location id, raw data package id, key, size in bytes,
    sha256)`` copies at one or more locations, once per location."""
    by_location: dict[int, list[tuple[int, str, int, str]]] = {}
    for location_id, pkg_id, key, size, sha in copies:
        by_location.setdefault(location_id, []).append((pkg_id, key, size, sha))
    for location_id, at in by_location.items():
        record_copies(session, location_id=location_id, copies=at)


#: How many copies :func:`record_copies` records with one set of statements (bound parameters
#: of one statement stay well below every database's limit).
COPIES_AT_ONCE = 500


def mark_lost(session: Session, *, location_id: int, raw_data_package_id: int | None = None,
              data_transfer_package_id: int | None = None, seen_gone_at: dt.datetime | None = None,
              quarantined_as: str | None = None) -> int:
    """Record the present copy of an artifact at ``location_id`` as ``missing`` (a
    compare-and-set on ``present``, so a copy repaired, deleted or being deleted meanwhile is
    left alone). With ``seen_gone_at`` (UTC, when its key was found empty) only a copy recorded
    by then: one recorded since is a new copy (a rebuild that published the key after that
    look; marking it would ship it again for nothing). With ``quarantined_as``, the key its bytes
    were moved aside to is recorded with it (:func:`note_quarantined`). Returns the rows changed (0 or 1). The
    desired state then finds another source of the bytes (:mod:`packhorse.rules.convergence`)."""
    t = PhysicalCopy.__table__
    subject = (t.c.raw_data_package_id == raw_data_package_id if raw_data_package_id is not None
               else t.c.data_transfer_package_id == data_transfer_package_id)
    recorded_by = [t.c.created_at <= seen_gone_at] if seen_gone_at is not None else []
    return int(session.connection().execute(update(t).where(
        subject, t.c.location_id == location_id, t.c.status == CopyStatus.PRESENT.value, *recorded_by)
        .values(status=CopyStatus.MISSING.value, found_bad_at=utcnow(),
                **({"quarantined_as": quarantined_as, "quarantined_at": utcnow()} if quarantined_as else {})))
        .rowcount or 0)


def note_quarantined(session: Session, copy_id: int, quarantined_as: str) -> None:
    """Record on the physical copy ``copy_id`` that its bytes were moved aside to the key
    ``quarantined_as`` of its location (``_packhorse/quarantine/...``, what
    :meth:`~packhorse.storage.base.StorageBackend.quarantine` returned), now (UTC, the database
    clock). ``packhorse locate`` shows it as the copy's "quarantined" event. Written by the
    process that moved the bytes, as soon as they are moved: a fact about the location, true
    whether or not the attempt that moved them completes (I2: nothing is lost, and the
    operator can see where it went). A copy already noted keeps its first record."""
    session.execute(update(PhysicalCopy).where(PhysicalCopy.id == copy_id, PhysicalCopy.quarantined_as.is_(None))
                    .values(quarantined_as=quarantined_as, quarantined_at=utcnow()))


def copy_at(session: Session, location_id: int, key: str) -> int | None:
    """The id of the physical copy whose bytes stand at ``key`` of data location ``location_id``:
    the newest copy row there with that path (a key belongs to one artifact); ``None`` if none.
    Read before the bytes are moved aside, it cannot be a copy a rebuild records once the key is
    free."""
    return session.scalar(select(PhysicalCopy.id).where(
        PhysicalCopy.location_id == location_id, PhysicalCopy.path == key)
        .order_by(PhysicalCopy.id.desc()).limit(1))


def note_key_quarantined(session: Session, location_id: int, key: str, quarantined_as: str) -> None:
    """:func:`note_quarantined` for the copy whose bytes stood at ``key`` of data location
    ``location_id`` (:func:`copy_at`), unless it is already noted. Nothing when there is none."""
    copy_id = copy_at(session, location_id, key)
    if copy_id is not None:
        note_quarantined(session, copy_id, quarantined_as)


def _record_lost_on_failure(work: Work, *, location_id: int, raw_data_package_id: int | None,
                            data_transfer_package_id: int | None, seen_gone_at: dt.datetime | None = None,
                            quarantined_as: str | None = None) -> None:
    """Chain onto :attr:`Work.salvage` the recording of the copy at ``location_id`` as
    ``missing`` (:func:`mark_lost`), run in the attempt's fenced failure transaction (I3)."""
    earlier = work.salvage

    def salvage(s: Session) -> None:
        if earlier is not None:
            earlier(s)
        mark_lost(s, location_id=location_id, raw_data_package_id=raw_data_package_id,
                  data_transfer_package_id=data_transfer_package_id, seen_gone_at=seen_gone_at,
                  quarantined_as=quarantined_as)

    work.salvage = salvage


def note_corrupt_source(work: Work, backend: StorageBackend, key: str, *, expected_sha256: str, location_id: int,
                        data_transfer_package_id: int | None = None, raw_data_package_id: int | None = None) -> bool:
    """After a copy from ``key`` failed verification (:class:`~packhorse.errors.VerificationError`):
    read the source object again and, if its own sha256 is not ``expected_sha256`` (the bytes
    at rest rotted or were changed, not the transfer), move it aside into the location's
    quarantine (never overwritten or deleted, I2) and have this attempt's failure record the
    copy ``missing`` at its key (:attr:`Work.salvage`, fenced: I3), as :func:`note_lost_source`
    does for a copy that is gone. Where the bytes went is recorded on that copy at once
    (:func:`note_quarantined`, a fact about the location whether or not this attempt's failure
    is recorded). Returns whether it did.

    That is what keeps a corrupt bundle in a buffer from being a dead end (DESIGN.md
    "Converging"): its key is free again, so the bundle is rebuilt byte-identical from its
    packages and shipped, instead of every transfer failing and every rebuild meeting
    different bytes under the name (``DestinationConflictError``).

    Raises:
        LocationUnavailableError / StorageServiceError: the source cannot be read (nothing recorded).
        TransientDatabaseError: the database is away (the bytes may be moved aside already;
            this attempt's failure then records where, as above).
    """
    h = hashlib.sha256()
    try:
        with backend.open_read(key) as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except SourceMissingError:
        return note_lost_source(work, backend, key, location_id=location_id, raw_data_package_id=raw_data_package_id,
                                data_transfer_package_id=data_transfer_package_id)
    if h.hexdigest() == expected_sha256:
        return False  # the source is good: the transfer or the destination was at fault
    # the copy these bytes are, read while they still stand at the key (no rebuild can have
    # recorded a copy there yet)
    copy_id = work.ctx.db.read(lambda s: copy_at(s, location_id, key))
    moved = backend.quarantine(key)
    log.warning("source_copy_corrupt_quarantined", location=backend.location, key=key, quarantined_as=moved,
                sha256=h.hexdigest(), expected=expected_sha256)
    _record_lost_on_failure(work, location_id=location_id, raw_data_package_id=raw_data_package_id,
                            data_transfer_package_id=data_transfer_package_id, quarantined_as=moved)
    if moved is not None and copy_id is not None:
        # where the bytes went is recorded now, not only by this attempt's failure: another
        # attempt that met the key empty meanwhile (a transfer to another destination) may
        # record the copy missing first, and the failure's compare-and-set on "present" would
        # then record nothing (found by CI: `locate` showed no quarantine for a rotten bundle)
        work.ctx.db.transact(lambda s: note_quarantined(s, copy_id, moved))
    return True


def note_lost_source(work: Work, backend: StorageBackend, key: str, *, location_id: int,
                     raw_data_package_id: int | None = None, data_transfer_package_id: int | None = None) -> bool:
    """After reading ``key`` failed with :class:`~packhorse.errors.SourceMissingError`: if the
    backend confirms there is no object under ``key`` (``stat`` returns ``None``; a location
    that cannot be asked raises, and nothing is recorded), the failure of this attempt also
    records the copy ``missing`` (:attr:`Work.salvage`, in the same fenced transaction: a stale
    attempt records nothing, I3). Returns whether it will.

    That is what lets the pipeline converge (DESIGN.md "Converging"): a bundle deleted from
    a buffer before its transfer is rebuilt from its packages instead of staying "present"
    in the database for ever.
    """
    looked = utcnow()
    if backend.stat(key) is not None:
        return False
    # only the copy recorded before this look: a rebuild may publish and record a new one
    # before this attempt's failure is written (two transfers of a lost bundle, one failing
    # after the rebuild their first failure caused)
    _record_lost_on_failure(work, location_id=location_id, raw_data_package_id=raw_data_package_id,
                            data_transfer_package_id=data_transfer_package_id, seen_gone_at=looked)
    return True
