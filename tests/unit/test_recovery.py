"""Recovery layers 2 and 3 (docs/recovery.md) against a real (SQLite) ops database: the stalled-task monitor and
its circuit breakers, admin reset / force retry, the reconciler, service health and the
resilient service loop. Each test asserts the rows a user would see (operation status,
breaker state, notification outbox, failure events)."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import pytest
import structlog
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session

from ops_support import expire, new_op, op_row, with_site
from packhorse.config import settings_from_dict
from packhorse.db.models import FailureEvent, Notification, Operation, utcnow
from packhorse.db.session import Database
from packhorse.domain import OperationKind
from packhorse.errors import ResetRefusedError, UnknownOperationError
from packhorse.operations.lifecycle import claim, reset_failed
from packhorse.recovery import breakers, health
from packhorse.recovery.loop import ServiceLoop
from packhorse.recovery.monitor import check_stalled, recovery_cycle
from packhorse.recovery.reconciler import reconcile
from packhorse.status.diagnose import diagnose_operation

KIND = OperationKind.LONG_TERM_ARCHIVE


def settings(**recovery: Any) -> Any:
    base = {"max_stall_count": 3, "circuit_breaker_timeout_seconds": 3600, "notification_cooldown_seconds": 3600,
            "reconcile_max_resets": 3}
    return settings_from_dict({"recovery": {**base, **recovery}}, environ={})


@pytest.fixture
def db(empty_db: Database) -> Database:
    return with_site(empty_db)


def stall(db: Database, op_id: int, owner: str = "dead-worker") -> None:
    """A worker claims the operation and dies: its lease expires."""
    assert claim(db, op_id, owner, 30) is not None
    expire(db, op_id)


def notes(db: Database, op_id: int | None = None, event: str | None = None) -> list[Notification]:
    def q(s: Session) -> list[Notification]:
        stmt = select(Notification).order_by(Notification.id)
        if op_id is not None:
            stmt = stmt.where(Notification.operation_id == op_id)
        if event is not None:
            stmt = stmt.where(Notification.event == event)
        return list(s.scalars(stmt))

    return db.read(q)


# ------------------------------------------------------------------ monitor + breakers


def test_stall_is_recorded_counted_and_reset_while_breaker_closed(db: Database) -> None:
    op_id = new_op(db)
    stall(db, op_id)
    report = check_stalled(db, settings())
    assert report.reset == [op_id]
    op = op_row(db, op_id)
    assert (op.status, op.lease_owner, op.retry_count, op.stall_count, op.not_before) == ("PENDING", None, 0, 1, None)
    events = db.read(lambda s: list(s.scalars(select(FailureEvent).where(FailureEvent.operation_id == op_id))))
    assert [(e.error_type, e.attempt) for e in events] == [("Stalled", 1)]
    assert "dead-worker" in events[0].message
    [b] = db.read(lambda s: breakers.list_breakers(s))
    assert (b["kind"], b["operation_id"], b["stall_count"], b["state"], b["opened_at"]) == (KIND.value, op_id, 1,
                                                                                         "closed", None)
    [n] = notes(db, op_id)
    assert (n.level, n.event) == ("WARNING", "stalled_recovered")
    # the next attempt can be claimed at once (a stall is not a retry: no backoff)
    assert claim(db, op_id, "w2", 30) is not None


def test_breaker_opens_after_max_stalls_and_leaves_the_operation(db: Database) -> None:
    s3 = settings()
    op_id = new_op(db)
    for _ in range(2):
        stall(db, op_id)
        assert check_stalled(db, s3).reset == [op_id]
    stall(db, op_id)
    report = check_stalled(db, s3)
    assert report.reset == [] and report.blocked == [op_id]
    op = op_row(db, op_id)
    assert op.status == "IN_PROGRESS" and op.attempt == 3  # left for a human
    # further cycles count nothing more and page nothing more (the breaker was open already)
    for _ in range(3):
        assert check_stalled(db, s3).blocked == [op_id]
    [b] = db.read(lambda s: breakers.list_breakers(s))
    assert b["state"] == "open" and b["stall_count"] == 3
    # held for the cool-down (600 s by default), then one attempt goes through by itself
    assert b["next_attempt_at"] == b["opened_at"] + dt.timedelta(seconds=600) and b["trips"] == 1
    opened = notes(db, op_id, "breaker_open")
    assert len(opened) == 1 and opened[0].level == "ERROR" and opened[0].repeat_count == 0
    assert "packhorse retry long_term_archive" in opened[0].body
    stalls = db.read(lambda s: s.scalar(select(text("count(*)")).select_from(FailureEvent)
                                        .where(FailureEvent.error_type == "Stalled")))
    assert stalls == 3
    assert db.read(breakers.open_breaker_count) == 1


def test_a_renewed_lease_is_never_reset(db: Database) -> None:
    op_id = new_op(db)
    assert claim(db, op_id, "w", 30) is not None
    assert check_stalled(db, settings()).reset == []
    assert op_row(db, op_id).status == "IN_PROGRESS"


def test_reset_breaker_by_hand(db: Database) -> None:
    s = settings(max_stall_count=1)
    op_id = new_op(db)
    stall(db, op_id)
    check_stalled(db, s)
    out = breakers.reset_breaker(db, KIND, op_id, reason="disk replaced", actor="test")
    assert out["state"] == "closed" and out["previous_stall_count"] == 1
    [n] = notes(db, op_id, "breaker_closed")
    assert "disk replaced" in n.body and "test" in n.body
    assert check_stalled(db, s).reset == [op_id]  # the next cycle recovers it


@pytest.mark.parametrize("bad", ["unknown id", "wrong kind"])
def test_admin_actions_refuse_unknown_operations(db: Database, bad: str) -> None:
    op_id = new_op(db)
    kind, oid = (KIND, op_id + 100) if bad == "unknown id" else (OperationKind.DELETION, op_id)
    # an id of another kind: the message names the kind it is, to ask again with
    said = f"no {kind.value} operation with id {oid}" + ("" if bad == "unknown id" else f": operation {oid} is of kind {KIND.value}")
    with pytest.raises(UnknownOperationError) as refused:
        breakers.reset_breaker(db, kind, oid, reason="x", actor="t")
    assert str(refused.value) == said
    with pytest.raises(UnknownOperationError) as refused:
        breakers.force_retry(db, kind, oid, reason="x", actor="t")
    assert str(refused.value) == said
    with pytest.raises(UnknownOperationError) as refused:
        db.read(lambda s: diagnose_operation(s, kind, oid, utcnow()))
    assert str(refused.value) == said
    with pytest.raises(ResetRefusedError) as reset_refused:
        reset_failed(db, kind, oid)
    assert str(reset_refused.value) == said


def test_force_retry_resets_breaker_and_state_and_is_dispatchable_now(db: Database) -> None:
    s = settings(max_stall_count=1)
    op_id = new_op(db)
    stall(db, op_id)
    check_stalled(db, s)
    db.transact(lambda x: x.execute(update(Operation).where(Operation.id == op_id).values(
        not_before=utcnow() + dt.timedelta(hours=1))))
    out = breakers.force_retry(db, KIND, op_id, reason="looked at it", actor="admin")
    assert out["previous_status"] == "IN_PROGRESS" and out["status"] == "PENDING"
    assert out["breaker"]["state"] == "closed"
    op = op_row(db, op_id)
    assert (op.status, op.not_before, op.retry_count, op.lease_owner) == ("PENDING", None, 0, None)
    assert db.read(breakers.open_breaker_count) == 0
    c = claim(db, op_id, "w", 30)
    assert c is not None and c.attempt == 2
    assert {n.event for n in notes(db, op_id)} >= {"forced_retry", "breaker_closed"}


def test_force_retry_of_failed_and_completed(db: Database) -> None:
    failed, done = new_op(db, "f"), new_op(db, "c")
    db.transact(lambda s: s.execute(update(Operation).where(Operation.id == failed).values(
        status="FAILED", error_context={"error_type": "X"})))
    db.transact(lambda s: s.execute(update(Operation).where(Operation.id == done).values(status="COMPLETED")))
    breakers.force_retry(db, KIND, failed, reason="fixed", actor="t")
    op = op_row(db, failed)
    assert (op.status, op.retry_count, op.error_context) == ("PENDING", 1, None)
    with pytest.raises(ResetRefusedError, match="COMPLETED"):
        breakers.force_retry(db, KIND, done, reason="x", actor="t")


# -------------------------------------------------------------------------- reconciler


def schedule(db: Database, op_id: int, seconds_ago: float) -> None:
    t = utcnow() - dt.timedelta(seconds=seconds_ago)
    db.transact(lambda s: s.execute(update(Operation).where(Operation.id == op_id).values(
        status="SCHEDULED", scheduled_at=t, updated_at=t)))


def test_reconciler_redispatches_lost_dispatches_older_than_the_floor(db: Database, capsys) -> None:
    s = settings(reconcile_floor_seconds=60)
    old, young = new_op(db, "old"), new_op(db, "young")
    schedule(db, old, 120)
    schedule(db, young, 10)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    assert reconcile(db, s) == [old]
    assert "reconciler_redispatched" in capsys.readouterr().out  # a WARNING on every reset
    op = op_row(db, old)
    assert (op.status, op.reconcile_count, op.retry_count) == ("PENDING", 1, 0)  # no retry consumed
    assert op_row(db, young).status == "SCHEDULED"


def test_reconciler_floor_is_at_least_the_visibility_timeout_with_celery() -> None:
    s = settings_from_dict({"executor": {"kind": "celery", "visibility_timeout_seconds": 3600},
                            "recovery": {"reconcile_floor_seconds": 60}}, environ={})
    assert s.reconcile_floor_seconds == 3600
    assert settings_from_dict({}, environ={}).reconcile_floor_seconds == 0


def test_reconciler_resets_in_progress_without_lease_but_not_expired_leases(db: Database) -> None:
    s = settings()
    no_lease, expired = new_op(db, "n"), new_op(db, "e")
    db.transact(lambda x: x.execute(update(Operation).where(Operation.id == no_lease).values(
        status="IN_PROGRESS", lease_expires_at=None)))
    stall(db, expired)
    assert reconcile(db, s) == [no_lease]
    assert op_row(db, expired).status == "IN_PROGRESS"  # the monitor's, with its breaker


def test_reconciler_cap_notifies_and_leaves_the_operation(db: Database) -> None:
    s = settings(reconcile_max_resets=2)
    op_id = new_op(db)
    for _ in range(2):
        schedule(db, op_id, 5)
        assert reconcile(db, s) == [op_id]
    schedule(db, op_id, 5)
    assert reconcile(db, s) == []
    assert reconcile(db, s) == []
    op = op_row(db, op_id)
    assert (op.status, op.reconcile_count, op.retry_count) == ("SCHEDULED", 2, 0)
    [n] = notes(db, op_id, "reconcile_cap")
    # one page at the give-up; while it waits for its cool-down it is listed as blocked
    # (dispatch_lost, tests/unit/test_reconciler_window.py), not paged again on every pass
    assert n.level == "ERROR" and n.repeat_count == 0


def test_reconciler_skips_what_this_process_has_queued(db: Database) -> None:
    op_id = new_op(db)
    schedule(db, op_id, 5)
    assert reconcile(db, settings(), exclude={op_id}) == []
    assert recovery_cycle(db, settings()).reset == [op_id]


# ------------------------------------------------------------------------------- health


def test_health_heartbeats_alive_and_dead(db: Database) -> None:
    health.record_heartbeat(db, "runner@h:1", kind="runner", host="h", pid=1)
    health.record_heartbeat(db, "monitor@h:2", kind="monitor", host="h", pid=2)
    later = utcnow() + dt.timedelta(seconds=60)
    health.record_heartbeat(db, "monitor@h:2", kind="monitor", host="h", pid=2)
    rows = db.read(lambda s: health.list_services(s, now=utcnow() + dt.timedelta(seconds=91)))
    assert [(r["service"], r["alive"]) for r in rows] == [("monitor@h:2", False), ("runner@h:1", False)]
    rows = db.read(lambda s: health.list_services(s, now=later))
    assert {r["service"]: r["alive"] for r in rows} == {"monitor@h:2": True, "runner@h:1": True}
    assert set(rows[0]) >= {"service", "kind", "host", "pid", "last_seen", "alive"}


# ------------------------------------------------------------------------- service loop


def test_service_loop_survives_a_broken_connection_mid_cycle_and_recovers(db: Database) -> None:
    seen: list[str] = []

    def work(session: Session) -> None:
        n = len(seen)
        session.execute(text("SELECT 1"))
        if n == 1:
            # the database connection breaks in the middle of the cycle
            session.connection().connection.dbapi_connection.close()
            seen.append("broken")
            session.execute(text("SELECT count(*) FROM operations"))
            return
        seen.append("ok")
        session.execute(text("SELECT count(*) FROM operations")).scalar()

    loop = ServiceLoop(db, "test-manager", work, interval_seconds=0.0, max_consecutive_errors=3)
    loop.run(max_cycles=4)
    assert seen == ["ok", "broken", "ok", "ok"]
    assert (loop.cycles, loop.failed_cycles, loop.consecutive_errors) == (4, 1, 0)
    assert notes(db, event="service_loop_failing") == []


def test_service_loop_goes_critical_after_max_consecutive_errors_and_keeps_running(db: Database) -> None:
    calls = {"n": 0}

    def work(session: Session) -> None:
        calls["n"] += 1
        if calls["n"] <= 4:
            session.execute(text("SELECT * FROM no_such_table"))

    loop = ServiceLoop(db, "flaky", work, interval_seconds=0.0, max_consecutive_errors=3)
    loop.run(max_cycles=6)
    assert calls["n"] == 6 and loop.consecutive_errors == 0
    [n] = notes(db, event="service_loop_failing")
    assert n.level == "CRITICAL" and "flaky" in n.subject and "no_such_table" in n.body


def test_service_loop_session_is_closed_as_the_last_operation_of_a_cycle(db: Database) -> None:
    sessions: list[Session] = []

    def work(session: Session) -> None:
        sessions.append(session)
        session.execute(text("SELECT 1"))

    loop = ServiceLoop(db, "s", work, interval_seconds=0.0)
    loop.run(max_cycles=2)
    assert len(sessions) == 2 and sessions[0] is not sessions[1]
    assert all(not s.in_transaction() for s in sessions)


def test_force_retry_is_a_compare_and_set_on_what_it_read(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker claims the operation between the forced retry's read and its write: the reset
    changes nothing (the fencing predicate no longer matches) and says so."""
    op_id = new_op(db, "raced")
    read = breakers.get_operation

    def read_then_claimed(session: Session, kind: OperationKind, operation_id: int) -> Operation:
        op = read(session, kind, operation_id)
        session.execute(update(Operation.__table__).where(Operation.__table__.c.id == operation_id)
                        .values(status="IN_PROGRESS", attempt=Operation.__table__.c.attempt + 1))
        return op

    monkeypatch.setattr(breakers, "get_operation", read_then_claimed)
    with pytest.raises(ResetRefusedError, match="changed while it was being retried"):
        breakers.force_retry(db, KIND, op_id, reason="x", actor="t")
    monkeypatch.undo()
    op = op_row(db, op_id)
    assert (op.status, op.attempt) == ("PENDING", 0)  # rolled back with the failed reset: nothing half-done
    assert "forced_retry" not in {n.event for n in notes(db, op_id)}


