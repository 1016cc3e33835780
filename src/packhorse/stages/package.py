"""``raw_data_package``: build a raw data package's BagIt tar at the source site's buffer.

The tar is deterministic (DESIGN.md I3): a rebuild after a crash yields the same bytes and
meets "already there". Source bytes are checked against the sha256 registered by the scan
while they stream into the tar (I4); the published tar is re-read and verified.

Files that no longer match their registration (README "Versions"; DESIGN.md "Converging":
siblings never wait). Before the tar is built, every file is stat'ed; while it is built, every
file is hashed. A file that is gone, or whose size or bytes differ from its registration, is
taken out of the package — its registration moves to ``withdrawn_files`` with the reason, in a
transaction fenced on this attempt (I3) — and the package is built from the others in the same
attempt. Nothing is published before that, so the package's name only ever means the bytes it
is finally built from. The scan registers a changed file again (it looks at withdrawn paths at
every cycle) and it is packaged with the next package of its group; a vanished file gets a
WARNING notification and stays listed by ``packhorse status`` until it comes back. A package
left with no file is dropped (its operation completes, its name is free again). A tar an
earlier attempt published but did not record is taken as the package when it is a valid bag of
exactly the registered files (:func:`_adopt_published`), so a file that changed after that
build becomes a new version instead of a conflict. Versions of
two or more carry ``Packhorse-Version`` in their bag-info (version 1 bags are unchanged, I3).

A rebuild (the package's sha256 is recorded) that finds other bytes under the package's key in
the buffer (a copy damaged at rest, which ``verify`` or the audit recorded corrupt) moves that
object into the buffer's quarantine (never overwritten or deleted, I2) and builds the package
again: the key belongs to the package and its bytes are known, so other bytes there are
damage, never a second truth (DESIGN.md "Converging": a rebuild must not meet a conflict it
cannot leave).
"""

from __future__ import annotations

import calendar
import datetime as dt
import hashlib
import posixpath
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, delete, func, select, update
from sqlalchemy.orm import Session

from packhorse.bags.packaging import PayloadFile, TeeReader, bag_info_value, read_bag_tar, write_bag_tar
from packhorse.db.models import Operation, RawDataFile, RawDataPackage, WithdrawnFile, utcnow
from packhorse.errors import (
    DestinationConflictError,
    LeaseLostError,
    PackageLimitError,
    SourceChangedError,
    SourceMissingError,
    UnsafePathError,
    VerificationError,
)
from packhorse.notify.messages import source_files_vanished
from packhorse.operations.lifecycle import fenced
from packhorse.rules.availability import look
from packhorse.rules.space import room_to_bundle, room_to_bundle_together
from packhorse.runtime.topology import raw_package_key
from packhorse.stages.base import (
    Recorder,
    Records,
    Work,
    clear_partials,
    publish_verified,
    record_copies_at,
    there_or_moved_aside,
)
from packhorse.storage.base import Entry, EntryKind, StorageBackend

#: ``withdrawn_files.cause`` and the reason recorded (and shown by ``packhorse status``).
CHANGED, VANISHED = "changed", "vanished"


def bag_dir_name(name: str) -> str:
    """Top folder of a package's bag inside its tar: the name's folders joined by ``__``
    (``instrument-00/obs-0003`` → ``instrument-00__obs-0003``).

    One-to-one, so two packages never unpack into one folder (``a__b/c`` and ``a/b__c`` both
    read ``a__b__c`` joined plainly, and the second bag extracted over the first broke both):
    ``%`` is written ``%25``, and an ``_`` that would touch a ``__`` — one next to another
    ``_``, or at a folder's end that meets the joint — is written ``%5F``. Names without
    ``%``, ``__`` or such an edge ``_`` come out as before."""
    parts = name.split("/")
    out = []
    for k, part in enumerate(parts):
        part = part.replace("%", "%25")
        chars = list(part)
        for i, ch in enumerate(part):
            if ch != "_":
                continue
            double = (i > 0 and part[i - 1] == "_") or (i + 1 < len(part) and part[i + 1] == "_")
            at_joint = (i == 0 and k > 0) or (i == len(part) - 1 and k < len(parts) - 1)
            if double or at_joint:
                chars[i] = "%5F"
        out.append("".join(chars))
    return "__".join(out)


