"""Threads that keep a lease or a service row alive, with real time: the lease keeper's
renewals, its takeover and deadline checks (restic's lock monitor, DESIGN.md "Numbers") and its
:meth:`~packhorse.operations.lease.LeaseKeeper.on_lost` callbacks at the renewal deadline, and the
service heartbeat thread. (The lifecycle they write through is unit-tested in
``tests/unit/test_operations.py``; the deadline's callbacks without threads in
``tests/unit/test_lease_deadline_on_lost.py``.)"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import pytest
from sqlalchemy import select, update

from packhorse.config import settings_from_dict
from packhorse.db.models import Operation, Site, utcnow
from packhorse.db.session import Database
from packhorse.domain import OperationKind
from packhorse.errors import LeaseLostError, LeaseNotRenewedError
from packhorse.operations import lease as lease_module
from packhorse.operations.lease import LeaseKeeper
from packhorse.operations.lifecycle import claim, create_operation, dedup_key
from packhorse.recovery import health
from packhorse.recovery.monitor import check_stalled

SETTINGS = settings_from_dict({"recovery": {"max_stall_count": 100}}, environ={})


@pytest.fixture
def db(empty_db: Database) -> Database:
    empty_db.transact(lambda s: s.add(Site(name="fyst")))
    return empty_db


def new_op(db: Database) -> int:
    def tx(s):  # type: ignore[no-untyped-def]
        sid = s.scalar(select(Site.id).where(Site.name == "fyst"))
        return create_operation(s, kind=OperationKind.TRANSFER, dedup_key=dedup_key(OperationKind.TRANSFER, "pkg-1",
                                                                                     "cologne"),
                                site_id=sid, max_retries=3).id

    return db.transact(tx)


def row(db: Database, op_id: int) -> Operation:
    return db.read(lambda s: s.get(Operation, op_id))


def set_cols(db: Database, op_id: int, **values: Any) -> None:
    db.transact(lambda s: s.execute(update(Operation).where(Operation.id == op_id).values(**values)))


def reset_stalled(db: Database) -> list[int]:
    return check_stalled(db, SETTINGS).reset


def test_lease_keeper_renews_while_work_runs(db: Database) -> None:
    op_id = new_op(db)
    c = claim(db, op_id, "w1", 1)
    assert c is not None
    with LeaseKeeper(db, c, lease_seconds=1, interval_seconds=0.05, deadline_seconds=0.4) as keeper:
        keeper.add_bytes(123)
        time.sleep(0.8)  # twice the deadline: only renewals keep it alive
        keeper.check()
        op = row(db, op_id)
        assert op.lease_expires_at is not None and op.lease_expires_at > utcnow() + dt.timedelta(seconds=0.5)
        assert op.bytes_done == 123
    assert reset_stalled(db) == []


def test_lease_keeper_raises_after_takeover(db: Database) -> None:
    op_id = new_op(db)
    c = claim(db, op_id, "w1", 30)
    assert c is not None
    with LeaseKeeper(db, c, lease_seconds=30, interval_seconds=0.05, deadline_seconds=10) as keeper:
        keeper.check()
        set_cols(db, op_id, attempt=c.attempt + 1)  # someone else's claim bumped the fencing token
        deadline = time.monotonic() + 5
        with pytest.raises(LeaseLostError, match=f"operation {op_id}: attempt 1 is no longer"):
            while time.monotonic() < deadline:
                keeper.check()
                time.sleep(0.02)
        with pytest.raises(LeaseLostError):  # and it stays lost
            keeper.check()


def test_lease_keeper_raises_when_not_renewed_within_deadline(db: Database) -> None:
    op_id = new_op(db)
    c = claim(db, op_id, "w1", 30)
    assert c is not None
    # renewals every 30 s never come within the test; the deadline is 0.2 s
    with LeaseKeeper(db, c, lease_seconds=30, interval_seconds=30, deadline_seconds=0.2) as keeper:
        keeper.check()
        time.sleep(0.3)
        with pytest.raises(LeaseLostError, match=r"lease not renewed for 0\.\d s \(limit 0\.2 s\)"):
            keeper.check()


def test_heartbeat_thread_beats_and_unregisters_on_clean_stop(db: Database) -> None:
    t = health.HeartbeatThread(db, "worker", interval_seconds=0.05).start()
    deadline = time.monotonic() + 10
    first = None
    while time.monotonic() < deadline:
        rows = db.read(health.list_services)
        if rows and first is None:
            first = rows[0]["last_seen"]
        if rows and first is not None and rows[0]["last_seen"] > first:
            break
        time.sleep(0.02)
    else:
        raise AssertionError("heartbeat was not renewed")
    t.stop(remove=True)
    assert db.read(health.list_services) == []


def test_lease_keeper_runs_on_lost_at_the_deadline_while_a_renewal_hangs(db: Database,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The database unreachable (every renewal hangs): the callbacks run at the renewal
    deadline from the scheduler thread, without a check by the work."""
    op_id = new_op(db)
    c = claim(db, op_id, "w1", 30)
    assert c is not None
    released = threading.Event()
    monkeypatch.setattr(lease_module, "heartbeat", lambda *a, **kw: released.wait(10))
    got: list[BaseException] = []
    try:
        with LeaseKeeper(db, c, lease_seconds=30, interval_seconds=0.05, deadline_seconds=0.3) as keeper:
            keeper.on_lost(got.append)
            started = time.monotonic()
            while not got and time.monotonic() < started + 5:
                time.sleep(0.01)
            took = time.monotonic() - started
            assert len(got) == 1 and isinstance(got[0], LeaseNotRenewedError)
            assert 0.25 <= took < 2
            with pytest.raises(LeaseNotRenewedError):
                keeper.check()
            released.set()  # the hung renewal now succeeds: the loss stays
            time.sleep(0.1)
            with pytest.raises(LeaseNotRenewedError):
                keeper.check()
            assert len(got) == 1
    finally:
        released.set()


def test_lease_keeper_runs_on_lost_at_a_deadline_before_the_first_renewal(db: Database) -> None:
    op_id = new_op(db)
    c = claim(db, op_id, "w1", 30)
    assert c is not None
    got: list[BaseException] = []
    with LeaseKeeper(db, c, lease_seconds=30, interval_seconds=30, deadline_seconds=0.2) as keeper:
        keeper.on_lost(got.append)
        started = time.monotonic()
        while not got and time.monotonic() < started + 5:
            time.sleep(0.01)
        assert len(got) == 1 and isinstance(got[0], LeaseNotRenewedError)
