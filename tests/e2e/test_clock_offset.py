"""Hosts whose clocks are off, in distributed mode: PostgreSQL, Redis, a Celery worker for
``fyst``, a manager and a monitor as real processes, some of them with their host clock
shifted (``tests/clock_shift``: the one read of the host clock, ``packhorse.db.clock.host_now``,
runs ahead in that process and the processes it forks).

Found in the field: a worker whose clock ran 1 h ahead, killed in the middle of its work, held
its operation for 3,637 s (121× the lease), while ``health`` showed it alive with a negative
age; a monitor whose clock ran 2 h ahead declared every live lease expired at each cycle. Every
process now times leases, heartbeats and ages by the database's clock, so:

* the operation of a killed worker 1 h ahead is handed back by the monitor within about the
  lease (2 s here), and ``health`` shows the worker's offset (about -3600 s), a non-negative
  age, and names its host on stderr;
* a monitor 2 h ahead leaves a live lease alone (no ``Stalled`` event, the attempt unchanged,
  the operation completes in its first attempt) and warns once in its log about its clock.

Either way the run then finishes with the other sites' workers (and, for the killed one, a
fyst worker on time): the source file is archived once at each destination with its bytes
(lost, duplicated, corrupt, overwritten: 0, ``HEAL`` line with the seconds).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from distributed_support import (
    CLEAN,
    ArchiveWatch,
    Cluster,
    postgres_database,
    redis_url,
    report_heal,
    source_digests,
    wait_for,
)
from packhorse.db.models import FailureEvent, Operation
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status
from support import SRC

pytestmark = [pytest.mark.slow, pytest.mark.long]

CLOCK_SHIFT = Path(__file__).resolve().parents[1] / "clock_shift"
LEASE = 2.0  # s, the test configuration's lease_timeout_seconds


DEAD_AFTER = 3.0  # s, service_dead_after_seconds here


def shifted(seconds: float, host: str | None = None) -> dict[str, str]:
    """The environment of a process whose host clock runs ``seconds`` ahead; with ``host``, one
    that names another host (whose processes the monitor and ``health`` cannot look at)."""
    return {"PYTHONPATH": f"{CLOCK_SHIFT}{os.pathsep}{SRC}", "PACKHORSE_TEST_CLOCK_SHIFT_SECONDS": str(seconds),
            **({"PACKHORSE_TEST_HOSTNAME": host} if host else {})}


@pytest.fixture
def pg() -> Iterator[str]:
    url, drop = postgres_database()
    yield url
    drop()


def _cluster(site_config: Any, pg: str, tmp_path: Path, faults: list[dict[str, Any]],
             broker_url: str | None = None) -> Cluster:
    config = site_config(poll_interval_seconds=0.5, bundle_max_wait_seconds=0.5,
                         extra=f"service_heartbeat_interval_seconds = 0.5\nservice_dead_after_seconds = {DEAD_AFTER}\n")
    src = config.parent / "source" / "inst" / "obs0"
    src.mkdir(parents=True)
    (src / "f0.dat").write_bytes(os.urandom(50_000))
    cluster = Cluster(config, pg, broker_url or redis_url(), env={"PACKHORSE_TEST_FAULTS": json.dumps(faults)})
    cluster.init()
    return cluster


def _packaging(pg: str) -> tuple[Operation | None, list[FailureEvent]]:
    """The raw-data-package operation and every failure event."""
    db = Database(pg, pool_size=1, max_overflow=0)
    try:
        return db.read(lambda s: (s.scalars(select(Operation).where(
            Operation.kind == OperationKind.RAW_DATA_PACKAGE.value)).first(), list(s.scalars(select(FailureEvent)))))
    finally:
        db.dispose()


def _health(cluster: Cluster) -> dict[str, dict[str, Any]]:
    r = cluster.cli("health", "--json")
    return {s["kind"]: s for s in json.loads(r.stdout)["services"]}


def _finish_and_count(cluster: Cluster, kind: str, broker: str, seconds: float, since: str) -> None:
    """The other sites' workers archive the package; report and require 0 lost, duplicated,
    corrupt and overwritten."""
    watch = ArchiveWatch(cluster.root)
    for site in ("cologne", "cornell"):
        if f"worker-{site}" not in cluster.procs:
            cluster.start_worker(site)
    cluster.wait_finished(180, packages=1, watch=watch)
    counts = watch.tally(source_digests(cluster.root / "source"))
    report_heal(kind, broker, seconds, counts, since=since)
    assert counts == CLEAN, counts


def _logs(cluster: Cluster) -> str:
    return "\n".join(f"--- {n}.log\n{cluster.log(n)[-3000:]}" for n in ("worker-fyst", "manager", "monitor"))


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_a_killed_worker_an_hour_ahead_is_handed_back_within_the_lease(broker: str, broker_url: str, site_config,
                                                                       pg: str, tmp_path: Path) -> None:
    marker = tmp_path / "packaging"
    cluster = _cluster(site_config, pg, tmp_path, [
        {"point": "raw_data_package.write", "action": "pause", "seconds": 300, "marker": str(marker)}], broker_url)
    try:
        worker = cluster.start_worker("fyst", env=shifted(3600, host="obs-ahead"))
        cluster.start("manager", "manager")
        cluster.start("monitor", "monitor")
        wait_for(lambda: marker.exists() and marker.read_text(), 90, "the worker to pause in its packaging write")
        op, _ = _packaging(pg)
        assert op is not None and op.status == Status.IN_PROGRESS.value
        attempt = op.attempt
        # the lease the worker took is the database's time plus the lease, not an hour more
        assert op.lease_expires_at is not None
        workers = wait_for(lambda: (h := _health(cluster)).get("worker") and h["worker"]["clock_offset_seconds"]
                           is not None and h, 30, "the worker's heartbeat with its clock offset")
        w = workers["worker"]
        assert w["alive"] and w["clock_offset_seconds"] == pytest.approx(-3600, abs=5), w
        assert 0 <= w["age_seconds"] < 30, w  # not negative: the worker wrote the database's time
        assert abs(workers["manager"]["clock_offset_seconds"]) < 2 and abs(workers["monitor"]["clock_offset_seconds"]) < 2
        text = cluster.cli("health")
        assert "clock offset (s)" in text.stdout and f"clock: {w['service']}" in text.stderr, text
        assert "3600" in text.stderr and "ahead of the database server's" in text.stderr
        assert op.lease_owner and op.lease_owner.startswith("obs-ahead:"), op.lease_owner  # "another host"

        os.killpg(worker.pid, signal.SIGKILL)  # the worker host dies: main process and pool child
        killed_at = time.monotonic()

        def handed_back() -> bool:
            now, events = _packaging(pg)
            assert now is not None
            return now.attempt != attempt or now.status != Status.IN_PROGRESS.value or any(
                e.error_type == "Stalled" for e in events)

        try:
            wait_for(handed_back, 30, "the monitor to hand the killed worker's operation back", interval=0.2)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{_logs(cluster)}") from None
        took = time.monotonic() - killed_at
        assert took < LEASE + 15, took  # about the lease (a loaded machine adds seconds), not an hour
        _, events = _packaging(pg)
        assert [(e.kind, e.error_type) for e in events] == [(OperationKind.RAW_DATA_PACKAGE.value, "Stalled")]
        # judged by its heartbeat's age alone (another host), the dead worker is dead once that age
        # passes service_dead_after_seconds — not alive for an hour with a negative age
        dead = wait_for(lambda: not (h := _health(cluster)["worker"])["alive"] and h, 30, "the killed worker to be dead")
        assert dead["age_seconds"] >= DEAD_AFTER, dead
        # a fyst worker on time (no pause) takes the handed-back packaging; the seconds reported
        # are the kill's to the hand-back (the operation moved)
        cluster.start_worker("fyst", env={"PACKHORSE_TEST_FAULTS": "[]"})
        _finish_and_count(cluster, "worker 1 h ahead killed in a write", broker, took,
                          "the kill (until the operation was handed back)")
    finally:
        cluster.stop_all()


def test_a_monitor_two_hours_ahead_leaves_a_live_lease_alone(site_config, pg: str, tmp_path: Path) -> None:
    marker, go_on = tmp_path / "packaging", tmp_path / "go-on"
    cluster = _cluster(site_config, pg, tmp_path, [
        {"point": "raw_data_package.write", "action": "wait_for", "path": str(go_on), "seconds": 120,
         "marker": str(marker)}])
    try:
        cluster.start_worker("fyst")
        cluster.start("manager", "manager")
        cluster.start("monitor", "monitor", env=shifted(7200))
        wait_for(lambda: marker.exists(), 90, "the worker to wait in its packaging write")
        op, _ = _packaging(pg)
        assert op is not None and op.status == Status.IN_PROGRESS.value
        attempt = op.attempt
        # the monitor checks every 0.2 s: 4 leases long, a monitor judging by its own clock
        # would have declared the live lease expired some 40 times
        time.sleep(4 * LEASE)
        op, events = _packaging(pg)
        assert op is not None and (op.status, op.attempt) == (Status.IN_PROGRESS.value, attempt), _logs(cluster)
        assert not [e for e in events if e.error_type == "Stalled"], [(e.error_type, e.message) for e in events]
        go_on.write_text("")
        released = time.monotonic()

        def completed() -> Operation | None:
            done, _ = _packaging(pg)
            return done if done is not None and done.status == Status.COMPLETED.value else None

        done = wait_for(completed, 60, "the packaging operation to complete")
        took = time.monotonic() - released
        assert done.attempt == attempt  # in its first attempt: nobody took it away
        monitor = wait_for(lambda: (h := _health(cluster)).get("monitor") and
                           h["monitor"]["clock_offset_seconds"] is not None and h["monitor"], 30,
                           "the monitor's heartbeat with its clock offset")
        assert monitor["clock_offset_seconds"] == pytest.approx(-7200, abs=5) and monitor["age_seconds"] >= 0
        warnings = [line for line in cluster.log("monitor").splitlines() if "clock_offset" in line]
        assert len(warnings) == 1, warnings  # once per process
        _finish_and_count(cluster, "monitor 2 h ahead, a live lease held", "redis", took,
                          "the held write's release (until it completed, first attempt)")
    finally:
        cluster.stop_all()


def test_a_source_site_worker_5_minutes_ahead_of_the_managers_scans_and_packages(site_config, pg: str,
                                                                                tmp_path: Path) -> None:
    # the manager asks for a scan every poll; a request is good for a minute. A worker whose clock
    # runs 5 minutes ahead judged that minute by its own clock (Celery's ``expires``) and dropped
    # every request: nothing at its site was ever scanned, packaged or archived
    cluster = _cluster(site_config, pg, tmp_path, [])
    try:
        cluster.start_worker("fyst", env=shifted(300, host="fyst-ahead"))
        cluster.start("manager", "manager")

        def packaged() -> Operation | None:
            op, _ = _packaging(pg)
            return op if op is not None and op.status == Status.COMPLETED.value else None

        try:
            wait_for(packaged, 90, "the source file to be packaged at the site 5 minutes ahead")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{_logs(cluster)}") from None
        assert "scan_skipped_expired" not in cluster.log("worker-fyst")
    finally:
        cluster.stop_all()
