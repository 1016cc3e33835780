"""Scanning: register new files of every source location (size, sha256, mtime).

Idempotent registration, no operation row (stage 1). Rules:

* Files modified less than ``settle_seconds`` ago are left for a later cycle; their group is
  *unsettled* and is not packaged yet. A file whose mtime is ahead of this host's clock (by
  more than :data:`FUTURE_MTIME_TOLERANCE_SECONDS`: the writer's clock is ahead) settles once
  scans of this process have seen it unchanged for ``settle_seconds`` (:data:`_FUTURE_SEEN`,
  kept with or without a :class:`ScanCache`, so the distributed scan task does the same); meanwhile it
  is listed as skipped with that reason, and its registration is logged as a warning.
* A file whose size or mtime changes while it is hashed is not registered this cycle.
* Folders are listed and files read through the location's storage backend (``ctx.backend``:
  :meth:`~packhorse.storage.base.StorageBackend.walk`, ``open_read``; confined to the root,
  nothing followed, ``O_NOFOLLOW``; I6). Whether a file changed while it was hashed is asked
  of the open file itself (``fstat`` of the descriptor the backend opened: the very bytes
  hashed, no second path lookup), or of the backend's ``stat`` for a stream without a
  descriptor. A source whose root is not there is reported (one skipped entry ``"."``), never
  scanned as empty.
* Symlinks are not followed; unreadable files, special files and names that are not UTF-8 or
  not valid object keys (a backslash, the partial-file suffix; see
  :func:`~packhorse.storage.base.check_key`) are recorded in ``skipped_files`` with a reason
  (shown by ``packhorse status``); the rest of the tree goes on.
* A registered file whose size or mtime differs now (README "Versions"): not packaged yet →
  registered again in place once it settles; in a package not built yet → left to the
  ``raw_data_package`` stage, which takes the registration out (:class:`WithdrawnFile`) and
  builds the package from the other files; in a built package → registered as a new
  ``version`` (the same bytes again, a ``touch``: no new version; the mtime they were found
  at is recorded as ``confirmed_mtime_ns`` and compared from then on, so the file is hashed
  once). A withdrawn path is looked at at every scan, whatever the folder cache says, until it
  is registered again.
* A full listing reads every registration of the location at once (the driver's cursor) and
  leaves every file whose ``(size, mtime)`` matches in one pass, with the cyclic garbage
  collector paused meanwhile (:func:`cycle_collection_paused`).
* Files of :data:`THREAD_HASH_MIN_BYTES` or more are hashed on a thread pool (sha256 and the
  reads release the GIL for large buffers); smaller ones in the scanning thread, one after the
  other: for them the threads would only pass the GIL around (20,000 files of 0–16 KiB: 0.5 s
  in one thread, 0.8 s in two, 1.4 s in four). No transaction is open meanwhile.
* With a :class:`ScanCache` (``packhorse run`` keeps one), a folder is listed again only when
  its mtime changed, or when at the last look it held a file not yet registered (unsettled,
  changing, unreadable) or its mtime was too recent to trust (within
  :data:`RACY_SECONDS` of that scan: a file added in the same clock tick would not change
  it). Every :data:`FULL_RESCAN_EVERY` scans every folder is listed again, which is when a
  registered file modified in place (no folder mtime change) is reported. A tree of millions
  of settled files then costs one ``stat`` per folder per poll, not one per file.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import structlog
from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.orm import Session

from packhorse.config import Settings
from packhorse.db.models import RawDataFile, RawDataPackage, SkippedFile, WithdrawnFile, utcnow
from packhorse.db.session import Database, insert_ignoring_conflicts
from packhorse.digest import sha256_stream
from packhorse.domain import LocationRole, StorageType
from packhorse.errors import (
    LocationUnavailableError,
    NotRegularFileError,
    SourceMissingError,
    UnsafePathError,
)
from packhorse.managers import scanshards
from packhorse.managers.listing import (
    FOLDER_NOT_READABLE,
    Folder,
    compare_listing,
    cycle_collection_paused,
    filter_listing,
    registered_files,
    walk,
)
from packhorse.managers.source_audit import audit_due
from packhorse.rules.availability import look, record_outage
from packhorse.runtime.context import ProcessContext
from packhorse.storage.base import Entry, EntryKind, StorageBackend
from packhorse.storage.registry import backend_for

log = structlog.get_logger(__name__)
#: Files hashed per thread-pool task.
HASH_BATCH = 64
#: Smaller files are hashed in the scanning thread itself (see the module docstring), bytes.
THREAD_HASH_MIN_BYTES = 1 << 20
#: Files hashed and registered per transaction of a scan (whole groups: a chunk ends at a
#: group's end), so the first groups are packaged while the rest are hashed.
REGISTER_CHUNK_FILES = 2000
#: A folder whose mtime is less than this many seconds older than the scan is listed again.
RACY_SECONDS = 2.0
#: Every this many scans with a :class:`ScanCache`, every folder is listed again.
FULL_RESCAN_EVERY = 30
#: A file whose mtime is more than this many seconds ahead of this host's clock was written by
#: a clock that is ahead (an instrument's, a file server's): its age says nothing about whether
#: it settled, so it settles by being seen unchanged for ``settle_seconds`` instead.
FUTURE_MTIME_TOLERANCE_SECONDS = 2.0


@dataclass
class ScanCache:
    """What the last scans saw per source location: folder → (mtime, subfolders, clean).

    Held by a long-running process between scans (see the module docstring); not shared
    between processes, and never needed for correctness: without it every scan lists every
    folder.
    """

    folders: dict[str, dict[str, Folder]] = field(default_factory=dict)
    scans: int = 0


@dataclass
class ScanResult:
    """What one scan cycle did: ``registered`` files, ``unsettled_groups`` (per location name),
    ``skipped`` files (path, reason) and ``pending_settle`` files waiting for ``settle_seconds``."""

    registered: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    unsettled_groups: dict[str, set[str]] = field(default_factory=dict)
    pending_settle: int = 0
    next_settle_at: float | None = None


def group_of(relative_path: str, depth: int) -> str:
    """The package group of a file: its first ``depth`` folders, or its own folder if shallower."""
    parts = relative_path.split("/")
    folders = parts[:-1]
    return "/".join(folders[:depth]) if len(folders) >= depth else "/".join(folders)


def list_source(settings: Settings, location: str, cache: ScanCache | None = None,
                backend: StorageBackend | None = None, left_out: list[tuple[str, str]] | None = None
                ) -> tuple[list[tuple[str, Entry]], list[tuple[str, str]], dict[str, Folder] | None, bool]:
    """List source location ``location`` as a scan sees it, registering nothing: ``(found,
    skipped, seen, full)`` — the regular files to consider (path, :class:`Entry`: size, mtime),
    the paths that cannot be registered (path, reason), the folders seen (for ``cache``) and
    whether every folder was listed. Files the location's ``include`` / ``exclude`` patterns
    leave out (:mod:`packhorse.scanfilter`) are in neither list; when ``left_out`` is a list they
    are appended to it with the pattern that left them out. The listing goes through the
    location's storage backend (``backend``, else built from ``settings``; I6: nothing followed).

    A location whose root is not there is reported as one skipped entry (``"."``) and lists
    nothing: a typo in a path or an unmounted disk must not look like "nothing to archive".
    """
    if backend is None:
        backend = backend_for(settings, location)
    found: list[tuple[str, Entry]] = []
    skipped: list[tuple[str, str]] = []
    full = cache is None or cache.scans % FULL_RESCAN_EVERY == 0
    previous = None if full or cache is None else cache.folders.get(location)
    seen: dict[str, Folder] | None = {} if cache is not None else None
    try:
        walk(backend, found, skipped, previous, seen, time.time_ns() - int(RACY_SECONDS * 1e9))
    except LocationUnavailableError as e:
        root = str(settings.location_path(location))
        log.warning("source_folder_missing", location=location, path=root, error=str(e))
        return [], [(".", f"source folder {root} does not exist")], None, False
    found, skipped = filter_listing(settings, location, found, skipped, left_out)
    return found, skipped, seen, full


def open_source(backend: StorageBackend, rel: str) -> BinaryIO | str:
    """Open source file ``rel`` for reading through the location's backend (confined,
    ``O_NOFOLLOW``; I6), or say why it cannot be: ``"not readable: <reason>"`` or ``"not a
    regular file ..."`` (a FIFO swapped in after the listing is refused by the backend, never
    waited on), the reason a scan skips it with (and ``run --dry-run`` predicts,
    :mod:`packhorse.status.dry_run`)."""
    try:
        return backend.open_read(rel)
    except SourceMissingError:
        return "not readable: No such file or directory"
    except NotRegularFileError:
        return "not a regular file (replaced after it was listed: a FIFO, a device or a folder)"
    except UnsafePathError:
        return "not readable: a symlink or outside the location"
    except OSError as e:
        return f"not readable: {e.strerror}"


def hash_source(backend: StorageBackend | None, rel: str, before: Entry) -> tuple[str, str | None]:
    """Hash source file ``rel`` through the location's backend (confined, ``O_NOFOLLOW``; I6).

    Whether it changed while it was hashed is decided on the open file (``fstat`` of the
    backend's descriptor: the file whose bytes were hashed; one confined lookup per file, not
    two), or through ``backend.stat`` for a stream without a descriptor.

    Returns ``("ok", sha)``, ``("changed", None)`` (size or mtime differ afterwards, or it is
    gone) or ``("error", reason)``."""
    assert backend is not None
    f = open_source(backend, rel)
    if isinstance(f, str):
        return "error", f
    try:
        with f:
            digest = sha256_stream(f)
            after = _stat_open(f)
    except OSError as e:
        return "error", f"read error: {e.strerror}"
    if after is None:
        try:
            info = backend.stat(rel)
        except (OSError, UnsafePathError):
            return "changed", None
        after = None if info is None else (info.size, info.mtime_ns)
    if after is None or after != (before.size, before.mtime_ns):
        return "changed", None
    return "ok", digest


def _stat_open(f: object) -> tuple[int, int] | None:
    """``(size in bytes, mtime in ns)`` of an open file through its descriptor, or ``None`` if
    the stream has none (then the caller asks the backend)."""
    try:
        fd = f.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return None
    s = os.fstat(fd)
    return s.st_size, s.st_mtime_ns


# ----------------------------------------------- versions: registrations their file no longer matches


@dataclass(frozen=True)
class Change:
    """What the scan does with a registered path whose size or mtime differs now.

    Attributes:
        action: ``"update"`` (the registration is not packaged: register the new bytes in its
            place), ``"version"`` (its package is built: register version ``version``), or
            ``"wait"`` (its package is planned but not built: the ``raw_data_package`` stage
            takes the registration out; README "Versions").
        row_id: the registration's id (``"update"``).
        version: the version the new registration gets.
        old: ``(size, mtime_ns, sha256)`` registered (bytes, ns, hex).
    """
    action: str
    row_id: int
    version: int
    old: tuple[int, int, str]


def plan_changes(db: Database, loc_id: int, paths: list[str]) -> dict[str, Change]:
    """The :class:`Change` for each of ``paths`` (registered at location ``loc_id``, their size or
    mtime differs now), from the latest version of each and the state of its package. Only
    reads ``db`` (the scan and ``run --dry-run`` both ask it)."""
    q = (select(RawDataFile.id, RawDataFile.relative_path, RawDataFile.version, RawDataFile.size,
                RawDataFile.mtime_ns, RawDataFile.sha256, RawDataFile.raw_data_package_id,
                RawDataPackage.sha256.label("package_sha256"))
         .outerjoin(RawDataPackage, RawDataPackage.id == RawDataFile.raw_data_package_id)
         .where(RawDataFile.location_id == loc_id))

    def tx(s: Session) -> dict[str, Change]:
        latest: dict[str, Any] = {}
        for i in range(0, len(paths), 500):
            for r in s.execute(q.where(RawDataFile.relative_path.in_(paths[i:i + 500]))):
                if r.relative_path not in latest or r.version > latest[r.relative_path].version:
                    latest[r.relative_path] = r
        out: dict[str, Change] = {}
        for path, r in latest.items():
            old = (r.size, r.mtime_ns, r.sha256)
            if r.raw_data_package_id is None:
                out[path] = Change("update", r.id, r.version, old)
            elif r.package_sha256 is None:
                out[path] = Change("wait", r.id, r.version, old)
            else:
                out[path] = Change("version", r.id, r.version + 1, old)
        return out

    return db.read(tx) if paths else {}


def is_new_content(change: Change, sha256: str) -> bool:
    """Whether a registered file whose size or mtime differs now (``change``) holds new bytes:
    its ``sha256`` (hex, of the bytes now) is not the one registered. The same bytes with a new
    mtime (a ``touch``) are not new content: no new version, nothing to package (README
    "Versions"). The one rule for it: the scan applies it to what it hashed, ``run --dry-run``
    through :func:`look_at_change`."""
    return sha256 != change.old[2]


def look_at_change(backend: StorageBackend, path: str, entry: Entry, change: Change) -> tuple[str, str | None]:
    """Whether registered file ``path``, whose size or mtime differs now (``entry``: as listed;
    ``change``: from :func:`plan_changes`), holds new bytes, found as the scan finds it: a
    different size is new content; otherwise the file is hashed through ``backend``, read only
    (confined, ``O_NOFOLLOW``; I6), and :func:`is_new_content` decides.

    Returns ``("new", None)``, ``("same", None)`` (a touch), ``("changed", None)`` (it changed
    while hashed, or is gone: the scan leaves it for a later cycle) or ``("error", reason)``
    (unreadable: the scan skips it with that reason)."""
    if entry.size != change.old[0]:
        return "new", None  # other bytes whatever they are (the scan hashes them to register them)
    state, value = hash_source(backend, path, entry)
    if state != "ok":
        return state, value
    assert value is not None
    return ("new" if is_new_content(change, value) else "same"), None


def withdrawn_paths(ctx: ProcessContext, loc_id: int) -> set[str]:
    """The paths of location ``loc_id`` whose registration was withdrawn and that are not
    registered again yet (:class:`~packhorse.db.models.WithdrawnFile`, ``resolved_at`` unset):
    the scan looks at them at every cycle (their folder may look unchanged to the cache)."""
    return set(ctx.db.read(lambda s: list(s.scalars(select(WithdrawnFile.relative_path).where(
        WithdrawnFile.location_id == loc_id, WithdrawnFile.resolved_at.is_(None))))))


def skipped_paths(ctx: ProcessContext, loc_id: int) -> set[str]:
    """The paths of location ``loc_id`` recorded as skipped (:class:`~packhorse.db.models.SkippedFile`):
    read by a scan before it registers anything, so that registering a file removes its record
    only where there is one. Only the scan of a location writes these records, under its scan
    lease; two scans overlapping after a take-over may leave a record of a file the other
    registered, which the next full listing removes (it is not found skipped again)."""
    return set(ctx.db.read(lambda s: list(s.scalars(select(SkippedFile.relative_path).where(
        SkippedFile.location_id == loc_id)))))


def _stat_withdrawn(backend: StorageBackend, paths: set[str], found: list[tuple[str, Entry]]) -> None:
    """Add the withdrawn ``paths`` that exist as regular files in the location to ``found``
    (those the folder walk did not list: the cache skipped their folder); looked at through
    the location's backend (confined, no link followed; I6)."""
    listed = {p for p, _ in found}
    for path in sorted(paths - listed):
        try:
            info = backend.stat(path)
        except (OSError, UnsafePathError):
            continue  # not a regular file (a link, a folder), or unreadable: not registered
        if info is None:
            continue  # still gone: its withdrawn row says so (packhorse status)
        found.append((path, Entry(path, EntryKind.FILE, info.size,
                                  info.mtime_ns if info.mtime_ns is not None else int(info.mtime * 1e9))))