def _epoch(d: dt.datetime) -> int:
    return calendar.timegm(d.utctimetuple())


def _bagging_day_epoch(bagging_date: str) -> int:
    """Midnight UTC of the Bagging-Date (``YYYY-MM-DD``), used as the tag files' mtime.

    The tar's bytes then depend on the Bagging-Date only, not on the second the package row
    was created (I3): the same files packaged again on the same day give the same bytes and
    meet "already there" at a destination instead of a conflict.
    """
    return _epoch(dt.datetime.strptime(bagging_date, "%Y-%m-%d").replace(tzinfo=dt.timezone.utc))


def stale_files(src: StorageBackend, files: list[Any]) -> list[tuple[str, str, str]]:
    """The registered ``files`` (rows with ``relative_path``, ``size``) that are gone or whose
    size differs now: ``[(path, cause, reason)]`` with cause :data:`CHANGED` or
    :data:`VANISHED`. (A file whose bytes changed without its size is found by the hash while
    the tar is built; an mtime alone changes nothing: the registered bytes are what is packaged.)

    Looked at with one walk of the folder the files share (``src.walk``: one listing per
    folder, as the scan does) instead of one ``stat`` per file — a package may hold thousands
    of files; files in the location's root, or a shared folder that is not a plain folder,
    are looked at one ``stat`` each.
    """
    folders = {f.relative_path.rpartition("/")[0] for f in files}
    shared = posixpath.commonpath(sorted(folders)) if folders and "" not in folders else ""
    now: dict[str, Entry] | None = None
    if shared:
        try:
            now = {e.path: e for e in src.walk(shared)}
        except UnsafePathError:
            now = None
    out: list[tuple[str, str, str]] = []
    for f in files:
        if now is not None:
            e = now.get(f.relative_path)
            kind, size = (None, None) if e is None or e.kind is EntryKind.UNKNOWN else (e.kind, e.size)
        else:
            try:
                info = src.stat(f.relative_path)
                kind, size = (None, None) if info is None else (EntryKind.FILE, info.size)
            except (OSError, SourceMissingError):
                kind, size = None, None
            except UnsafePathError:
                kind, size = EntryKind.SYMLINK, None
        if kind is None:
            out.append((f.relative_path, VANISHED, "gone from the source before it was packaged"))
        elif kind is not EntryKind.FILE:
            out.append((f.relative_path, VANISHED, "no longer a regular file in the location (a symbolic link?)"))
        elif size != f.size:
            out.append((f.relative_path, CHANGED, f"changed before it was packaged ({size} bytes, registered "
                                                  f"with {f.size}); registered again when it settles"))
    return out


def refuse_beyond_limits(max_member_bytes: int, files: list[Any]) -> None:
    """Refuse to build a package holding a file larger than ``max_member_bytes`` (``[extraction]
    max_member_bytes``, bytes): every destination's tar reader would refuse the file, its
    package and the bundle carrying them (:mod:`packhorse.bags.extraction`, DESIGN.md I6), for good
    and with the bundle's other packages. Such a file is larger than ``max_package_bytes``
    (the start-up check holds ``max_member_bytes`` to at least that), so it is alone in its
    package and nothing else waits for it. (The member count is kept by the package manager,
    which splits a group at ``max_members``.)

    Args:
        max_member_bytes: the limit, bytes.
        files: the package's rows with ``relative_path`` and ``size`` (bytes).

    Raises:
        PackageLimitError: naming the largest such file, its size and the limit (permanent:
            the operation fails with a notification; the file stays registered).
    """
    over = [f for f in files if f.size > max_member_bytes]
    if not over:
        return
    f = max(over, key=lambda f: f.size)
    raise PackageLimitError(
        f"source file {f.relative_path!r} is {f.size} bytes, more than extraction.max_member_bytes = "
        f"{max_member_bytes}: every destination would refuse it (and the bundle carrying it); not packaged",
        side="source", path=f.relative_path, step="package",
        diagnosis="raise [extraction] max_member_bytes at every site, or split the file at the source")


