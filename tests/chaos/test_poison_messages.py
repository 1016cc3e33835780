"""Poison messages on a site's queues (real processes, PostgreSQL, Redis and RabbitMQ).

Garbage is pushed straight onto the queues a running ``packhorse worker`` consumes: a Redis
list entry that is not JSON (``lpush <queue> garbage``), a kombu envelope whose body is not
base64, a JSON value that is no envelope; on RabbitMQ a body that is no Celery message and a
JSON task message whose body does not parse. What an operator checks afterwards: the worker
process is still alive and still works (the scan and packaging of the site run on it after the
garbage), every garbage message was dropped (the queue is empty of it) and logged once with
its queue; once the other sites' workers are up too, every source file is archived once at each
destination with its bytes. The seconds from the push until the last garbage message was
dropped (the worker free for real work again) are reported (``HEAL`` line). And a worker
whose consumer must stop exits non-zero (so a ``Restart=`` unit brings it back), where
Celery's own ``worker_main`` exits 0.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
import redis
from kombu import Connection, Exchange, Producer
from sqlalchemy import func, select

from distributed_support import (
    CLEAN,
    ArchiveWatch,
    Cluster,
    postgres_database,
    rabbitmq_vhost,
    redis_url,
    report_heal,
    source_digests,
    wait_for,
    write_source,
)
from packhorse.db.models import Operation
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status

pytestmark = pytest.mark.slow

SCAN_QUEUE = "fyst_fyst-source_scan"
PACKAGE_QUEUE = "fyst_fyst-buffer_raw_data_package"


def _ready(cluster: Cluster, name: str) -> bool:
    return " ready." in cluster.log(name)


def _push_redis(url: str) -> int:
    r = redis.Redis.from_url(url)
    envelope = {"body": "%%% not base64 %%%", "content-encoding": "utf-8", "content-type": "application/json",
                "headers": {}, "properties": {"body_encoding": "base64", "delivery_tag": "x-1",
                                              "delivery_info": {"exchange": "packhorse", "routing_key": SCAN_QUEUE}}}
    r.lpush(SCAN_QUEUE, "garbage")
    r.lpush(SCAN_QUEUE, json.dumps(envelope))
    r.lpush(PACKAGE_QUEUE, "42")
    r.lpush(PACKAGE_QUEUE, json.dumps({"no": "envelope"}))
    return 4


def _push_rabbitmq(url: str) -> int:
    with Connection(url) as conn:
        producer = Producer(conn.channel(), exchange=Exchange("packhorse", type="direct", durable=True))
        producer.publish(b"garbage", routing_key=SCAN_QUEUE, content_type="application/octet-stream",
                         content_encoding="binary", serializer=None)
        producer.publish(b"{not json", routing_key=PACKAGE_QUEUE, content_type="application/json",
                         content_encoding="utf-8",
                         headers={"task": "packhorse.run_operation", "id": "poison-1", "lang": "py",
                                  "argsrepr": "", "kwargsrepr": ""})
    return 2


def _count(database_url: str, kind: OperationKind, status: Status) -> int:
    db = Database(database_url, pool_size=1, max_overflow=0)
    try:
        return db.read(lambda s: s.scalar(select(func.count()).select_from(Operation).where(
            Operation.kind == kind.value, Operation.status == status.value))) or 0
    finally:
        db.dispose()


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_worker_survives_poison_messages_and_keeps_working(broker: str, site_config) -> None:
    db_url, drop = postgres_database()
    delete_vhost = None
    if broker == "redis":
        broker_url = redis_url()
        push = _push_redis
    else:
        broker_url, delete_vhost = rabbitmq_vhost()
        push = _push_rabbitmq
    config = site_config(bundle_max_wait_seconds=0.5, poll_interval_seconds=0.5)
    write_source(config.parent / "source", groups=2, files_per_group=1, size=32 << 10)
    cluster = Cluster(config, db_url, broker_url)
    watch = ArchiveWatch(config.parent)
    try:
        cluster.init()
        worker = cluster.start_worker("fyst")
        wait_for(lambda: _ready(cluster, "worker-fyst"), 60, "the fyst worker to be ready")
        sent = push(broker_url)
        pushed = time.monotonic()
        wait_for(lambda: len(re.findall(r"broker_message_dropped", cluster.log("worker-fyst"))) >= sent, 30,
                 "every poison message to be dropped")
        healed = time.monotonic() - pushed
        assert worker.poll() is None, f"the worker died on a poison message:\n{cluster.log('worker-fyst')[-3000:]}"
        if broker == "redis":
            r = redis.Redis.from_url(broker_url)
            assert (r.llen(SCAN_QUEUE), r.llen(PACKAGE_QUEUE)) == (0, 0)  # nothing left to trip on
        # it keeps consuming: the site's scan and packaging run on it now
        cluster.start("manager", "manager")
        wait_for(lambda: _count(db_url, OperationKind.RAW_DATA_PACKAGE, Status.COMPLETED) >= 2, 120,
                 "the fyst worker to build both packages after the garbage")
        assert worker.poll() is None
        cluster.start_worker("cologne")
        cluster.start_worker("cornell")
        cluster.wait_finished(240, packages=2, watch=watch)
        assert worker.poll() is None
        log = cluster.log("worker-fyst")
    finally:
        cluster.stop_all()
        drop()
        if delete_vhost is not None:
            delete_vhost()
    counts = watch.tally(source_digests(config.parent / "source"))
    report_heal("poison messages", broker, healed, counts, since="the push (until the last one dropped)")
    assert counts == CLEAN, counts
    lines = [ln for ln in log.splitlines() if "broker_message_dropped" in ln]
    assert len(lines) == sent, lines  # once per message
    assert all(SCAN_QUEUE in ln or PACKAGE_QUEUE in ln for ln in lines), lines  # with its queue
    assert "Unrecoverable error" not in log


def test_worker_that_must_stop_exits_non_zero(site_config) -> None:
    db_url, drop = postgres_database()
    config = site_config()
    cluster = Cluster(config, db_url, redis_url())
    fault = json.dumps([{"point": "worker.consumer", "action": "fail"}])
    try:
        cluster.init()
        worker = cluster.start_worker("fyst", env={"PACKHORSE_TEST_FAULTS": fault})
        code = worker.wait(90)
        log = cluster.log("worker-fyst")
    finally:
        cluster.stop_all()
        drop()
    assert "Unrecoverable error" in log, log[-3000:]
    assert code != 0, log[-3000:]


def test_worker_asked_to_stop_exits_zero(site_config) -> None:
    db_url, drop = postgres_database()
    config = site_config()
    cluster = Cluster(config, db_url, redis_url())
    try:
        cluster.init()
        worker = cluster.start_worker("fyst")
        wait_for(lambda: _ready(cluster, "worker-fyst"), 60, "the fyst worker to be ready")
        os.kill(worker.pid, signal.SIGTERM)
        code = worker.wait(60)
    finally:
        cluster.stop_all()
        drop()
    assert code == 0

