"""The scan's exclusion is a lease with heartbeats (real SQLite ops database, real threads).

A holder excludes every other scan of its location while it renews; a holder that stops
renewing (paused, hung) loses the lease once it expires and the next worker's scan takes it
over, after which the old holder's renewals and release change nothing (fenced on the token);
a location whose scan has not completed for longer than ``scan_overdue_seconds`` is listed as
blocked (``scan_overdue``) for ``status`` and the dashboard and by ``health``.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from types import SimpleNamespace

from sqlalchemy import update

from packhorse.config import settings_from_dict
from packhorse.db.models import ScanLease, utcnow
from packhorse.db.session import Database
from packhorse.operations.scan_lease import ScanClaim, ScanLeaseKeeper, acquire, release, renew, scan_lease
from packhorse.recovery.health import scan_health
from packhorse.status.blocked_work import PROVIDERS, blocked_items, scan_overdue

LOC = "fyst-source"



def row(db: Database) -> ScanLease:
    return db.read(lambda s: s.get(ScanLease, LOC))


def test_a_live_holder_excludes_others_and_a_silent_one_loses_the_lease(empty_db: Database) -> None:
    db = empty_db
    a = acquire(db, LOC, "worker-a", lease_seconds=0.6)
    assert a is not None and acquire(db, LOC, "worker-b", lease_seconds=0.6) is None
    keeper = ScanLeaseKeeper(db, a, lease_seconds=0.6, heartbeat_seconds=0.1).start()
    time.sleep(1.0)  # longer than the lease: the renewals keep it
    assert acquire(db, LOC, "worker-b", lease_seconds=0.6) is None and not keeper.lost.is_set()
    keeper.stop()  # the holder stops renewing (paused, hung on a mount)
    time.sleep(0.7)
    b = acquire(db, LOC, "worker-b", lease_seconds=5)
    assert b is not None and b.token == a.token + 1  # another worker of the site scans
    # the old holder comes back: fenced out
    assert renew(db, a, lease_seconds=5) is False and release(db, a, completed=True) is False
    assert (row(db).holder, row(db).completed_at) == ("worker-b", None)
    assert release(db, b, completed=True) and row(db).completed_at is not None


def test_a_completed_scan_rests_before_the_next_one(empty_db: Database) -> None:
    """Every manager sends every site a scan request each poll: a scan completed less than the
    poll interval ago, or than three times its own duration, rests, and the requests meanwhile
    are skipped (one scan per interval however many managers send)."""
    db = empty_db
    a = acquire(db, LOC, "worker-a", lease_seconds=60, now=utcnow() - dt.timedelta(seconds=10))
    assert a is not None and release(db, a, completed=True)  # a scan that took about 10 s
    done = row(db).completed_at
    assert acquire(db, LOC, "worker-b", lease_seconds=60, min_rest_seconds=1, now=done + dt.timedelta(seconds=5)) is None
    assert acquire(db, LOC, "worker-b", lease_seconds=60, min_rest_seconds=60,
                   now=done + dt.timedelta(seconds=31)) is None  # the poll interval is longer
    b = acquire(db, LOC, "worker-b", lease_seconds=60, min_rest_seconds=1, now=done + dt.timedelta(seconds=31))
    assert b is not None and b.token == a.token + 1
    # a scan that did not complete (the holder died) leaves nothing to rest: taken over at once
    db.transact(lambda s: s.execute(update(ScanLease).values(expires_at=utcnow() - dt.timedelta(seconds=1))))
    assert acquire(db, LOC, "worker-c", lease_seconds=60, min_rest_seconds=60) is not None


def test_a_keeper_whose_lease_was_taken_over_says_it_lost_it(empty_db: Database) -> None:
    db = empty_db
    a = acquire(db, LOC, "worker-a", lease_seconds=5)
    assert a is not None
    db.transact(lambda s: s.execute(update(ScanLease).values(expires_at=utcnow() - dt.timedelta(seconds=1))))
    assert acquire(db, LOC, "worker-b", lease_seconds=5) is not None
    keeper = ScanLeaseKeeper(db, a, lease_seconds=5, heartbeat_seconds=0.05).start()
    assert keeper.lost.wait(5)
    keeper.stop()


def test_a_scan_not_completed_for_long_is_listed_in_status_and_health(empty_db: Database) -> None:
    db = empty_db
    assert scan_overdue in PROVIDERS
    settings = settings_from_dict({"recovery": {"scan_overdue_seconds": 60}}, environ={})
    ctx = SimpleNamespace(settings=settings)
    with scan_lease(db, LOC, "worker-a", lease_seconds=5, heartbeat_seconds=1) as held:
        assert held is not None
    assert db.read(lambda s: blocked_items(s, ctx)) == []  # completed just now
    # the last completion was two minutes ago; the scans since never completed
    db.transact(lambda s: s.execute(update(ScanLease).values(completed_at=utcnow() - dt.timedelta(seconds=120))))
    [item] = db.read(lambda s: blocked_items(s, ctx))
    assert (item.cause, item.subject) == ("scan_overdue", f"location {LOC}")
    assert item.detail is not None and item.detail["overdue_seconds"] >= 120
    [h] = db.read(lambda s: scan_health(s, overdue_seconds=60))
    assert h["location"] == LOC


def test_a_scan_that_raised_records_no_completion(empty_db: Database) -> None:
    db = empty_db
    try:
        with scan_lease(db, LOC, "worker-a", lease_seconds=5, heartbeat_seconds=1):
            raise RuntimeError("mount hung")
    except RuntimeError:
        pass
    r = row(db)
    assert (r.completed_at, r.expires_at, r.holder) == (None, None, None)  # released, not completed
    assert acquire(db, LOC, "worker-b", lease_seconds=5) is not None


def test_health_and_status_commands_list_an_overdue_scan(site_config) -> None:
    """``packhorse health --json`` (exit 1) and ``packhorse status --json`` (blocked) list a
    source location whose scan has not completed for longer than ``scan_overdue_seconds``."""
    from support import run_packhorse

    config = site_config()
    assert run_packhorse("init", "-c", str(config), cwd=config.parent).returncode == 0
    db = Database(f"sqlite:///{config.parent / 'packhorse.db'}")
    try:
        long_ago = utcnow() - dt.timedelta(hours=3)
        db.transact(lambda s: s.add(ScanLease(location=LOC, token=4, started_at=long_ago, completed_at=long_ago)))
    finally:
        db.dispose()
    health = run_packhorse("health", "--json", "-c", str(config), cwd=config.parent)
    assert health.returncode == 1, health.stderr
    [sc] = json.loads(health.stdout)["scans_overdue"]
    assert sc["location"] == LOC and sc["overdue_seconds"] >= 3 * 3600
    status = run_packhorse("status", "--json", "-c", str(config), cwd=config.parent)
    assert [b["subject"] for b in json.loads(status.stdout)["blocked"] if b["cause"] == "scan_overdue"] == [
        f"location {LOC}"]


def test_a_release_committed_while_another_scan_looks_does_not_skip_the_rest_postgresql(pg_db: Database) -> None:
    """On PostgreSQL a holder's release can commit between another worker's read of the lease
    and its update. The request decides by what it read (the lease live: it skips), and its take
    is a compare-and-set on the completion it read, so a release that slipped in cannot let it
    start a scan with no rest. Before, the update only asked whether the lease was free now: the
    release slipped in, the update found the lease free, and a scan started with no rest and
    warned of a takeover that never happened (found on the multi-site test bed:
    ``scan_lease_taken_over`` 2 s into a 20 s lease)."""
    import threading

    from sqlalchemy import event

    db = pg_db
    a = acquire(db, LOC, "worker-a", lease_seconds=60)
    assert a is not None
    released_update = threading.Event()
    me = threading.get_ident()

    def release() -> None:  # the holder's release, committed
        with db.engine.begin() as conn:
            conn.execute(update(ScanLease).where(ScanLease.token == a.token).values(
                holder=None, expires_at=None, completed_at=utcnow()))
        released_update.set()

    racer = threading.Thread(target=release)

    def after(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        # right after the late request has read the lease: the holder releases it
        if threading.get_ident() == me and statement.lstrip().startswith("SELECT") and "scan_leases" in statement \
                and not racer.is_alive() and not released_update.is_set():
            racer.start()
            released_update.wait(1.5)  # committed before this request goes on (a lock would hold it)

    event.listen(db.engine, "after_cursor_execute", after)
    took = acquire(db, LOC, "worker-b", lease_seconds=60, min_rest_seconds=60)
    event.remove(db.engine, "after_cursor_execute", after)
    racer.join()
    assert took is None  # the lease was live when this request looked: it skips
    assert row(db).holder is None and row(db).completed_at is not None and row(db).token == a.token


def test_a_scan_whose_renewals_hung_records_only_its_work_and_rests_by_that(empty_db: Database,
                                                                             monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The holder's renewals hang while the link to the database is silent (a site cut off from
    the centre) and the scan waits as long; the lease records how long the scan worked without
    that wait, and the managers' look (``not_due``) finds the location due again after three
    times the work, not three times the wait (a trial's files waited minutes after a cut)."""
    import threading

    import packhorse.operations.scan_lease as sl

    db = empty_db
    real = sl.renew
    silent = threading.Event()

    def renew(db, claim, *, lease_seconds):  # type: ignore[no-untyped-def]
        while silent.is_set():  # a link gone silent: the renewal hangs until it is back
            time.sleep(0.02)
        return real(db, claim, lease_seconds=lease_seconds)

    monkeypatch.setattr(sl, "renew", renew)
    with scan_lease(db, LOC, "worker-a", lease_seconds=60, heartbeat_seconds=0.1) as keeper:
        assert keeper is not None
        time.sleep(0.3)  # the scan works
        silent.set()
        time.sleep(2.5)  # it waits on the database as its renewals do
        silent.clear()
        time.sleep(0.3)
    r = row(db)
    took = (r.completed_at - r.started_at).total_seconds()
    assert took >= 3.0 and r.worked_seconds is not None and r.worked_seconds < 1.5, (took, r.worked_seconds)
    due = r.completed_at + dt.timedelta(seconds=3 * r.worked_seconds + 0.1)
    assert db.read(lambda s: sl.not_due(s, [LOC], min_rest_seconds=0.5, now=due)) == {}
    assert db.read(lambda s: sl.not_due(s, [LOC], min_rest_seconds=0.5,
                                        now=r.completed_at + dt.timedelta(seconds=0.2))) == {LOC: "resting"}


