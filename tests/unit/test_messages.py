"""The message catalogue: service lifecycle messages carry their reason and uptime;
still-alive goes out once per interval."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select

from packhorse.db.models import Notification
from packhorse.db.session import Database
from packhorse.notify import messages


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
    from packhorse.notify.lifecycle import ServiceLifecycle

    now = [1000.0]  # an injected monotonic clock (seconds)
    life = ServiceLifecycle(empty_db, "monitor", still_alive_interval_seconds=0.3, clock=lambda: now[0])
    life.started()
    life.tick()
    subjects = lambda: empty_db.read(lambda s: [n.subject for n in s.scalars(select(Notification)  # noqa: E731
                                                                               .order_by(Notification.id))])
    assert [x.split(":")[0] for x in subjects()] == ["Service started"]
    now[0] += 0.29
    life.tick()
    assert [x.split(":")[0] for x in subjects()] == ["Service started"]  # not yet
    now[0] += 0.02
    life.tick()
    life.tick()
    life.stopped("signal 2")
    assert [x.split(":")[0] for x in subjects()] == ["Service started", "Service still alive", "Service stopped"]
