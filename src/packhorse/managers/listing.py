"""Listing a source location: the walk of its folders and the comparison with what is registered.

One walk (:func:`walk`) serves the scan of one process (:mod:`packhorse.managers.scan`) and the
shards of a full listing made by several processes (:mod:`packhorse.managers.scanshards`), so
both list, skip and compare exactly alike: :func:`filter_listing` applies a location's
``include``/``exclude`` patterns, :func:`registered_files` reads the registrations back and
:func:`compare_listing` finds what is new or changed. Paths are relative to the location root,
sizes bytes, mtimes nanoseconds.
"""

from __future__ import annotations

import contextlib
import gc
import operator
import threading
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from packhorse.config import Settings
from packhorse.db.models import RawDataFile
from packhorse.db.session import driver_rows
from packhorse.errors import UnsafePathError
from packhorse.scanfilter import location_filter
from packhorse.storage.base import RESERVED_PREFIX, Entry, EntryKind, StorageBackend, check_key
from packhorse.storage.identity import MARKER_KEY

log = structlog.get_logger(__name__)

#: How the skip reason of a folder that could not be listed begins: such a record is ended by
#: the next scan that lists the folder, not only by a full listing (:mod:`packhorse.managers.scan`).
FOLDER_NOT_READABLE = "folder not readable"


_gc_lock = threading.Lock()


_gc_pausers = 0


_gc_was_enabled = False


@contextlib.contextmanager
def cycle_collection_paused() -> Any:
    """Pause Python's cyclic garbage collector while a full listing is compared with the
    registrations, and resume it afterwards (as it was; nested and concurrent uses count).

    A listing of N files makes about 2N objects that hold no reference cycle (entries, tuples,
    strings), freed by reference counting all the same; but the collector walks the growing heap
    every few thousand allocations, which cost a third of a full scan of 100,000 files (0.80 s
    against 0.53 s, docs/benchmarks.md "Control plane"). Nothing is leaked: collection only
    waits until the listing is compared."""
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


@dataclass
class Folder:
    """A folder as last listed: its mtime (ns), its subfolders' names and whether its listing
    may be reused (``clean``: nothing in it was racy or skipped)."""
    mtime_ns: int
    subfolders: list[str]
    clean: bool = True


def _printable(name: str) -> str:
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


@dataclass(frozen=True)
class Shard:
    """The part of a full listing one process makes (:mod:`packhorse.managers.scanshards`):
    shard ``index`` lists the folders two levels down whose paths (with a trailing ``/``) lie
    in ``[lo, hi)`` (``hi`` ``None``: no upper end) and reports exactly the entries whose path
    lies there; shard 0 also keeps the root and the top-level folders in its ``seen``."""

    index: int
    lo: str
    hi: str | None

    def holds(self, path: str) -> bool:
        """Whether ``path`` (a file's, or a folder's with its trailing ``/``) lies in this shard's range."""
        return self.lo <= path and (self.hi is None or path < self.hi)


#: where ``init --adopt`` keeps the marker of the installation it took a root over from
#: (:func:`packhorse.storage.identity.mark_location`): ``<quarantine key of the marker>.<stamp>``
_OLD_MARKERS = f"{RESERVED_PREFIX}quarantine/{MARKER_KEY}."


