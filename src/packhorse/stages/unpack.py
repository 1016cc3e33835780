"""``unpack``: take the raw data packages out of a bundle at a destination buffer.

The bundle tar is read once, as a stream, through the one tar reader
(:func:`packhorse.bags.extraction.iter_members`: no absolute names, no ``..``, no links, devices
or duplicates, nothing beyond the ``[extraction]`` limits, only regular files under the bag;
a refused member fails the operation permanently, I6), every raw package tar is copied to
its own object; every member of it goes through the one tar reader's refusal rules, and it is
published only if its bytes, read back from the buffer's medium before they are published, are
the package as built (its recorded sha256, I4); bytes that are not get their own bag validated
too (manifest, tag manifest, Payload-Oxum) so the error says what is wrong with them. The
bundle's manifest is checked against what was read. The bundle must carry exactly the packages
the database says it does. A package archived at every archive of the buffer's site already
(a bundle shipped again to repair one of its siblings) is read past, not written: its bytes are
still checked against the bundle's manifest.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, BinaryIO, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.bags.extraction import ExtractionLimits, iter_members
from packhorse.bags.packaging import TeeReader, read_bag_bytes, read_bag_tar
from packhorse.db.models import DataTransferPackage, PhysicalCopy, RawDataPackage
from packhorse.digest import sha256_stream
from packhorse.domain import CopyStatus, LocationRole
from packhorse.errors import SourceMissingError, UnsafePathError, VerificationError
from packhorse.names import quoted
from packhorse.runtime.topology import bundle_key, raw_package_key
from packhorse.stages.base import (
    Recorder,
    Work,
    clear_partials,
    note_corrupt_source,
    note_lost_source,
    publish_verified,
    record_copies,
    there_or_moved_aside,
)
from packhorse.storage.base import CHUNK_BYTES, PendingWrite, PublishResult, StorageBackend

if TYPE_CHECKING:
    from packhorse.runtime.context import ProcessContext


def _seekable(stream: BinaryIO) -> bool:
    try:
        return bool(stream.seekable())
    except (AttributeError, OSError, ValueError):
        return False


def _copy_stream(stream: BinaryIO, sink: BinaryIO | PendingWrite) -> int:
    """Copy ``stream`` to its end into ``sink`` in :data:`CHUNK_BYTES` blocks; returns the bytes copied."""
    buf = bytearray(CHUNK_BYTES)
    view = memoryview(buf)
    total = 0
    while True:
        n = stream.readinto(buf)  # type: ignore[attr-defined]
        if not n:
            return total
        sink.write(view[:n])
        total += n


#: Raw packages up to this size (bytes) are taken out of the bundle into memory and their bag
#: checked there (:func:`~packhorse.bags.packaging.read_bag_bytes`); larger ones are streamed. A
#: worker holds at most one such package at a time.
IN_MEMORY_BYTES = 64 << 20


def _read_exactly(stream: BinaryIO, size: int, source: str) -> memoryview:
    """The next ``size`` bytes of ``stream`` (a member of the bundle tar).

    Raises:
        VerificationError: the stream ends before (a truncated bundle).
    """
    data = bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        n = stream.readinto(view[got:])  # type: ignore[attr-defined]
        if not n:
            raise VerificationError(f"{source}: ends after {got} of {size} bytes", step="unpack")
        got += n
    return view


def _check_members(stream: BinaryIO, *, source: str, limits: ExtractionLimits) -> None:
    """Pass every member of the raw package tar ``stream`` (seekable) through the one tar
    reader (:func:`packhorse.bags.extraction.iter_members`) without reading any member's data, and
    require one top folder, the bag's: a recorded sha256 says the bytes are the ones built,
    not that they are safe (I6: every input is checked, whoever wrote it).

    Raises:
        UnsafePathError: a member is refused, or lies outside the first member's top folder;
            names ``source`` and the member (permanent).
        VerificationError: not a tar, or a damaged one.
    """
    top = None
    for m in iter_members(stream, source=source, limits=limits, step="unpack"):
        first = m.name.partition("/")[0]
        top = first if top is None else top
        if first != top:
            raise UnsafePathError(f"{source}: member {quoted(m.name)} is outside the bag folder {quoted(top)}",
                                  path=m.name, step="unpack")


def _publish_checked(work: Work, w: PendingWrite, buf: StorageBackend, pkg: "_Package",
                     source: str, limits: ExtractionLimits, *, members: Callable[[], BinaryIO],
                     bag: Callable[[], object]) -> PublishResult:
    """Publish the raw package written to ``w`` once it is shown safe and the package as built.

    Every member first passes the one tar reader's refusal rules (:func:`_check_members`,
    from ``members()``: a fresh stream of the bytes written; I6: a recorded sha256 says the
    bytes are the ones built, not that they are safe). Then the bytes are published only if
    they are the package's recorded sha256: read back from the buffer's medium before they are
    published when the caller deferred ``w``'s hash
    (:meth:`~packhorse.storage.base.PendingWrite.defer_hash`: one pass over them), else hashed as
    written and re-read after publishing (I4). Bytes that are
    not the package as built get the full bag check (``bag()``: manifests, payload hashes,
    Payload-Oxum), so a hostile or damaged package is reported for what it is; the sha256
    comparison refuses them all the same. A package with no recorded sha256 gets that check
    before it is published.

    Raises:
        UnsafePathError: a member, or an entry of its bag, is refused (permanent).
        VerificationError: other bytes than the package as built, or a bag that does not check.
    """
    _check_members(members(), source=source, limits=limits)
    if pkg.sha256 is None:
        bag()
        return publish_verified(work, w, buf, expected_sha256=None, point="unpack")
    try:
        return publish_verified(work, w, buf, expected_sha256=pkg.sha256, point="unpack")
    except VerificationError:
        bag()  # what is wrong with them, if their own bag says so
        raise


class _Package(Protocol):
    id: int
    name: str
    size: int | None
    sha256: str | None


def unpack_bundle(work: Work, stream: BinaryIO, *, buf: StorageBackend, source: str,
                  packages: Mapping[str, _Package], limits: ExtractionLimits,
                  done: list[tuple[int, str, int, str]] | None = None,
                  not_needed: Collection[str] = (),
                  taken_out: Callable[[str], bool] | None = None) -> list[tuple[int, str, int, str]]:
    """Read the bundle tar ``stream`` once and publish every raw package it carries to ``buf``
    (but those of ``not_needed``).

    Args:
        work: the claimed operation (lease checks, progress).
        stream: the bundle tar.
        buf: the buffer location's backend the raw packages are written to.
        source: the bundle, ``"location:key"``, for messages.
        packages: payload path in the bundle (``"<package name>.tar"``) → the raw package.
        limits: member count and byte limits (the bundle's and each raw package's).
        done: the list the published raw packages are appended to as they are verified (so a
            caller still knows them when a later member raises); a new one by default.
        not_needed: payload paths of packages this buffer need not hold (archived already at
            every archive its copy would go to): read past, their bytes checked against the
            bundle's manifest all the same, nothing written.
        taken_out: ``taken_out(path)``: whether a payload path that is none of ``packages`` is
            a package taken out of this bundle since it was built (shipped again in a bundle
            of its own, :mod:`packhorse.rules.convergence`): read past like ``not_needed``. ``None``:
            every payload must be one of ``packages``.

    Returns:
        ``[(package id, key, size in bytes, sha256)]`` of every raw package now in ``buf``.

    Raises:
        UnsafePathError: a member of the bundle or of a raw package is refused (permanent);
            nothing of that raw package is published.
        VerificationError: the bundle's or a raw package's bag does not check.
        DestinationConflictError: a quarantine name is taken (other bytes under a raw
            package's key in ``buf`` are a copy damaged at rest: moved aside first,
            :func:`~packhorse.stages.base.there_or_moved_aside`).
        OSError: a folder of ``buf`` could not be synced.
    """
    done = [] if done is None else done

    def on_payload(path: str, size: int, member: BinaryIO) -> str:
        """Copy one raw package out of the bundle, verifying its own bag; returns its sha256."""
        pkg = packages.get(path)
        if pkg is None and taken_out is not None and taken_out(path):
            return sha256_stream(member)  # it travels in another bundle now; the manifest checks it
        if pkg is None:
            raise VerificationError(f"{source}: bundle carries {path!r}, which is not one of its packages",
                                    path=path, step="unpack")
        if path in not_needed:
            return sha256_stream(member)  # the bundle's manifest still checks its bytes
        pkey = raw_package_key(pkg.name)
        if there_or_moved_aside(buf, pkey, pkg.size, pkg.sha256, work.ctx):
            done.append((pkg.id, pkey, size, pkg.sha256 or ""))
            return sha256_stream(member)
        clear_partials(buf, pkey)
        psource = f"{source}:{path}"
        with buf.open_write(pkey) as w:
            if size <= IN_MEMORY_BYTES:
                # read it once into memory and write it; its members and, if need be, its bag
                # are checked from those bytes: no file object per member
                if pkg.sha256 is not None:
                    w.defer_hash()  # read back and compared before it is published (I4)
                data = _read_exactly(member, size, psource)
                w.write(data)
                work.progress(size)
                result = _publish_checked(work, w, buf, pkg, psource, limits,
                                          members=lambda: io.BytesIO(data),
                                          bag=lambda: read_bag_bytes(data, source=psource, limits=limits))
            elif _seekable(member):
                # copy it, then check it from the bundle's cached bytes in random-access mode:
                # cheaper per member than parsing the tar as a stream while copying it
                if pkg.sha256 is not None:
                    w.defer_hash()
                copied = _copy_stream(member, w)
                work.progress(copied)

                def again() -> BinaryIO:
                    member.seek(0)
                    return member

                result = _publish_checked(work, w, buf, pkg, psource, limits, members=again,
                                          bag=lambda: read_bag_tar(again(), source=psource, limits=limits))
                member.seek(copied)
            else:
                tee = TeeReader(member, w)  # w hashes what passes through
                read_bag_tar(tee, source=psource, limits=limits)  # type: ignore[arg-type]  # its own bag
                tee.drain()
                work.progress(tee.size)
                result = publish_verified(work, w, buf, expected_sha256=pkg.sha256, point="unpack")
            # the bytes published: the package's recorded sha256, read back from the buffer
            # (or hashed as written and re-read, on a backend that cannot read back first)
            digest = result.sha256
        done.append((pkg.id, pkey, result.size, result.sha256))
        return digest

    # one sync of each folder the raw packages went into, when the bundle has been read and
    # before anything is recorded (the caller records ``done`` after this returns or raises)
    with buf.deferred_sync():
        read_bag_tar(stream, source=source, on_payload=on_payload, limits=limits)
    return done


def archived_at_site(s: Session, ctx: "ProcessContext", buffer: str, package_ids: list[int]) -> set[int]:
    """Ids among ``package_ids`` with a ``present`` copy at every active long-term archive of
    ``buffer``'s site: a copy in this buffer would only be freed again (nothing of that site
    needs it; DESIGN.md "Converging"). A site without an archive: none."""
    site = ctx.topology.location_site[buffer]
    archives = [ctx.topology.location_ids[loc.name] for loc in ctx.settings.locations
                if loc.site == site and loc.active and loc.role is LocationRole.LONG_TERM_ARCHIVE]
    if not archives or not package_ids:
        return set()
    held: dict[int, set[int]] = {}
    for pid, loc in s.execute(select(PhysicalCopy.raw_data_package_id, PhysicalCopy.location_id).where(
            PhysicalCopy.raw_data_package_id.in_(package_ids), PhysicalCopy.location_id.in_(archives),
            PhysicalCopy.status == CopyStatus.PRESENT.value)):
        held.setdefault(pid, set()).add(loc)
    return {pid for pid, locs in held.items() if len(locs) == len(archives)}


def _taken_out_of(ctx: "ProcessContext", dtp_id: int) -> Callable[[str], bool]:
    """For a bundle that carries fewer packages now than it was built with: whether payload
    path ``<name>.tar`` is a package that was in it and travels in another bundle now (taken
    out to be shipped again alone; :attr:`packhorse.rules.convergence.Plan.detach`)."""
    def moved(path: str) -> bool:
        if not path.endswith(".tar"):
            return False
        bundle = ctx.db.read(lambda s: s.execute(select(RawDataPackage.data_transfer_package_id).where(
            RawDataPackage.name == path[:-len(".tar")])).first())
        return bundle is not None and bundle[0] != dtp_id

    return moved


def run(work: Work) -> Recorder:
    """Unpack and verify every raw package of the bundle that this site still needs
    (:func:`archived_at_site`: not those archived at every archive of the site already);
    record their copies at this buffer."""
    ctx = work.ctx
    dtp_id = work.op.data_transfer_package_id

    def load(s: Session) -> tuple[DataTransferPackage, list[RawDataPackage]]:
        dtp = s.get(DataTransferPackage, dtp_id)
        assert dtp is not None
        return dtp, list(s.scalars(select(RawDataPackage).where(RawDataPackage.data_transfer_package_id == dtp_id)))

    dtp, pkgs = ctx.db.read(load)
    buf_name = ctx.location_name(work.op.destination_location_id)
    # a bundle shipped again (a repair of one of its packages) need not bring the others back
    # into this buffer: those archived at every archive of this site already are read past
    done_here = ctx.db.read(lambda s: archived_at_site(s, ctx, buf_name, [p.id for p in pkgs]))
    buf = ctx.backend(buf_name)
    key = bundle_key(dtp.name)
    work.info.update(bundle=dtp.name, location=buf_name, key=key)
    location_id = ctx.topology.location_ids[buf_name]
    done: list[tuple[int, str, int, str]] = []

    def record(s: Session) -> None:
        record_copies(s, location_id=location_id, copies=done)

    # a raw package published and verified stays recorded if a later member fails the
    # unpack (a refused member, a damaged package): no verified object is left in the buffer
    # without its copy row, and the packages that are good go on to their archives
    work.salvage = record
    ctx.hooks.hit("unpack.start")  # hooks: claimed, nothing read yet
    try:
        stream = buf.open_read(key)
    except SourceMissingError:  # the bundle copy is gone: recorded, so it is shipped again
        note_lost_source(work, buf, key, location_id=location_id, data_transfer_package_id=dtp_id)
        raise
    try:
        with stream as f:
            unpack_bundle(work, f, buf=buf, source=f"{buf_name}:{key}", packages={f"{p.name}.tar": p for p in pkgs},
                          limits=ExtractionLimits.from_settings(ctx.settings), done=done,
                          not_needed={f"{p.name}.tar" for p in pkgs if p.id in done_here},
                          taken_out=(_taken_out_of(ctx, dtp_id) if dtp.package_count is not None
                                     and dtp.package_count > len(pkgs) else None))
        seen_ids = {d[0] for d in done} | done_here
        missing = sorted(p.name for p in pkgs if p.id not in seen_ids)
        if missing:
            raise VerificationError(f"{buf_name}:{key}: bundle lacks {len(missing)} package(s), e.g. {missing[0]!r}",
                                    step="unpack")
    except VerificationError:
        # the bundle copy rotted in this buffer: quarantined and recorded missing (the packages
        # already published stay recorded), so it is shipped again (DESIGN.md "Converging")
        note_corrupt_source(work, buf, key, expected_sha256=dtp.sha256, location_id=location_id,
                            data_transfer_package_id=dtp_id)
        raise
    return record
