"""Scanning with a :class:`~packhorse.managers.scan.ScanCache` (what ``packhorse run`` keeps):
unchanged, fully registered folders are not listed again, yet nothing that appears is missed —
new files, files that were still settling, and (at the periodic full rescan) files added
without changing their folder's mtime."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

import pytest
from sqlalchemy import select

from packhorse.config import load_config
from packhorse.db.models import RawDataFile
from packhorse.db.session import Database
from packhorse.managers import listing
from packhorse.managers import scan as scan_module
from packhorse.managers.scan import ScanCache, scan_all
from packhorse.rules.availability import mark_locations
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.hooks import Hooks
from packhorse.runtime.topology import sync_topology
from packhorse.storage.base import StorageBackend
from packhorse.storage.identity import MARKER_KEY
from packhorse.storage.layers import Layer
from support import write_site_config


def make_ctx(folder: Path, **overrides: object) -> ProcessContext:
    settings = load_config(write_site_config(folder, **overrides))
    db = Database(settings.database_url)
    db.upgrade()
    c = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    mark_locations(c)  # as `packhorse init` does: every location root exists and is marked
    c._backends.clear()  # a test may hand in its own hooks afterwards
    return c


@pytest.fixture
def ctx(tmp_path: Path) -> ProcessContext:
    c = make_ctx(tmp_path / "site", settle_seconds=0)
    yield c
    c.db.dispose()


def source(ctx: ProcessContext) -> Path:
    return ctx.settings.location_path("fyst-source")


def write(path: Path, data: bytes, *, age: float = 10.0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    t = time.time() - age
    os.utime(path, (t, t))


def age_folders(root: Path, age: float = 10.0) -> None:
    """Make every folder's mtime old enough to be trusted (as after a quiet while)."""
    t = time.time() - age
    for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        os.utime(d, (t, t))