def _resolve_withdrawn(s: Session, loc_id: int, paths: list[str], stamp: Any) -> None:
    """The withdrawn registrations of ``paths`` are over: the paths are registered again."""
    for i in range(0, len(paths), 500):
        s.execute(update(WithdrawnFile).where(WithdrawnFile.location_id == loc_id,
                                              WithdrawnFile.resolved_at.is_(None),
                                              WithdrawnFile.relative_path.in_(paths[i:i + 500]))
                  .values(resolved_at=stamp))


def _apply_updates(s: Session, updates: list[tuple[Change, dict[str, Any]]], stamp: Any) -> list[str]:
    """Register new bytes in place of unpackaged registrations (compare-and-set on the old size,
    mtime and sha256 and on "not packaged": one packaged meanwhile is left to the stage).
    Returns the paths updated."""
    done: list[str] = []
    t = RawDataFile.__table__
    for change, row in updates:
        size, mtime_ns, sha = change.old
        res = s.execute(update(t).where(t.c.id == change.row_id, t.c.raw_data_package_id.is_(None),
                                        t.c.size == size, t.c.mtime_ns == mtime_ns, t.c.sha256 == sha)
                        .values(size=row["size"], sha256=row["sha256"], mtime_ns=row["mtime_ns"],
                                registered_at=stamp))
        if res.rowcount:
            done.append(str(row["relative_path"]))
    return done


