"""Half-open circuit breakers against a real (SQLite) ops database, with the clock moved by
backdating ``next_attempt_at`` (no sleeping): after the cool-down one attempt is let through by
the monitor; its success closes the breaker, its stall or retryable failure opens it again for
a doubled cool-down, a permanent failure closes it (the operation is FAILED). Open and
half-open breakers are blocked work in :mod:`packhorse.status.blocked_work` (DESIGN.md "Circuit breaker")."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from sqlalchemy import select, update

import ops_support
from ops_support import expire, op_row, with_site
from packhorse.config import settings_from_dict
from packhorse.db.models import CircuitBreaker, Notification, Operation, utcnow
from packhorse.db.session import Database
from packhorse.domain import OperationKind
from packhorse.engine.outcome import complete_in, complete_many, record_failure
from packhorse.errors import SourceChangedError, VerificationError
from packhorse.operations.lifecycle import claim, claim_many
from packhorse.recovery import breakers
from packhorse.recovery.monitor import check_stalled
from packhorse.status import blocked_work
from packhorse.status.blocked_work import EXIT_WAITING, PROVIDERS, circuit_breakers

KIND = OperationKind.TRANSFER


def settings(**recovery: Any) -> Any:
    base = {"max_stall_count": 3, "circuit_breaker_cooldown_seconds": 600, "circuit_breaker_timeout_seconds": 3600,
            "notification_cooldown_seconds": 3600}
    return settings_from_dict({"recovery": {**base, **recovery}}, environ={})


@pytest.fixture
def db(empty_db: Database) -> Database:
    return with_site(empty_db)


def new_op(db: Database, name: str = "a") -> int:
    return ops_support.new_op(db, name, KIND)


def breaker(db: Database, op_id: int) -> dict[str, Any]:
    [b] = [r for r in db.read(breakers.list_breakers) if r["operation_id"] == op_id]
    return b


def stall(db: Database, op_id: int) -> None:
    """A worker claims the operation and is killed: its lease expires."""
    assert claim(db, op_id, "killed-worker", 30) is not None
    expire(db, op_id)


def cool_down_passes(db: Database, op_id: int) -> None:
    db.transact(lambda s: s.execute(update(CircuitBreaker).where(CircuitBreaker.operation_id == op_id)
                                    .values(next_attempt_at=utcnow() - dt.timedelta(seconds=1))))


def events(db: Database, op_id: int) -> list[str]:
    return db.read(lambda s: [n.event for n in s.scalars(select(Notification).where(
        Notification.operation_id == op_id).order_by(Notification.id))])


def opened(db: Database, s: Any) -> int:
    op_id = new_op(db)
    for _ in range(3):
        stall(db, op_id)
        check_stalled(db, s)
    assert breaker(db, op_id)["state"] == "open"
    return op_id


def test_the_cool_down_lets_one_attempt_through_and_its_success_closes_the_breaker(db: Database) -> None:
    s = settings()
    op_id = opened(db, s)
    # during the cool-down the monitor leaves it alone
    assert check_stalled(db, s).blocked == [op_id]
    assert op_row(db, op_id).status == "IN_PROGRESS"
    cool_down_passes(db, op_id)
    report = check_stalled(db, s)
    assert report.let_through == [op_id] and report.blocked == []
    op = op_row(db, op_id)
    assert (op.status, op.not_before, op.lease_owner) == ("PENDING", None, None)
    b = breaker(db, op_id)
    assert b["state"] == "half_open" and b["half_open_at"] is not None and b["next_attempt_at"] is None
    # a second monitor cycle lets nothing more through
    assert check_stalled(db, s).let_through == []
    c = claim(db, op_id, "healthy-worker", 30)
    assert c is not None and c.attempt == 4
    assert db.transact(lambda x: complete_in(x, c)) is True
    assert op_row(db, op_id).status == "COMPLETED"
    assert db.read(breakers.list_breakers) == []  # closed, stall count 0
    assert db.read(lambda x: breakers.get_breaker(x, KIND, op_id)).state == "closed"
    assert events(db, op_id)[-2:] == ["breaker_half_open", "breaker_closed"]


def test_a_batch_completion_closes_the_breaker_of_the_attempt_let_through_and_no_other(db: Database) -> None:
    s = settings()
    op_id = opened(db, s)
    cool_down_passes(db, op_id)
    assert check_stalled(db, s).let_through == [op_id]
    healthy = new_op(db, "b")
    claims = claim_many(db, {op_id: None, healthy: 0}, "healthy-worker", 30)
    assert db.transact(lambda x: complete_many(x, claims.values())) == {op_id, healthy}
    assert db.read(breakers.list_breakers) == []
    assert db.read(lambda x: breakers.get_breaker(x, KIND, op_id)).state == "closed"
    assert events(db, op_id)[-2:] == ["breaker_half_open", "breaker_closed"]
    assert events(db, healthy) == []


def test_a_stall_of_the_attempt_let_through_opens_the_breaker_again_for_a_doubled_cool_down(db: Database) -> None:
    s = settings()
    op_id = opened(db, s)
    cool_down_passes(db, op_id)
    check_stalled(db, s)
    stall(db, op_id)  # the one attempt is killed too
    report = check_stalled(db, s)
    assert report.blocked == [op_id] and report.reset == []
    b = breaker(db, op_id)
    assert (b["state"], b["trips"], b["stall_count"]) == ("open", 2, 4)
    assert b["next_attempt_at"] == b["opened_at"] + dt.timedelta(seconds=1200)
    assert op_row(db, op_id).status == "IN_PROGRESS"  # held again, nothing else let through


def test_a_retryable_failure_of_the_attempt_let_through_holds_the_operation_until_the_next_cool_down_ends(
        db: Database) -> None:
    s = settings()
    op_id = opened(db, s)
    cool_down_passes(db, op_id)
    check_stalled(db, s)
    c = claim(db, op_id, "w", 30)
    assert c is not None
    out = record_failure(db, c, VerificationError("read-back differs"), backoff_base=0, backoff_max=0,
                         recovery=s.recovery)
    assert out.will_retry
    b = breaker(db, op_id)
    assert (b["state"], b["trips"]) == ("open", 2)
    op = op_row(db, op_id)
    assert op.status == "PENDING" and op.not_before == b["next_attempt_at"]  # not due before it
    assert claim(db, op_id, "eager", 30) is None  # nothing else gets through meanwhile
    cool_down_passes(db, op_id)
    assert check_stalled(db, s).let_through == [op_id]
    assert op_row(db, op_id).not_before is None and breaker(db, op_id)["state"] == "half_open"
    assert claim(db, op_id, "w2", 30) is not None


def test_a_permanent_failure_of_the_attempt_let_through_closes_the_breaker(db: Database) -> None:
    s = settings()
    op_id = opened(db, s)
    cool_down_passes(db, op_id)
    check_stalled(db, s)
    c = claim(db, op_id, "w", 30)
    assert c is not None
    assert record_failure(db, c, SourceChangedError("source file changed"), backoff_base=0, backoff_max=0,
                          recovery=s.recovery).will_retry is False
    assert op_row(db, op_id).status == "FAILED"
    assert db.read(lambda x: breakers.get_breaker(x, KIND, op_id)).state == "closed"
    assert db.read(lambda x: blocked_work.circuit_breakers(x, None)) == []  # FAILED is listed as failed, not twice


def test_a_breaker_whose_operation_finished_meanwhile_is_closed_at_the_end_of_its_cool_down(db: Database) -> None:
    s = settings()
    op_id = opened(db, s)
    db.transact(lambda x: x.execute(update(Operation).where(Operation.id == op_id).values(status="COMPLETED")))
    assert db.read(lambda x: blocked_work.circuit_breakers(x, None)) == []
    cool_down_passes(db, op_id)
    assert check_stalled(db, s).let_through == []
    assert db.read(lambda x: breakers.get_breaker(x, KIND, op_id)).state == "closed"


def test_open_and_half_open_breakers_are_blocked_work_with_their_releasing_command(db: Database) -> None:
    assert circuit_breakers in PROVIDERS
    s = settings()
    op_id = opened(db, s)
    [item] = db.read(lambda x: blocked_work.circuit_breakers(x, None))
    assert (item.cause, item.subject, item.release, item.exit_code) == (
        "circuit_breaker", f"transfer {op_id}", f"packhorse retry transfer {op_id}", EXIT_WAITING)
    b = breaker(db, op_id)
    assert item.detail is not None and item.detail["state"] == "open"
    assert item.detail["next_attempt_at"] == b["next_attempt_at"].isoformat()
    assert "circuit breaker open after 3 stall(s)" in item.reason and item.since == b["opened_at"].isoformat()
    cool_down_passes(db, op_id)
    check_stalled(db, s)
    [item] = db.read(lambda x: blocked_work.circuit_breakers(x, None))
    assert item.detail is not None and (item.detail["state"], item.detail["next_attempt_at"]) == ("half_open", None)
    # the releasing command works: a forced retry closes it and nothing is blocked any more
    breakers.force_retry(db, KIND, op_id, reason="test", actor="t")
    assert db.read(lambda x: blocked_work.circuit_breakers(x, None)) == []


def test_a_completion_of_an_operation_that_never_stalled_touches_no_breaker(db: Database) -> None:
    op_id = new_op(db)
    c = claim(db, op_id, "w", 30)
    assert c is not None and db.transact(lambda x: complete_in(x, c))
    assert db.read(lambda x: x.scalars(select(CircuitBreaker)).all()) == []
    assert events(db, op_id) == []


@pytest.mark.parametrize("trips, seconds", [(1, 600), (2, 1200), (3, 2400), (4, 3600), (40, 3600)])
def test_the_cool_down_doubles_with_each_failed_attempt_up_to_the_timeout(trips: int, seconds: float) -> None:
    assert settings().recovery.breaker_cooldown_seconds(trips) == seconds


def test_a_cool_down_longer_than_the_timeout_is_kept() -> None:
    rec = settings(circuit_breaker_cooldown_seconds=7200, circuit_breaker_timeout_seconds=3600).recovery
    assert rec.breaker_cooldown_seconds(1) == rec.breaker_cooldown_seconds(5) == 7200



def _no_such_pid() -> int:
    """A pid no process can have: above the kernel's ``pid_max``."""
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read()) + 1


