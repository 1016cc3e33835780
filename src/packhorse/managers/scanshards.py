"""A full listing of a large source location, compared with its registrations, in several
processes at once (the scan's own rules are :mod:`packhorse.managers.scan`'s).

Python's cost per entry of a folder walk is by itself about 1.7× ``find``'s, so one process
cannot list an unchanged tree of a million files and compare it with its registrations within
2× ``find`` (docs/benchmarks.md "Control plane"). A full listing (a fresh ``packhorse run``,
and every :data:`~packhorse.managers.scan.FULL_RESCAN_EVERY`-th scan of one) of a disk location
holding at least :data:`SHARD_MIN_FILES` registered files is therefore split:

* the folders two levels down (``<a>/<b>``) are sorted by their path with a trailing ``/``
  (the order of the paths under them) and cut into ``processes`` contiguous ranges
  (:func:`plan_shards`; read with ``scandir`` of the root and the top-level folders, nothing
  followed: this only decides who lists what);
* each process walks the location through its own storage backend, as a one-process scan does
  (I6), listing only the folders two levels down of its range; it reports exactly the entries
  whose path lies in its range (:class:`~packhorse.managers.listing.Shard`), reads the
  registrations of that range of paths (:func:`~packhorse.managers.listing.registered_files`) and
  returns only the files whose ``(size, mtime)`` differ from their registration: nothing, for
  an unchanged tree;
* the scan goes on with what the processes returned as it does with a one-process listing.

The processes come from the ``forkserver`` start method (the embedded runner's fork server
already holds packhorse's modules) and end with the listing. Anything that goes wrong in them
(a root that went away, a process that died) makes the scan list the location in its own
process instead, which reports it as usual.
"""

from __future__ import annotations

import bisect
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import structlog
from sqlalchemy import func, select

from packhorse.config import Settings
from packhorse.db.models import RawDataFile
from packhorse.db.session import Database
from packhorse.managers.listing import (
    Shard,
    compare_listing,
    cycle_collection_paused,
    filter_listing,
    registered_files,
    walk,
)
from packhorse.storage.base import RESERVED_PREFIX, Entry
from packhorse.storage.registry import backend_for

log = structlog.get_logger(__name__)

#: A full listing of a location holding at least this many registered files is made by
#: several processes (below that, starting them costs more than they save).
SHARD_MIN_FILES = 100_000


@dataclass
class ShardListing:
    """What one shard's process returns: the files whose ``(size, mtime)`` differ from their
    registration or that have none (``new_or_changed``, path and entry), the paths of those that
    have one (``differs``), the paths it could not register (``skipped``: path, reason), the
    folders it saw (``seen``, for the scan cache) and the paths whose folder must be listed again
    (``unclean``)."""

    new_or_changed: list[tuple[str, Entry]] = field(default_factory=list)
    differs: set[str] = field(default_factory=set)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    seen: dict[str, object] | None = None
    unclean: list[str] = field(default_factory=list)