def registered(ctx: ProcessContext) -> set[str]:
    return set(ctx.db.read(lambda s: list(s.scalars(select(RawDataFile.relative_path)))))


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Folders the scan lists (``os.scandir`` calls)."""
    calls: list[str] = []
    real = os.scandir

    def spy(path):  # type: ignore[no-untyped-def]
        calls.append(os.fspath(path))
        return real(path)

    monkeypatch.setattr(scan_module.os, "scandir", spy)
    return calls


def test_unchanged_folders_are_not_listed_again_and_new_files_are_found(ctx: ProcessContext, listed: list[str]) -> None:
    root = source(ctx)
    for g in range(3):
        write(root / f"inst/obs{g}/a.fits", b"a" * (g + 1))
    age_folders(root)
    listed.clear()
    cache = ScanCache()
    with ThreadPoolExecutor(2) as pool:
        assert scan_all(ctx, pool, cache).registered == 3
        assert len(listed) == 6  # root, inst, obs0..2 and _packhorse (the marker's: a file put there is reported)
        listed.clear()
        assert scan_all(ctx, pool, cache).registered == 0
        assert listed == []  # nothing changed: no folder listed
        write(root / "inst/obs1/b.fits", b"new")  # changes obs1's mtime (now)
        assert scan_all(ctx, pool, cache).registered == 1
        assert listed == [str(root / "inst/obs1")]
    assert registered(ctx) == {"inst/obs0/a.fits", "inst/obs1/a.fits", "inst/obs2/a.fits", "inst/obs1/b.fits"}


def test_a_folder_with_a_settling_file_is_listed_until_the_file_is_registered(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path / "site", settle_seconds=5)
    root = source(ctx)
    write(root / "inst/obs0/old.fits", b"old", age=60)
    write(root / "inst/obs0/new.fits", b"new", age=0)  # still being written
    age_folders(root)  # the folder's mtime says nothing changed from now on
    cache = ScanCache()
    with ThreadPoolExecutor(2) as pool:
        first = scan_all(ctx, pool, cache)
        assert (first.registered, first.pending_settle) == (1, 1)
        t = time.time() - 60
        os.utime(root / "inst/obs0/new.fits", (t, t))  # it settles; the folder's mtime stays
        age_folders(root)
        assert scan_all(ctx, pool, cache).registered == 1
    assert registered(ctx) == {"inst/obs0/old.fits", "inst/obs0/new.fits"}


def test_a_file_added_without_changing_the_folder_mtime_is_found_by_the_full_rescan(
        ctx: ProcessContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan_module, "FULL_RESCAN_EVERY", 3)
    root = source(ctx)
    write(root / "inst/obs0/a.fits", b"a")
    age_folders(root)
    folder = root / "inst/obs0"
    cache = ScanCache()
    with ThreadPoolExecutor(2) as pool:
        assert scan_all(ctx, pool, cache).registered == 1  # scan 0: full
        before = folder.stat().st_mtime_ns
        write(folder / "b.fits", b"b")
        os.utime(folder, ns=(before, before))  # a same-tick addition: the folder looks unchanged
        assert scan_all(ctx, pool, cache).registered == 0  # scan 1: trusts the folder
        assert scan_all(ctx, pool, cache).registered == 0  # scan 2
        assert scan_all(ctx, pool, cache).registered == 1  # scan 3: full rescan
    assert "inst/obs0/b.fits" in registered(ctx)


def test_a_folder_modified_just_before_the_scan_is_not_trusted(ctx: ProcessContext) -> None:
    root = source(ctx)
    write(root / "inst/obs0/a.fits", b"a")  # folder mtime: now (within RACY_SECONDS)
    cache = ScanCache()
    with ThreadPoolExecutor(2) as pool:
        assert scan_all(ctx, pool, cache).registered == 1
        folder = root / "inst/obs0"
        before = folder.stat().st_mtime_ns
        write(folder / "b.fits", b"b")
        os.utime(folder, ns=(before, before))  # same tick as the first scan saw
        assert scan_all(ctx, pool, cache).registered == 1  # listed again: its mtime was too recent


def test_a_missing_source_folder_is_an_outage_and_nothing_is_forgotten(ctx: ProcessContext, tmp_path: Path) -> None:
    # an unmounted source disk (or a renamed folder): every scan (with or without a cache)
    # records the outage and registers, skips and forgets nothing; back, the scan goes on
    from sqlalchemy import func, select

    from packhorse.db.models import LocationOutage, RawDataFile

    write(source(ctx) / "inst/obs1/a.dat", b"a")
    with ThreadPoolExecutor(2) as pool:
        assert scan_all(ctx, pool).registered == 1
        away = tmp_path / "unmounted"
        source(ctx).rename(away)
        cache = ScanCache()
        for c in (cache, cache, None):
            result = scan_all(ctx, pool, c)
            assert result.registered == 0 and result.skipped == []
        assert not source(ctx).exists()  # never re-created
        assert ctx.db.read(lambda s: s.scalar(select(func.count()).select_from(RawDataFile))) == 1
        [outage] = ctx.db.read(lambda s: list(s.scalars(select(LocationOutage))))
        assert "does not exist" in outage.reason and not outage.marker_only
        away.rename(source(ctx))
        write(source(ctx) / "inst/obs2/b.dat", b"b")
        assert scan_all(ctx, pool).registered == 1
    assert ctx.db.read(lambda s: s.scalar(select(func.count()).select_from(LocationOutage))) == 0


def test_a_file_registered_by_another_scanner_meanwhile_is_not_an_error(ctx: ProcessContext,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # two `packhorse run` on one database (found by a new-user trial): the second scan hashed
    # files the first registered after it looked. Its insert must not fail — a failed scan left
    # the runner without the list of groups still settling, and it packaged a group whose
    # last files then became a second package of their own.
    write(source(ctx) / "inst/obs1/a.dat", b"a")
    write(source(ctx) / "inst/obs1/b.dat", b"b")
    with ThreadPoolExecutor(2) as pool:
        assert scan_all(ctx, pool).registered == 2
        monkeypatch.setattr(scan_module, "registered_files", lambda *a, **k: {})  # looked before the other committed
        again = scan_all(ctx, pool)
    assert again.unsettled_groups == {"fyst-source": set()} and not again.skipped
    rows = ctx.db.read(lambda s: s.execute(select(RawDataFile.relative_path, RawDataFile.sha256)).all())
    assert sorted(p for p, _ in rows) == ["inst/obs1/a.dat", "inst/obs1/b.dat"]


def test_no_packaging_after_a_failed_scan(ctx: ProcessContext) -> None:
    # the runner passes None when its latest scan failed: which groups are still settling is
    # unknown then, and a group packaged half-registered would be split in two packages
    from packhorse.db.models import RawDataPackage
    from packhorse.executors.local import LocalRunner

    write(source(ctx) / "inst/obs1/a.dat", b"a")
    with ThreadPoolExecutor(2) as pool:
        scan_all(ctx, pool)
    runner = LocalRunner(ctx)
    try:
        assert runner.manage(None, flush=True)[0] == 0
        assert ctx.db.read(lambda s: s.scalar(select(RawDataPackage.id))) is None
        assert runner.manage({}, flush=True)[0] >= 1  # once a scan succeeded
    finally:
        runner.hash_pool.shutdown()


def skipped_rows(ctx: ProcessContext) -> set[str]:
    from packhorse.db.models import SkippedFile

    return set(ctx.db.read(lambda s: list(s.scalars(select(SkippedFile.relative_path)))))


def test_a_folder_readable_again_leaves_the_skipped_list(ctx: ProcessContext, monkeypatch: pytest.MonkeyPatch) -> None:
    # found by a new-user trial: after `chmod 755` the folder was archived, yet `status` listed
    # it as "folder not readable" forever (tests run as root, so the denial is simulated)
    write(source(ctx) / "inst/obs1/a.dat", b"a")
    write(source(ctx) / "inst/obs2/b.dat", b"b")
    age_folders(source(ctx))
    real = os.scandir

    def denied(path):  # type: ignore[no-untyped-def]
        if str(path).endswith("inst/obs2"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    cache = ScanCache()
    with ThreadPoolExecutor(2) as pool:
        monkeypatch.setattr(os, "scandir", denied)
        first = scan_all(ctx, pool, cache)
        assert ("inst/obs2", "folder not readable: Permission denied") in first.skipped
        assert skipped_rows(ctx) == {"inst/obs2"}
        monkeypatch.setattr(os, "scandir", real)
        scan_all(ctx, pool, cache)  # not a full listing: the cache skips inst/obs1
    assert skipped_rows(ctx) == set()
    assert registered(ctx) == {"inst/obs1/a.dat", "inst/obs2/b.dat"}


def test_a_full_listing_forgets_skipped_paths_that_are_gone(ctx: ProcessContext) -> None:
    write(source(ctx) / "inst/obs1/a.dat", b"a")
    os.symlink("a.dat", source(ctx) / "inst/obs1/link.dat")
    with ThreadPoolExecutor(2) as pool:
        scan_all(ctx, pool)
        assert skipped_rows(ctx) == {"inst/obs1/link.dat"}
        scan_all(ctx, pool)  # still there: still listed
        assert skipped_rows(ctx) == {"inst/obs1/link.dat"}
        (source(ctx) / "inst/obs1/link.dat").unlink()
        scan_all(ctx, pool)
    assert skipped_rows(ctx) == set()


class _ReadLog(Hooks):
    """Hooks whose storage layer records every read and corrupts nothing."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, str]] = []

    def storage_layer(self, backend: StorageBackend) -> StorageBackend:
        hooks = self

        class Reads(Layer):
            def open_read(self, key: str) -> BinaryIO:
                hooks.reads.append((self.location, key))
                return self.inner.open_read(key)

        return Reads(backend)


