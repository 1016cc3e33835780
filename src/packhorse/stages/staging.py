"""``staging``: get an archived raw data package back out into a ``processing`` location.

1. If a live copy of the package is already recorded at the processing location, there is
   nothing to do (staging twice is a no-op).
2. The source is the nearest ``present`` long-term-archive copy: warm before cold, the
   processing location's own site first, the most recently verified first.
3. A cold source (``cold = true``) must be restored first: the stage requests the restore
   and raises :class:`~packhorse.errors.OperationDeferred`, so the operation goes back to
   ``PENDING`` until ``restore_poll_seconds`` later, without holding a worker; the worker that
   picks it up again finds the restore ready and goes on.
4. Check pass, nothing written: the package tar is streamed out of the archive through the
   one tar reader (:mod:`packhorse.bags.extraction`: no links, devices, duplicates, ``..``, names
   merged by normalization, members beyond the ``[extraction]`` limits; I6) and the bag
   checks (:func:`~packhorse.bags.packaging.verify_bag_archive`: manifest, tag manifest,
   Payload-Oxum), hashed while read; it must be exactly the package's size and sha256. An
   archive copy with other bytes fails with :class:`~packhorse.errors.SourceChangedError`
   and a refused member with :class:`~packhorse.errors.UnsafePathError`, both permanent:
   the operation is not retried and the processing location is never written to.
5. Extraction pass: the copy is read again and extracted with
   :func:`~packhorse.bags.extraction.extract_tar` (descriptor-relative, ``O_NOFOLLOW``,
   ``O_EXCL``) into a hidden partial folder the processing location's disk backend hands out
   (:meth:`~packhorse.storage.disk.DiskBackend.open_folder_write`), hashed again; if
   the bytes differ from the first pass (the copy changed in between) the folder is removed
   and the operation fails permanently. The extracted bag is then validated to RFC 8493 (:mod:`~packhorse.bags.validation`:
   every manifest, every payload file, the tag manifests and the Payload-Oxum).
6. The backend publishes the bag folder under ``<package name>/`` with a no-replace rename
   (I2); an existing folder from an earlier attempt counts only if it verifies the same way,
   else the operation fails (:class:`~packhorse.errors.DestinationConflictError`) and leaves it
   untouched. Staging again (``packhorse stage --again``, which records the staged copy it found
   damaged ``corrupt``): a staged folder of the package that no longer verifies is first moved
   aside whole into the location's quarantine
   (:meth:`~packhorse.storage.disk.DiskBackend.quarantine_folder`:
   ``_packhorse/quarantine/<name>.<UTC stamp>-<random>``, never overwritten or deleted), with
   an INFO notification naming where it went. A crashed attempt's partial folder is removed by
   the start-up sweep.
7. The completion transaction records the staged copy (path = that folder).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.bags.extraction import ExtractionLimits, extract_tar, remove_target
from packhorse.bags.packaging import BagContents, verify_bag_archive, verify_bag_folder
from packhorse.db.models import PhysicalCopy, RawDataPackage
from packhorse.domain import LIVE_COPY_STATUSES, CopyStatus, LocationRole, NotificationLevel, OperationKind
from packhorse.errors import (
    DestinationConflictError,
    InvalidBagError,
    OperationDeferred,
    SourceChangedError,
    SourceMissingError,
    UnsafePathError,
    VerificationError,
)
from packhorse.notify.outbox import enqueue
from packhorse.stages.base import Recorder, Work, note_quarantined, record_copy
from packhorse.storage.base import CHUNK_BYTES, StorageBackend

#: Statuses of a staged copy recorded damaged or gone (by ``packhorse stage --again``).
_BAD_STAGED = (CopyStatus.CORRUPT.value, CopyStatus.MISSING.value)


class _HashingReader:
    """Reads through ``stream``, hashing and counting; calls ``on_block(bytes)`` per block
    (lease checks, progress).

    Raises:
        SourceChangedError: the stream goes on past ``limit`` bytes (the package's size).
    """

    def __init__(self, stream: Any, *, limit: int, source: str, on_block: Callable[[int], None]) -> None:
        self.stream, self.limit, self.source, self.on_block = stream, limit, source, on_block
        self.hash = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self.stream.read(n if n and n > 0 else CHUNK_BYTES)
        if data:
            self.hash.update(data)
            self.size += len(data)
            if self.size > self.limit:
                raise SourceChangedError(f"{self.source}: the archive copy is longer than the package's "
                                         f"{self.limit} bytes", step="staging", side="source")
            self.on_block(len(data))
        return data

    def drain(self) -> None:
        while self.read(CHUNK_BYTES):
            pass

    def matches(self, size: int, sha256: str) -> bool:
        """True when what was read is exactly ``size`` bytes with ``sha256``."""
        return self.size == size and self.hash.hexdigest() == sha256


@dataclass(frozen=True)
class ArchiveCopy:
    """One archive copy of a raw data package to stage from.

    Attributes:
        open: opens the copy's bytes for reading (called once per pass).
        size: the package's size (bytes), as recorded when it was built.
        sha256: the package's sha256 (hex), as recorded.
        host: the long-term archive location's name.
        key: the copy's key there.
    """
    open: Callable[[], Any]
    size: int
    sha256: str
    host: str
    key: str

    @property
    def source(self) -> str:
        """``"location:key"``, how messages name the copy."""
        return f"{self.host}:{self.key}"

    def differs(self, reader: _HashingReader, why: str) -> SourceChangedError:
        """The permanent error for a copy whose bytes are not the package's."""
        return SourceChangedError(
            f"{self.source}: the archive copy has {reader.size} bytes with sha256 {reader.hash.hexdigest()}, "
            f"the package {self.size} bytes with {self.sha256}; {why}", step="staging", side="source",
            path=self.key, host=self.host,
            diagnosis="the archive copy is corrupt or was replaced; stage from another copy after a fixity check")


def check_archive_copy(copy: ArchiveCopy, *, limits: ExtractionLimits,
                       on_block: Callable[[int], None] = lambda n: None) -> BagContents:
    """The check pass of staging: read the archive copy once through the tar reader and the
    bag checks, writing nothing; it must be exactly the package's bytes.

    Returns:
        the bag found (its folder and manifest).

    Raises:
        SourceChangedError: the bytes are not the package's size and sha256 (permanent).
        UnsafePathError: a member is refused (permanent; the bytes are the package's own).
        InvalidBagError: the bytes are the package's but its bag does not check (permanent).
    """
    with copy.open() as f:
        reader = _HashingReader(f, limit=copy.size, source=copy.source, on_block=on_block)
        try:
            contents = verify_bag_archive(reader, source=copy.source, limits=limits)  # type: ignore[arg-type]
            reader.drain()
        except (UnsafePathError, VerificationError) as e:
            reader.drain()  # bounded by the package size: tells a corrupt copy from a bad package
            if not reader.matches(copy.size, copy.sha256):
                raise copy.differs(reader, f"nothing was extracted ({e})") from e
            if isinstance(e, VerificationError):  # the recorded bytes themselves: a retry reads them again
                raise InvalidBagError(f"{e} (the archive copy holds exactly the package's recorded bytes; "
                                      "nothing was extracted)", step="staging", path=e.path, host=e.host,
                                      diagnosis=e.diagnosis) from e
            raise
    if not reader.matches(copy.size, copy.sha256):
        raise copy.differs(reader, "nothing was extracted")
    return contents


def extract_archive_copy(copy: ArchiveCopy, target: Path, *, limits: ExtractionLimits,
                         check: Callable[[int], None] = lambda n: None,
                         progress: Callable[[int], None] = lambda n: None,
                         checked: BagContents | None = None) -> Path:
    """Staging's extraction of one archive copy into the new folder ``target`` (steps 4-5 of
    the module): the check pass (:func:`check_archive_copy`), then the extraction pass with
    :func:`~packhorse.bags.extraction.extract_tar`, hashed again, then every payload file against
    the manifest (:func:`verify_bag_folder`).

    Args:
        copy: the archive copy.
        target: must not exist; its parent must. Nothing is created before the check pass
            has passed.
        limits: member count and byte limits.
        check: called per block read in the check pass (lease checks).
        progress: called per block read in the extraction pass (progress and lease checks).
        checked: what :func:`check_archive_copy` of ``copy`` returned, when the caller ran the
            check pass itself (before it created anything the target lives in); the check
            pass is not repeated.

    Returns:
        the extracted bag folder (inside ``target``).

    Raises:
        SourceChangedError: the copy's bytes are not the package's, in either pass (permanent).
        UnsafePathError: a member is refused (permanent).
        VerificationError: the bag does not check.
        On every error ``target`` does not exist afterwards.
    """
    contents = checked if checked is not None else check_archive_copy(copy, limits=limits, on_block=check)
    extracted = False  # extract_tar removes its target itself when it fails
    try:
        with copy.open() as f:
            reader = _HashingReader(f, limit=copy.size, source=copy.source, on_block=progress)
            try:
                extract_tar(reader, target, source=copy.source, limits=limits)  # type: ignore[arg-type]
            except VerificationError as e:  # damaged: did the copy change since the check pass?
                reader.drain()
                if not reader.matches(copy.size, copy.sha256):
                    raise copy.differs(reader, f"it changed after the check pass ({e}); the extracted folder "
                                               "was removed") from e
                raise
            extracted = True
            reader.drain()
        if not reader.matches(copy.size, copy.sha256):
            raise copy.differs(reader, "it changed after the check pass; the extracted folder was removed")
        bag = target / contents.bag_dir
        verify_bag_folder(bag, source=copy.source, limits=limits)
    except BaseException:
        if extracted:
            _remove_extracted(target)
        raise
    return bag


def _remove_extracted(target: Path) -> None:
    """Remove the extracted folder ``target`` whatever its depth (no link followed); what
    cannot be removed is left to the start-up sweep of partial folders."""
    try:
        parent_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        remove_target(parent_fd, target.name)
    except OSError:
        pass
    finally:
        os.close(parent_fd)


def ensure_readable(work: Work, backend: StorageBackend, key: str) -> None:
    """For a cold location: request the restore of ``key`` and defer the operation until it is
    ready (:class:`~packhorse.errors.OperationDeferred`); returns at once for warm storage."""
    if not backend.cold or backend.restore_ready(key):
        return
    backend.request_restore(key)
    seconds = work.ctx.settings.location(backend.location).restore_poll_seconds
    work.info.update(waiting_for_restore=f"{backend.location}:{key}")
    raise OperationDeferred(f"{backend.location}:{key}: waiting for the cold-storage restore", seconds=seconds)


def _nearest_source(work: Work, pkg_id: int, dst: str) -> tuple[str, str]:
    ctx = work.ctx
    dst_site = ctx.topology.location_site[dst]

    def find(s: Session) -> list[PhysicalCopy]:
        return list(s.scalars(select(PhysicalCopy).where(PhysicalCopy.raw_data_package_id == pkg_id,
                                                         PhysicalCopy.status == CopyStatus.PRESENT.value)))

    options = []
    for c in ctx.db.read(find):
        loc = ctx.location_name(c.location_id)
        if ctx.topology.location_role[loc] is not LocationRole.LONG_TERM_ARCHIVE:
            continue
        cold = ctx.settings.location(loc).cold
        verified = c.verified_at.timestamp() if c.verified_at else 0.0
        options.append(((cold, ctx.topology.location_site[loc] != dst_site, -verified), loc, c.path))
    if not options:
        raise SourceMissingError(f"no present long-term archive copy of raw data package {pkg_id} to stage from",
                                 step="staging", side="source")
    options.sort()
    return options[0][1], options[0][2]


def run(work: Work) -> Recorder:
    """Stage one raw data package into the operation's processing location (see the module)."""
    ctx = work.ctx
    pkg = ctx.db.read(lambda s: s.get(RawDataPackage, work.op.raw_data_package_id))
    assert pkg is not None and pkg.sha256 is not None and pkg.size is not None
    dst = ctx.location_name(work.op.destination_location_id)
    dst_id = ctx.topology.location_ids[dst]
    work.info.update(package=pkg.name, destination=dst)

    def staged(s: Session) -> bool:
        return s.scalar(select(PhysicalCopy.id).where(
            PhysicalCopy.raw_data_package_id == pkg.id, PhysicalCopy.location_id == dst_id,
            PhysicalCopy.status.in_([x.value for x in LIVE_COPY_STATUSES]))) is not None

    def recorded_bad(s: Session) -> int | None:
        return s.scalar(select(PhysicalCopy.id).where(
            PhysicalCopy.raw_data_package_id == pkg.id, PhysicalCopy.location_id == dst_id,
            PhysicalCopy.status.in_(_BAD_STAGED)).order_by(PhysicalCopy.id.desc()).limit(1))

    if ctx.db.read(staged):
        work.info.update(result="already staged")
        return lambda s: None
    dst_backend = ctx.backend(dst)  # a disk location (request_staging refuses others)
    existing = dst_backend.folder(pkg.name)  # the key is checked and confined by the backend (I6)
    limits = ExtractionLimits.from_settings(ctx.settings)
    moved_aside = None
    bad_copy = ctx.db.read(recorded_bad) if existing is not None else None
    if existing is not None and bad_copy is not None:
        # staging again (`packhorse stage --again`): the staged folder packhorse made here was
        # found damaged; it is moved aside whole, never overwritten or deleted (I2)
        try:
            verify_bag_folder(existing, source=f"{dst}:{pkg.name}", limits=limits)
        except (VerificationError, UnsafePathError):
            work.check()
            moved_aside = dst_backend.quarantine_folder(pkg.name)
            work.info.update(moved_aside=moved_aside)
            if moved_aside is not None:
                # where it went is recorded on the bad copy now (`packhorse locate`), whether or
                # not this attempt completes: its notification below is sent only if it does
                ctx.db.transact(lambda s: note_quarantined(s, bad_copy, moved_aside))
            existing = None
    if existing is None:
        src_name, key = _nearest_source(work, pkg.id, dst)
        work.info.update(source=src_name, key=key)
        src = ctx.backend(src_name)
        ensure_readable(work, src, key)
        copy = ArchiveCopy(open=lambda: src.open_read(key), size=pkg.size, sha256=pkg.sha256, host=src_name,
                           key=key)
        # the check pass first: nothing, not even the partial folder, is created in the
        # processing location before the copy proved to be the package's bytes (I6)
        contents = check_archive_copy(copy, limits=limits, on_block=lambda n: work.check())
        with dst_backend.open_folder_write(pkg.name) as pending:  # a hidden partial folder beside the key
            bag = extract_archive_copy(copy, pending.path / "extracted", limits=limits, checked=contents,
                                       progress=work.progress)
            work.check()
            # False: a concurrent attempt published it first; verified below like any existing folder
            pending.publish(bag)
    final = dst_backend.folder(pkg.name)
    if final is None:
        raise VerificationError(f"{dst}: {pkg.name!r} vanished right after it was staged", step="staging",
                                side="destination", path=pkg.name, host=dst)
    try:
        verify_bag_folder(final, source=f"{dst}:{pkg.name}", limits=limits)
    except VerificationError as e:
        raise DestinationConflictError(f"{dst}: {pkg.name!r} already exists and does not match the package: {e}; "
                                       "left untouched", step="staging", side="destination", path=pkg.name,
                                       host=dst) from None

    def record(s: Session) -> None:
        record_copy(s, location_id=dst_id, key=pkg.name, size=pkg.size, sha256=pkg.sha256,
                    raw_data_package_id=pkg.id)
        if moved_aside:

            enqueue(s, level=NotificationLevel.INFO, event="staged_folder_moved_aside",
                    subject=f"Staging: damaged folder {dst}:{pkg.name} moved aside",
                    body=(f"The staged folder {dst}:{pkg.name} of raw data package {pkg.name} no longer matched its "
                          f"bag manifests; it was moved aside, unchanged, to {dst}:{moved_aside} and the package "
                          "was staged again from a verified archive copy."),
                    context={"location": dst, "path": pkg.name, "quarantined_as": moved_aside},
                    operation_kind=OperationKind.STAGING.value, operation_id=work.op.id, cooldown_seconds=0)

    return record
