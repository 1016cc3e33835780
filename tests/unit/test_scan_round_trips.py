"""A scan's database statements per chunk of files it registers (the distributed scan task's
path: :func:`packhorse.engine.pipeline.scan_and_package`). A site's workers may be 100 ms from
the central database, every statement a round trip: a scan of 20,000 files cost about 160 of
them, 16 s, most of the time until its files were registered. A chunk now costs its
registration (one statement) and its packaging (five), with no per-500-paths deletion of skip
records that are not there and no read of which groups have unpackaged files; a file skipped
before and registered now still loses its skip record. Real files, a real SQLite ops database."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import event, select
from test_scan_cache import make_ctx

from packhorse.db.models import RawDataFile, RawDataPackage, SkippedFile
from packhorse.engine.pipeline import scan_and_package
from packhorse.managers import scan as scan_module
from packhorse.runtime.context import ProcessContext


@pytest.fixture
def ctx(tmp_path: Path) -> ProcessContext:
    c = make_ctx(tmp_path / "site", settle_seconds=0)
    yield c
    c.db.dispose()


def _write(root: Path, groups: int, per_group: int) -> None:
    old = time.time() - 600
    for g in range(groups):
        for f in range(per_group):
            p = root / "inst" / f"obs{g:02d}" / f"f{f:03d}"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(os.urandom(64))
            os.utime(p, (old, old))


def _statements(ctx: ProcessContext) -> list[str]:
    sent: list[str] = []

    def stmt(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        words = " ".join(statement.split()[:3]).upper()
        if not words.startswith(("BEGIN", "COMMIT", "ROLLBACK")):
            sent.append(words)

    event.listen(ctx.db.engine, "before_cursor_execute", stmt)
    return sent


def test_a_chunk_costs_its_registration_and_its_packaging(ctx: ProcessContext,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan_module, "REGISTER_CHUNK_FILES", 20)  # 100 files of 10 groups: 5 chunks
    root = ctx.settings.location_path("fyst-source")
    _write(root, 10, 10)
    sent = _statements(ctx)
    with ThreadPoolExecutor(2) as pool:
        done = scan_and_package(ctx, "fyst-source", pool)
    assert done == {"registered": 100, "packages": 10, "skipped": 0}
    chunks = 5
    # SQLite inserts the packages of a chunk one statement each (RETURNING in parameter order);
    # PostgreSQL in one: counted once a chunk here
    per_chunk = [s for s in sent if not s.startswith("INSERT INTO RAW_DATA_PACKAGES")]
    # per chunk: the registration INSERT and the packaging's four others; a few fixed ones per
    # scan (withdrawn and skipped paths, the final packaging read)
    assert len(per_chunk) <= 5 * chunks + 3, "\n".join(sent)
    assert sum(s.startswith("INSERT INTO RAW_DATA_FILES") for s in sent) == chunks
    assert not [s for s in sent if s.startswith("DELETE FROM SKIPPED_FILES")]  # there were none
    assert sum(s.startswith("SELECT DISTINCT") for s in sent) == 1  # the final packaging, once
    assert ctx.db.read(lambda s: s.query(RawDataPackage).count()) == 10


def test_a_file_skipped_before_loses_its_record_once_registered(ctx: ProcessContext) -> None:
    root = ctx.settings.location_path("fyst-source")
    _write(root, 2, 3)
    with ThreadPoolExecutor(2) as pool:
        scan_and_package(ctx, "fyst-source", pool)
    # a file the last scan could not register (recorded skipped), there now with bytes to register
    late = root / "inst" / "obs05" / "late"
    late.parent.mkdir(parents=True)
    late.write_bytes(b"late bytes")
    old = time.time() - 600
    os.utime(late, (old, old))
    loc_id = ctx.topology.location_ids["fyst-source"]

    def skip(s) -> None:  # type: ignore[no-untyped-def]
        s.add_all([SkippedFile(location_id=loc_id, relative_path="inst/obs05/late", reason="was unreadable"),
                   SkippedFile(location_id=loc_id, relative_path="inst/obs09/elsewhere", reason="was unreadable")])

    ctx.db.transact(skip)
    with ThreadPoolExecutor(2) as pool:
        scan_and_package(ctx, "fyst-source", pool)
    assert ctx.db.read(lambda s: s.scalar(select(RawDataFile.sha256).where(
        RawDataFile.relative_path == "inst/obs05/late"))) is not None
    left = ctx.db.read(lambda s: list(s.scalars(select(SkippedFile.relative_path))))
    # registered: no longer skipped; the other record is not this scan's to judge (a full
    # listing that does not find it skipped again removes it)
    assert "inst/obs05/late" not in left
