"""Scan requests do not pile up in a site's scan queue (:func:`packhorse.executors.celery_app.dispatch_scans`):
a manager sends a location none more while one still waits there. Every request a worker takes
costs one of its pool processes the broker's round trips; on the test bed with the database and
broker 100 ms away, two managers polling every 0.5 s left 887 expired requests for fyst's two
processes to take and skip between their packaging operations."""

from __future__ import annotations

import time
from pathlib import Path

from packhorse.config import settings_from_dict
from packhorse.db.session import Database
from packhorse.executors.celery_app import dispatch_scans, make_app, queue_depths, queue_name
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology


def test_a_location_whose_scan_request_waits_gets_no_second_one(empty_db: Database, tmp_path: Path) -> None:
    settings = settings_from_dict({
        "executor": {"kind": "celery", "broker_url": "memory://"},
        "sites": [{"name": "pileup-site"}, {"name": "pileup-dest"}],
        "locations": [
            {"name": "pileup-src", "site": "pileup-site", "role": "source", "path": "src"},
            {"name": "pileup-buf", "site": "pileup-site", "role": "buffer", "path": "buf"},
            {"name": "pileup-lta", "site": "pileup-dest", "role": "long_term_archive", "path": "lta"},
        ],
    }, base_dir=tmp_path, environ={})
    ctx = ProcessContext(settings=settings, db=empty_db, topology=sync_topology(empty_db, settings))
    app = make_app(settings)
    q = queue_name("pileup-site", "pileup-src", "scan")

    def waiting() -> int:
        return queue_depths(app, [q])[q]

    # two managers, ten polls each: one request waits, not twenty
    assert dispatch_scans(ctx, app, 0.5) == [q]
    for _ in range(10):
        assert dispatch_scans(ctx, app, 0.5) == []
        assert dispatch_scans(ctx, make_app(settings), 0.5) == []
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

    settings = settings_from_dict({
        "executor": {"kind": "celery", "broker_url": "memory://"},
        "sites": [{"name": "resting-site"}, {"name": "resting-dest"}],
        "locations": [
            {"name": "resting-src", "site": "resting-site", "role": "source", "path": "src"},
            {"name": "resting-buf", "site": "resting-site", "role": "buffer", "path": "buf"},
            {"name": "resting-lta", "site": "resting-dest", "role": "long_term_archive", "path": "lta"},
        ],
    }, base_dir=tmp_path, environ={})
    ctx = ProcessContext(settings=settings, db=empty_db, topology=sync_topology(empty_db, settings))
    app = make_app(settings)
    q = queue_name("resting-site", "resting-src", "scan")

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
