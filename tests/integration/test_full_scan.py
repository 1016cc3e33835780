"""A full scan (a fresh process, every 30th scan of ``packhorse run``) of a tree larger than
one registration read per path, on SQLite and on PostgreSQL: the location's registrations are
read with the driver's own cursor and compared with the listing, so an unchanged tree
registers nothing, and a file changed in place (no folder mtime change), a touched file and a
new file are each found as the rules say (README "Versions")."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from pg_scratch import scratch_postgres
from sqlalchemy import select

from packhorse.config import load_config
from packhorse.db.models import RawDataFile
from packhorse.db.session import Database
from packhorse.managers.scan import scan_location
from packhorse.rules.availability import mark_locations
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from support import write_site_config

FILES = 2600  # above the 2,000 paths up to which registrations are read path by path


@pytest.fixture(params=["sqlite", "postgresql"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProcessContext]:
    settings = load_config(write_site_config(tmp_path / "site", settle_seconds=0))
    dbs: Iterator[Database] | None = None
    if request.param == "postgresql":
        dbs = scratch_postgres()
        db = next(dbs)
    else:
        db = Database(settings.database_url)
        db.upgrade()
    c = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    mark_locations(c)
    try:
        yield c
    finally:
        if dbs is None:
            db.dispose()
        else:
            dbs.close()


def _old(path: Path, age: float = 60.0) -> None:
    t = time.time() - age
    os.utime(path, (t, t))


def _rows(ctx: ProcessContext) -> dict[tuple[str, int], tuple[int, str]]:
    """``{(path, version): (size, sha256)}`` of every registration."""
    return {(r.relative_path, r.version): (r.size, r.sha256) for r in ctx.db.read(lambda s: list(s.execute(
        select(RawDataFile.relative_path, RawDataFile.version, RawDataFile.size, RawDataFile.sha256))))}


def test_a_full_scan_registers_only_what_changed(ctx: ProcessContext) -> None:
    root = ctx.settings.location_path("fyst-source")
    for i in range(FILES):
        p = root / "inst" / f"obs{i // 500:02d}" / f"f{i:05d}.dat"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x" * (i % 7))
        _old(p)
    with ThreadPoolExecutor(2) as pool:
        first = scan_location(ctx, "fyst-source", pool)
        assert first.registered == FILES and not first.skipped
        before = _rows(ctx)
        again = scan_location(ctx, "fyst-source", pool)
        assert (again.registered, again.skipped, again.pending_settle) == (0, [], 0)
        assert _rows(ctx) == before

        unpackaged = root / "inst" / "obs00" / "f00003.dat"
        unpackaged.write_bytes(b"new bytes")  # in place: its folder's mtime does not change
        _old(unpackaged, 30)
        touched = root / "inst" / "obs01" / "f00501.dat"
        _old(touched, 20)  # a touch: same bytes, new mtime
        added = root / "inst" / "obs04" / "g.dat"
        added.write_bytes(b"added")
        _old(added)
        third = scan_location(ctx, "fyst-source", pool)

    rows = _rows(ctx)
    assert third.registered == 3 and not third.skipped
    # not packaged yet: the new bytes are registered in place of the old, the touch is
    # registered with its new mtime (same sha256), the new file is version 1
    assert rows[("inst/obs00/f00003.dat", 1)][0] == len(b"new bytes")
    assert rows[("inst/obs01/f00501.dat", 1)] == before[("inst/obs01/f00501.dat", 1)]
    assert rows[("inst/obs04/g.dat", 1)][0] == 5
    assert len(rows) == FILES + 1
