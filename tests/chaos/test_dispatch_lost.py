"""The reconciler's give-up is listed and ends by itself (real processes, PostgreSQL, a private Redis).

The transfers to cologne and cornell wait in Redis while those sites' workers are down; their
messages are lost (``FLUSHALL``) twice with a reconciler cap of one re-dispatch. What an
operator sees: after the second loss ``packhorse status --json`` lists each lost transfer as
blocked with cause ``dispatch_lost`` (not an empty list with one ERROR mail as the only sign);
once the sites' workers are back, the reconciler's half-open re-dispatch after its cool-down
moves them without anyone running ``packhorse retry``: the run finishes, nothing is blocked,
every source file archived once at each destination with its bytes. The seconds from the
workers' return until the run finished are reported (``HEAL`` line; the cool-down included).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from sqlalchemy import func, select

from distributed_support import (
    CLEAN,
    ArchiveWatch,
    Cluster,
    PrivateRedis,
    postgres_database,
    report_heal,
    source_digests,
    wait_for,
    write_source,
)
from packhorse.db.models import Operation
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status

pytestmark = pytest.mark.slow

COOLDOWN = 20


def _events(log: str, event: str) -> list[dict[str, Any]]:
    out = []
    for line in log.splitlines():
        if f'"{event}"' in line and "{" in line:
            try:
                out.append(json.loads(line[line.index("{"):]))
            except ValueError:
                continue
    return out


def test_a_dispatch_lost_beyond_the_cap_is_listed_and_retried_after_the_cool_down(site_config) -> None:
    pg, drop = postgres_database()
    redis = PrivateRedis()
    config = site_config(bundle_max_wait_seconds=0.5, poll_interval_seconds=0.5)
    write_source(config.parent / "source", groups=1, files_per_group=1, size=64 << 10)
    # floor = visibility timeout = 4 s; one re-dispatch per window, then a 20 s cool-down
    cluster = Cluster(config, pg, redis.url, visibility_timeout=4,
                      env={"PACKHORSE_RECOVERY__RECONCILE_MAX_RESETS": "1",
                           "PACKHORSE_RECOVERY__RECONCILE_COOLDOWN_SECONDS": str(COOLDOWN)})
    cluster.init()
    watch = ArchiveWatch(config.parent)
    db = Database(pg, pool_size=1, max_overflow=0)

    def transfers_scheduled() -> bool:
        return db.read(lambda s: s.scalar(select(func.count()).select_from(Operation).where(
            Operation.kind == OperationKind.TRANSFER.value, Operation.status == Status.SCHEDULED.value))) >= 2

    def transfer_messages() -> int:
        return sum(redis.client.llen(k) for k in redis.client.scan_iter(match="*_transfer*")
                   if redis.client.type(k) in (b"list", "list"))

    def blocked() -> list[dict[str, Any]]:
        return [b for b in cluster.status()["blocked"] if b["cause"] == "dispatch_lost"]

    try:
        cluster.start_worker("fyst")
        cluster.start("manager", "manager")
        cluster.start("monitor", "monitor")
        wait_for(transfers_scheduled, 120, "transfers scheduled for cologne and cornell")
        wait_for(lambda: transfer_messages() >= 2, 60, "transfer messages in Redis")
        redis.client.flushall()  # lost once: re-dispatched (the window's one re-dispatch)
        wait_for(lambda: len([e for e in _events(cluster.log("monitor"), "reconciler_redispatched")
                              if e["operation_kind"] == "transfer"]) >= 2, 90, "the lost transfers re-dispatched")
        wait_for(lambda: transfer_messages() >= 2, 60, "the re-dispatched transfer messages in Redis")
        assert blocked() == []
        redis.client.flushall()  # lost again within the window: the reconciler gives up
        items = wait_for(lambda: len(blocked()) >= 2 and blocked(), 90, "the given-up transfers listed as blocked")
        assert {i["detail"]["kind"] for i in items} == {"transfer"}
        assert all(i["release"].startswith("packhorse retry transfer ") for i in items)
        assert {e["operation_kind"] for e in _events(cluster.log("monitor"), "reconciler_gave_up")} == {"transfer"}
        # the sites' workers come back; nobody runs `packhorse retry`: the half-open
        # re-dispatch after the cool-down moves the transfers
        cluster.start_worker("cologne")
        cluster.start_worker("cornell")
        back = time.monotonic()
        st = cluster.wait_finished(180, packages=1, watch=watch)
        healed = time.monotonic() - back
        half_open = [e for e in _events(cluster.log("monitor"), "reconciler_redispatched") if e.get("half_open")]
    finally:
        cluster.stop_all()
        db.dispose()
        redis.close()
        drop()
    counts = watch.tally(source_digests(config.parent / "source"))
    report_heal("dispatch lost beyond the cap", "redis", healed, counts,
                since="the workers' return (after the give-up)")
    assert counts == CLEAN, counts
    assert st["blocked"] == []
    assert {e["operation_kind"] for e in half_open} == {"transfer"}