def test_the_scan_reads_source_files_through_the_location_backend(ctx: ProcessContext) -> None:
    ctx.hooks = hooks = _ReadLog()
    write(source(ctx) / "inst" / "obs" / "a.dat", b"a" * 10)
    write(source(ctx) / "inst" / "obs" / "big.dat", os.urandom(scan_module.THREAD_HASH_MIN_BYTES))  # on the pool
    with ThreadPoolExecutor(2) as pool:
        scan_all(ctx, pool)
    # (the identity marker is read too: the scan looks at the location first)
    assert sorted(r for r in hooks.reads if r[1] != MARKER_KEY) == [("fyst-source", "inst/obs/a.dat"),
                                                                   ("fyst-source", "inst/obs/big.dat")]
    assert registered(ctx) == {"inst/obs/a.dat", "inst/obs/big.dat"}


class _GrowsWhileRead(Hooks):
    """Hooks whose storage layer appends to a source file right after the scan opened it (an
    instrument still writing it), handing the scan either the real file or a copy of its bytes
    with no descriptor (a backend whose streams have none)."""

    def __init__(self, *, descriptor: bool) -> None:
        self.descriptor = descriptor

    def storage_layer(self, backend: StorageBackend) -> StorageBackend:
        hooks = self

        class Grows(Layer):
            def open_read(self, key: str) -> BinaryIO:
                f = self.inner.open_read(key)
                if not key.startswith("inst/"):  # the location's own files (its identity marker)
                    return f
                with open(self.inner.local_path(key), "ab") as w:  # type: ignore[attr-defined]
                    w.write(b"more")
                if hooks.descriptor:
                    return f
                import io

                with f:
                    return io.BytesIO(f.read())

        return Grows(backend)