def plan_shards(root: str, processes: int) -> list[str] | None:
    """The ranges of a sharded listing of the folder ``root``: ``processes - 1`` (or fewer)
    boundaries, each ``"<a>/<b>/"`` of a folder two levels down; shard ``i`` holds the paths in
    ``[boundary i-1, boundary i)`` (the first from ``""``, the last without end). The folders
    are cut into ranges of about equal counts. ``None`` when the location cannot be split so
    (fewer than two such folders, or its top cannot be read: the one-process scan reports why).
    Only folders that are not symbolic links and whose names are UTF-8 are boundaries."""
    if processes < 2:
        return None
    folders: list[str] = []
    try:
        with os.scandir(root) as top:
            tops = [e.name for e in top if e.is_dir(follow_symlinks=False)]
        for a in tops:
            if a + "/" == RESERVED_PREFIX:
                continue
            try:
                with os.scandir(os.path.join(root, a)) as sub:
                    folders += [f"{a}/{e.name}/" for e in sub if e.is_dir(follow_symlinks=False)]
            except OSError:
                continue  # the walk reports it
    except OSError:
        return None
    usable = sorted(f for f in folders if _utf8(f))
    if len(usable) < 2:
        return None
    cuts = sorted({usable[len(usable) * k // processes] for k in range(1, processes)} - {usable[0]})
    return cuts or None


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shard_bounds(boundaries: list[str], index: int) -> tuple[str, str | None]:
    """``(lo, hi)`` of shard ``index`` of :func:`plan_shards`' ``boundaries``."""
    return (boundaries[index - 1] if index else "", boundaries[index] if index < len(boundaries) else None)


def shard_of(boundaries: list[str], path: str) -> int:
    """The shard whose range holds ``path``."""
    return bisect.bisect_right(boundaries, path)


def registered_count(db: Database, loc_id: int) -> int:
    """How many registrations location ``loc_id`` holds (every version; an index count)."""
    return int(db.read(lambda s: s.scalar(select(func.count()).select_from(RawDataFile).where(
        RawDataFile.location_id == loc_id))) or 0)


def list_shard(settings: Settings, location: str, loc_id: int, boundaries: list[str], index: int,
               keep_seen: bool, trusted_before_ns: int) -> ShardListing:
    """List shard ``index`` of ``location`` and compare it with its registrations (the body of
    one shard's process; see the module docstring). The cyclic garbage collector is paused
    meanwhile, as in a one-process scan (the listing holds no cycles).

    Raises:
        LocationUnavailableError: the location's root is not there.
    """
    lo, hi = shard_bounds(boundaries, index)
    out = ShardListing(seen={} if keep_seen else None)
    found: list[tuple[str, Entry]] = []
    with cycle_collection_paused():
        walk(backend_for(settings, location), found, out.skipped, None, out.seen,  # type: ignore[arg-type]
              trusted_before_ns, shard=Shard(index, lo, hi), unclean_out=out.unclean)
        found, out.skipped = filter_listing(settings, location, found, out.skipped)
        db = Database(settings.database_url)
        try:
            registered = db.read(lambda s: registered_files(s.connection(), loc_id, lo=lo, hi=hi))
        finally:
            db.dispose()
        out.new_or_changed, out.differs = compare_listing(found, registered)
    return out


def list_in_shards(settings: Settings, location: str, loc_id: int, root: str, processes: int,
                   keep_seen: bool, trusted_before_ns: int) -> ShardListing | None:
    """A full listing of ``location`` (its root folder ``root``) compared with its
    registrations, made by up to ``processes`` processes and merged; ``None`` when it cannot
    be split (:func:`plan_shards`) or a process failed: the caller lists the location itself.
    Each shard's entries are its own, so the merge is a concatenation (``seen``: a union of
    disjoint folders)."""
    boundaries = plan_shards(root, processes)
    if boundaries is None:
        return None
    started = time.perf_counter()
    # the embedded runner's fork server holds packhorse's modules already (its preload)
    context = multiprocessing.get_context("forkserver")
    try:
        with ProcessPoolExecutor(len(boundaries) + 1, mp_context=context) as pool:
            parts = list(pool.map(list_shard, *zip(*[(settings, location, loc_id, boundaries, i, keep_seen,
                                                       trusted_before_ns) for i in range(len(boundaries) + 1)])))
    except Exception as e:  # noqa: BLE001 - listed again in this process, which reports it
        log.warning("sharded_listing_failed", location=location, error=repr(e))
        return None
    merged = ShardListing(seen={} if keep_seen else None)
    for part in parts:
        merged.new_or_changed += part.new_or_changed
        merged.differs |= part.differs
        merged.skipped += part.skipped
        merged.unclean += part.unclean
        if merged.seen is not None and part.seen is not None:
            merged.seen.update(part.seen)
    log.debug("sharded_listing", location=location, processes=len(parts),
              seconds=round(time.perf_counter() - started, 3), differ=len(merged.new_or_changed))
    return merged
