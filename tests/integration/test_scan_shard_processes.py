"""A full scan listed by several processes (packhorse.managers.scanshards) registers exactly
what a one-process scan registers (a new file, a new version of a changed file, nothing for an
unchanged one) and leaves the scan cache a later scan can rely on; a range read of the
registrations on PostgreSQL (database collation or not) holds exactly the paths Python puts in
it, whatever the database's collation. Starts real processes (the ``forkserver`` start method) and uses the shared PostgreSQL."""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import select, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from test_scan_cache import age_folders, make_ctx, write  # noqa: E402
from test_scan_shards import PATHS, check_ranges, insert_registrations  # noqa: E402

from packhorse.config import load_config  # noqa: E402
from packhorse.db.models import RawDataFile  # noqa: E402
from packhorse.db.session import Database  # noqa: E402
from packhorse.managers import scanshards  # noqa: E402
from packhorse.managers.scan import ScanCache, scan_location  # noqa: E402
from packhorse.runtime.topology import sync_topology  # noqa: E402
from support import write_site_config  # noqa: E402


@pytest.fixture
def ctx(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = make_ctx(tmp_path / "site", settle_seconds=0)
    yield c
    c.db.dispose()


@pytest.fixture
def sharded(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Any location is listed in shards; the merged listings each sharded scan used."""
    monkeypatch.setattr(scanshards, "SHARD_MIN_FILES", 1)
    used: list[object] = []
    real = scanshards.list_in_shards

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(*args, **kwargs)
        used.append(out)
        return out

    monkeypatch.setattr(scanshards, "list_in_shards", spy)
    return used


def versions(ctx) -> dict[str, list[tuple[int, int]]]:  # type: ignore[no-untyped-def]
    rows = ctx.db.read(lambda s: list(s.execute(select(RawDataFile.relative_path, RawDataFile.version,
                                                       RawDataFile.size))))
    out: dict[str, list[tuple[int, int]]] = {}
    for path, version, size in rows:
        out.setdefault(path, []).append((version, size))
    return {p: sorted(v) for p, v in out.items()}


def test_a_sharded_full_scan_registers_what_one_process_would(ctx, sharded) -> None:  # type: ignore[no-untyped-def]
    root = ctx.settings.location_path("fyst-source")
    files = [f"inst{i % 3}/obs{i:02d}/f{i}.dat" for i in range(24)] + ["inst0/shallow.txt", "top.txt"]
    for rel in files:
        write(root / rel, rel.encode())
    age_folders(root)
    with ThreadPoolExecutor(2) as pool:
        first = scan_location(ctx, "fyst-source", pool, None, processes=2)
        assert first.registered == len(files) and not first.skipped
        assert sharded == [None] or all(u is not None for u in sharded)
        before = versions(ctx)
        # changes a full listing must find: new bytes of another size, a new file deep down, a
        # new file at the top, an entry it skips
        write(root / "inst1/obs01/f1.dat", b"new bytes, longer than before")
        write(root / "inst2/obs23/deeper/new.dat", b"new")
        write(root / "new-top.txt", b"top")
        os.symlink("f1.dat", root / "inst1/obs01/link")
        age_folders(root)
        sharded.clear()
        cache = ScanCache()  # a fresh `packhorse run`: its first scan is a full one
        second = scan_location(ctx, "fyst-source", pool, cache, processes=2)
        assert sharded and sharded[-1] is not None, "the listing was not made in shards"
        assert second.registered == 3
        assert second.skipped == [("inst1/obs01/link", "symbolic link (not followed)")]
        after = versions(ctx)
        # not packaged yet: its registration is brought up to date, as a one-process scan does
        assert before["inst1/obs01/f1.dat"] == [(1, 18)] and after["inst1/obs01/f1.dat"] == [(1, 29)]
        assert after["inst2/obs23/deeper/new.dat"] == [(1, 3)] and after["new-top.txt"] == [(1, 3)]
        assert {p: v for p, v in after.items() if p in before and p != "inst1/obs01/f1.dat"} == \
            {p: v for p, v in before.items() if p != "inst1/obs01/f1.dat"}  # nothing else registered
        # the cache the shards left lets the next (cached) scan find a file in a folder two
        # levels down and one at the top, as a one-process listing's cache does
        assert {"", "inst0", "inst0/obs00", "inst2/obs23/deeper"} <= set(cache.folders["fyst-source"])
        write(root / "inst0/obs03/later.dat", b"later")
        os.utime(root / "inst0/obs03", (time.time() - 5, time.time() - 5))
        third = scan_location(ctx, "fyst-source", pool, cache, processes=2)
        assert third.registered == 1
        assert versions(ctx)["inst0/obs03/later.dat"] == [(1, 5)]


def test_a_sharded_scan_of_a_root_that_is_not_a_tree_falls_back_to_one_process(ctx, sharded) -> None:  # type: ignore[no-untyped-def]
    root = ctx.settings.location_path("fyst-source")
    write(root / "a" / "b" / "one.dat", b"1")  # one folder two levels down: nothing to cut between
    with ThreadPoolExecutor(1) as pool:
        assert scan_location(ctx, "fyst-source", pool, None).registered == 1
        write(root / "a" / "b" / "two.dat", b"2")
        result = scan_location(ctx, "fyst-source", pool, None, processes=2)
    assert sharded == [None] and result.registered == 1



def test_a_range_of_registrations_is_the_paths_python_puts_in_it_postgresql(pg_db: Database, tmp_path: Path) -> None:
    loc_id = sync_topology(pg_db, load_config(write_site_config(tmp_path / "site"))).location_ids["fyst-source"]
    # a database made with a linguistic collation (what initdb takes from a site's locale),
    # where 'a/B' sorts beside 'a/b' and '/' is ignored at first
    pg_db.transact(lambda s: s.execute(text(
        'ALTER TABLE raw_data_files ALTER COLUMN relative_path TYPE text COLLATE "en-US-x-icu"')))
    insert_registrations(pg_db, loc_id, PATHS)
    check_ranges(pg_db, loc_id)
