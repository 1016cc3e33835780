"""Chaos in distributed mode: real Celery workers, a real broker and PostgreSQL.

* every task published twice, and tasks outliving a 2 s broker visibility timeout (the broker
  hands them to a second worker while the first still runs): one effect, no error;
* a worker's pool child SIGKILLed in the middle of a long-term archive write: recovered and
  archived once;
* ``FLUSHALL`` on Redis in the middle of a run (a private ``redis-server``): the reconciler
  re-dispatches every lost message and the run completes;
* PostgreSQL restarted in the middle of a run (a private cluster): manager, monitor and
  workers recover by themselves, without a restart and without a ``PendingRollbackError`` loop.

What is checked is what a user cares about: every source file in exactly one verified bag per
archive, one physical copy per (package, archive), no FAILED operation, every service alive.
Each test also counts, from the archives' bytes, the source files lost, duplicated or corrupt
and the archive objects overwritten (all 0), and reports the seconds until the run was done
again (``HEAL`` line; ``benchmarks/fault_table.py`` collects them).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
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
    PrivatePostgres,
    PrivateRedis,
    has_monitor,
    postgres_database,
    redis_url,
    report_heal,
    source_digests,
    wait_for,
    write_source,
)
from packhorse.db.models import FailureEvent, Operation, PhysicalCopy
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status

pytestmark = pytest.mark.slow

needs_monitor = pytest.mark.skipif(
    not has_monitor(), reason="needs `packhorse monitor` and the reconciler (packhorse.recovery), "
                              "not on this branch yet")


@pytest.fixture
def pg() -> Iterator[str]:
    url, drop = postgres_database()
    yield url
    drop()


def _events(log: str, event: str) -> list[dict[str, Any]]:
    out = []
    for line in log.splitlines():
        if f'"{event}"' in line and "{" in line:
            try:
                out.append(json.loads(line[line.index("{"):]))
            except ValueError:
                continue
    return out


def _heal(kind: str, broker: str, seconds: float, watch: ArchiveWatch, *, since: str) -> None:
    """Count lost, duplicated, corrupt, overwritten from the archives, report them with the
    seconds to heal, and require all four to be 0."""
    counts = watch.tally(source_digests(watch.root / "source"))
    report_heal(kind, broker, seconds, counts, since=since)
    assert counts == CLEAN, counts


def _assert_archived_once(cluster: Cluster, config: Path, cli: Any, scratch: Path, st: dict[str, Any]) -> None:
    assert_clean_finish(st)
    assert_archived_everywhere(Pipeline(config, cli, scratch), source_files(config.parent / "source"))
    db = Database(cluster.database_url, pool_size=1, max_overflow=0)
    try:
        per_copy = db.read(lambda s: s.execute(
            select(PhysicalCopy.raw_data_package_id, PhysicalCopy.location_id, func.count())
            .group_by(PhysicalCopy.raw_data_package_id, PhysicalCopy.location_id)
            .where(PhysicalCopy.raw_data_package_id.is_not(None))).all())
        assert per_copy and all(n == 1 for *_k, n in per_copy), per_copy
    finally:
        db.dispose()


def _failure_events(cluster: Cluster) -> list[tuple[str, str]]:
    db = Database(cluster.database_url, pool_size=1, max_overflow=0)
    try:
        return db.read(lambda s: [(e.kind, e.error_type) for e in s.scalars(select(FailureEvent))])
    finally:
        db.dispose()


# --------------------------------------------------------------- duplicates and redelivery


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_every_task_published_twice_has_one_effect(broker: str, broker_url: str, pg: str, site_config, cli,
                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from packhorse.config import load_config
    from packhorse.executors import celery_app

    config = site_config(bundle_max_wait_seconds=0.5, poll_interval_seconds=0.5)
    write_source(config.parent / "source", groups=3, files_per_group=2, size=128 << 10)
    cluster = Cluster(config, pg, broker_url)
    cluster.init()
    watch = ArchiveWatch(config.parent)
    published: list[int] = []
    original = celery_app.publish

    def twice(app: Any, task: Any) -> None:  # one operation, or a batch of one queue
        original(app, task)
        original(app, task)
        published.extend(d.operation_id for d in ([task] if isinstance(task, celery_app.Dispatched) else task))

    monkeypatch.setattr(celery_app, "publish", twice)
    for k, v in cluster.env.items():
        if k.startswith("PACKHORSE_"):
            monkeypatch.setenv(k, v)
    manager = celery_app.Manager(load_config(config))
    t = threading.Thread(target=manager.run, daemon=True)
    try:
        for site in SITES:
            cluster.start_worker(site, concurrency=2)
        t.start()
        started = time.monotonic()  # every publication doubled from the first: the fault lasts the run
        st = cluster.wait_finished(240, packages=3, watch=watch)
        healed = time.monotonic() - started
    finally:
        manager.stop.set()
        t.join(30)
        cluster.stop_all()
    _assert_archived_once(cluster, config, cli, tmp_path / "x", st)
    _heal("published twice", broker, healed, watch, since="the run's start (fault throughout)")
    skipped = sum(len(_events(cluster.log(f"worker-{s}"), "task_skipped")) for s in SITES)
    assert len(published) == len(set(published)) > 0
    assert skipped >= len(published), (skipped, len(published))  # every second copy found nothing to do
    assert _failure_events(cluster) == []


def test_a_task_outliving_the_visibility_timeout_is_not_run_twice(pg: str, site_config, cli, tmp_path: Path) -> None:
    config = site_config(bundle_max_wait_seconds=0.5, poll_interval_seconds=0.5)
    write_source(config.parent / "source", groups=2, files_per_group=1, size=128 << 10)
    # every archive write takes 5 s: well past the 2 s visibility timeout, the broker hands the
    # message to the second cologne worker while the first still runs (and renews its lease)
    slow = json.dumps([{"point": "long_term_archive.writing", "action": "pause", "seconds": 5}])
    cluster = Cluster(config, pg, redis_url(), visibility_timeout=2, env={"PACKHORSE_TEST_FAULTS": slow})
    cluster.init()
    watch = ArchiveWatch(config.parent)
    try:
        cluster.start_worker("fyst")
        cluster.start_worker("cornell")
        cluster.start_worker("cologne", name="worker-cologne")
        cluster.start_worker("cologne", name="worker-cologne-2")
        cluster.start("manager", "manager")
        started = time.monotonic()  # every archive write slow from the first: the fault lasts the run
        st = cluster.wait_finished(300, packages=2, watch=watch)
        healed = time.monotonic() - started
    finally:
        cluster.stop_all()
    _assert_archived_once(cluster, config, cli, tmp_path / "x", st)
    _heal("visibility timeout", "redis", healed, watch, since="the run's start (fault throughout)")
    logs = [cluster.log(n) for n in ("worker-cologne", "worker-cologne-2", "worker-cornell")]
    db = Database(pg, pool_size=1, max_overflow=0)
    lta_ids = set(db.read(lambda s: list(s.scalars(select(Operation.id).where(
        Operation.kind == OperationKind.LONG_TERM_ARCHIVE.value)))))
    attempts = db.read(lambda s: sorted(s.scalars(select(Operation.attempt).where(Operation.id.in_(lta_ids)))))
    db.dispose()
    redelivered = [e for log in logs for e in _events(log, "task_skipped") if e["operation_id"] in lta_ids]
    assert redelivered, "no archive message was redelivered while its task ran (visibility timeout not exercised)"
    assert attempts == [1] * len(lta_ids), attempts  # each archive ran exactly one attempt
    assert _failure_events(cluster) == []


# --------------------------------------------------------------- a pool child killed


@needs_monitor
@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_sigkill_of_a_pool_child_in_the_middle_of_an_archive_write(broker: str, broker_url: str, pg: str, site_config,
                                                                   cli, tmp_path: Path) -> None:
    config = site_config(bundle_max_wait_seconds=0.5, poll_interval_seconds=0.5)
    write_source(config.parent / "source", groups=2, files_per_group=2, size=512 << 10)
    marker = tmp_path / "archive-writing.pid"
    hook = json.dumps([{"point": "long_term_archive.writing", "action": "pause", "seconds": 120,
                        "marker": str(marker), "unless_exists": str(marker)}])
    cluster = Cluster(config, pg, broker_url, visibility_timeout=5)
    cluster.init()
    watch = ArchiveWatch(config.parent)
    try:
        cluster.start_all(monitor=True, worker_env={"cologne": {"PACKHORSE_TEST_FAULTS": hook}})
        child = int(wait_for(lambda: marker.exists() and marker.read_text().strip(), 180,
                             "a cologne pool child to start writing an archive"))
        main = cluster.procs["worker-cologne"].pid
        assert child != main, "the marker must name a pool child, not the worker's main process"
        partial = wait_for(lambda: [p for p in (config.parent / "sites/cologne/archive").rglob("*")
                                    if p.name.endswith(".packhorse-partial")], 30, "a partial archive write")
        assert partial
        watch.look()
        os.kill(child, signal.SIGKILL)
        killed = time.monotonic()  # a killed process does not come back: counted from the kill
        st = cluster.wait_finished(240, packages=2, watch=watch)
        healed = time.monotonic() - killed
        assert cluster.procs["worker-cologne"].poll() is None, "the worker itself must survive its child's death"
    finally:
        cluster.stop_all()
    _assert_archived_once(cluster, config, cli, tmp_path / "x", st)
    _heal("pool child killed in an archive write", broker, healed, watch, since="the kill")
    stalled = [k for k, t in _failure_events(cluster) if t == "Stalled"]
    assert stalled == [OperationKind.LONG_TERM_ARCHIVE.value], stalled


# --------------------------------------------------------------- the broker forgets everything


@needs_monitor
def test_flushall_in_the_middle_of_a_run_is_recovered_by_the_reconciler(pg: str, site_config, cli,
                                                                        tmp_path: Path) -> None:
    redis = PrivateRedis()
    config = site_config(bundle_max_wait_seconds=0.5, poll_interval_seconds=0.5)
    write_source(config.parent / "source", groups=3, files_per_group=1, size=128 << 10)
    # floor = visibility timeout = 8 s: the queued messages are not re-dispatched before they are lost
    cluster = Cluster(config, pg, redis.url, visibility_timeout=8)
    cluster.init()
    watch = ArchiveWatch(config.parent)
    db = Database(pg, pool_size=1, max_overflow=0)
    try:
        cluster.start_worker("fyst")
        cluster.start("manager", "manager")
        cluster.start("monitor", "monitor")

        def transfers_queued() -> bool:
            return db.read(lambda s: s.scalar(select(func.count()).select_from(Operation).where(
                Operation.kind == OperationKind.TRANSFER.value, Operation.status == Status.SCHEDULED.value))) >= 2

        def transfer_messages_in_redis() -> int:
            # kombu's Redis transport keeps a queue's messages in a list named after the queue
            # (with a priority suffix for non-default priorities)
            return sum(redis.client.llen(k) for k in redis.client.scan_iter(match="*_transfer*")
                       if redis.client.type(k) in (b"list", "list"))

        # the destination sites' workers are not up yet: their transfer messages wait in Redis.
        # The dispatcher commits SCHEDULED before it publishes, so the rows alone do not say the
        # messages are there yet (a flush in between lost nothing, and nothing was re-dispatched)
        wait_for(transfers_queued, 120, "transfer operations scheduled for cologne and cornell")
        wait_for(lambda: transfer_messages_in_redis() >= 2, 60, "transfer messages in Redis")
        redis.client.flushall()  # every queued message is gone
        flushed = time.monotonic()  # lost messages do not come back: counted from the flush
        assert redis.client.dbsize() == 0
        cluster.start_worker("cologne")
        cluster.start_worker("cornell")
        st = cluster.wait_finished(240, packages=3, watch=watch)
        healed = time.monotonic() - flushed
        assert all(p.poll() is None for p in cluster.procs.values())
    finally:
        cluster.stop_all()
        db.dispose()
        redis.close()
    _assert_archived_once(cluster, config, cli, tmp_path / "x", st)
    _heal("FLUSHALL of queued transfers", "redis", healed, watch, since="the flush")
    redispatched = {e["operation_kind"] for e in _events(cluster.log("monitor"), "reconciler_redispatched")}
    assert "transfer" in redispatched, "the lost transfer messages were not re-dispatched by the reconciler"


# --------------------------------------------------------------- the database restarts


@needs_monitor
@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_postgres_restart_in_the_middle_of_a_run(broker: str, broker_url: str, site_config, cli, tmp_path: Path) -> None:
    server = PrivatePostgres()
    try:
        url = server.new_database()
        # a lease long enough to ride out the restart; archive writes slow enough to be in flight
        config = site_config(bundle_max_wait_seconds=0.5, poll_interval_seconds=0.5, lease_timeout_seconds=30,
                             heartbeat_interval_seconds=0.5)
        write_source(config.parent / "source", groups=4, files_per_group=1, size=256 << 10)
        slow = json.dumps([{"point": "long_term_archive.writing", "action": "pause", "seconds": 3}])
        cluster = Cluster(config, url, broker_url, env={"PACKHORSE_TEST_FAULTS": slow})
        cluster.init()
        watch = ArchiveWatch(config.parent)
        db = Database(url, pool_size=1, max_overflow=0)
        try:
            cluster.start_all(monitor=True)

            def archiving() -> bool:
                return db.read(lambda s: s.scalar(select(func.count()).select_from(Operation).where(
                    Operation.kind == OperationKind.LONG_TERM_ARCHIVE.value,
                    Operation.status == Status.IN_PROGRESS.value))) >= 1

            wait_for(archiving, 180, "an archive write in flight")
            watch.look()
            server.stop("fast")  # every connection dropped, the server gone
            # longer than a unit of work retries (8 attempts, about 6-12 s): services see failures
            time.sleep(15)
            server.start()
            back = time.monotonic()
            st = cluster.wait_finished(300, packages=4, watch=watch)
            healed = time.monotonic() - back
            dead = {n: p.returncode for n, p in cluster.procs.items() if p.poll() is not None}
            assert not dead, f"services died instead of recovering: {dead}"
        finally:
            cluster.stop_all()
            db.dispose()
        _assert_archived_once(cluster, config, cli, tmp_path / "x", st)
        _heal("PostgreSQL restart (15 s down)", broker, healed, watch, since="the restart")
        assert "service_loop_cycle_failed" in cluster.log("manager"), "the outage was not felt by the manager"
        for name in ["manager", "monitor", *(f"worker-{s}" for s in SITES)]:
            log = cluster.log(name)
            assert log.count("PendingRollbackError") <= 3, f"{name}: PendingRollbackError loop\n{log[-3000:]}"
        failed = [e for e in _failure_events(cluster) if e[1] not in ("Stalled",)]
        assert failed == [], f"a database outage was recorded as an operation's failure: {failed}"
    finally:
        server.close()