def walk(backend: StorageBackend, out: list[tuple[str, Entry]], skipped: list[tuple[str, str]],
          previous: dict[str, Folder] | None = None, seen: dict[str, Folder] | None = None,
          trusted_before_ns: int = 0, shard: Shard | None = None, unclean_out: list[str] | None = None) -> None:
    """List the location through its backend's :meth:`~packhorse.storage.base.StorageBackend.walk`
    into ``out`` (regular files with their entry) and ``skipped`` (path, reason); with
    ``previous``/``seen`` (a :class:`~packhorse.managers.scan.ScanCache`'s folders), a clean, unchanged folder's listing
    is reused instead of stat-ing its files again (the walk's ``reuse``). With ``shard``, only
    that shard's part of the location (:class:`Shard`); the paths whose folder must be listed
    again at the next scan are then appended to ``unclean_out`` (their folder may be in another
    shard's ``seen``).

    Raises:
        LocationUnavailableError: the location's root is not there.
    """
    reused: set[str] = set()

    def reuse(rel: str, mtime_ns: int) -> list[str] | None:
        if shard is not None and rel.count("/") == 1 and not shard.holds(rel + "/"):
            return []  # another shard lists this folder
        before = previous.get(rel) if previous else None
        if before is not None and before.clean and before.mtime_ns == mtime_ns and mtime_ns < trusted_before_ns:
            reused.add(rel)
            return before.subfolders
        return None

    def unclean(path: str) -> None:
        if unclean_out is not None:
            unclean_out.append(path)
        elif seen is not None and (folder := seen.get(path.rpartition("/")[0])) is not None:
            folder.clean = False

    append, FILE = out.append, EntryKind.FILE
    # everything: a source holds only the instrument's files besides packhorse's identity
    # marker, so a file named like packhorse's partial writes, or put in its reserved folder,
    # is reported below instead of being left out unseen (I1)
    for e in backend.walk(reuse=reuse if seen is not None or shard is not None else None, everything=True):
        path = e.path
        if shard is not None and not (shard.holds(path) if e.kind is FILE else _in_shard(shard, e, seen)):
            continue
        if path.startswith(RESERVED_PREFIX):
            # the marker, and an earlier installation's marker kept by `init --adopt`, are ours
            if e.kind is not EntryKind.FOLDER and path != MARKER_KEY and not path.startswith(_OLD_MARKERS):
                skipped.append((_printable(path), f"in the folder packhorse keeps for its identity marker "
                                                  f"({RESERVED_PREFIX}); not archived: move it elsewhere"))
            continue
        if e.kind is FILE:
            if not path.isascii():  # (an ASCII name is UTF-8: no encoding per file)
                try:
                    path.encode("utf-8")
                except UnicodeEncodeError:
                    skipped.append((_printable(path), "file name is not valid UTF-8"))
                    continue
            try:
                check_key(path)
            except UnsafePathError as err:
                skipped.append((path, f"name not allowed in an archive: {err}"))
                continue
            append((path, e))
        elif e.kind is EntryKind.FOLDER:
            if seen is not None:
                if path in reused:
                    seen[path] = previous[path]  # type: ignore[index]
                else:
                    seen[path] = Folder(e.mtime_ns, [], clean=e.mtime_ns < trusted_before_ns)
                    if path and (parent := seen.get(path.rpartition("/")[0])) is not None \
                            and path.rpartition("/")[0] not in reused:
                        parent.subfolders.append(path)
            if e.error is not None:
                skipped.append((_printable(path or "."), f"{FOLDER_NOT_READABLE}: {e.error}"))
                if seen is not None:
                    seen[path].clean = False
        elif e.kind is EntryKind.SYMLINK:
            skipped.append((_printable(path), "symbolic link (not followed)"))
        elif e.kind is EntryKind.SPECIAL:
            skipped.append((_printable(path), "not a regular file"))
        else:
            skipped.append((_printable(path), f"cannot stat: {e.error}"))
            unclean(path)


def _in_shard(shard: Shard, e: Entry, seen: dict[str, Folder] | None) -> bool:
    """Whether entry ``e`` of a sharded walk is ``shard``'s to report (each entry is exactly
    one shard's). A folder two levels down belongs to the shard holding its path with a trailing
    ``/`` (so do all entries under it); the root and the top-level folders to shard 0, which
    also records every folder two levels down as a subfolder of its parent in ``seen``, whoever
    lists it; every other entry to the shard holding its path."""
    if e.kind is not EntryKind.FOLDER:
        return shard.holds(e.path)
    depth = e.path.count("/") + 1 if e.path else 0
    if depth < 2:
        return shard.index == 0
    if shard.holds(e.path + "/"):
        return True
    if depth == 2 and shard.index == 0 and seen is not None:
        parent = seen.get(e.path.rpartition("/")[0])
        if parent is not None:
            parent.subfolders.append(e.path)
    return False


