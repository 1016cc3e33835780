"""One clock for every process: the database's (``packhorse.db.clock``). The offset of this
host's clock to the database's is measured compensating half the round trip (the best of a few
samples), ``utcnow`` adds it, a process beyond the threshold warns once, SQLite is never
measured, and a service records its offset with its heartbeat for ``packhorse health``.

Clocks are injected (no sleep): the host clock through ``clock.host_now``, the database's through
the function handed to ``clock.measure``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from packhorse.config import DatabaseConfig
from packhorse.db import clock
from packhorse.db.models import utcnow
from packhorse.db.session import Database
from packhorse.recovery import health
from packhorse.status.metrics import registry_for, render

T0 = dt.datetime(2026, 12, 5, 23, 0, tzinfo=dt.timezone.utc)


@pytest.fixture(autouse=True)
def fresh_clock() -> Iterator[None]:
    clock.reset()
    yield
    clock.reset()


class Host:
    """A host clock that moves only when told to (each read may advance it by ``step``)."""

    def __init__(self, at: dt.datetime) -> None:
        self.t = at
        self.steps: list[float] = []

    def __call__(self) -> dt.datetime:
        now = self.t
        if self.steps:
            self.t += dt.timedelta(seconds=self.steps.pop(0))
        return now


def test_the_offset_is_the_database_time_at_the_midpoint_of_the_round_trip(monkeypatch) -> None:
    host = Host(T0)
    monkeypatch.setattr(clock, "host_now", host)
    # the host is an hour ahead; the round trip takes 0.2 s and the server reads its clock half-way
    host.steps = [0.2]
    offset = clock.measure(lambda: T0 - dt.timedelta(hours=1) + dt.timedelta(seconds=0.1), samples=1)
    assert offset == pytest.approx(-3600.0, abs=1e-6)


def test_the_sample_with_the_shortest_round_trip_is_kept(monkeypatch) -> None:
    host = Host(T0)
    monkeypatch.setattr(clock, "host_now", host)
    # three samples: round trips 2 s, 0.02 s, 1 s; the server's answer always 5 s after the call
    # started (a slow answer looks like another offset; the quick one is nearly exact)
    host.steps = [2.0, 0.0, 0.02, 0.0, 1.0, 0.0]
    answers = iter([T0 + dt.timedelta(seconds=5), T0 + dt.timedelta(seconds=2 + 5),
                    T0 + dt.timedelta(seconds=2.02 + 5)])
    offset = clock.measure(lambda: next(answers), samples=3)
    assert offset == pytest.approx(5 - 0.01, abs=1e-6)


def test_a_zoneless_server_answer_is_utc(monkeypatch) -> None:
    monkeypatch.setattr(clock, "host_now", lambda: T0)
    assert clock.measure(lambda: (T0 + dt.timedelta(seconds=3)).replace(tzinfo=None), samples=1) == pytest.approx(3.0)


def test_utcnow_is_the_host_clock_plus_the_recorded_offset(monkeypatch) -> None:
    monkeypatch.setattr(clock, "host_now", lambda: T0 + dt.timedelta(hours=1))  # a host an hour ahead
    assert not clock.measured() and utcnow() == T0 + dt.timedelta(hours=1)  # nothing measured: the host's
    clock.record(-3600.0)
    assert clock.measured() and clock.offset_seconds() == -3600.0
    assert utcnow() == T0 and utcnow().tzinfo is not None


def test_an_offset_beyond_the_threshold_warns_once_per_process() -> None:
    with capture_logs() as logs:
        clock.record(1.5, warn_above_seconds=2.0)
        clock.record(-7200.0, warn_above_seconds=2.0, database="postgresql+psycopg://db/x")
        clock.record(-7200.2, warn_above_seconds=2.0)
    warnings = [e for e in logs if e["event"] == "clock_offset"]
    assert len(warnings) == 1
    assert warnings[0]["log_level"] == "warning" and warnings[0]["offset_seconds"] == -7200.0
    assert warnings[0]["database"] == "postgresql+psycopg://db/x" and "NTP" in warnings[0]["hint"]


def test_a_failed_measurement_keeps_the_offset(monkeypatch) -> None:
    clock.record(12.0)

    def down() -> dt.datetime:
        raise ConnectionError("server away")

    with pytest.raises(ConnectionError):
        clock.measure(down)
    assert clock.offset_seconds() == 12.0


def test_sqlite_is_on_this_host_and_never_measured(empty_db: Database, monkeypatch) -> None:
    monkeypatch.setattr(clock, "measure", lambda *a, **k: pytest.fail("SQLite must not be measured"))
    assert empty_db.measure_clock() == 0.0
    empty_db.read(lambda s: None)
    assert not clock.measured() and clock.offset_seconds() == 0.0


def test_the_warning_threshold_is_a_database_setting() -> None:
    assert DatabaseConfig().clock_offset_warn_seconds == clock.DEFAULT_WARN_SECONDS == 2.0
    with pytest.raises(ValueError):
        DatabaseConfig(clock_offset_warn_seconds=0)


def test_a_service_records_its_offset_with_its_heartbeat(empty_db: Database) -> None:
    clock.record(-3600.25)
    health.record_heartbeat(empty_db, "worker:cologne@dc1", kind="worker", host="dc1", pid=4242, now=T0)
    health.record_heartbeat(empty_db, "monitor@dc2", kind="monitor", host="dc2", pid=4243, now=T0,
                            clock_offset_seconds=0.004)
    rows = {r["service"]: r for r in empty_db.read(lambda s: health.list_services(s, now=T0))}
    assert rows["worker:cologne@dc1"]["clock_offset_seconds"] == -3600.25
    assert rows["monitor@dc2"]["clock_offset_seconds"] == 0.004
    clock.record(0.5)  # measured again (NTP fixed the host): the next heartbeat says so
    health.record_heartbeat(empty_db, "worker:cologne@dc1", kind="worker", host="dc1", pid=4242, now=T0)
    [row] = [r for r in empty_db.read(lambda s: health.list_services(s, now=T0)) if r["service"].startswith("worker")]
    assert row["clock_offset_seconds"] == 0.5


def test_the_offsets_are_exported_as_a_metric(empty_db: Database) -> None:
    health.record_heartbeat(empty_db, "worker:fyst@obs1", kind="worker", host="obs1", pid=4242,
                            clock_offset_seconds=-3600.5)
    text = render(registry_for(empty_db)).decode()
    assert 'packhorse_service_clock_offset_seconds{kind="worker",service="worker:fyst@obs1"} -3600.5' in text
