"""The source audit's passes (packhorse.managers.source_audit): a slice that runs out of time
records the path it reached and the next slice goes on after it; a pass counts its files; the
cadence (``source_audit_interval_seconds``) says when a pass is due; an unpackaged file whose
bytes changed behind its size and mtime is registered again in place. In-process, against a
real SQLite ops database and real files."""

from __future__ import annotations

import datetime as dt
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import select

from packhorse.config import load_config
from packhorse.db.models import RawDataFile, SourceAudit
from packhorse.db.session import Database
from packhorse.managers.scan import hash_source, scan_all
from packhorse.managers.source_audit import audit_due, audit_source, is_due
from packhorse.rules.availability import mark_locations
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from support import write_site_config


@pytest.fixture
def ctx(tmp_path: Path):
    cfg = write_site_config(tmp_path / "site", settle_seconds=0)
    text = cfg.read_text().replace('role = "source"\n', 'role = "source"\nsource_audit_interval_seconds = 3600\n')
    cfg.write_text(text)
    settings = load_config(cfg)
    db = Database(settings.database_url)
    db.upgrade()
    c = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    mark_locations(c)
    yield c
    db.dispose()


def write(ctx: ProcessContext, rel: str, data: bytes) -> Path:
    p = ctx.settings.location_path("fyst-source") / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    t = time.time() - 60
    os.utime(p, (t, t))
    return p


def row(ctx: ProcessContext) -> SourceAudit:
    return ctx.db.read(lambda s: s.get(SourceAudit, "fyst-source"))


def test_slices_go_on_from_the_path_they_reached(ctx) -> None:
    for i in range(3):
        write(ctx, f"cam/obs1/f{i}.dat", bytes([i]) * 100)
    with ThreadPoolExecutor(1) as pool:
        scan_all(ctx, pool)  # registers them; the scan's own slice makes the first pass
    first = row(ctx)
    assert first.completed_at is not None and first.files_checked == 3 and first.cursor is None
    seen: list[str] = []

    def hasher(backend, rel, before):  # type: ignore[no-untyped-def]
        seen.append(rel)
        return hash_source(backend, rel, before)

    # a slice of no time audits one file: a new pass, then on from where it stopped
    results = [audit_source(ctx, "fyst-source", hasher, budget_seconds=0.0) for _ in range(3)]
    assert seen == ["cam/obs1/f0.dat", "cam/obs1/f1.dat", "cam/obs1/f2.dat"]
    assert [r.completed for r in results] == [False, False, False]
    assert row(ctx).cursor == "cam/obs1/f2.dat" and row(ctx).completed_at is None
    last = audit_source(ctx, "fyst-source", hasher, budget_seconds=0.0)
    assert last.completed and last.checked == 0 and row(ctx).cursor is None
    assert row(ctx).files_checked == 3  # the counts of the whole pass


def test_cadence_and_an_unpackaged_file_changed_in_place(ctx) -> None:
    p = write(ctx, "cam/obs1/a.dat", b"a" * 100)
    with ThreadPoolExecutor(1) as pool:
        scan_all(ctx, pool)
    now = dt.datetime.now(dt.UTC)
    assert not is_due(row(ctx), 3600, now) and is_due(row(ctx), 3600, now + dt.timedelta(hours=2))
    assert is_due(None, 3600, now)
    assert audit_due(ctx, "fyst-source", hash_source) is None  # not due: nothing read
    st = os.stat(p)
    p.write_bytes(b"A" * 100)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = audit_source(ctx, "fyst-source", hash_source)
    assert [(c["path"], c["action"]) for c in r.changed] == [("cam/obs1/a.dat", "update")]
    regs = ctx.db.read(lambda s: [(f.version, f.found_by) for f in s.scalars(select(RawDataFile))])
    assert regs == [(1, "source_audit")]  # registered again in place: not packaged yet


def test_a_location_that_is_not_a_source_is_refused(ctx) -> None:
    with pytest.raises(ValueError, match="not a source location"):
        audit_source(ctx, "cologne-lta", hash_source)
