"""Service health keyed by identity (kind, site, instance, host), never by process, against a
real (SQLite) ops database with an injected clock: a restarted service takes over its dead
predecessor's row, dead rows expire, ``forget_service`` removes one, the metric label set stays
bounded whatever the number of crashes (seed 002 "Health Check Service")."""

from __future__ import annotations

import datetime as dt

import pytest

from packhorse.db.models import ServiceHeartbeat
from packhorse.db.session import Database
from packhorse.errors import ConfigError, ServiceHealthError
from packhorse.recovery import health
from packhorse.status.metrics import collect_values
from support import no_such_pid

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def beat(db: Database, service: str, *, pid: int, started: float, now: float, kind: str = "runner") -> None:
    health.record_heartbeat(db, service, kind=kind, host="obs1", pid=pid, started_at=at(started), now=at(now))


def services(db: Database, now: float, **kw: float) -> list[dict]:
    return db.read(lambda s: health.list_services(s, now=at(now), **kw))


def test_the_identity_is_what_the_service_is() -> None:
    assert health.service_identity("runner", host="obs1") == "runner@obs1"
    assert health.service_identity("worker", site="cologne", host="dc1") == "worker:cologne@dc1"
    assert health.service_identity("worker", site="cologne", instance="b-2", host="dc1") == "worker:cologne:b-2@dc1"
    assert health.service_identity("monitor", instance="", host="h") == "monitor@h"
    for bad in ("two words", "../x", "-x", "x" * 65):
        with pytest.raises(ConfigError, match="--instance"):
            health.service_identity("runner", instance=bad, host="h")


def test_a_restarted_service_replaces_its_dead_predecessor(empty_db: Database) -> None:
    beat(empty_db, "runner@obs1", pid=100, started=0, now=0)
    [dead] = services(empty_db, 200)
    assert (dead["alive"], dead["pid"]) == (False, 100)  # killed: no heartbeat for 200 s
    beat(empty_db, "runner@obs1", pid=200, started=210, now=210)  # restarted
    [row] = services(empty_db, 215)
    assert (row["service"], row["alive"], row["pid"], row["restarts"]) == ("runner@obs1", True, 200, 1)
    assert row["started_at"] == at(210)
    beat(empty_db, "runner@obs1", pid=200, started=210, now=240)  # the same process beating on
    assert services(empty_db, 240)[0]["restarts"] == 1


def test_a_restart_with_the_same_pid_is_told_apart_by_its_start(empty_db: Database) -> None:
    # every process of a container is pid 1
    beat(empty_db, "monitor@obs1", pid=1, started=0, now=10, kind="monitor")
    beat(empty_db, "monitor@obs1", pid=1, started=500, now=500, kind="monitor")
    [row] = services(empty_db, 500)
    assert (row["alive"], row["restarts"], row["started_at"]) == (True, 1, at(500))


def test_dead_services_expire_after_the_forget_time(empty_db: Database) -> None:
    beat(empty_db, "worker:cornell@dc2", pid=7, started=0, now=0, kind="worker")
    assert [r["alive"] for r in services(empty_db, 3600)] == [False]  # dead: listed, a problem
    assert services(empty_db, 86401) == []  # a day later: forgotten, not listed nor counted
    assert services(empty_db, 3601, forget_after_seconds=3600) == []
    # the next heartbeat of any service deletes the expired row
    beat(empty_db, "runner@obs1", pid=9, started=86401, now=86401)
    names = empty_db.read(lambda s: sorted(s.scalars(__import__("sqlalchemy").select(ServiceHeartbeat.service))))
    assert names == ["runner@obs1"]


