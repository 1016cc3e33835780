"""Every status write of an operation is a compare-and-set on ``operations.lifecycle.fenced`` (I3).

Two kinds of check against a real SQLite database:

* behaviour: a write made on a stale reading of the row — a claim carrying the token of an
  earlier dispatch, a dispatch whose row changed between its select and its update, a Celery
  unscheduling of an attempt that has moved on — changes nothing;
* completeness: every ``UPDATE operations SET status = …`` that the lifecycle, both
  dispatchers, the stalled-task monitor, the reconciler and the reset of a FAILED operation
  execute carries the fencing predicate (the operation id, its attempt and its status) in its
  ``WHERE``; a status write that bypasses it fails this test.
"""

from __future__ import annotations

import datetime as dt
import re
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import event, select, update
from sqlalchemy.orm import Session

from packhorse.config import settings_from_dict
from packhorse.db.models import CircuitBreaker, DataLocation, FailureEvent, Operation, Site, utcnow
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status
from packhorse.engine import outcome, pipeline
from packhorse.engine.worker import Outcome, hand_back
from packhorse.errors import SourceChangedError, TransientDatabaseError
from packhorse.operations import lifecycle as operations
from packhorse.recovery.monitor import check_stalled

KIND = OperationKind.TRANSFER
SETTINGS = settings_from_dict({"recovery": {"max_stall_count": 100}}, environ={})
RUNNABLE = pipeline.runnable_statuses(executor_knows_its_queue=True)


@pytest.fixture
def db(empty_db: Database) -> Database:
    d = empty_db
    d.ensure_migrated()

    def topo(s: Session) -> None:
        site = Site(name="fyst")
        s.add(site)
        s.flush()
        s.add(DataLocation(name="fyst-buffer", site_id=site.id, role="buffer", storage_type="disk", uri="/b"))

    d.transact(topo)
    yield d
    d.dispose()


def new_op(db: Database, subject: str) -> int:
    sid = db.read(lambda s: s.scalar(select(Site.id)))
    op = db.transact(lambda s: operations.create_operation(
        s, kind=KIND, dedup_key=operations.dedup_key(KIND, subject), site_id=sid, max_retries=3))
    assert op is not None
    return op.id


def state(db: Database, op_id: int) -> tuple[str, int]:
    return db.read(lambda s: tuple(s.execute(select(Operation.status, Operation.attempt)
                                       .where(Operation.id == op_id)).one()))


def expire_and_recover(db: Database, op_id: int) -> None:
    db.transact(lambda s: s.execute(update(Operation).where(Operation.id == op_id)
                                    .values(lease_expires_at=utcnow() - dt.timedelta(seconds=1))))
    assert check_stalled(db, SETTINGS).reset == [op_id]


def test_a_claim_with_the_token_of_an_earlier_dispatch_is_refused(db: Database) -> None:
    op_id = new_op(db, "a")
    first = operations.claim(db, op_id, "worker-1", 60, token=0)
    assert first is not None and first.attempt == 1
    expire_and_recover(db, op_id)  # PENDING again, at token 1
    # a late duplicate of the first dispatch (token 0) must not start a second attempt
    assert operations.claim(db, op_id, "late-duplicate", 60, token=0) is None
    assert state(db, op_id) == (Status.PENDING.value, 1)
    again = operations.claim(db, op_id, "worker-2", 60, token=1)
    assert again is not None and again.attempt == 2
    # the Celery form "at attempt >= A" is the same predicate at token A - 1
    expire_and_recover(db, op_id)
    assert operations.claim(db, op_id, "stale-message", 60, min_attempt=2) is None
    assert operations.claim(db, op_id, "fresh-message", 60, min_attempt=3) is not None


def test_claim_many_refuses_the_stale_tokens_and_takes_the_rest(db: Database) -> None:
    a, b = new_op(db, "a"), new_op(db, "b")
    assert operations.claim(db, a, "w", 60) is not None
    expire_and_recover(db, a)  # a is at token 1 now
    got = operations.claim_many(db, {a: 0, b: 0}, "w", 60)
    assert set(got) == {b}
    assert state(db, a) == (Status.PENDING.value, 1)


def test_a_dispatch_does_not_schedule_a_row_that_changed_after_it_was_read(db: Database) -> None:
    moved, kept = new_op(db, "moved"), new_op(db, "kept")

    def tx(s: Session) -> list[Any]:
        conn = s.connection()

        def choose(rows: list[Any]) -> list[int]:
            # another writer claims `moved` between the dispatcher's select and its update
            conn.execute(update(Operation).where(Operation.id == moved).values(
                status=Status.IN_PROGRESS.value, attempt=Operation.attempt + 1))
            return [r.id for r in rows]

        return pipeline.take_runnable(conn, limit=10, statuses=RUNNABLE, choose=choose)

    taken = db.transact(tx)
    assert [r.id for r in taken] == [kept]
    assert state(db, moved) == (Status.IN_PROGRESS.value, 1)  # left as the other writer made it
    assert state(db, kept) == (Status.SCHEDULED.value, 0)