# ------------------------------------------------------------- reconciler: the broker's view


class FakeBroker:
    """A broker holding ``depth[key]`` messages per queue (``None``: cannot be asked);
    ``counts_delivered``: the counts include what workers took and did not acknowledge (Redis)."""

    counts_delivered = False

    def __init__(self, **depths: int | None) -> None:
        self.depths_by_kind = depths
        self.down = False

    def depths(self, keys: Any) -> dict[Any, int | None]:
        if self.down:
            raise ConnectionError("broker unreachable")
        return {k: self.depths_by_kind.get(k[2], 0) for k in keys}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def watch(broker: FakeBroker, clock: Clock, confirm: float = 10) -> Any:
    from packhorse.recovery.reconciler import BrokerWatch

    return BrokerWatch(broker, confirm_seconds=confirm, clock=clock)


def test_reconciler_leaves_what_the_broker_still_queues_however_old(db: Database) -> None:
    """A queue of 2 messages of one operation each (transfers) holds its 2 most recently
    scheduled operations (FIFO): those wait behind a busy worker, for hours if need be; the
    oldest one's message is gone."""
    s = settings(reconcile_floor_seconds=60)
    transfer = OperationKind.TRANSFER
    oldest, older, old = (new_op(db, n, transfer) for n in ("a", "b", "c"))
    schedule(db, oldest, 7200)
    schedule(db, older, 5000)
    schedule(db, old, 3600)
    clock = Clock()
    w = watch(FakeBroker(transfer=2), clock)
    assert reconcile(db, s, broker=w) == []  # absent, but not yet confirmed lost
    clock.t += 10
    assert reconcile(db, s, broker=w) == [oldest]
    for _ in range(5):
        clock.t += 3600
        assert reconcile(db, s, broker=w) == []
    assert [op_row(db, i).reconcile_count for i in (older, old)] == [0, 0]
    assert [op_row(db, i).status for i in (older, old)] == ["SCHEDULED", "SCHEDULED"]
    assert notes(db, event="reconcile_cap") == []


