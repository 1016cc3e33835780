"""The whole pipeline in distributed mode: PostgreSQL, one Celery worker process per site
(fyst, cologne, cornell), two ``packhorse manager`` and two ``packhorse monitor`` processes
(high availability), with Redis and again with RabbitMQ.

What a user checks: every source file archived once in each long-term archive (GNU tar
extracts it, the reference ``bagit`` validates it, bytes and mtimes match), buffers freed,
every operation COMPLETED, each worker only ran work of its own site's queues, and the two
managers together made one manager's work: every package in exactly one bundle, each bundle
shipped and unpacked once per destination, each buffer copy deleted once.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from e2e_helpers import Pipeline, assert_archived_everywhere, assert_clean_finish, source_files

from distributed_support import SITES, Cluster, postgres_database, rabbitmq_vhost, redis_url, work_created, write_source
from packhorse.config import load_config
from packhorse.executors.celery_app import site_queues

pytestmark = [pytest.mark.slow, pytest.mark.long]


def _broker(kind: str) -> tuple[str, object]:
    if kind == "redis":
        return redis_url(), None
    url, delete = rabbitmq_vhost()
    return url, delete


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_pipeline_on_postgres_with_a_worker_per_site(broker: str, site_config, cli, tmp_path: Path) -> None:
    db_url, drop = postgres_database()
    broker_url, delete_vhost = _broker(broker)
    config = site_config(bundle_max_wait_seconds=1, poll_interval_seconds=0.5)
    write_source(config.parent / "source", groups=4, files_per_group=2, size=256 << 10)
    cluster = Cluster(config, db_url, broker_url)
    try:
        cluster.init()
        cluster.start_all(managers=2, monitors=2)
        st = cluster.wait_finished(240, packages=4)
        created = work_created(db_url)
        health = cluster.cli("health", "--json")
        services = [sv for sv in json.loads(health.stdout)["services"] if sv["alive"]] if health.stdout.strip() else []
    finally:
        cluster.stop_all()
    try:
        p = Pipeline(config, cli, tmp_path / "extracted")
        assert_clean_finish(st)
        # every service registered its health (the manager, one worker per site)
        assert sorted(sv["kind"] for sv in services) == ["manager", "manager", "monitor", "monitor", "worker", "worker",
                                                         "worker"], (health.returncode, health.stdout, health.stderr[-3000:])
        # one manager's worth of work from two (two destination sites)
        assert created["packages"] == created["bundled"] == created["bundled_as_counted"] == 4, created
        assert created["op:data_transfer_package"] == created["bundles"], created
        assert created["op:transfer"] == created["op:unpack"] == 2 * created["bundles"], created
        assert created["op:long_term_archive"] == 2 * 4, created
        assert created["op:deletion"] == created["buffer_copies"] == 3 * created["bundles"] + 3 * 4, created
        assert_archived_everywhere(p, source_files(config.parent / "source"))
        settings = load_config(config)
        for site in SITES:
            log = cluster.log(f"worker-{site}")
            consumed = set(re.findall(r"^\s*\.> (\S+) exchange=", log, re.M))
            assert consumed == set(site_queues(settings, site)), (site, consumed)
            ran = _completed(log)
            assert ran, f"worker of {site} ran nothing:\n{log[-2000:]}"
            for kind, destination in ran:
                assert destination is None or destination.startswith(f"{site}-"), (site, kind, destination)
            kinds = {k for k, _ in ran}
            if site == "fyst":
                assert {"raw_data_package", "data_transfer_package"} <= kinds <= {
                    "raw_data_package", "data_transfer_package", "deletion"}, kinds
            else:
                assert {"transfer", "unpack", "long_term_archive"} <= kinds, (site, kinds)
                assert "raw_data_package" not in kinds and "data_transfer_package" not in kinds, (site, kinds)
    finally:
        drop()
        if callable(delete_vhost):
            delete_vhost()


def _completed(log: str) -> list[tuple[str, str | None]]:
    """(operation kind, destination location) of every ``operation_completed`` JSON log line."""
    out = []
    for line in log.splitlines():
        if '"operation_completed"' in line:
            rec = json.loads(line[line.index("{"):])
            out.append((rec["operation_kind"], rec.get("destination") or rec.get("location")))
    return out
