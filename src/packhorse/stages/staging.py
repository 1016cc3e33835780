"""``staging``: get an archived raw data package back out into a ``processing`` location.

1. If a live copy of the package is already recorded at the processing location, there is
   nothing to do (staging twice is a no-op).
2. The source is the nearest ``present`` long-term-archive copy: warm before cold, the
   processing location's own site first, the most recently verified first.
3. A cold source (``cold = true``) must be restored first: the stage requests the restore
   and raises :class:`~packhorse.errors.OperationDeferred`, so the operation goes back to
   ``PENDING`` until ``restore_poll_seconds`` later, without holding a worker; the worker that
   picks it up again finds the restore ready and goes on.
4. The package tar is streamed out of the archive, hashed while read (it must match the
   package's sha256: the archive copy is verified on the way), and extracted with
   :func:`~packhorse.packaging.safe_extract` (I6) into a hidden temporary folder of the
   processing location.
5. The extracted bag is validated to RFC 8493 (:mod:`~packhorse.bagvalidation`): every
   manifest, every payload file, the tag manifests and the Payload-Oxum.
6. The bag folder is published under ``<package name>/`` with a no-replace rename (I2); an
   existing folder from an earlier attempt counts only if it verifies the same way.
7. The completion transaction records the staged copy (path = that folder).
"""

from __future__ import annotations

import errno
import hashlib
import secrets
import shutil
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..db.models import PhysicalCopy, RawDataPackage
from ..domain import LIVE_COPY_STATUSES, CopyStatus, LocationRole
from ..errors import (
    DestinationConflictError,
    OperationDeferred,
    SourceMissingError,
    UnsafePathError,
    VerificationError,
)
from ..bagvalidation import validate_folder
from ..packaging import raise_for_problems, safe_extract
from ..storage.base import CHUNK_BYTES, StorageBackend
from ..storage.disk import _renameat2_noreplace
from .base import Recorder, Work, record_copy

#: Prefix of the temporary extraction folders in a processing location.
STAGING_TMP_PREFIX = ".packhorse-staging-"


class _HashingReader:
    """Reads through ``stream``, hashing and counting (progress and lease checks per block)."""

    def __init__(self, stream: Any, work: Work) -> None:
        self.stream, self.work = stream, work
        self.hash = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self.stream.read(n if n and n > 0 else CHUNK_BYTES)
        if data:
            self.hash.update(data)
            self.size += len(data)
            self.work.progress(len(data))
        return data

    def drain(self) -> None:
        while self.read(CHUNK_BYTES):
            pass


def ensure_readable(work: Work, backend: StorageBackend, key: str) -> None:
    """For a cold location: request the restore of ``key`` and defer the operation until it is
    ready (:class:`~packhorse.errors.OperationDeferred`); returns at once for warm storage."""
    if not backend.cold or backend.restore_ready(key):
        return
    backend.request_restore(key)
    seconds = work.ctx.settings.location(backend.location).restore_poll_seconds
    work.info.update(waiting_for_restore=f"{backend.location}:{key}")
    raise OperationDeferred(f"{backend.location}:{key}: waiting for the cold-storage restore", seconds=seconds)


def verify_bag_folder(bag: Path, *, source: str) -> dict[str, str]:
    """Validate the bag folder ``bag`` to RFC 8493 (:func:`~packhorse.bagvalidation.validate_folder`:
    every manifest, the tag manifests, Payload-Oxum, no symlinks). Returns ``{payload path under
    data/: sha256}``.

    Raises:
        VerificationError: the bag is not valid (a file missing, extra, with other bytes...),
            naming the first problem and counting the others.
        UnsafePathError: the folder holds a symlink or a special file.
    """
    report = validate_folder(bag, bag=source, required_algorithms=("sha256",))
    raise_for_problems(report, step="staging", side="destination")
    return {p[len("data/"):]: e.digests["sha256"] for p, e in report.payload.items()}


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

    if ctx.db.read(staged):
        work.info.update(result="already staged")
        return lambda s: None
    root = ctx.settings.location_path(dst)
    final = root / pkg.name
    if not (final.resolve().is_relative_to(root.resolve())):
        raise UnsafePathError(f"{dst}: package name {pkg.name!r} leaves the location root", path=pkg.name)
    if not final.exists():
        src_name, key = _nearest_source(work, pkg.id, dst)
        work.info.update(source=src_name, key=key)
        src = ctx.backend(src_name)
        ensure_readable(work, src, key)
        tmp = root / f"{STAGING_TMP_PREFIX}{secrets.token_hex(6)}"
        try:
            with src.open_read(key) as f:
                reader = _HashingReader(f, work)
                names = safe_extract(reader, tmp, source=f"{src_name}:{key}")  # type: ignore[arg-type]
                reader.drain()
            if reader.hash.hexdigest() != pkg.sha256 or reader.size != pkg.size:
                raise VerificationError(f"{src_name}:{key}: read {reader.size} bytes with sha256 "
                                        f"{reader.hash.hexdigest()}, expected {pkg.size} with {pkg.sha256}",
                                        step="staging", side="source", path=key, host=src_name)
            tops = {n.split("/", 1)[0] for n in names}
            if len(tops) != 1:
                raise VerificationError(f"{src_name}:{key}: expected one bag folder, found {sorted(tops)}",
                                        step="staging", path=key)
            bag = tmp / tops.pop()
            verify_bag_folder(bag, source=f"{src_name}:{key}")
            work.check()
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                _renameat2_noreplace(str(bag), str(final))
            except FileExistsError:
                pass  # a concurrent attempt published it: verified below like any existing folder
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    try:
        verify_bag_folder(final, source=f"{dst}:{pkg.name}")
    except VerificationError as e:
        raise DestinationConflictError(f"{dst}: {pkg.name!r} already exists and does not match the package: {e}; "
                                       "left untouched", step="staging", side="destination", path=pkg.name,
                                       host=dst) from None

    def record(s: Session) -> None:
        record_copy(s, location_id=dst_id, key=pkg.name, size=pkg.size, sha256=pkg.sha256,
                    raw_data_package_id=pkg.id)

    return record