def _hash_chunk(backend: StorageBackend, pool: ThreadPoolExecutor, chunk: list[tuple[str, Entry]],
                changes: dict[str, Change], loc_id: int, groups: dict[str, str], result: ScanResult,
                unsettled: set[str],
                look_again: Callable[[str], None], now: float, settle: float
                ) -> tuple[list[dict[str, object]], list[tuple[Change, dict[str, Any]]], list[dict[str, Any]]]:
    """Hash the files of ``chunk`` (large ones on ``pool``, in batches; small ones here, see the
    module docstring); returns the rows to register, the registrations to update, and the
    registrations whose file holds the registered bytes at a new mtime (a touch: ``{"touched_id",
    "touched_sha256", "touched_mtime_ns"}`` to record as confirmed, so the file is not hashed
    again). A file that changed while hashed makes its group unsettled; an unreadable one is
    skipped. ``groups``: the package group of each path of ``chunk`` (:func:`group_of`)."""
    rows: list[dict[str, object]] = []
    large = [(p, st_) for p, st_ in chunk if st_.size >= THREAD_HASH_MIN_BYTES]
    batches = [large[i:i + HASH_BATCH] for i in range(0, len(large), HASH_BATCH)]
    pending = pool.map(lambda b: [hash_source(backend, p, st_) for p, st_ in b], batches)
    digests = {p: hash_source(backend, p, st_) for p, st_ in chunk if st_.size < THREAD_HASH_MIN_BYTES}
    for batch, results in zip(batches, pending):
        digests.update((p, r) for (p, _), r in zip(batch, results))
    updates: list[tuple[Change, dict[str, Any]]] = []
    touched: list[dict[str, Any]] = []
    for path, s in chunk:
        state, value = digests[path]
        if state == "ok":
            row = dict(location_id=loc_id, relative_path=path, group_path=groups[path],
                       size=s.size, sha256=value, mtime_ns=s.mtime_ns, version=1)
            change = changes.get(path)
            if change is None:
                rows.append(row)
            elif change.action == "update":
                updates.append((change, row))
            elif is_new_content(change, value):  # "version": new bytes
                rows.append(dict(row, version=change.version))
            else:  # a touch: no new version; the next scans take this mtime as unchanged
                touched.append({"touched_id": change.row_id, "touched_sha256": value, "touched_mtime_ns": s.mtime_ns})
        elif state == "changed":
            look_again(path)
            unsettled.add(groups[path])
            result.pending_settle += 1
            result.next_settle_at = now + max(settle, 0.5)
        else:
            look_again(path)  # unreadable now, perhaps not later
            result.skipped.append((path, str(value)))
    return rows, updates, touched


