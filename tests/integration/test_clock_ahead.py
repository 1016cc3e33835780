"""Files written by a clock ahead of this host's (an instrument's, a file server's): their mtime
cannot age into ``settle_seconds``, so they settle by being seen unchanged for that long
(``packhorse.managers.scan._FUTURE_SEEN``, with or without a scan cache: both modes), are listed as skipped with the reason
meanwhile, and hold their observation unit back only that long. Real time passes here (the
settle time), hence not a unit test."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sqlalchemy import select

from packhorse.config import load_config
from packhorse.db.models import RawDataFile, SkippedFile
from packhorse.db.session import Database
from packhorse.managers.scan import ScanCache, scan_all, scan_location
from packhorse.rules.availability import mark_locations
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from support import write_site_config


def _ctx(folder: Path, settle: float) -> ProcessContext:
    settings = load_config(write_site_config(folder, settle_seconds=settle))
    db = Database(settings.database_url)
    db.upgrade()
    c = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    mark_locations(c)
    return c


def _write(path: Path, data: bytes, age: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    t = time.time() - age
    os.utime(path, (t, t))


def _registered(ctx: ProcessContext) -> set[str]:
    return set(ctx.db.read(lambda s: list(s.scalars(select(RawDataFile.relative_path)))))


def test_a_file_from_a_clock_ahead_settles_by_being_seen_unchanged(tmp_path: Path) -> None:
    # found by a trial: a file whose mtime was an hour ahead (an instrument's clock) held its
    # observation unit back until that hour came, and `run --until-idle` waited for it, saying
    # nothing; one dated years ahead was left out of the archive without a word
    ctx = _ctx(tmp_path / "site", settle=1)
    try:
        root = ctx.settings.location_path("fyst-source")
        _write(root / "inst/obs1/ahead.dat", b"ahead", age=-3600)  # an hour in the future
        _write(root / "inst/obs1/past.dat", b"past", age=60)
        _write(root / "inst/obs2/far.dat", b"far", age=-5 * 365 * 86400)
        cache = ScanCache()
        with ThreadPoolExecutor(2) as pool:
            first = scan_all(ctx, pool, cache)
            assert _registered(ctx) == {"inst/obs1/past.dat"}
            assert first.unsettled_groups["fyst-source"] == {"inst/obs1", "inst/obs2"}  # not packaged yet
            reasons = dict(first.skipped)
            assert set(reasons) == {"inst/obs1/ahead.dat", "inst/obs2/far.dat"}
            assert "ahead of this host's clock" in reasons["inst/obs1/ahead.dat"]
            assert first.pending_settle == 2 and first.next_settle_at is not None
            assert first.next_settle_at - time.time() <= 1.0  # the run waits a settle time, not an hour
            time.sleep(max(0.0, first.next_settle_at - time.time()) + 0.05)
            second = scan_all(ctx, pool, cache)
        assert _registered(ctx) == {"inst/obs1/past.dat", "inst/obs1/ahead.dat", "inst/obs2/far.dat"}
        assert not second.skipped and not second.pending_settle
        assert second.unsettled_groups["fyst-source"] == set()
        assert not ctx.db.read(lambda s: list(s.scalars(select(SkippedFile))))  # nothing left listed
    finally:
        ctx.db.dispose()


def test_a_file_from_a_clock_ahead_that_still_changes_waits(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path / "site", settle=0.5)
    try:
        f = ctx.settings.location_path("fyst-source") / "inst/obs1/growing.dat"
        _write(f, b"a", age=-3600)
        cache = ScanCache()
        with ThreadPoolExecutor(2) as pool:
            scan_all(ctx, pool, cache)
            time.sleep(0.6)
            _write(f, b"ab", age=-3590)  # written again meanwhile: seen anew
            assert scan_all(ctx, pool, cache).registered == 0
            time.sleep(0.6)
            assert scan_all(ctx, pool, cache).registered == 1
        assert _registered(ctx) == {"inst/obs1/growing.dat"}
    finally:
        ctx.db.dispose()


def test_the_scan_without_a_folder_cache_settles_it_too(tmp_path: Path) -> None:
    # the distributed scan task (pipeline.scan_and_package) keeps no ScanCache: a file from a
    # clock ahead must settle there as in `packhorse run`, not wait for its mtime to come
    ctx = _ctx(tmp_path / "site", settle=0.5)
    try:
        _write(ctx.settings.location_path("fyst-source") / "inst/obs1/ahead.dat", b"ahead", age=-3600)
        with ThreadPoolExecutor(2) as pool:
            first = scan_location(ctx, "fyst-source", pool)
            assert first.registered == 0 and first.next_settle_at is not None
            assert first.next_settle_at - time.time() <= 0.5
            time.sleep(max(0.0, first.next_settle_at - time.time()) + 0.05)
            assert scan_location(ctx, "fyst-source", pool).registered == 1
        assert _registered(ctx) == {"inst/obs1/ahead.dat"}
    finally:
        ctx.db.dispose()