def test_the_celery_unscheduling_of_a_stale_attempt_is_refused(db: Database) -> None:
    from packhorse.executors.celery_app import _unschedule

    op_id = new_op(db, "a")
    rows = db.transact(lambda s: pipeline.take_runnable(s.connection(), limit=10, statuses=RUNNABLE))
    assert [(r.id, r.attempt) for r in rows] == [(op_id, 0)]
    assert operations.claim(db, op_id, "w", 60, token=0) is not None
    expire_and_recover(db, op_id)
    db.transact(lambda s: pipeline.take_runnable(s.connection(), limit=10, statuses=RUNNABLE))  # token 1
    _unschedule(db, op_id, 0)  # a publish failure reported for the old dispatch
    assert state(db, op_id) == (Status.SCHEDULED.value, 1)
    _unschedule(db, op_id, 1)
    assert state(db, op_id) == (Status.PENDING.value, 1)


_SETS_STATUS = re.compile(r"^\s*UPDATE operations SET .*\bstatus=", re.S)


def test_every_status_write_of_an_operation_goes_through_the_fencing_predicate(db: Database) -> None:
    from packhorse.executors.celery_app import _unschedule
    from packhorse.recovery.reconciler import reconcile

    writes: list[str] = []

    @event.listens_for(db._engine, "before_cursor_execute")
    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if _SETS_STATUS.match(statement):
            writes.append(statement)

    try:
        a, b, c = new_op(db, "a"), new_op(db, "b"), new_op(db, "c")
        rows = db.transact(lambda s: pipeline.take_runnable(s.connection(), limit=10, statuses=RUNNABLE))
        tokens = {r.id: r.attempt for r in rows}
        _unschedule(db, c, tokens[c])  # the Celery dispatcher's hand-back
        ca = operations.claim(db, a, "w", 60, token=tokens[a])
        assert ca is not None
        assert operations.heartbeat(db, ca, 60)
        assert operations.defer(db, ca, 0)
        ca = operations.claim(db, a, "w", 60)
        assert ca is not None
        assert db.transact(lambda s: outcome.complete_in(s, ca))
        cb = operations.claim_many(db, {b: tokens[b]}, "w", 60)[b]
        cd = operations.claim_many(db, {new_op(db, "d"): None}, "w", 60)
        assert db.transact(lambda s: outcome.complete_many(s, cd.values())) == set(cd)
        assert outcome.record_failure(db, cb, SourceChangedError("x"), backoff_base=0,
                                         backoff_max=0).status is Status.FAILED
        assert operations.reset_failed(db, KIND, b) == [b]
        cb = operations.claim(db, b, "w", 60)
        assert cb is not None
        assert outcome.record_failure(db, cb, RuntimeError("blip"), backoff_base=0,
                                         backoff_max=0).status is Status.PENDING
        cb = operations.claim(db, b, "w", 60)
        assert cb is not None
        expire_and_recover(db, b)  # the stalled-task monitor's reset
        db.transact(lambda s: pipeline.take_runnable(s.connection(), limit=10, statuses=RUNNABLE))
        assert reconcile(db, settings_from_dict({"recovery": {"reconcile_floor_seconds": 0}}, environ={}))
    finally:
        event.remove(db._engine, "before_cursor_execute", capture)

    assert len(writes) >= 12, writes  # every writer above was seen
    for sql in writes:
        where = sql.split(" WHERE ", 1)[1] if " WHERE " in sql else ""
        assert "operations.id = " in where and "operations.attempt = " in where and "operations.status" in where, (
            f"a status write of an operation without the fencing predicate (operations.fenced):\n{sql}")


def test_a_hand_back_after_a_database_outage_is_fenced_and_counts_no_stall(db: Database) -> None:
    """A worker that lost the database for as long as its lease could last hands its attempt
    back (engine.worker.hand_back): PENDING at once with a failure event, no retry and no stall
    counted; a hand-back of an attempt somebody else took over meanwhile changes nothing."""
    ctx: Any = SimpleNamespace(db=db, settings=SETTINGS)
    op_id = new_op(db, "outage")
    first = operations.claim(db, op_id, "worker-1", 60, token=0)
    assert first is not None
    out = hand_back(ctx, first, TransientDatabaseError("database unavailable after 8 attempts"))
    assert out is Outcome.DEFERRED and state(db, op_id) == (Status.PENDING.value, 1)
    op = db.read(lambda s: s.get(Operation, op_id))
    assert op.lease_owner is None and op.retry_count == 0 and op.stall_count == 0
    assert op.not_before is None or op.not_before <= utcnow()

    second = operations.claim(db, op_id, "worker-2", 60, token=1)
    assert second is not None and second.attempt == 2
    # a late hand-back of the first attempt: the second's lease is untouched
    assert hand_back(ctx, first, TransientDatabaseError("late")) is Outcome.STALE
    assert state(db, op_id) == (Status.IN_PROGRESS.value, 2)
    assert db.read(lambda s: s.get(Operation, op_id).lease_owner) == "worker-2"
    events = db.read(lambda s: [(e.attempt, e.error_type, e.will_retry)
                                for e in s.scalars(select(FailureEvent).order_by(FailureEvent.id))])
    assert events == [(1, "TransientDatabaseError", True), (1, "LeaseLostError", False)]
    assert db.read(lambda s: s.scalars(select(CircuitBreaker)).all()) == []
