"""A service's health heartbeat right after its link to the ops database comes back.

A trial cut a site off from the centre and healed it: three seconds later ``status`` still
listed the site as unreachable, with a ``since`` five seconds later than during the cut. The
heartbeat that got through first carried a time read before the cut held it up, and the next
came a whole interval (30 s) later. Now a slow heartbeat is made again at once, and a failed one
is tried again within seconds. Real (SQLite) ops database; the cut is played by its writes.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from packhorse.db.models import ServiceHeartbeat, utcnow
from packhorse.db.session import Database
from packhorse.recovery import health


def _database(tmp_path: Path) -> Database:
    db = Database(f"sqlite:///{tmp_path / 'ops.db'}")
    db.upgrade()
    return db


def _last_seen(db: Database) -> dt.datetime | None:
    return db.read(lambda s: s.scalar(select(ServiceHeartbeat.last_seen)))


def _wait(until: Callable[[], Any], seconds: float) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = until()
        if got:
            return got
        time.sleep(0.05)
    return until()


def test_a_heartbeat_held_up_by_a_cut_is_made_again_with_the_time_it_got_through(tmp_path: Path) -> None:
    db = _database(tmp_path)
    real = db.transact
    held = {"first": True}

    def transact(fn: Any, *a: Any, **kw: Any) -> Any:
        if held.pop("first", False):
            time.sleep(0.6)  # the link is cut after the heartbeat read its time
        return real(fn, *a, **kw)

    db.transact = transact  # type: ignore[method-assign]
    thread = health.HeartbeatThread(db, "worker", site="fyst", interval_seconds=60, clock=utcnow)
    thread.slow_beat_seconds = 0.3
    begun = utcnow()
    with thread:
        seen = _wait(lambda: (t := _last_seen(db)) is not None and t > begun + dt.timedelta(seconds=0.5) and t, 3)
    assert seen, f"last seen {_last_seen(db)}: the time from before the cut, kept for a whole interval"


def test_a_failed_heartbeat_is_tried_again_within_seconds_not_an_interval(tmp_path: Path) -> None:
    db = _database(tmp_path)
    real = db.transact
    failures = {"left": 2}

    def transact(fn: Any, *a: Any, **kw: Any) -> Any:
        if failures["left"]:
            failures["left"] -= 1
            raise OperationalError("INSERT", {}, Exception("could not connect to server: timed out"))
        return real(fn, *a, **kw)

    db.transact = transact  # type: ignore[method-assign]
    thread = health.HeartbeatThread(db, "worker", site="fyst", interval_seconds=60, clock=utcnow)
    thread.retry_after_failure_seconds = 0.2
    with thread:
        assert _wait(lambda: _last_seen(db), 3) is not None, "no heartbeat until the next interval (60 s)"
    assert failures["left"] == 0
