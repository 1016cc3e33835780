"""The database's clock on a real PostgreSQL: ``Database`` measures this host's offset to the
server's ``clock_timestamp()`` before its first unit of work, and again when due; a host whose
clock is an hour ahead (its clock read shifted in this process) gets an offset of about -3600 s,
so ``utcnow`` stays the server's time, and it warns once."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from sqlalchemy import text
from structlog.testing import capture_logs

from distributed_support import free_port, postgres_database
from packhorse.db import clock
from packhorse.db.models import utcnow
from packhorse.db.session import Database


@pytest.fixture
def pg_db() -> Iterator[Database]:
    url, drop = postgres_database()
    clock.reset()
    db = Database(url, pool_size=1, max_overflow=0)
    yield db
    db.dispose()
    clock.reset()
    drop()


def _server_now(db: Database) -> dt.datetime:
    with db.engine.connect() as conn:
        return conn.execute(text("SELECT clock_timestamp()")).scalar_one()


def test_a_host_an_hour_ahead_writes_the_servers_time(pg_db: Database, monkeypatch) -> None:
    real = clock.host_now
    monkeypatch.setattr(clock, "host_now", lambda: real() + dt.timedelta(hours=1))
    assert utcnow() - _server_now(pg_db) > dt.timedelta(minutes=59)  # not measured yet: the host's clock
    with capture_logs() as logs:
        pg_db.read(lambda s: s.execute(text("SELECT 1")))  # the first unit of work measures
        pg_db.transact(lambda s: s.execute(text("SELECT 1")))  # not due again: no second measurement
    assert clock.measured() and clock.offset_seconds() == pytest.approx(-3600, abs=0.5)
    assert abs((utcnow() - _server_now(pg_db)).total_seconds()) < 0.5
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["clock_offset"]


def test_the_offset_is_measured_again_when_due(pg_db: Database, monkeypatch) -> None:
    pg_db.clock_refresh_seconds = 0.0  # due before every unit of work
    pg_db.statements(lambda c: c.execute(text("SELECT 1")))
    assert abs(clock.offset_seconds()) < 0.5  # this host and the server share one clock
    real = clock.host_now
    monkeypatch.setattr(clock, "host_now", lambda: real() - dt.timedelta(seconds=30))  # NTP stepped it back
    pg_db.statements(lambda c: c.execute(text("SELECT 1")))
    assert clock.offset_seconds() == pytest.approx(30, abs=0.5)
    assert abs((utcnow() - _server_now(pg_db)).total_seconds()) < 0.5


def test_a_server_that_cannot_be_asked_keeps_the_offset_and_raises_nothing() -> None:
    clock.reset()
    clock.record(1.25)
    db = Database(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing", pool_size=1, max_overflow=0)
    try:
        db.follow_clock()  # nobody listens on that port: refused at once
        assert clock.offset_seconds() == 1.25
        db.follow_clock()  # not tried again before CLOCK_RETRY_SECONDS
    finally:
        db.dispose()
        clock.reset()