def stall_held_by(db: Database, op_id: int, owner: str) -> None:
    """The operation is claimed by ``owner`` and its lease expires unrenewed."""
    assert claim(db, op_id, owner, 30) is not None
    db.transact(lambda s: s.execute(update(Operation).where(Operation.id == op_id).values(
        lease_expires_at=utcnow() - dt.timedelta(seconds=1))))


def test_stalls_of_a_runner_that_is_gone_open_no_breaker_but_a_live_runners_workers_do(db: Database) -> None:
    # `packhorse run` killed five times in the middle of one transfer (a crash loop, reboots):
    # the operation is not the suspect, so it is recovered each time and never held
    import os
    import socket

    s = settings()
    host = socket.gethostname()
    restarted = new_op(db, "restarted")
    for k in range(5):  # held by the runner's thread, or by one of its worker processes
        holder = "ThreadPoolExecutor-0_1" if k % 2 else f"worker-{_no_such_pid()}:MainThread"
        stall_held_by(db, restarted, f"{host}:{_no_such_pid()}:{holder}")
        report = check_stalled(db, s)
        assert report.reset == [restarted] and report.blocked == []
    row = op_row(db, restarted)
    assert row.status == "PENDING" and row.retry_count == 0
    assert [b for b in db.read(breakers.list_breakers) if b["operation_id"] == restarted
            and b["state"] != "closed"] == []

    # a worker process dying under a runner that lives (this process), a hung thread of it, a
    # Celery pool child and a runner on another host are counted: three stalls open the breaker
    for name, owner in (("worker", f"{host}:{os.getpid()}:worker-{_no_such_pid()}:MainThread"),
                        ("thread", f"{host}:{os.getpid()}:ThreadPoolExecutor-0_1"),
                        ("celery", f"{host}:{_no_such_pid()}:celery-1a2b3c4d"),
                        ("elsewhere", f"not-{host}:{_no_such_pid()}:ThreadPoolExecutor-0_1")):
        op_id = new_op(db, name)
        for _ in range(3):
            stall_held_by(db, op_id, owner)
            check_stalled(db, s)
        assert breaker(db, op_id)["state"] == "open", name