def _source_available(work: Work) -> None:
    """Before a missing source file is taken for gone: is the source location there at all?
    An unmounted or renamed root (or its identity marker missing) makes every file look gone;
    the package must then wait for the location (deferred, DESIGN.md "storage that is absent is
    not empty"), not lose its files to ``withdrawn_files``.

    Raises:
        LocationUnavailableError: the source location's root or marker is missing.
    """
    err = look(work.ctx, work.ctx.location_name(work.op.source_location_id))
    if err is not None:
        raise err


def withdraw(work: Work, pkg_id: int, stale: list[tuple[str, str, str]]) -> None:
    """Take the ``stale`` files (``[(path, cause, reason)]``) out of package ``pkg_id``, which is
    not built yet: their registrations move to ``withdrawn_files``, the package's file count and
    payload bytes follow, vanished files get one WARNING notification. One transaction, fenced
    on this attempt (I3).

    Raises:
        LeaseLostError: the attempt is stale; nothing was changed.
    """
    ctx = work.ctx
    claim = work.claim

    def tx(s: Session) -> None:
        conn = s.connection()
        ops = Operation.__table__
        if conn.execute(update(ops).where(fenced(claim.operation_id, claim.attempt))
                        .values(updated_at=utcnow())).rowcount != 1:
            raise LeaseLostError(f"operation {claim.operation_id}: attempt {claim.attempt} is stale; "
                                 "its files stay in the package")
        t = RawDataFile.__table__
        pkg = conn.execute(select(RawDataPackage.__table__.c.name, RawDataPackage.__table__.c.sha256)
                           .where(RawDataPackage.__table__.c.id == pkg_id)).one()
        assert pkg.sha256 is None, f"package {pkg.name!r} is built: its files are never taken out"
        now = utcnow()
        vanished: list[str] = []
        location = ""
        for path, cause, reason in stale:
            row = conn.execute(select(t).where(t.c.raw_data_package_id == pkg_id, t.c.relative_path == path)).first()
            if row is None:
                continue
            conn.execute(WithdrawnFile.__table__.insert().values(
                location_id=row.location_id, relative_path=path, version=row.version, size=row.size,
                sha256=row.sha256, mtime_ns=row.mtime_ns, registered_at=row.registered_at, package_name=pkg.name,
                cause=cause, reason=f"{reason} (taken out of package {pkg.name})", withdrawn_at=now))
            conn.execute(delete(t).where(t.c.id == row.id))
            location = ctx.location_name(row.location_id)
            if cause == VANISHED:
                vanished.append(path)
        count, payload = conn.execute(select(func.count(), func.coalesce(func.sum(t.c.size), 0))
                                      .where(t.c.raw_data_package_id == pkg_id)).one()
        conn.execute(update(RawDataPackage.__table__).where(RawDataPackage.__table__.c.id == pkg_id)
                     .values(file_count=count, payload_bytes=payload))
        if vanished:
            source_files_vanished(s, location=location, package=pkg.name, paths=vanished,
                                  operation_id=claim.operation_id)

    ctx.db.transact(tx)
    work.info.setdefault("withdrawn", []).extend(f"{cause}: {path}" for path, cause, _ in stale)