def test_forget_removes_a_dead_service_and_refuses_a_live_or_unknown_one(empty_db: Database) -> None:
    beat(empty_db, "monitor:b@obs1", pid=5, started=0, now=0, kind="monitor")
    beat(empty_db, "runner@obs1", pid=6, started=0, now=100)
    with pytest.raises(ServiceHealthError, match="runner@obs1 is alive"):
        health.forget_service(empty_db, "runner@obs1", now=at(120))
    with pytest.raises(ServiceHealthError, match=r"no service 'nope@x' is recorded \(recorded: monitor:b@obs1, runner@obs1\)"):
        health.forget_service(empty_db, "nope@x", now=at(120))
    gone = health.forget_service(empty_db, "monitor:b@obs1", now=at(120))
    assert gone["service"] == "monitor:b@obs1" and gone["last_seen"] == at(0)
    assert [r["service"] for r in services(empty_db, 120)] == ["runner@obs1"]


def test_the_metric_label_set_does_not_grow_with_crashes(empty_db: Database) -> None:
    for crash in range(5):  # killed and restarted five times
        beat(empty_db, "runner@obs1", pid=1000 + crash, started=crash * 100, now=crash * 100)
    beat(empty_db, "worker:cologne@obs1", pid=2000, started=0, now=400, kind="worker")
    now = dt.datetime.now(dt.timezone.utc)
    values = empty_db.read(lambda s: collect_values(s, dead_after_seconds=(now - at(400)).total_seconds() + 60,
                                                    forget_after_seconds=10 ** 9))
    assert sorted((svc, kind) for svc, kind, _alive in values["services"]) == [
        ("runner@obs1", "runner"), ("worker:cologne@obs1", "worker")]


def test_a_clean_stop_removes_only_its_own_row_not_a_successors(empty_db: Database) -> None:
    first = health.HeartbeatThread(empty_db, "runner", instance="a", clock=lambda: at(0))
    assert first.service.startswith("runner:a@") and first.beat()
    successor = health.HeartbeatThread(empty_db, "runner", instance="a", clock=lambda: at(50))
    assert successor.beat()  # took the row over (the first hung, then was stopped)
    first.stop(remove=True)
    [row] = services(empty_db, 60)
    assert row["started_at"] == at(50) and row["restarts"] == 1
    successor.stop(remove=True)
    assert services(empty_db, 60) == []


def test_two_live_processes_sharing_one_identity_are_reported(empty_db: Database) -> None:
    import os
    import socket

    from structlog.testing import capture_logs

    other = os.getppid()  # a live process on this host that is not this one
    health.record_heartbeat(empty_db, "manager@" + socket.gethostname(), kind="manager", host=socket.gethostname(),
                            pid=other, started_at=at(0), now=at(0))
    t = health.HeartbeatThread(empty_db, "manager", clock=lambda: at(5))
    with capture_logs() as logs:
        assert t.beat() and t.beat()
    shared = [e for e in logs if e["event"] == "service_identity_shared"]
    assert len(shared) == 1 and shared[0]["other_pid"] == other and "--instance" in shared[0]["hint"]


def test_a_service_of_this_host_whose_process_is_gone_is_dead_at_once(empty_db: Database) -> None:
    # `packhorse health` right after a kill -9: the heartbeat is seconds old, but the process
    # that wrote it no longer runs on this host; it is dead now, not dead_after_seconds later
    import os
    import socket

    gone = no_such_pid()
    here = socket.gethostname()
    health.record_heartbeat(empty_db, f"runner@{here}", kind="runner", host=here, pid=gone,
                            started_at=at(0), now=at(0))
    health.record_heartbeat(empty_db, f"monitor@{here}", kind="monitor", host=here, pid=os.getpid(),
                            started_at=at(0), now=at(0))
    rows = {r["service"]: r["alive"] for r in services(empty_db, 3)}
    assert rows == {f"runner@{here}": False, f"monitor@{here}": True}
    # and it may be forgotten (a live one may not)
    assert health.forget_service(empty_db, f"runner@{here}", now=at(3))["pid"] == gone
    with pytest.raises(health.ServiceHealthError, match="alive"):
        health.forget_service(empty_db, f"monitor@{here}", now=at(3))
