"""Several notifiers on one outbox (issue #7): each notification is claimed by one notifier at
a time (lease + fencing token), so every one is delivered exactly once per channel — on SQLite
and on PostgreSQL."""

from __future__ import annotations

import os
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select, text

from packhorse.config import settings_from_dict
from packhorse.db.models import Notification, NotificationDelivery
from packhorse.db.session import Database
from packhorse.domain import NotificationLevel
from packhorse.notify.channels import Message
from packhorse.notify.notifier import Notifier
from packhorse.notify.outbox import enqueue

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


class Recorder:
    """A channel that records what it was sent (after a small delay, like a network round trip)."""

    name = "recorder"

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.lock = threading.Lock()

    def wants(self, level: str) -> bool:
        return True

    def send(self, message: Message) -> None:
        threading.Event().wait(0.002)
        with self.lock:
            self.sent.append(message.notification_id)


def _postgres() -> Iterator[Database]:
    try:
        admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(text("SELECT 1"))
    except Exception as e:  # noqa: BLE001
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL is required in CI: {e}")
        pytest.skip(f"PostgreSQL not reachable at 127.0.0.1:5432: {e}")
    name = f"packhorse_issue7_{uuid.uuid4().hex[:12]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    db = Database(f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}")
    try:
        db.upgrade()
        yield db
    finally:
        db.dispose()
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        d = Database(f"sqlite:///{tmp_path / 'ops.db'}")
        d.upgrade()
        yield d
        d.dispose()
    else:
        yield from _postgres()


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