def _statements(db: Database) -> list[str]:
    """Every statement sent on ``db``'s engine from now on (``BEGIN`` and ``COMMIT`` of a
    transaction included: each is a round trip on PostgreSQL)."""
    from sqlalchemy import event

    sent: list[str] = []

    def stmt(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        sent.append(statement.split()[0].upper())

    def begin(conn) -> None:  # type: ignore[no-untyped-def]
        if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            sent.append("BEGIN")

    def commit(conn) -> None:  # type: ignore[no-untyped-def]
        if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            sent.append("COMMIT")

    event.listen(db.engine, "before_cursor_execute", stmt)
    event.listen(db.engine, "begin", begin)
    event.listen(db.engine, "commit", commit)
    return sent


def test_a_scan_request_costs_one_round_trip_to_skip_and_two_to_take_the_lease_postgresql(pg_db: Database) -> None:
    """Every manager sends every source a scan request each poll; across a long link each round
    trip of deciding keeps a worker process from its work (the locking transaction took five):
    a request that skips reads once, one that takes the lease reads and updates, a renewal and
    a release are one statement each, and none opens a transaction."""
    db = pg_db
    assert acquire(db, LOC, "worker-a", lease_seconds=60) is not None  # the location's first: its row
    sent = _statements(db)
    assert acquire(db, LOC, "worker-b", lease_seconds=60) is None  # live: skipped
    assert sent == ["SELECT"], sent
    held = ScanClaim(LOC, "worker-a", row(db).token)
    sent.clear()
    assert renew(db, held, lease_seconds=60)
    assert release(db, held, completed=True, worked_seconds=0.01)
    assert sent == ["UPDATE", "UPDATE"], sent
    sent.clear()
    assert acquire(db, LOC, "worker-b", lease_seconds=60, min_rest_seconds=60) is None  # resting
    assert sent == ["SELECT"], sent
    time.sleep(0.1)  # 3 × its 0.01 s of work
    sent.clear()
    assert acquire(db, LOC, "worker-b", lease_seconds=60) is not None  # rested (no minimum): taken
    assert sent == ["SELECT", "UPDATE"], sent


def test_an_expired_holders_release_committed_while_another_scan_looks_is_not_overtaken_postgresql(pg_db: Database) -> None:
    """A holder whose lease expired may still finish and release it (fenced on its token, which
    nobody took yet) between another worker's read of the lease (free: expired) and its take.
    The take is a compare-and-set on the completion it read, so it finds the row changed and the
    request skips: the scan that just completed rests, and no takeover is warned of."""
    import threading

    from sqlalchemy import event

    db = pg_db
    a = acquire(db, LOC, "worker-a", lease_seconds=0.2)
    assert a is not None
    time.sleep(0.4)  # its lease expired; nobody took it over
    me = threading.get_ident()
    done = threading.Event()

    def after(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        # right after the late request has read the lease: the old holder completes and releases
        if threading.get_ident() == me and statement.lstrip().startswith("SELECT") and "scan_leases" in statement \
                and not done.is_set():
            done.set()
            t = threading.Thread(target=lambda: release(db, a, completed=True, worked_seconds=30.0))
            t.start()
            t.join(timeout=2)  # a lock on the row would keep it waiting for this request

    event.listen(db.engine, "after_cursor_execute", after)
    took = acquire(db, LOC, "worker-b", lease_seconds=60)
    event.remove(db.engine, "after_cursor_execute", after)
    assert done.is_set()
    assert took is None  # the holder's completed scan rests (3 × 30 s): nothing taken
    r = row(db)
    assert r.holder is None and r.completed_at is not None and r.token == a.token
    assert acquire(db, LOC, "worker-b", lease_seconds=60) is None  # and it still rests
