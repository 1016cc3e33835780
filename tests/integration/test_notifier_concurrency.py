"""Several notifiers on one outbox: each notification is claimed by one notifier at
a time (lease + fencing token), so every one is delivered exactly once per channel — on SQLite
and on PostgreSQL."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from pg_scratch import scratch_postgres
from sqlalchemy import select

from packhorse.config import settings_from_dict
from packhorse.db.models import Notification, NotificationDelivery
from packhorse.db.session import Database
from packhorse.domain import NotificationLevel
from packhorse.notify.channels.base import Message
from packhorse.notify.notifier import Notifier
from packhorse.notify.outbox import enqueue


class Recorder:
    """A channel that records what it was sent (after a small delay, like a network round trip)."""

    name = "recorder"

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.lock = threading.Lock()

    def wants(self, level: str) -> bool:
        return True

    def abort(self) -> None:
        pass

    def send(self, message: Message, *, timeout: float | None = None) -> None:
        threading.Event().wait(0.002)
        with self.lock:
            self.sent.append(message.notification_id)


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        d = Database(f"sqlite:///{tmp_path / 'ops.db'}")
        d.upgrade()
        yield d
        d.dispose()
    else:
        yield from scratch_postgres()


def test_four_notifiers_deliver_every_notification_once(db: Database) -> None:
    n = 120
    db.transact(lambda s: [enqueue(s, level=NotificationLevel.INFO, event="t", subject=f"n{i}", body="b",
                                   cooldown_seconds=0) for i in range(n)])
    cfg = settings_from_dict({"notifications": {"apprise_urls": []}}, environ={}).notifications
    channel = Recorder()
    notifiers = [Notifier(cfg, db, channels=[channel], owner=f"notifier-{i}") for i in range(4)]
    threads = [threading.Thread(target=x.drain) for x in notifiers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(channel.sent) == sorted(set(channel.sent)) and len(channel.sent) == n
    rows = db.read(lambda s: list(s.scalars(select(Notification))))
    assert Counter(r.status for r in rows) == {"sent": n}
    deliveries = db.read(lambda s: list(s.scalars(select(NotificationDelivery))))
    assert len(deliveries) == n


def test_failures_of_one_cause_recorded_at_once_all_land_in_one_digest(db: Database) -> None:
    """Eight workers fail at the same moment with one root cause: every one is listed in the one
    waiting digest (the fold is a compare-and-set: none overwrites another's)."""
    from sqlalchemy.orm import Session

    from packhorse.db.models import Site
    from packhorse.domain import OperationKind
    from packhorse.engine.outcome import record_failure
    from packhorse.errors import DestinationWriteError
    from packhorse.operations.lifecycle import claim, create_operation, dedup_key

    def ops(s: Session) -> list[int]:
        s.add(Site(name="cologne"))
        s.flush()
        sid = s.scalar(select(Site.id))
        out = []
        for i in range(8):
            op = create_operation(s, kind=OperationKind.LONG_TERM_ARCHIVE,
                                  dedup_key=dedup_key(OperationKind.LONG_TERM_ARCHIVE, f"p{i}"), site_id=sid,
                                  max_retries=0)
            assert op is not None
            out.append(op.id)
        return out

    ids = db.transact(ops)
    claims = [claim(db, op_id, f"w{i}", 60) for i, op_id in enumerate(ids)]
    start = threading.Barrier(len(ids))

    def fail(i: int) -> None:
        c = claims[i]
        assert c is not None
        exc = DestinationWriteError(f"cologne-lta: writing 'raw/p{i}.tar' failed, the file system is full",
                                    step="write", side="destination", path=f"raw/p{i}.tar", host="cologne-lta")
        start.wait()
        record_failure(db, c, exc, backoff_base=0, backoff_max=0, notification_cooldown_seconds=3600,
                       notification_gather_seconds=60)

    threads = [threading.Thread(target=fail, args=(i,)) for i in range(len(ids))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    [row] = db.read(lambda s: list(s.scalars(select(Notification))))
    assert sorted(f["operation_id"] for f in row.context["failures"]) == sorted(ids)
    assert row.subject == "Permanent failure x8 (long_term_archive): DestinationWriteError at cologne-lta"


def test_an_operation_reset_and_failed_again_is_listed_once_in_the_digest(db: Database) -> None:
    """A digest listed an operation that an operator reset and that failed again within the
    gather window twice ("Permanent failure x2", one operation; found by a trial): it is one
    operation, listed once with its latest failure."""
    from sqlalchemy.orm import Session

    from packhorse.db.models import Site
    from packhorse.domain import OperationKind
    from packhorse.engine.outcome import record_failure
    from packhorse.errors import DestinationConflictError
    from packhorse.operations.lifecycle import claim, create_operation, dedup_key, reset_failed

    def ops(s: Session) -> list[int]:
        s.add(Site(name="cologne"))
        s.flush()
        sid = s.scalar(select(Site.id))
        return [create_operation(s, kind=OperationKind.LONG_TERM_ARCHIVE,
                                 dedup_key=dedup_key(OperationKind.LONG_TERM_ARCHIVE, f"p{i}"), site_id=sid,
                                 max_retries=0).id for i in range(2)]

    first, other = db.transact(ops)

    def fail(op_id: int, attempt: int) -> None:
        c = claim(db, op_id, "w", 60)
        assert c is not None and c.attempt == attempt
        exc = DestinationConflictError("cologne-lta: cannot create the folder of 'raw/cam.tar/x.tar'",
                                       step="publish", side="destination", path="raw/cam.tar/x.tar",
                                       host="cologne-lta")
        record_failure(db, c, exc, backoff_base=0, backoff_max=0, notification_cooldown_seconds=3600,
                       notification_gather_seconds=60)

    fail(first, 1)
    assert reset_failed(db, OperationKind.LONG_TERM_ARCHIVE, first) == [first]
    fail(first, 2)
    [row] = db.read(lambda s: list(s.scalars(select(Notification))))
    assert [f["operation_id"] for f in row.context["failures"]] == [first]
    assert row.subject.startswith(f"Permanent failure: long_term_archive {first}"), row.subject
    fail(other, 1)  # another operation of the cause: two now
    [row] = db.read(lambda s: list(s.scalars(select(Notification))))
    assert [f["operation_id"] for f in row.context["failures"]] == [first, other]
    assert row.subject.startswith("Permanent failure x2"), row.subject