def _dropped(work: Work, pkg_id: int) -> Recorder:
    """The recorder of a package left with no file: the package row goes (it was never built),
    its operation completes and stays as history, its dedup key freed (SQLite may give the id to
    the next package)."""
    op_id = work.claim.operation_id

    def record(s: Session) -> None:
        ops = Operation.__table__
        conn = s.connection()
        key = conn.execute(select(ops.c.dedup_key).where(ops.c.id == op_id)).scalar_one()
        conn.execute(update(ops).where(ops.c.id == op_id)
                     .values(raw_data_package_id=None, dedup_key=f"{key}:dropped-op{op_id}"))
        t = RawDataPackage.__table__
        conn.execute(delete(t).where(t.c.id == pkg_id, t.c.sha256.is_(None)))

    return record


def _loaded(s: Session, pkg_ids: list[int]) -> dict[int, tuple[RawDataPackage, list[Any]]]:
    """``{package id: (package, its files)}`` for ``pkg_ids``, in two statements whatever their
    number; the files as plain rows (``relative_path``, ``size``, ``sha256``, ``mtime_ns``), not
    ORM objects: a package may hold thousands."""
    pkgs = {p.id: p for p in s.scalars(select(RawDataPackage).where(RawDataPackage.id.in_(pkg_ids)))}
    files: dict[int, list[Any]] = {i: [] for i in pkg_ids}
    for row in s.execute(select(RawDataFile.raw_data_package_id, RawDataFile.relative_path, RawDataFile.size,
                                RawDataFile.sha256, RawDataFile.mtime_ns)
                         .where(RawDataFile.raw_data_package_id.in_(pkg_ids))):
        files[row.raw_data_package_id].append(row)
    assert set(pkgs) == set(pkg_ids)
    return {i: (pkgs[i], files[i]) for i in pkg_ids}


@dataclass
class _Preloaded:
    """What :func:`preload` read for one build: its package, its files, and whether its buffer
    room was admitted with the rest of its task's (:func:`~packhorse.rules.space.room_to_bundle_together`)."""

    package: RawDataPackage
    files: list[Any]
    admitted: bool


def preload(works: list[Work]) -> None:
    """Read the packages and files of every build of one task at once, for each build's first
    round (:attr:`~packhorse.stages.base.Work.preloaded`), and admit their room at their
    buffers together: three statements for the task, not three a build, which a site whose
    database is far away pays in round trips (docs/benchmarks.md, "20,000 small files over a
    long thin link"). A build whose room was not admitted with the others' asks for its own."""
    ids = [w.op.raw_data_package_id for w in works if w.op.raw_data_package_id is not None]
    if not ids:
        return
    ctx = works[0].ctx
    loaded = ctx.db.read(lambda s: _loaded(s, ids))
    by_buffer: dict[int, dict[int, int]] = {}
    for w in works:
        if w.op.raw_data_package_id is not None and w.op.destination_location_id is not None:
            by_buffer.setdefault(w.op.destination_location_id, {})[w.op.id] = sum(
                f.size for f in loaded[w.op.raw_data_package_id][1])
    admitted = {op_id for location_id, builds in by_buffer.items()
                if room_to_bundle_together(ctx, builds, ctx.location_name(location_id)) for op_id in builds}
    for w in works:
        if w.op.raw_data_package_id is not None:
            pkg, files = loaded[w.op.raw_data_package_id]
            w.preloaded = _Preloaded(pkg, files, w.op.id in admitted)


