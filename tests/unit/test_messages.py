"""The message catalogue (issue #7): each kind has its subject naming the event in plain ASCII,
its level, and a body of the fields that are set; the cooldown folds repeats."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select

from packhorse.db.models import Notification, Operation, Site
from packhorse.db.session import Database
from packhorse.domain import OperationKind
from packhorse.notify import messages
from packhorse.operations import create_operation, dedup_key


@pytest.fixture
def op_id(empty_db: Database) -> int:
    def tx(s):  # type: ignore[no-untyped-def]
        s.add(Site(id=1, name="fyst"))
        s.flush()
        return create_operation(s, kind=OperationKind.TRANSFER, dedup_key=dedup_key(OperationKind.TRANSFER, "x"),
                                site_id=1, max_retries=3).id

    return empty_db.transact(tx)


def test_monitor_messages(empty_db: Database, op_id: int) -> None:
    t = dt.datetime(2026, 11, 30, 1, 2, 3, tzinfo=dt.timezone.utc)
    calls = [
        lambda s: messages.stalled_recovered(s, kind="transfer", operation_id=op_id, lease_owner="h:1:w",
                                             stall_count=1, max_stall_count=3),
        lambda s: messages.breaker_open(s, kind="transfer", operation_id=op_id, stall_count=3, max_stall_count=3,
                                        last_stall_at=t, reset_after_seconds=3600),
        lambda s: messages.breaker_open(s, kind="transfer", operation_id=op_id, stall_count=4, max_stall_count=3,
                                        last_stall_at=t, reset_after_seconds=3600),  # within the cooldown
        lambda s: messages.breaker_reset(s, kind="transfer", operation_id=op_id, previous_stall_count=3,
                                         reason="disk replaced", automatic=False),
        lambda s: messages.missing_handler(s, kind="transfer", operation_id=op_id, status="IN_PROGRESS"),
        lambda s: messages.recovery_failed(s, kind="transfer", operation_id=op_id, error="boom", stall_count=2),
        lambda s: messages.forced_retry(s, kind="transfer", operation_id=op_id, reason=None),
    ]
    for c in calls:
        empty_db.transact(c)
    rows = empty_db.read(lambda s: list(s.scalars(select(Notification).order_by(Notification.id))))
    assert [(r.level, r.subject, r.repeat_count) for r in rows] == [
        ("WARNING", f"Stalled operation recovered: transfer {op_id}", 0),
        ("ERROR", f"Circuit breaker open: transfer {op_id}", 1),
        ("INFO", f"Circuit breaker reset: transfer {op_id}", 0),
        ("ERROR", f"No recovery handler: transfer {op_id}", 0),
        ("ERROR", f"Recovery failed: transfer {op_id}", 0),
        ("INFO", f"Forced retry: transfer {op_id}", 0),
    ]
    assert "Last stall (UTC): 2026-11-30T01:02:03+00:00" in rows[1].body
    assert f"packhorse breaker reset transfer {op_id}" in rows[1].body
    assert "Reset by: admin" in rows[2].body and "Reason: disk replaced" in rows[2].body
    assert "Reason" not in rows[5].body  # unset fields are left out
    assert rows[1].operation_kind == "transfer" and rows[1].operation_id == op_id
    assert empty_db.read(lambda s: s.get(Operation, op_id)) is not None


def test_service_messages_carry_reason_and_uptime(empty_db: Database) -> None:
    start = dt.datetime(2026, 11, 30, 0, 0, tzinfo=dt.timezone.utc)
    later = start + dt.timedelta(hours=25)
    empty_db.transact(lambda s: messages.service_started(s, service="notifier", host="fyst-1", pid=7,
                                                         started_at=start, settings={"workers": 4}))
    empty_db.transact(lambda s: messages.service_still_alive(s, service="notifier", host="fyst-1", pid=7,
                                                             started_at=start, now=later))
    empty_db.transact(lambda s: messages.service_stopped(s, service="notifier", host="fyst-1", pid=7,
                                                         started_at=start, now=later, reason="signal 15"))
    rows = empty_db.read(lambda s: list(s.scalars(select(Notification).order_by(Notification.id))))
    assert [(r.level, r.subject) for r in rows] == [
        ("INFO", "Service started: notifier on fyst-1"), ("INFO", "Service still alive: notifier on fyst-1"),
        ("WARNING", "Service stopped: notifier on fyst-1")]
    assert "Uptime (s): 90000" in rows[1].body
    assert "Reason: signal 15" in rows[2].body and "Uptime (s): 90000" in rows[2].body


def test_lifecycle_sends_still_alive_only_after_its_interval(empty_db: Database) -> None:
    import time

    from packhorse.notify.lifecycle import ServiceLifecycle

    life = ServiceLifecycle(empty_db, "monitor", still_alive_interval_seconds=0.3)
    life.started()
    life.tick()
    subjects = lambda: empty_db.read(lambda s: [n.subject for n in s.scalars(select(Notification)  # noqa: E731
                                                                               .order_by(Notification.id))])
    assert [x.split(":")[0] for x in subjects()] == ["Service started"]
    time.sleep(0.35)
    life.tick()
    life.tick()
    life.stopped("signal 2")
    assert [x.split(":")[0] for x in subjects()] == ["Service started", "Service still alive", "Service stopped"]
