"""A half-open circuit breaker in distributed mode: PostgreSQL, RabbitMQ (a private vhost), a
Celery worker per site, a manager and a monitor as real processes.

The fyst worker's pool process is SIGKILLed three times in the middle of a packaging write (as
an OOM killer would); the monitor opens the operation's circuit breaker and ``status --json``
lists it as blocked with its releasing command. After the (short, configured) cool-down the
monitor lets one attempt through by itself, the manager dispatches it, it succeeds, the breaker
closes and everything is archived — nobody reset anything. The operation ran four attempts:
three killed, one let through.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
from pathlib import Path

import pytest
from e2e_helpers import Pipeline, assert_archived_everywhere, source_files

from distributed_support import Cluster, postgres_database, rabbitmq_vhost, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.long]

COOL_DOWN = 20.0  # long enough to see the breaker open on a loaded machine


def test_the_monitor_lets_one_attempt_through_after_the_cool_down(site_config, cli, tmp_path: Path) -> None:
    db_url, drop = postgres_database()
    broker_url, delete_vhost = rabbitmq_vhost()
    config = site_config(bundle_max_wait_seconds=1, poll_interval_seconds=0.5,
                         extra=f"max_stall_count = 3\ncircuit_breaker_cooldown_seconds = {COOL_DOWN}\n")
    src = config.parent / "source" / "inst" / "obs0"
    src.mkdir(parents=True)
    for i in range(2):
        (src / f"f{i}.dat").write_bytes(os.urandom(100_000))
    marker, healed = tmp_path / "packaging", tmp_path / "healed"
    faults = [{"point": "raw_data_package.write", "action": "pause", "seconds": 300, "marker": str(marker),
               "unless_exists": str(healed)}]
    cluster = Cluster(config, db_url, broker_url, env={"PACKHORSE_TEST_FAULTS": json.dumps(faults)})
    try:
        cluster.init()
        cluster.start_all(monitor=True)
        killed = []
        for _ in range(3):
            pid = int(wait_for(lambda: marker.exists() and marker.read_text(), 120, "the packaging worker to pause"))
            marker.unlink()
            os.kill(pid, signal.SIGKILL)  # the worker's pool process, not the worker
            killed.append(pid)
        healed.write_text("")  # the neighbour is gone: the next attempt survives the write

        def held() -> dict | None:
            items = [b for b in cluster.status()["blocked"] if b["cause"] == "circuit_breaker"]
            return items[0] if items and items[0]["detail"]["state"] == "open" else None

        try:
            item = wait_for(held, 90, "the circuit breaker to open")
        except AssertionError as e:
            raise AssertionError(f"{e}\nbreakers: {cluster.cli('breaker', 'list', '--json').stdout}\n"
                                 f"monitor:\n{cluster.log('monitor')[-4000:]}\n"
                                 f"worker-fyst:\n{cluster.log('worker-fyst')[-4000:]}") from None
        op_id = item["detail"]["operation_id"]
        assert item["subject"] == f"raw_data_package {op_id}" and item["release"] == f"packhorse retry raw_data_package {op_id}"
        next_attempt = dt.datetime.fromisoformat(item["detail"]["next_attempt_at"])
        assert item["detail"]["stall_count"] == 3 and item["exit_code"] == 4
        st = cluster.wait_finished(240, packages=1)
        monitor_log = cluster.log("monitor")
        breakers = json.loads(cluster.cli("breaker", "list", "--json").stdout)
        audit = json.loads(cluster.cli("audit", "--json").stdout)
    finally:
        cluster.stop_all()
    try:
        assert len(set(killed)) == 3
        assert st["blocked"] == [] and breakers == []  # closed by the attempt's success
        assert audit == []  # no reset, no retry: the breaker released itself
        half_open = [json.loads(line[line.index("{"):]) for line in monitor_log.splitlines()
                     if '"circuit_breaker_half_open"' in line and "{" in line]
        assert len(half_open) == 1 and half_open[0]["operation_id"] == op_id
        assert dt.datetime.fromisoformat(half_open[0]["timestamp"]) >= next_attempt  # not before the cool-down
        from packhorse.db.models import Operation
        from packhorse.db.session import Database

        db = Database(db_url)
        try:
            op = db.read(lambda s: s.get(Operation, op_id))
            assert (op.status, op.attempt, op.stall_count) == ("COMPLETED", 4, 3)
        finally:
            db.dispose()
        assert_archived_everywhere(Pipeline(config, cli, tmp_path / "extracted"), source_files(config.parent / "source"))
    finally:
        drop()
        delete_vhost()