def test_a_message_of_a_batch_of_deletions_may_hold_sixteen_of_them(db: Database) -> None:
    """The executors put up to 16 buffer-copy deletions in one task (one message,
    packhorse.operations.batching): a deletion queue holding one message may hold the 16 most recently
    scheduled deletions, none of which is lost; the 17th, older, is."""
    from packhorse.operations.batching import DELETION_BATCH

    s = settings(reconcile_floor_seconds=60)
    ops = [new_op(db, f"d{i}", OperationKind.DELETION) for i in range(DELETION_BATCH + 1)]
    for age, op_id in enumerate(reversed(ops)):  # ops[0] the oldest
        schedule(db, op_id, 3600 + age)
    clock = Clock()
    w = watch(FakeBroker(deletion=1), clock)
    assert reconcile(db, s, broker=w) == []
    clock.t += 10
    assert reconcile(db, s, broker=w) == [ops[0]]
    assert {op_row(db, i).status for i in ops[1:]} == {"SCHEDULED"}


def test_reconciler_counts_nothing_while_the_broker_cannot_be_asked(db: Database) -> None:
    s = settings(reconcile_max_resets=1)
    op_id = new_op(db)
    schedule(db, op_id, 5)
    broker, clock = FakeBroker(), Clock()
    w = watch(broker, clock)
    broker.down = True
    for _ in range(4):
        assert reconcile(db, s, broker=w) == []
        clock.t += 60
    assert (op_row(db, op_id).reconcile_count, notes(db, event="reconcile_cap")) == (0, [])
    broker.down = False  # back, and the queue is empty: lost once confirmed
    assert reconcile(db, s, broker=w) == []
    clock.t += 10
    assert reconcile(db, s, broker=w) == [op_id]


