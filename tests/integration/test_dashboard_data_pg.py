"""The dashboard's queries on PostgreSQL: the backlog sample upsert (the latest sample of an
interval stands, two samplers write one row), the history grid, failure groups and locate."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from pg_scratch import scratch_postgres

from dashboard_support import NOW, make_ctx, world
from packhorse.actions.failure_groups import failure_groups, reset_group
from packhorse.db.models import BacklogSample, Operation
from packhorse.domain import OperationKind
from packhorse.status.history import history, record_backlog
from packhorse.status.locate import locate


@pytest.fixture
def pg():
    yield from scratch_postgres()


def test_dashboard_data_on_postgres(tmp_path: Path, pg) -> None:
    ctx = make_ctx(tmp_path, pg)
    world(ctx)
    record_backlog(pg, interval_seconds=60, keep_days=7, now=NOW - dt.timedelta(seconds=20))
    pg.transact(lambda s: s.query(Operation).filter(Operation.status == "FAILED", Operation.dedup_key == "transfer:10")
                .update({"status": "PENDING"}))
    record_backlog(pg, interval_seconds=60, keep_days=7, now=NOW)
    rows = pg.read(lambda s: s.query(BacklogSample).filter_by(kind="transfer").all())
    assert [(r.waiting, r.failed) for r in rows] == [(1, 3)]
    h = pg.read(lambda s: history(s, ctx.settings, minutes=15, now=NOW))
    assert sum(h["throughput"]["transfer"]["bytes_per_minute"]) == 6000 and sum(h["failures"]["transfer"]) == 4
    assert h["backlog"]["transfer"]["failed"][-1] == 3
    groups = pg.read(failure_groups)["groups"]
    assert [(g["location"], g["error_type"], g["count"]) for g in groups][0] == ("cologne-buffer", "TransferCommandError", 2)
    assert len(reset_group(ctx, OperationKind.TRANSFER, "cologne-buffer", "TransferCommandError", actor="t",
                           reason="pg")) == 2
    found = pg.read(lambda s: locate(s, "cam/obs1/a.dat"))
    assert found["matched"] == "file" and found["packages"][0]["bundle"] == "fyst-b1"
