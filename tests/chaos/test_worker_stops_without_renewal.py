"""A worker whose lease cannot be renewed (the database refuses its heartbeats) stops its work
before its lease can look stale to others, removes its temporary output and commits nothing
(DESIGN.md "Numbers": stop after lease − 1.5 × heartbeat interval); it then hands the
operation back at once (PENDING, fenced, no stall counted: docs/recovery.md "Layer 2")."""

from __future__ import annotations

import json

from chaos_helpers import context, drive_until_kind_exists, make_source
from sqlalchemy import select

from packhorse.db.models import CircuitBreaker, FailureEvent, Operation, PhysicalCopy, utcnow
from packhorse.domain import OperationKind
from packhorse.engine.worker import Outcome, execute_operation
from packhorse.errors import TransientDatabaseError
from packhorse.operations import lease


def test_worker_stops_before_its_lease_expires_cleans_up_and_commits_nothing(site_config, monkeypatch):
    # lease 6 s, heartbeat 1 s: the worker must give up after 4.5 s without a renewal
    cfg = site_config(lease_timeout_seconds=6, heartbeat_interval_seconds=1)
    site = cfg.parent
    make_source(site / "source", groups=1, files_per_group=1, size=3 << 20)
    ctx = context(cfg)
    op_id = drive_until_kind_exists(ctx, OperationKind.LONG_TERM_ARCHIVE)[0]

    def refused(*a, **k):
        raise TransientDatabaseError("database unavailable (test)")

    monkeypatch.setattr(lease, "heartbeat", refused)
    # the writer is slow: it sits 4.8 s after its first chunk (past the 4.5 s renewal deadline,
    # before the 6 s lease ends)
    monkeypatch.setenv("PACKHORSE_TEST_FAULTS", json.dumps(
        [{"point": "long_term_archive.writing", "action": "pause", "seconds": 4.8}]))
    with ctx.db.session() as s:
        attempt = s.get(Operation, op_id).attempt
    outcome = execute_operation(ctx, op_id, "slow-worker")
    assert outcome is Outcome.DEFERRED

    with ctx.db.session() as s:
        op = s.get(Operation, op_id)
        # handed back at once (it stopped while its lease was still valid: nobody else could
        # have started meanwhile), no retry counted, no stall on a breaker
        assert op is not None and op.status == "PENDING" and op.lease_expires_at is None
        assert op.attempt == attempt + 1 and op.retry_count == 0
        assert op.not_before is None or op.not_before <= utcnow()
        assert s.scalars(select(PhysicalCopy).where(PhysicalCopy.location_id == op.destination_location_id)).all() == []
        [ev] = s.scalars(select(FailureEvent).where(FailureEvent.operation_id == op_id)).all()
        assert ev.error_type == "LeaseNotRenewedError" and "not renewed" in ev.message and ev.will_retry
        assert s.scalars(select(CircuitBreaker)).all() == []
        lta = ctx.location_name(op.destination_location_id)
    root = ctx.settings.location_path(lta)
    # no partial, nothing published (the location's identity marker aside)
    assert [p for p in root.rglob("*") if p.is_file() and p.relative_to(root).parts[0] != "_packhorse"] == []