@pytest.mark.parametrize("counts_delivered", [True, False])
def test_a_message_redis_holds_nowhere_is_sent_again_without_waiting_the_visibility_timeout(
        db: Database, counts_delivered: bool) -> None:
    """A worker's connection took the message from Redis in the second its site's link went
    down: the message is in no queue and in no worker's unacknowledged set, so the broker will
    never deliver it again (a trial's bundle waited the hour of the visibility timeout). A
    broker whose counts include what workers hold (Redis) lets the reconciler send it again
    once its absence is confirmed; one whose counts do not (RabbitMQ, which requeues a lost
    worker's messages itself) keeps the floor."""
    s = settings(reconcile_floor_seconds=3600)
    op_id = new_op(db)
    schedule(db, op_id, 120)  # sent two minutes ago, never claimed
    broker, clock = FakeBroker(long_term_archive=0), Clock()
    broker.counts_delivered = counts_delivered
    w = watch(broker, clock)
    assert reconcile(db, s, broker=w) == []  # absent once: not yet confirmed
    clock.t += 10
    assert reconcile(db, s, broker=w) == ([op_id] if counts_delivered else [])
    assert op_row(db, op_id).status == ("PENDING" if counts_delivered else "SCHEDULED")


def test_reconciler_needs_two_absences_confirm_seconds_apart(db: Database) -> None:
    """A worker that took the message but has not claimed yet: absent once, then claimed."""
    s = settings()
    op_id = new_op(db)
    schedule(db, op_id, 5)
    broker, clock = FakeBroker(long_term_archive=1), Clock()
    w = watch(broker, clock)
    assert reconcile(db, s, broker=w) == []  # queued
    broker.depths_by_kind["long_term_archive"] = 0
    assert reconcile(db, s, broker=w) == []  # taken by a worker, not yet claimed
    clock.t += 5
    broker.depths_by_kind["long_term_archive"] = 1  # seen queued again: the absence starts over
    assert reconcile(db, s, broker=w) == []
    broker.depths_by_kind["long_term_archive"] = 0
    clock.t += 20
    assert reconcile(db, s, broker=w) == []  # absent since now
    clock.t += 9
    assert reconcile(db, s, broker=w) == []
    clock.t += 1
    assert reconcile(db, s, broker=w) == [op_id]  # absent for 10 s: lost
    assert op_row(db, op_id).reconcile_count == 1