def _list_in_shards(ctx: ProcessContext, location: str, loc_id: int, cache: ScanCache | None,
                    processes: int) -> Any:
    """The full listing of ``location`` made by ``processes`` processes
    (:func:`packhorse.managers.scanshards.list_in_shards`) when this scan lists every folder,
    the location holds at least :data:`~packhorse.managers.scanshards.SHARD_MIN_FILES`
    registrations and this process may start processes; else ``None`` (list it here)."""
    import multiprocessing


    if processes < 2 or (cache is not None and cache.scans % FULL_RESCAN_EVERY != 0):
        return None
    if multiprocessing.current_process().daemon:  # a daemonic process may not start any
        return None
    if scanshards.registered_count(ctx.db, loc_id) < scanshards.SHARD_MIN_FILES:
        return None
    return scanshards.list_in_shards(ctx.settings, location, loc_id, str(ctx.settings.location_path(location)),
                                     processes, cache is not None, time.time_ns() - int(RACY_SECONDS * 1e9))


def scan_location(ctx: ProcessContext, location: str, pool: ThreadPoolExecutor,
                  cache: ScanCache | None = None,
                  on_registered: Callable[[str, list[str]], None] | None = None,
                  processes: int = 1) -> ScanResult:
    """Scan one source location and register what is new and settled.

    Files are hashed and registered in chunks of about :data:`REGISTER_CHUNK_FILES`, whole
    groups each, in group order, one transaction per chunk.

    Args:
        cache: folders seen by earlier scans of this process (see the module docstring);
            ``None`` lists every folder.
        processes: how many processes may make a full listing of a large location together
            (:mod:`packhorse.managers.scanshards`); 1: this process alone.
        on_registered: ``on_registered(location, groups)`` after each chunk's transaction, with
            the chunk's groups that are settled and now wholly registered: the caller may
            package them while the next chunk is hashed (the first packages start before the
            scan of a large tree ends). Not called for a chunk whose groups all wait.
    """
    settings = ctx.settings
    loc_id = ctx.topology.location_ids[location]
    result = ScanResult()
    unavailable = look(ctx, location)
    if unavailable is not None:
        # storage that is absent is not empty: record the outage; register, skip and forget nothing
        record_outage(ctx, unavailable)
        result.unsettled_groups[location] = set()
        return result
    backend = ctx.backend(location)  # every listing and read goes through it (I6)

    def look_again(path: str) -> None:
        """The folder of ``path`` holds a file not registered yet: list it at the next scan."""
        if seen is not None and (folder := seen.get(os.path.dirname(path))) is not None:
            folder.clean = False

    with cycle_collection_paused():  # a listing and its registrations: no cycles, see there
        withdrawn = withdrawn_paths(ctx, loc_id)
        sharded = _list_in_shards(ctx, location, loc_id, cache, processes)
        if sharded is not None:  # a full listing, compared in several processes
            new_or_changed, differs, result.skipped = sharded.new_or_changed, sharded.differs, sharded.skipped
            seen, full = sharded.seen, True  # type: ignore[assignment]
            for path in sharded.unclean:
                look_again(path)
        else:
            found, result.skipped, seen, full = list_source(ctx.settings, location, cache, backend)
            if withdrawn and seen is not None:  # only a cached walk may have skipped their folder
                _stat_withdrawn(backend, withdrawn, found)
            # read after the walk, not on another thread during it: the two only took turns at
            # the GIL, and the scan took half as long again
            listed = None if full else [p for p, _ in found]
            registered = ctx.db.read(lambda s: registered_files(s.connection(), loc_id, listed))
            new_or_changed, differs = compare_listing(found, registered)
            del found, registered
    now = time.time()
    settle = settings.packaging.settle_seconds
    depth = settings.packaging.group_depth
    unsettled: set[str] = set()
    todo: list[tuple[str, Entry]] = []
    changes = plan_changes(ctx.db, loc_id, sorted(differs))
    for path, s in new_or_changed:
        if path in differs:
            change = changes.get(path)
            if change is None:
                continue
            if change.action == "wait":
                look_again(path)  # the package stage takes it out; registered again after that
                continue
        age = now - s.mtime_ns / 1e9
        if age < settle:
            ready_at = s.mtime_ns / 1e9 + settle
            if age < -FUTURE_MTIME_TOLERANCE_SECONDS:
                # written by a clock ahead of ours: settled once seen unchanged for settle_seconds
                # (waiting for its mtime to age would hold its group back until that clock's
                # time comes, unreported)
                ready_at = _future_file_ready_at(location, path, s, now, settle)
                if ready_at <= now:
                    log.warning("source_mtime_in_future", location=location, path=path,
                                ahead_seconds=round(-age, 1))
                    todo.append((path, s))
                    continue
                result.skipped.append((path, f"modification time {-age:.0f} s ahead of this host's clock (the "
                                             f"writer's clock is ahead?): registered once it has not changed for "
                                             f"settle_seconds ({settle:g} s)"))
            look_again(path)
            unsettled.add(group_of(path, depth))
            result.pending_settle += 1
            result.next_settle_at = ready_at if result.next_settle_at is None else min(result.next_settle_at, ready_at)
            continue
        todo.append((path, s))

    # hashed and registered in chunks of whole groups, in group order: each chunk's settled
    # groups can be packaged (``on_registered``) while the next chunk is hashed
    groups = {path: group_of(path, depth) for path, _ in todo}  # (once per file: split and join)
    todo.sort(key=lambda e: (groups[e[0]], e[0]))
    registered_paths: list[str] = []
    skipped_before: set[str] | None = None
    start = 0
    while start < len(todo):
        end = min(start + REGISTER_CHUNK_FILES, len(todo))
        while end < len(todo) and groups[todo[end][0]] == groups[todo[end - 1][0]]:
            end += 1  # a group is never split between two chunks
        chunk = todo[start:end]
        start = end
        rows, updates, touched = _hash_chunk(backend, pool, chunk, changes, loc_id, groups, result, unsettled,
                                             look_again, now, settle)

        def register(s: Session, rows: list[dict[str, object]] = rows,
                     updates: list[tuple[Change, dict[str, Any]]] = updates,
                     touched: list[dict[str, Any]] = touched) -> list[str]:
            stamp = utcnow()
            if touched:  # compare-and-set on the bytes hashed: a registration replaced meanwhile is left
                t = RawDataFile.__table__
                s.execute(update(t).where(t.c.id == bindparam("touched_id"),
                                          t.c.sha256 == bindparam("touched_sha256"))
                          .values(confirmed_mtime_ns=bindparam("touched_mtime_ns")), touched)
            paths = [str(r["relative_path"]) for r in rows] + _apply_updates(s, updates, stamp)
            if rows:
                # a file another scanner (a second `packhorse run`) registered since registered_files
                # looked is left as it is: registration is idempotent, never an error that would
                # cost this scan its view of which groups are still settling
                t = RawDataFile.__table__
                s.execute(insert_ignoring_conflicts(s, t, t.c.location_id, t.c.relative_path, t.c.version),
                          [dict(r, registered_at=stamp) for r in rows])
            if paths:
                if withdrawn:
                    _resolve_withdrawn(s, loc_id, [p for p in paths if p in withdrawn], stamp)
                # a file skipped before and registered now is no longer skipped (only those:
                # a statement for every 500 registered paths cost a site across a long link
                # 0.4 s a chunk, for rows that are almost never there)
                was_skipped = [p for p in paths if p in (skipped_before or ())]
                for i in range(0, len(was_skipped), 500):
                    s.execute(delete(SkippedFile).where(SkippedFile.location_id == loc_id,
                                                        SkippedFile.relative_path.in_(was_skipped[i:i + 500])))
            return paths

        if rows or updates or touched:
            if skipped_before is None:  # read once, when there is something to register
                skipped_before = skipped_paths(ctx, loc_id)
            registered_paths += ctx.db.transact(register)
        if on_registered is not None:
            ready = sorted({groups[p] for p, _ in chunk} - unsettled)
            if ready:
                on_registered(location, ready)
    result.unsettled_groups[location] = unsettled

    def tx(s: Session) -> int:
        stamp = utcnow()
        existing = {k.relative_path: k for k in s.scalars(select(SkippedFile).where(SkippedFile.location_id == loc_id))}
        for path, reason in result.skipped:
            row = existing.get(path)
            if row is None:
                s.add(SkippedFile(location_id=loc_id, relative_path=path, reason=reason,
                                  first_seen_at=stamp, last_seen_at=stamp))
            else:
                row.reason, row.last_seen_at = reason, stamp
        # an entry this scan did not find again is over (the folder is readable again, the
        # link or the file is gone): a folder that could not be listed is listed again at every
        # scan, so its entry goes at once; the others at the next full listing
        current = {path for path, _ in result.skipped}
        for path, row in existing.items():
            if path not in current and (full or row.reason.startswith(FOLDER_NOT_READABLE)):
                s.delete(row)
        return len(registered_paths)

    if result.skipped:
        result.registered = ctx.db.transact(tx)
    else:  # the usual scan, nothing skipped: one statement (a round trip) instead of a transaction
        if skipped_before != set():  # (none at all if this scan read them: nothing to delete)
            gone = delete(SkippedFile).where(SkippedFile.location_id == loc_id)
            if not full:
                gone = gone.where(SkippedFile.reason.startswith(FOLDER_NOT_READABLE, autoescape=True))
            ctx.db.statements(lambda conn: conn.execute(gone))
        result.registered = len(registered_paths)
    if cache is not None and seen is not None:  # only once what was seen is registered
        cache.folders[location] = seen
    # the source audit's slice, when its pass is due: what the scan cannot see (other bytes
    # behind an unchanged size and mtime) is registered the way the scan registers a change
    try:
        audit_due(ctx, location, hash_source)
    except Exception as e:  # never costs the scan its result: the next scan's slice goes on
        log.error("source_audit_slice_failed", location=location, error=repr(e))
    return result