def filter_listing(settings: Settings, location: str, found: list[tuple[str, Entry]],
                   skipped: list[tuple[str, str]], left_out: list[tuple[str, str]] | None = None
                   ) -> tuple[list[tuple[str, Entry]], list[tuple[str, str]]]:
    """``(found, skipped)`` of a listing of ``location`` without what its ``include`` /
    ``exclude`` patterns leave out (:mod:`packhorse.scanfilter`); the lists as they are when
    the location has none. An unreadable folder may hold wanted files: it stays listed unless
    it is excluded itself. When ``left_out`` is a list, each path left out is appended to it
    with the pattern that left it out (:meth:`~packhorse.scanfilter.PathFilter.why_left_out`;
    ``run --dry-run -v``)."""
    wanted = location_filter(settings.location(location))
    if not wanted.active:
        return found, skipped
    kept_found = [(p, s) for p, s in found if wanted.accepts(p)]
    kept_skipped = [(p, r) for p, r in skipped
                    if wanted.accepts(p) or (r.startswith(FOLDER_NOT_READABLE) and not wanted.excludes(p))]
    if left_out is not None:
        kept = {p for p, _ in kept_found} | {p for p, _ in kept_skipped}
        for p in [p for p, _ in found] + [p for p, _ in skipped]:
            if p not in kept:
                left_out.append((p, wanted.why_left_out(p) or "left out by the location's patterns"))
    return kept_found, kept_skipped


def compare_listing(found: list[tuple[str, Entry]], registered: dict[str, tuple[int, int]]
                    ) -> tuple[list[tuple[str, Entry]], set[str]]:
    """``(new_or_changed, differs)``: the listed files whose ``(size, mtime)`` is not their
    registration's (:func:`registered_files`), and the paths among them that have one. The
    files that match are left at once: all but a few of a full scan's (this runs once per
    file of the location)."""
    get = registered.get
    new_or_changed = [(path, s) for path, s in found if get(path) != (s.size, s.mtime_ns)]
    return new_or_changed, {path for path, _ in new_or_changed if path in registered}


_VERSION = operator.itemgetter(3)


def registered_files(conn: Connection, loc_id: int, paths: list[str] | None = None, *,
                     lo: str = "", hi: str | None = None) -> dict[str, tuple[int, int]]:
    """``{path: (size in bytes, mtime in ns)}`` of the latest registered version of the files
    among ``paths``, or of every file of location ``loc_id`` (``paths`` ``None`` or long) whose
    path lies in ``[lo, hi)`` (code-point order; ``hi`` ``None``: no upper end), read on ``conn``. The mtime is the one a scan last confirmed the registered bytes at
    (``confirmed_mtime_ns``, a touched file) where there is one, else the registered one: a
    file is unchanged if its ``(size, mtime)`` is this. The one rule of the scan and of ``run
    --dry-run`` (:mod:`packhorse.status.dry_run`).

    The whole location is read with the database driver's own cursor (plain tuples, no
    SQLAlchemy row per registration): a full scan reads every registration of its location,
    millions in a large archive, and a SQLAlchemy row for each cost about as much as the
    walk's ``lstat`` of the file (docs/benchmarks.md "Control plane")."""
    t = RawDataFile.__table__
    q = select(t.c.relative_path, t.c.size, func.coalesce(t.c.confirmed_mtime_ns, t.c.mtime_ns), t.c.version
               ).where(t.c.location_id == loc_id)
    rows: list[Any]
    if paths is None or len(paths) > 2000:
        # code-point order on either database: SQLite compares text as UTF-8 bytes, PostgreSQL
        # by the database's collation unless told "C" (bytes)
        path = t.c.relative_path.collate("C") if conn.dialect.name == "postgresql" else t.c.relative_path
        if lo:
            q = q.where(path >= lo)
        if hi is not None:
            q = q.where(path < hi)
        rows = driver_rows(conn, q)
    else:
        rows = [r for i in range(0, len(paths), 500)
                for r in conn.execute(q.where(t.c.relative_path.in_(paths[i:i + 500]))).all()]
    if any(r[3] != 1 for r in rows):  # most files have one version: nothing to order then
        rows.sort(key=_VERSION)  # stable: later versions win
    return {path: (size, mtime_ns) for path, size, mtime_ns, _ in rows}