def test_the_stalled_attempt_failing_late_under_an_open_breaker_keeps_its_cool_down(db: Database) -> None:
    # a site cut off mid-transfer: its attempt stalled three times and the breaker opened; when
    # the link came back the cut-off worker's attempt failed (its SSH connection was gone) and that
    # late failure was taken for the attempt let through after the cool-down: "open again", a
    # second page, and the cool-down doubled 54 s into the first
    from packhorse.engine.outcome import record_failure
    from packhorse.errors import SshConnectionError

    s3 = settings()
    op_id = new_op(db)
    for _ in range(2):
        stall(db, op_id)
        assert check_stalled(db, s3).reset == [op_id]
    late = claim(db, op_id, "cut-off-worker", 30)
    assert late is not None
    expire(db, op_id)
    assert check_stalled(db, s3).blocked == [op_id]
    [before] = db.read(lambda s: breakers.list_breakers(s))
    record_failure(db, late, SshConnectionError("connection to fyst lost"), backoff_base=0, backoff_max=0,
                   recovery=s3.recovery)
    [after] = db.read(lambda s: breakers.list_breakers(s))
    assert (after["state"], after["trips"], after["next_attempt_at"]) == ("open", 1, before["next_attempt_at"])
    assert [n.subject for n in notes(db, op_id, "breaker_open")] == [f"Circuit breaker open: long_term_archive {op_id} held after 3 stalls"]
    op = op_row(db, op_id)
    assert op.status == "PENDING" and op.not_before == before["next_attempt_at"]  # held until the cool-down ends



