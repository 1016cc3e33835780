"""The notification outbox: a FAILED operation queues its notification in the same transaction,
a rolled-back change queues nothing, and repeats within the cooldown are counted, not re-queued
(DESIGN.md I1 and "Architecture"; issues #3 and #7)."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.db.models import Notification, Operation, Site, utcnow
from packhorse.db.session import Database
from packhorse.domain import NotificationLevel, OperationKind, Status
from packhorse.engine.outcome import record_failure
from packhorse.errors import SourceChangedError, VerificationError
from packhorse.notify.outbox import WINDOW_START, ascii_subject, enqueue, render_error_context
from packhorse.operations.lifecycle import claim, create_operation, dedup_key


@pytest.fixture
def db(empty_db: Database) -> Database:
    empty_db.transact(lambda s: s.add(Site(name="fyst")))
    return empty_db


def new_op(db: Database, subject: str = "pkg-1", max_retries: int = 3) -> int:
    def tx(s: Session) -> int:
        sid = s.scalar(select(Site.id))
        op = create_operation(s, kind=OperationKind.TRANSFER, dedup_key=dedup_key(OperationKind.TRANSFER, subject),
                              site_id=sid, max_retries=max_retries)
        assert op is not None
        return op.id

    return db.transact(tx)


def outbox(db: Database) -> list[Notification]:
    return db.read(lambda s: list(s.scalars(select(Notification).order_by(Notification.id))))


def test_permanent_failure_queues_one_error_notification_rendered_from_the_error_context(db: Database) -> None:
    op_id = new_op(db)
    c = claim(db, op_id, "w1", 30)
    assert c is not None
    exc = SourceChangedError("source file 'x.fits' changed", step="package", side="source", path="x.fits",
                             diagnosis="the file was modified after it was registered")
    out = record_failure(db, c, exc, backoff_base=0, backoff_max=0)
    assert out.status is Status.FAILED
    [n] = outbox(db)
    assert (n.level, n.event, n.operation_kind, n.operation_id, n.status) == (
        "ERROR", "permanent_failure", "transfer", op_id, "pending")
    assert n.subject == f"Permanent failure: transfer {op_id}"
    # the one error context, plus the operations of its cause (a digest) and its cooldown window
    assert {k: v for k, v in n.context.items() if k not in ("failures", WINDOW_START)} == out.error_context
    assert [f["operation_id"] for f in n.context["failures"]] == [op_id]
    assert "Error: source file 'x.fits' changed" in n.body
    assert "Diagnosis: the file was modified after it was registered" in n.body
    assert "Path: x.fits" in n.body


def test_retryable_failure_queues_nothing(db: Database) -> None:
    op_id = new_op(db)
    c = claim(db, op_id, "w1", 30)
    assert c is not None
    assert record_failure(db, c, VerificationError("differs"), backoff_base=0, backoff_max=0).status is Status.PENDING
    assert outbox(db) == []


def test_notification_is_rolled_back_with_its_state_change(db: Database) -> None:
    op_id = new_op(db)

    def tx(s: Session) -> None:
        s.get(Operation, op_id).status = Status.FAILED.value  # type: ignore[union-attr]
        enqueue(s, level=NotificationLevel.ERROR, event="permanent_failure", subject="x", body="y",
                operation_kind="transfer", operation_id=op_id)
        raise RuntimeError("the state change fails after the notification was queued")

    with pytest.raises(RuntimeError):
        db.transact(tx)
    assert outbox(db) == []
    assert db.read(lambda s: s.get(Operation, op_id).status) == "PENDING"  # type: ignore[union-attr]


def test_cooldown_counts_repeats_of_the_same_kind_operation_and_subject(db: Database) -> None:
    op_id = new_op(db)
    t0 = utcnow()

    def send(subject: str, at: dt.datetime, operation_id: int | None = op_id) -> Notification | None:
        return db.transact(lambda s: enqueue(s, level=NotificationLevel.ERROR, event="breaker_open",
                                             subject=subject, body="b", operation_kind="transfer",
                                             operation_id=operation_id, cooldown_seconds=3600, now=at))

    assert send("Circuit breaker open: transfer 1", t0) is not None
    assert send("Circuit breaker open: transfer 1", t0 + dt.timedelta(seconds=10)) is None
    assert send("Circuit breaker open: transfer 1", t0 + dt.timedelta(seconds=3599)) is None
    assert send("Another subject", t0 + dt.timedelta(seconds=20)) is not None
    assert send("Circuit breaker open: transfer 1", t0 + dt.timedelta(seconds=20), operation_id=None) is not None
    assert send("Circuit breaker open: transfer 1", t0 + dt.timedelta(seconds=3601)) is not None
    rows = outbox(db)
    assert [r.repeat_count for r in rows] == [2, 0, 0, 0]
    assert rows[0].last_repeat_at == t0 + dt.timedelta(seconds=3599)


def test_subject_is_one_line_of_plain_ascii() -> None:
    assert ascii_subject("Permanent failure:\n long_term_archive 17 — Köln") == \
        "Permanent failure: long_term_archive 17 ? K?ln"
    assert len(ascii_subject("x" * 1000)) == 200


def test_render_skips_fields_that_are_not_set() -> None:
    body = render_error_context({"operation_kind": "unpack", "operation_id": 3, "retry_count": 0,
                                 "error_type": "E", "message": "m", "diagnosis": None, "traceback": "TB"})
    assert "Diagnosis" not in body
    assert body.splitlines()[:5] == ["Task: unpack", "Operation: 3", "Retry count: 0", "Error type: E", "Error: m"]
    assert body.endswith("Traceback:\nTB")


def test_repeats_after_the_message_went_are_reported_when_the_cooldown_ends(db: Database) -> None:
    op_id = new_op(db)
    t0 = utcnow()

    def send(at: dt.datetime) -> Notification | None:
        return db.transact(lambda s: enqueue(s, level=NotificationLevel.ERROR, event="breaker_open",
                                             subject="Circuit breaker open: transfer 1", body="b",
                                             operation_kind="transfer", operation_id=op_id, cooldown_seconds=3600,
                                             now=at))

    first = send(t0)
    assert first is not None
    db.transact(lambda s: s.get(Notification, first.id).__setattr__("status", "sent"))  # delivered
    follow = send(t0 + dt.timedelta(seconds=100))
    assert follow is not None and follow.subject == "Repeated: Circuit breaker open: transfer 1"
    assert follow.next_attempt_at == t0 + dt.timedelta(seconds=3600)  # when the window ends
    assert follow.context["follow_up_of"] == first.id
    assert send(t0 + dt.timedelta(seconds=200)) is None  # folded into the follow-up
    assert send(t0 + dt.timedelta(seconds=300)) is None
    rows = outbox(db)
    assert [r.repeat_count for r in rows] == [0, 2]
    # the follow-up opens the next window: a repeat right after it went waits for its end
    db.transact(lambda s: s.get(Notification, follow.id).__setattr__("status", "sent"))
    later = send(t0 + dt.timedelta(seconds=3700))
    assert later is not None and later.next_attempt_at == t0 + dt.timedelta(seconds=7200)


def test_the_root_cause_key_ignores_what_differs_between_operations(db: Database) -> None:
    from packhorse.notify.messages import cause_key, failure_item

    def ctx(i: int, where: str = "cologne-lta") -> dict:
        return {"error_type": "DestinationWriteError", "step": "write", "host": where,
                "message": f"{where}: writing 'raw/obs{i}.tar' failed after {i * 1000:,} bytes, the file system is full",
                "operation_kind": "long_term_archive", "operation_id": i, "path": f"raw/obs{i}.tar"}

    keys = {cause_key(failure_item(ctx(i), {}), ctx(i)) for i in range(1, 20)}
    assert len(keys) == 1  # keys, sizes and ids differ; the cause does not
    other = ctx(1, "cornell-lta")
    assert cause_key(failure_item(other, {}), other) not in keys
