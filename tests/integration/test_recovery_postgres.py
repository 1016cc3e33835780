"""Recovery against a real PostgreSQL: the service loop survives its connection being killed
by the server in the middle of a cycle and recovers without a restart; the monitor and the
reconciler work on PostgreSQL.

Needs PostgreSQL on 127.0.0.1:5432 (trust auth, user ``postgres``); skipped when unreachable,
except under ``CI=true``, where it fails. Each test creates and drops its own database.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session

from packhorse.config import settings_from_dict
from packhorse.db.models import Notification, Operation, ServiceHeartbeat, Site, SiteOutage, utcnow
from packhorse.db.session import Database, insert_if_absent
from packhorse.domain import OperationKind
from packhorse.operations.lifecycle import claim, create_operation
from packhorse.recovery.loop import ServiceLoop
from packhorse.recovery.monitor import recovery_cycle
from packhorse.recovery.site_reachability import track_sites

ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=test"


def _admin():  # type: ignore[no-untyped-def]
    import psycopg

    try:
        return psycopg.connect(ADMIN, autocommit=True, connect_timeout=3)
    except Exception as e:  # pragma: no cover - depends on the machine
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL unreachable under CI: {e}")
        pytest.skip(f"PostgreSQL unreachable at 127.0.0.1:5432: {e}")


@pytest.fixture
def pg_db():  # type: ignore[no-untyped-def]
    admin = _admin()
    name = f"packhorse_recovery_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    db = Database(f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}")
    try:
        db.upgrade()
        db.transact(lambda s: s.add(Site(id=1, name="fyst")))
        yield db
    finally:
        db.dispose()
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def test_service_loop_survives_the_server_killing_its_connection_mid_cycle(pg_db: Database) -> None:
    log: list[str] = []

    def work(session: Session) -> None:
        pid = session.execute(text("SELECT pg_backend_pid()")).scalar()
        if len(log) == 1:
            # another connection kills this session's backend in the middle of the cycle
            admin = _admin()
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            admin.close()
            log.append("killed")
            session.execute(text("SELECT count(*) FROM operations")).scalar()
            return
        session.execute(text("SELECT count(*) FROM operations")).scalar()
        log.append("ok")

    loop = ServiceLoop(pg_db, "pg-manager", work, interval_seconds=0.0, max_consecutive_errors=3)
    loop.run(max_cycles=4)
    assert log == ["ok", "killed", "ok", "ok"]
    assert (loop.failed_cycles, loop.consecutive_errors) == (1, 0)
    assert pg_db.read(lambda s: s.scalars(select(Notification)).all()) == []


def test_monitor_and_reconciler_on_postgres(pg_db: Database) -> None:
    settings = settings_from_dict({"recovery": {"reconcile_floor_seconds": 0}}, environ={})

    def ops(s: Session) -> list[int]:
        a = create_operation(s, kind=OperationKind.TRANSFER, dedup_key="a", site_id=1, max_retries=3)
        b = create_operation(s, kind=OperationKind.TRANSFER, dedup_key="b", site_id=1, max_retries=3)
        assert a is not None and b is not None
        return [a.id, b.id]

    stalled, lost = pg_db.transact(ops)
    assert claim(pg_db, stalled, "dead", 30) is not None
    past = utcnow() - dt.timedelta(seconds=5)
    pg_db.transact(lambda s: s.execute(update(Operation).where(Operation.id == stalled).values(lease_expires_at=past)))
    pg_db.transact(lambda s: s.execute(update(Operation).where(Operation.id == lost).values(
        status="SCHEDULED", scheduled_at=past, updated_at=past)))
    report = recovery_cycle(pg_db, settings)
    assert sorted(report.reset) == sorted([stalled, lost])
    rows = pg_db.read(lambda s: {o.id: (o.status, o.retry_count, o.reconcile_count, o.stall_count)
                                 for o in s.scalars(select(Operation))})
    assert rows == {stalled: ("PENDING", 0, 0, 1), lost: ("PENDING", 0, 1, 0)}


def test_a_stall_caused_by_a_database_restart_or_a_cut_off_site_is_not_counted(pg_db: Database) -> None:
    # A worker that cannot reach the database stops before its lease could look expired; when the
    # outage outlasts the lease the monitor resets its operation. Each such reset used to count a
    # stall, so a site cut off for hours three times opened the breakers of the work it had in hand
    # (and a long database restart did the same everywhere).
    settings = settings_from_dict({}, environ={})
    now = utcnow()
    started = pg_db.read(lambda s: s.scalar(text("SELECT pg_postmaster_start_time()")))

    def seed(s: Session) -> dict[str, int]:
        s.add(Site(id=2, name="cologne"))
        s.flush()
        # fyst's worker is alive; every worker of cologne has been silent for ten minutes
        s.add(ServiceHeartbeat(service="worker:fyst@a", kind="worker", host="a", pid=1, site="fyst",
                               started_at=now, last_seen=now))
        s.add(ServiceHeartbeat(service="worker:cologne@b", kind="worker", host="b", pid=2, site="cologne",
                               started_at=now - dt.timedelta(hours=1), last_seen=now - dt.timedelta(minutes=10)))
        ids = {}
        # default lease 300 s, renewed every 60 s: each attempt stopped renewing 310 s ago
        for name, site_id, renewed in (("suspect", 1, now - dt.timedelta(seconds=310)),
                                       ("before_restart", 1, started - dt.timedelta(seconds=1)),
                                       ("cut_off_site", 2, now - dt.timedelta(seconds=310))):
            op = create_operation(s, kind=OperationKind.TRANSFER, dedup_key=name, site_id=site_id, max_retries=3)
            assert op is not None
            op.status, op.attempt, op.lease_owner = "IN_PROGRESS", 1, f"elsewhere:{op.id}"
            op.heartbeat_at, op.lease_expires_at = renewed, now - dt.timedelta(seconds=5)
            ids[name] = op.id
        return ids

    ids = pg_db.transact(seed)
    report = recovery_cycle(pg_db, settings)
    assert sorted(report.reset) == sorted(ids.values())
    stalls = pg_db.read(lambda s: {name: s.get(Operation, i).stall_count for name, i in ids.items()})
    assert stalls == {"suspect": 1, "before_restart": 0, "cut_off_site": 0}
    # only the suspect pages; the others are no one's to act on (a cut site is notified once, as such)
    bodies = pg_db.read(lambda s: {n.operation_id: n.body for n in s.scalars(
        select(Notification).where(Notification.event == "stalled_recovered"))})
    assert list(bodies) == [ids["suspect"]] and "Stall count: 1 of" in bodies[ids["suspect"]]


def test_a_site_cut_off_is_notified_once_on_postgres(pg_db: Database) -> None:
    # on PostgreSQL an INSERT's rowcount is -1 (SQLAlchemy 2.1, psycopg 3): the cut was recorded
    # in site_outages but taken for another monitor's, so `Site X unreachable` was never queued
    # while `Site X reachable again` was
    settings = settings_from_dict({}, environ={})
    now = utcnow()
    pg_db.transact(lambda s: s.add(ServiceHeartbeat(
        service="worker:fyst@a", kind="worker", host="a", pid=1, site="fyst",
        started_at=now - dt.timedelta(hours=1), last_seen=now - dt.timedelta(minutes=5))))
    assert track_sites(pg_db, settings) == (["fyst"], [])
    assert track_sites(pg_db, settings) == ([], [])  # a second pass (or monitor): nothing more
    pg_db.transact(lambda s: s.execute(update(ServiceHeartbeat).values(last_seen=utcnow())))
    assert track_sites(pg_db, settings) == ([], ["fyst"])
    notes = pg_db.read(lambda s: [(n.level, n.event) for n in s.scalars(select(Notification).order_by(Notification.id))])
    assert notes == [("WARNING", "site_unreachable"), ("INFO", "site_reachable")]


def test_insert_if_absent_tells_the_first_insert_on_postgres(pg_db: Database) -> None:
    t = SiteOutage.__table__
    row = {"site": "fyst", "since": utcnow(), "noticed_at": utcnow()}
    assert pg_db.transact(lambda s: insert_if_absent(s, t, [t.c.site], row)) is True
    assert pg_db.transact(lambda s: insert_if_absent(s, t, [t.c.site], row)) is False