@pytest.mark.parametrize("descriptor", [True, False], ids=["file", "stream-without-descriptor"])
def test_a_file_that_grows_while_it_is_hashed_is_not_registered(ctx: ProcessContext, descriptor: bool) -> None:
    ctx.hooks = _GrowsWhileRead(descriptor=descriptor)
    write(source(ctx) / "inst" / "obs" / "a.dat", b"a" * 10)
    with ThreadPoolExecutor(1) as pool:
        result = scan_all(ctx, pool)
    assert registered(ctx) == set()
    assert result.pending_settle == 1  # looked at again later, not skipped


def test_files_in_a_folder_named_with_the_partial_suffix_are_listed_as_skipped(tmp_path: Path) -> None:
    # such files were dropped without a trace: neither registered nor in the skipped list
    from packhorse.storage.disk import DiskBackend

    root = tmp_path / "src"
    (root / "cam14" / ".packhorse-partial").mkdir(parents=True)
    (root / "cam14" / ".packhorse-partial" / "f.txt").write_bytes(b"x")
    (root / "cam14" / "ok.txt").write_bytes(b"y")
    found: list = []
    skipped: list[tuple[str, str]] = []
    listing.walk(DiskBackend("src", root), found, skipped)
    assert [p for p, _ in found] == ["cam14/ok.txt"]
    assert [p for p, _ in skipped] == ["cam14/.packhorse-partial/f.txt"]
    assert "reserved suffix" in skipped[0][1]



def test_a_skip_reason_quotes_a_4_kb_name_cut_with_its_length_and_keeps_the_path_whole(tmp_path: Path) -> None:
    from packhorse.storage.disk import DiskBackend

    root = tmp_path / "src"
    deep = root.joinpath(*["d" * 200] * 19, "cam14", ".packhorse-partial")
    deep.mkdir(parents=True)
    (deep / "f.txt").write_bytes(b"x")
    found: list = []
    skipped: list[tuple[str, str]] = []
    listing.walk(DiskBackend("src", root), found, skipped)
    ((path, reason),) = skipped
    # ~3.8 KB (the test makes the folders by absolute path, which must stay under PATH_MAX)
    assert len(path) > 3800 and path.endswith("/cam14/.packhorse-partial/f.txt")  # the row keeps it whole
    assert "reserved suffix" in reason and len(reason) < 400, reason
    assert f"({len(path):,} characters)" in reason, reason