#: Files of this process's scans with an mtime ahead of this host's clock: ``(location, path) →
#: (size, mtime_ns, first seen so, UTC s)``. Kept by the process whether or not its scans keep a
#: :class:`ScanCache` (a distributed scan task has none), so both modes settle such a file alike.
_FUTURE_SEEN: dict[tuple[str, str], tuple[int, int, float]] = {}


def _future_file_ready_at(location: str, path: str, entry: Entry, now: float, settle: float) -> float:
    """When (UTC s) file ``path``, whose mtime is ahead of this host's clock, counts as settled:
    ``settle`` seconds after a scan of this process first saw it with its present size and
    mtime (:data:`_FUTURE_SEEN`); at once when ``settle`` is 0."""
    key = (location, path)
    seen = _FUTURE_SEEN.get(key)
    if seen is None or seen[:2] != (entry.size, entry.mtime_ns):
        _FUTURE_SEEN[key] = seen = (entry.size, entry.mtime_ns, now)
    if seen[2] + settle <= now:
        _FUTURE_SEEN.pop(key, None)
    return seen[2] + settle


def scan_all(ctx: ProcessContext, pool: ThreadPoolExecutor, cache: ScanCache | None = None,
             on_registered: Callable[[str, list[str]], None] | None = None, processes: int = 1) -> ScanResult:
    """Scan every active disk source location; merge the results.

    Args:
        cache: kept between the scans of one process to skip unchanged folders (see the
            module docstring); ``None`` lists every folder.
        on_registered, processes: see :func:`scan_location`.
    """
    total = ScanResult()
    for loc in ctx.settings.locations:
        if loc.role is not LocationRole.SOURCE or not loc.active or loc.storage is not StorageType.DISK:
            continue
        r = scan_location(ctx, loc.name, pool, cache, on_registered, processes)
        total.registered += r.registered
        total.skipped += r.skipped
        total.pending_settle += r.pending_settle
        total.unsettled_groups.update(r.unsettled_groups)
        if r.next_settle_at is not None:
            total.next_settle_at = r.next_settle_at if total.next_settle_at is None else min(total.next_settle_at,
                                                                                              r.next_settle_at)
    if cache is not None:
        cache.scans += 1
    return total