def run(work: Work) -> Recorder:
    """Build, publish and verify the package tar; record its size, sha256 and buffer copy.

    Files gone or changed since their registration are taken out first (:func:`withdraw`,
    module docstring); so is a file that cannot be read as a regular file inside the location
    while the tar is built (it or a folder on its path swapped for a symbolic link, a FIFO put
    in its place: :class:`~packhorse.errors.UnsafePathError` of the source backend), which the
    scan registers again once it is back, as a swapped file. A package left empty is dropped. A package built before (a rebuild of
    a lost package) is never changed: a source file that differs fails the rebuild
    (``SourceChangedError`` / ``SourceMissingError``, permanent)."""
    ctx = work.ctx
    pkg_id = work.op.raw_data_package_id
    assert pkg_id is not None

    def load(s: Session) -> tuple[RawDataPackage, list[Any]]:
        return _loaded(s, [pkg_id])[pkg_id]

    src = ctx.backend(ctx.location_name(work.op.source_location_id))
    dst_name = ctx.location_name(work.op.destination_location_id)
    dst = ctx.backend(dst_name)
    admitted = False  # its room at the buffer, with its task's (a later round holds fewer files)
    while True:  # each round takes at least one file out, or ends
        if work.preloaded is not None:
            pkg, files, admitted = work.preloaded.package, work.preloaded.files, work.preloaded.admitted
        else:
            pkg, files = ctx.db.read(load)
        work.preloaded = None  # a later round (after a withdrawal) reads again
        key = raw_package_key(pkg.name)
        work.info.update(package=pkg.name, destination=dst_name, key=key)
        if there_or_moved_aside(dst, key, pkg.size, pkg.sha256, work.ctx):
            size, sha = pkg.size, pkg.sha256
            break
        if not files:
            work.info.update(dropped=True)
            return _dropped(work, pkg_id)
        if pkg.sha256 is None and (adopted := _adopt_published(dst, key, pkg, files)) is not None:
            size, sha = adopted
            break
        ctx.hooks.hit("raw_data_package.sources")  # tests: change a source file here
        built = pkg.sha256 is not None  # a rebuild (convergence): exactly the recorded bytes, or nothing
        stale = [] if built else stale_files(src, files)
        if stale:
            if any(cause == VANISHED for _, cause, _ in stale):
                _source_available(work)
            withdraw(work, pkg_id, stale)
            continue
        refuse_beyond_limits(ctx.settings.extraction.max_member_bytes, files)
        # keep room at the buffer for the bundle of what waits there (a deadlock otherwise)
        if not admitted:
            room_to_bundle(ctx, work.op.id, pkg.name, sum(f.size for f in files), dst_name)
        try:
            size, sha = _build(work, pkg, files, src, dst, key)
        except (SourceChangedError, SourceMissingError, UnsafePathError) as e:
            registered = {f.relative_path for f in files}
            swapped = isinstance(e, UnsafePathError)
            if swapped and e.host != src.location:
                raise  # not the reading of a source file
            if isinstance(e, SourceMissingError):
                _source_available(work)
            if built or e.path not in registered:
                raise
            cause = CHANGED if isinstance(e, SourceChangedError) else VANISHED
            reason = (f"changed before it was packaged ({e}); registered again when it settles" if cause == CHANGED
                      else f"not a regular file inside the location when it was packaged ({e}); registered again "
                           "when it is back" if swapped else "gone from the source before it was packaged")
            clear_partials(dst, key)
            withdraw(work, pkg_id, [(e.path, cause, reason)])
            continue
        break
    assert size is not None and sha is not None
    location_id = ctx.topology.location_ids[dst_name]
    return Records(record_builds, (pkg_id, location_id, key, size, sha))


