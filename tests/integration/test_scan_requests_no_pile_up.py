"""Scan requests do not pile up in a site's scan queue (:func:`packhorse.executors.celery_app.dispatch_scans`):
a manager sends a location none more while one still waits there. Every request a worker takes
costs one of its pool processes the broker's round trips; on the test bed with the database and
broker 100 ms away, two managers polling every 0.5 s left 887 expired requests for fyst's two
processes to take and skip between their packaging operations."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from packhorse.config import settings_from_dict
from packhorse.db.session import Database
from packhorse.executors.celery_app import dispatch_scans, make_app, queue_depths, queue_name
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology


def _site(db: Database, tmp_path: Path, name: str) -> tuple[ProcessContext, Any, str]:
    """A source site ``name`` with a buffer and a destination, in distributed mode over the
    in-memory broker: ``(process context, Celery app, the source's scan queue)``."""
    settings = settings_from_dict({
        "executor": {"kind": "celery", "broker_url": "memory://"},
        "sites": [{"name": f"{name}-site"}, {"name": f"{name}-dest"}],
        "locations": [
            {"name": f"{name}-src", "site": f"{name}-site", "role": "source", "path": "src"},
            {"name": f"{name}-buf", "site": f"{name}-site", "role": "buffer", "path": "buf"},
            {"name": f"{name}-lta", "site": f"{name}-dest", "role": "long_term_archive", "path": "lta"},
        ],
    }, base_dir=tmp_path, environ={})
    ctx = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    return ctx, make_app(settings), queue_name(f"{name}-site", f"{name}-src", "scan")


def test_a_location_whose_scan_request_waits_gets_no_second_one(empty_db: Database, tmp_path: Path) -> None:
    ctx, app, q = _site(empty_db, tmp_path, "pileup")

    def waiting() -> int:
        return queue_depths(app, [q])[q]

    # two managers, ten polls each: one request waits, not twenty
    assert dispatch_scans(ctx, app, 0.5) == [q]
    for _ in range(10):
        assert dispatch_scans(ctx, app, 0.5) == []
        assert dispatch_scans(ctx, make_app(ctx.settings), 0.5) == []
    assert waiting() == 1

    # the worker takes it: the next poll sends the next one
    with app.connection_for_read() as conn:
        message = conn.SimpleQueue(q, no_ack=True).get(timeout=5)
        assert message.headers["task"] == "packhorse.scan"
    assert waiting() == 0
    assert dispatch_scans(ctx, app, 0.5) == [q]
    assert waiting() == 1


def test_a_location_whose_scan_runs_or_rests_gets_no_request(empty_db: Database, tmp_path: Path) -> None:
    from packhorse.operations import scan_lease

    ctx, app, q = _site(empty_db, tmp_path, "resting")

    def take() -> None:  # a worker takes the waiting request
        with app.connection_for_read() as conn:
            conn.SimpleQueue(q, no_ack=True).get(timeout=5)

    claim = scan_lease.acquire(empty_db, "resting-src", "w1", lease_seconds=60)
    assert claim is not None
    assert dispatch_scans(ctx, app, 30) == []  # its scan runs
    scan_lease.release(empty_db, claim, completed=True)
    assert dispatch_scans(ctx, app, 30) == []  # it rests the poll interval (30 s) after completing
    time.sleep(0.5)  # three times as long as that scan took (acquire to release) has passed too
    assert dispatch_scans(ctx, app, 0.01) == [q]  # rested: a request goes out
    take()
    claim = scan_lease.acquire(empty_db, "resting-src", "w2", lease_seconds=0.01)
    assert claim is not None
    time.sleep(0.05)
    assert dispatch_scans(ctx, app, 0.01) == [q]  # a holder whose lease expired is not waited for