def test_a_silent_site_excuses_a_stall_only_where_a_live_site_is_heard_from_within_a_lease() -> None:
    from packhorse.recovery.monitor import Circumstances, excuse

    # lease 20 s, renewals every 2 s, health heartbeats every 5 s: a live site is heard from
    # within a lease, so a site silent since the renewal is cut off (or stopped)
    rec = settings(lease_timeout_seconds=20, heartbeat_interval_seconds=2,
                   service_heartbeat_interval_seconds=5).recovery
    t0 = utcnow()
    op = Operation(kind="transfer", site_id=7, lease_owner="elsewhere:1", heartbeat_at=t0)
    cut = Circumstances(site_heard_at={7: t0 - dt.timedelta(seconds=3)})
    assert "No worker of its site has been heard from" in str(excuse(op, cut, rec))
    alive = Circumstances(site_heard_at={7: t0 + dt.timedelta(seconds=4)})
    assert excuse(op, alive, rec) is None
    assert excuse(op, Circumstances(), rec) is None  # no worker heartbeats at all (embedded mode)
    # health heartbeats every 30 s against a 20 s lease: silence proves nothing, the stall counts
    slow = settings(lease_timeout_seconds=20, heartbeat_interval_seconds=2,
                    service_heartbeat_interval_seconds=30).recovery
    assert excuse(op, cut, slow) is None
