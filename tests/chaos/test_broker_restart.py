"""The broker restarts under a running distributed packhorse (real processes).

A private broker (a ``redis-server`` on a free port, a RabbitMQ node of our own) is stopped
and started again while the Celery workers, the manager and the monitor run. What a user
checks afterwards: the same worker processes (same PIDs, still alive) carry on, every source
file ends in exactly one verified bag per archive, no operation FAILED, every service alive.
A restarted Redis (``--save ""``) comes back empty: the messages queued in it are lost and
the reconciler re-dispatches them after its floor. The seconds from the broker's last return
until the run finished are reported (``HEAL`` line) with the source files lost, duplicated or
corrupt and the archive objects overwritten, counted from the archives' bytes (all 0).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))  # the archive checks of the e2e suite

from e2e_helpers import Pipeline, assert_archived_everywhere, assert_clean_finish, source_files  # noqa: E402

from distributed_support import (  # noqa: E402
    CLEAN,
    SITES,
    ArchiveWatch,
    Cluster,
    PrivateRabbitMQ,
    PrivateRedis,
    postgres_database,
    report_heal,
    source_digests,
    wait_for,
    write_source,
)
from packhorse.db.models import FailureEvent, Operation, PhysicalCopy
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status

pytestmark = pytest.mark.slow


@pytest.fixture
def pg():  # type: ignore[no-untyped-def]
    url, drop = postgres_database()
    yield url
    drop()


def _archived_once(database_url: str) -> list[Any]:
    db = Database(database_url, pool_size=1, max_overflow=0)
    try:
        return db.read(lambda s: s.execute(
            select(PhysicalCopy.raw_data_package_id, PhysicalCopy.location_id, func.count())
            .group_by(PhysicalCopy.raw_data_package_id, PhysicalCopy.location_id)
            .where(PhysicalCopy.raw_data_package_id.is_not(None))).all())
    finally:
        db.dispose()


def _failures(database_url: str) -> list[tuple[str, str]]:
    db = Database(database_url, pool_size=1, max_overflow=0)
    try:
        return db.read(lambda s: [(e.kind, e.error_type) for e in s.scalars(select(FailureEvent))])
    finally:
        db.dispose()


def _run_through_restart(cluster: Cluster, config: Path, stop: Any, start: Any, *, outage_seconds: float,
                         packages: int, restarts: int = 1, between_seconds: float = 1.5,
                         heal: tuple[str, str] | None = None) -> dict[str, Any]:
    """Start every service; once an archive write is in flight, stop the broker for
    ``outage_seconds`` and start it again (``restarts`` times, ``between_seconds`` apart: a
    worker that loses its connection while a task runs is what used to exit); then add a
    second batch of source files (new work that only moves if the workers consume from the
    restarted broker) and wait for the end; ``heal`` (kind, broker): count from the archives
    and report the seconds from the broker's last start to the end."""
    db = Database(cluster.database_url, pool_size=1, max_overflow=0)
    watch = ArchiveWatch(config.parent)
    try:
        cluster.start_all(monitor=True)
        pids = {name: p.pid for name, p in cluster.procs.items()}

        def archiving() -> bool:
            return db.read(lambda s: s.scalar(select(func.count()).select_from(Operation).where(
                Operation.kind == OperationKind.LONG_TERM_ARCHIVE.value,
                Operation.status == Status.IN_PROGRESS.value))) >= 1

        wait_for(archiving, 180, "an archive write in flight")
        watch.look()
        for i in range(restarts):
            if i:
                time.sleep(between_seconds)
            stop()
            time.sleep(outage_seconds)
            start()
        back = time.monotonic()
        for g in (10, 11):  # two more observation units: two more packages
            f = config.parent / "source" / f"inst/obs{g}/frame_00.fits"
            f.parent.mkdir(parents=True)
            f.write_bytes(os.urandom(64 << 10))
        st = cluster.wait_finished(300, packages=packages, watch=watch)
        healed = time.monotonic() - back
        if heal is not None:
            counts = watch.tally(source_digests(config.parent / "source"))
            report_heal(*heal, healed, counts, since="the broker's last start (until the run finished)")
            assert counts == CLEAN, counts
        dead = {n: p.returncode for n, p in cluster.procs.items() if p.poll() is not None}
        assert not dead, f"services exited on the broker restart instead of reconnecting: {dead}\n" + "\n".join(
            f"--- {n}.log\n{cluster.log(n)[-3000:]}" for n in dead)
        assert {name: p.pid for name, p in cluster.procs.items()} == pids  # the same processes carried on
        return st
    finally:
        db.dispose()


def test_redis_restart_under_running_workers(pg: str, site_config, cli, tmp_path: Path) -> None:
    redis = PrivateRedis()
    config = site_config(bundle_max_wait_seconds=0.5, poll_interval_seconds=0.5)
    write_source(config.parent / "source", groups=3, files_per_group=1, size=128 << 10)
    slow = json.dumps([{"point": "long_term_archive.writing", "action": "pause", "seconds": 2}])
    # floor = visibility timeout = 8 s: what the restart lost is re-dispatched 8 s later
    cluster = Cluster(config, pg, redis.url, visibility_timeout=8, env={"PACKHORSE_TEST_FAULTS": slow})
    cluster.init()
    try:
        # four restarts while archives are written (under Celery 5.7.0 a worker exited on one)
        st = _run_through_restart(cluster, config, redis.stop, redis.start, outage_seconds=2, packages=5,
                                  restarts=4,
                                  heal=("broker restarted (4 times, 2 s down)", "redis"))
    finally:
        cluster.stop_all()
        redis.close()
    assert_clean_finish(st)
    assert_archived_everywhere(Pipeline(config, cli, tmp_path / "x"), source_files(config.parent / "source"))
    _assert_once_and_felt(cluster, pg)


def test_rabbitmq_restart_under_running_workers(pg: str, site_config, cli, tmp_path: Path) -> None:
    rabbit = PrivateRabbitMQ()
    config = site_config(bundle_max_wait_seconds=0.5, poll_interval_seconds=0.5)
    write_source(config.parent / "source", groups=3, files_per_group=1, size=128 << 10)
    slow = json.dumps([{"point": "long_term_archive.writing", "action": "pause", "seconds": 2}])
    cluster = Cluster(config, pg, rabbit.url, visibility_timeout=8, env={"PACKHORSE_TEST_FAULTS": slow})
    cluster.init()
    try:
        # a node restart takes some 10-30 s here: the outage is the shutdown and the boot
        st = _run_through_restart(cluster, config, rabbit.stop, rabbit.start, outage_seconds=1, packages=5,
                                  heal=("broker restarted (node shutdown and boot)", "rabbitmq"))
    finally:
        cluster.stop_all()
        rabbit.close()
    assert_clean_finish(st)
    assert_archived_everywhere(Pipeline(config, cli, tmp_path / "x"), source_files(config.parent / "source"))
    _assert_once_and_felt(cluster, pg)


def _assert_once_and_felt(cluster: Cluster, database_url: str) -> None:
    per_copy = _archived_once(database_url)
    assert per_copy and all(n == 1 for *_k, n in per_copy), per_copy  # one copy per (package, location)
    assert [f for f in _failures(database_url) if f[1] != "Stalled"] == []
    for site in SITES:  # every worker lost its broker connection and carried on
        assert "Connection to broker lost" in cluster.log(f"worker-{site}"), f"worker-{site}: restart not felt"
