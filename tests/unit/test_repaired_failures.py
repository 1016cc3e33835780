"""A failure that the convergence repaired before its digest went out does not page.

Against a real (SQLite) ops database, the real failure path (:func:`record_failure`, a
digest gathering its cause) and the real notifier with the engine's review, delivering to a
channel that, like an on-call mailbox, takes only ERROR, and to one that takes everything.
The decision is made when the digest is sent: a failure whose repair is a fact by then (a later
operation of the same work COMPLETED) arrives as INFO "Repaired without you", a failure still
FAILED pages, and a digest with both pages only for what still needs a human.
"""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select, update

from packhorse.config import settings_from_dict
from packhorse.db.models import Notification, Operation, utcnow
from packhorse.db.session import Database
from packhorse.domain import OperationKind
from packhorse.engine.outcome import record_failure, review_notification
from packhorse.errors import SourceChangedError
from packhorse.notify.notifier import Notifier
from packhorse.operations.lifecycle import claim, create_operation
from support import RecordingChannel, seed_rows

KIND = OperationKind.LONG_TERM_ARCHIVE
GATHER = 30.0


@pytest.fixture
def db(empty_db: Database) -> Database:
    seed_rows(empty_db, "fyst", [("fyst-source", "source"), ("cologne-lta", "long_term_archive")],
              [(f"fyst_inst_obs{i}", f"inst/obs{i}") for i in (1, 2)])
    return empty_db


def failed_archive(db: Database, package_id: int) -> int:
    """An archive copy of package ``package_id`` that failed permanently (a digest gathering)."""
    op = db.transact(lambda s: create_operation(s, kind=KIND, dedup_key=f"lta:{package_id}", site_id=1,
                                                max_retries=0, raw_data_package_id=package_id,
                                                destination_location_id=2))
    c = claim(db, op.id, "w", 30)
    assert c is not None
    out = record_failure(db, c, SourceChangedError("the bundle under it was deleted"), backoff_base=0,
                         backoff_max=0, notification_gather_seconds=GATHER)
    assert out.will_retry is False
    return op.id


def repaired(db: Database, package_id: int) -> None:
    """The convergence's repair generation of the same work COMPLETED (no human)."""
    def tx(s) -> None:  # type: ignore[no-untyped-def]
        op = create_operation(s, kind=KIND, dedup_key=f"lta:{package_id}#1", site_id=1, max_retries=3,
                              raw_data_package_id=package_id, destination_location_id=2)
        s.flush()
        s.execute(update(Operation).where(Operation.id == op.id).values(status="COMPLETED", finished_at=utcnow()))

    db.transact(tx)


def send_due(db: Database, *, review: bool = True) -> tuple[RecordingChannel, RecordingChannel]:
    """The gather window ends; the notifier sends what is due."""
    db.transact(lambda s: s.execute(update(Notification).values(
        next_attempt_at=utcnow() - dt.timedelta(seconds=1))))
    oncall, everything = RecordingChannel("oncall", {"ERROR", "CRITICAL"}), RecordingChannel("all", {"DEBUG", "INFO", "WARNING", "ERROR"})
    cfg = settings_from_dict({}, environ={}).notifications
    n = Notifier(cfg, db, channels=[oncall, everything], review=review_notification if review else None)
    n.drain()
    return oncall, everything


def rows(db: Database) -> list[tuple[str, str, str]]:
    return db.read(lambda s: [(n.level, n.event, n.status) for n in s.scalars(select(Notification))])


def test_a_failure_repaired_within_the_gather_window_does_not_page(db: Database) -> None:
    op_id = failed_archive(db, 1)
    repaired(db, 1)
    oncall, everything = send_due(db)
    assert oncall.got == []  # no page
    [m] = everything.got
    assert m.level == "INFO" and m.subject.endswith(f"Repaired without you: long_term_archive {op_id}")
    assert "nothing needs doing" in m.body and "SourceChangedError" in m.body
    assert rows(db) == [("INFO", "failure_repaired", "sent")]


def test_a_failure_still_failed_when_the_digest_goes_out_pages(db: Database) -> None:
    op_id = failed_archive(db, 1)
    oncall, _ = send_due(db)
    [m] = oncall.got
    assert m.level == "ERROR" and m.subject.endswith(f"Permanent failure: long_term_archive {op_id}")


def test_a_digest_pages_only_for_what_still_needs_a_human(db: Database) -> None:
    fixed, broken = failed_archive(db, 1), failed_archive(db, 2)
    repaired(db, 1)
    oncall, everything = send_due(db)
    [m] = oncall.got
    assert m.level == "ERROR" and m.subject.endswith(f"Permanent failure: long_term_archive {broken}")
    head, _, tail = m.body.partition("Repaired meanwhile without a human")
    assert f"long_term_archive {fixed}" in tail and "no action needed" in tail
    assert f"operation {fixed}" not in head  # what failed: only the one still failed
    assert everything.got == [m]


def test_without_the_review_a_repaired_failure_still_pages(db: Database) -> None:
    """The control: the same story, with the notifier not reviewing at send time."""
    failed_archive(db, 1)
    repaired(db, 1)
    oncall, _ = send_due(db, review=False)
    assert [m.level for m in oncall.got] == ["ERROR"]