def record_builds(s: Session, items: list[tuple[int, int, str, int, str]]) -> None:
    """Record built packages ``(raw data package id, buffer location id, key, size in bytes,
    sha256)``: each package's bytes (a first build records them, a rebuild must match them) and
    its buffer copy (:func:`~packhorse.stages.base.record_copies_at`), with a few
    statements for a whole task of builds, not two a build.

    Raises:
        DestinationConflictError: a rebuild's bytes differ from those recorded (I2), or a live
            buffer copy has other bytes.
    """
    t = RawDataPackage.__table__
    conn = s.connection()
    built = {pkg_id: (size, sha) for pkg_id, _, _, size, sha in items}
    first: set[int] = set()
    if conn.dialect.update_returning:  # every first build's bytes in one statement
        first = set(conn.execute(update(t).where(t.c.id.in_(list(built)), t.c.sha256.is_(None)).values(
            size=case({i: v[0] for i, v in built.items()}, value=t.c.id),
            sha256=case({i: v[1] for i, v in built.items()}, value=t.c.id)).returning(t.c.id)).scalars())
    else:
        for pkg_id, (size, sha) in built.items():
            if conn.execute(update(t).where(t.c.id == pkg_id, t.c.sha256.is_(None))
                            .values(size=size, sha256=sha)).rowcount:
                first.add(pkg_id)
    again = [i for i in built if i not in first]
    if again:  # rebuilds (convergence): exactly the recorded bytes, or nothing
        seen = set()
        for row in conn.execute(select(t.c.id, t.c.name, t.c.sha256).where(t.c.id.in_(again))):
            seen.add(row.id)
            if row.sha256 != built[row.id][1]:
                raise DestinationConflictError(
                    f"package {row.name!r} rebuilt with sha256 {built[row.id][1]}, recorded {row.sha256}")
        assert seen == set(again), f"raw data packages {sorted(set(again) - seen)} are gone"
    record_copies_at(s, [(location_id, pkg_id, key, size, sha) for pkg_id, location_id, key, size, sha in items])


class _Sha256Sink:
    def __init__(self) -> None:
        self.hash = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        return len(data)


def _adopt_published(dst: StorageBackend, key: str, pkg: RawDataPackage, files: list[Any]) -> tuple[int, str] | None:
    """An earlier attempt that published the tar and died before recording it left the object
    at ``key``: if it is a valid bag of exactly ``files`` as registered (paths and sha256) with
    the package's name, it is the package — returns its (size, sha256), read back (I4) — so a
    source file that changed since cannot turn a finished build into a conflict. ``None``: no
    object there, or one of other contents (publishing over it then fails loudly, I2)."""
    if dst.stat(key) is None:
        return None
    sink = _Sha256Sink()
    try:
        with dst.open_read(key) as f:
            tee = TeeReader(f, sink)
            contents = read_bag_tar(tee, source=f"{dst.location}:{key}")  # type: ignore[arg-type]
            tee.drain()
    except (VerificationError, UnsafePathError, SourceMissingError):
        return None
    if contents.bag_info.get("External-Identifier") != bag_info_value(pkg.name):
        return None
    if contents.files != {f.relative_path: f.sha256 for f in files}:
        return None
    return tee.size, sink.hash.hexdigest()


def _build(work: Work, pkg: RawDataPackage, files: list[Any], src: StorageBackend, dst: StorageBackend,
           key: str) -> tuple[int, str]:
    """Write, publish and verify the tar of ``pkg`` from ``files``; returns (size, sha256).

    Raises:
        SourceChangedError, SourceMissingError: a payload file differs from its registration.
    """
    ctx = work.ctx
    payload = [
        PayloadFile(path=f.relative_path, size=f.size, sha256=f.sha256, mtime=f.mtime_ns // 1_000_000_000,
                    open=(lambda p=f.relative_path: src.open_read(p)))
        for f in files
    ]
    loc = ctx.settings.location(ctx.location_name(pkg.source_location_id))
    bag_info = {
        "Packhorse-Group": pkg.group_path,
        "Packhorse-Source-Site": loc.site,
        "Packhorse-Source-Location": loc.name,
    }
    if pkg.version > 1:  # version 1 bags keep the bytes they always had (I3)
        bag_info["Packhorse-Version"] = str(pkg.version)
    clear_partials(dst, key)
    with dst.open_write(key) as w:
        write_bag_tar(w, bag_dir=bag_dir_name(pkg.name), files=payload, bag_info=bag_info,
                      bagging_date=pkg.bagging_date, external_identifier=pkg.name,
                      tag_mtime=_bagging_day_epoch(pkg.bagging_date), on_bytes=work.progress)
        result = publish_verified(work, w, dst, expected_sha256=pkg.sha256, point="raw_data_package")
    assert result.size is not None and result.sha256 is not None
    return result.size, result.sha256
