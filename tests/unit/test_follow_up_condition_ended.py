"""A follow-up ("Repeated: …") of a standing condition is sent only while the condition stands.

Against a real (SQLite) ops database and the real notifier with the engine's review: a data
location full queues its WARNING, the message goes, more writes meet the full location within
the cooldown (a follow-up due when the window ends). If, by then, nothing waits for space there
any more, the follow-up is not sent (an operator was told an hour after the location had room
again); while work still waits, it goes. The review and the notifier report the withdrawal by
one name (:data:`packhorse.notify.outbox.WITHDRAWN`).
"""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select, update

from packhorse.config import settings_from_dict
from packhorse.db.models import Notification, Operation, Site, utcnow
from packhorse.db.session import Database
from packhorse.domain import NotificationLevel, OperationKind
from packhorse.engine.outcome import review_notification
from packhorse.notify.notifier import Notifier
from packhorse.notify.outbox import WITHDRAWN, enqueue
from packhorse.operations.lifecycle import create_operation
from support import RecordingChannel

LOCATION = "cologne-buffer"
SUBJECT = f"Data location {LOCATION} is full: work waits for space"


@pytest.fixture
def db(empty_db: Database) -> Database:
    empty_db.transact(lambda s: s.add(Site(id=1, name="fyst")))
    return empty_db


def waiting_for_space(db: Database) -> int:
    """An operation handed back because LOCATION was full (as the worker leaves it)."""
    def tx(s) -> int:  # type: ignore[no-untyped-def]
        op = create_operation(s, kind=OperationKind.TRANSFER, dedup_key="transfer:1", site_id=1, max_retries=3)
        s.flush()
        s.execute(update(Operation).where(Operation.id == op.id).values(
            status="PENDING", not_before=utcnow() + dt.timedelta(seconds=600),
            error_context={"waiting": "space", "location": LOCATION, "message": "no space left"}))
        return op.id

    return db.transact(tx)


def location_full(db: Database, at: dt.datetime) -> Notification | None:
    """The worker's WARNING for a write that met the full location (its cooldown key)."""
    return db.transact(lambda s: enqueue(s, level=NotificationLevel.WARNING, event="location_full", subject=SUBJECT,
                                         body="b", context={"location": LOCATION}, cooldown_seconds=3600,
                                         key=f"location_full:{LOCATION}", now=at))


def deliver_all_due(db: Database) -> RecordingChannel:
    """The notifier (with the engine's review) sends what is due, the follow-up included."""
    db.transact(lambda s: s.execute(update(Notification).where(Notification.status == "pending")
                                    .values(next_attempt_at=utcnow() - dt.timedelta(seconds=1))))
    box = RecordingChannel()
    Notifier(settings_from_dict({}, environ={}).notifications, db, channels=[box], review=review_notification).drain()
    return box


def rows(db: Database) -> list[tuple[str, str]]:
    return db.read(lambda s: [(n.subject, n.status) for n in s.scalars(select(Notification).order_by(Notification.id))])


def full_then_repeated(db: Database) -> None:
    t0 = utcnow() - dt.timedelta(seconds=3700)
    assert location_full(db, t0) is not None
    first = deliver_all_due(db)
    assert [m.subject for m in first.got] == [f"[packhorse] {SUBJECT}"]
    follow = location_full(db, t0 + dt.timedelta(seconds=60))  # another write met it, in the cooldown
    assert follow is not None and follow.subject == f"Repeated: {SUBJECT}"


def test_no_repeated_message_once_the_location_has_room_again(db: Database) -> None:
    op_id = waiting_for_space(db)
    full_then_repeated(db)
    # space came back: the operation got its space and completed
    db.transact(lambda s: s.execute(update(Operation).where(Operation.id == op_id).values(
        status="COMPLETED", error_context=None, finished_at=utcnow())))
    box = deliver_all_due(db)
    assert box.got == []
    assert rows(db) == [(SUBJECT, "sent")]  # the follow-up is gone, unsent


def test_the_repeated_message_goes_while_work_still_waits_for_space(db: Database) -> None:
    waiting_for_space(db)
    full_then_repeated(db)
    box = deliver_all_due(db)
    assert [m.subject for m in box.got] == [f"[packhorse] Repeated: {SUBJECT}"]
    assert rows(db) == [(SUBJECT, "sent"), (f"Repeated: {SUBJECT}", "sent")]


def test_no_repeated_breaker_message_once_the_breaker_closed(db: Database) -> None:
    from packhorse.db.models import CircuitBreaker

    op_id = waiting_for_space(db)
    db.transact(lambda s: s.add(CircuitBreaker(kind="transfer", operation_id=op_id, stall_count=3,
                                               last_stall_attempt=3, state="open", trips=1)))
    subject = f"Circuit breaker open: transfer {op_id} held after 3 stalls"

    def opened(at: dt.datetime) -> Notification | None:
        return db.transact(lambda s: enqueue(s, level=NotificationLevel.ERROR, event="breaker_open", subject=subject,
                                             body="b", operation_kind="transfer", operation_id=op_id,
                                             cooldown_seconds=3600, now=at))

    t0 = utcnow() - dt.timedelta(seconds=3700)
    opened(t0)
    deliver_all_due(db)
    assert opened(t0 + dt.timedelta(seconds=60)) is not None  # the follow-up
    db.transact(lambda s: s.execute(update(CircuitBreaker).values(state="closed")))  # "Circuit breaker closed" went
    assert deliver_all_due(db).got == []
    assert rows(db) == [(subject, "sent")]


def test_the_review_and_the_notifier_report_the_withdrawn_follow_up_by_one_name(db: Database) -> None:
    op_id = waiting_for_space(db)
    full_then_repeated(db)
    db.transact(lambda s: s.execute(update(Operation).where(Operation.id == op_id).values(
        status="COMPLETED", error_context=None, finished_at=utcnow())))
    follow = db.read(lambda s: s.scalars(select(Notification).where(Notification.status == "pending")).one())
    assert db.transact(lambda s: review_notification(s, s.get(Notification, follow.id))) == WITHDRAWN
    assert rows(db) == [(SUBJECT, "sent")]  # the review deleted it


def test_the_notifier_counts_a_withdrawn_follow_up_under_that_name(db: Database) -> None:
    op_id = waiting_for_space(db)
    full_then_repeated(db)
    db.transact(lambda s: s.execute(update(Operation).where(Operation.id == op_id).values(
        status="COMPLETED", error_context=None, finished_at=utcnow())))
    db.transact(lambda s: s.execute(update(Notification).where(Notification.status == "pending")
                                    .values(next_attempt_at=utcnow() - dt.timedelta(seconds=1))))
    box = RecordingChannel()
    counts = Notifier(settings_from_dict({}, environ={}).notifications, db, channels=[box],
                      review=review_notification).run_once()
    assert counts == {WITHDRAWN: 1} and box.got == []
