"""An expired lease that nothing takes back is never silent (DESIGN.md I5, every state has an
owner): when no monitor runs (it died, or was never started) a crashed worker's operation would
stay ``IN_PROGRESS`` for ever while the worker that replaced it heartbeats and every view says
all is well. ``status`` lists it as blocked (``lease_not_reclaimed``), ``health`` exits 1
naming the missing monitor and the operation, and a monitor's first pass releases it.

Real CLI processes on a real SQLite ops database."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from sqlalchemy import select

from packhorse.db.models import Operation, ServiceHeartbeat, Site, utcnow
from packhorse.db.session import Database
from packhorse.domain import Status
from packhorse.status.metrics import collect_values
from support import run_packhorse


@pytest.mark.long  # five real CLI processes: out of the default selection
def test_an_expired_lease_with_no_monitor_is_listed_and_fails_health_until_a_monitor_takes_it_back(
        site_config) -> None:
    config = site_config()
    assert run_packhorse("init", "-c", str(config), cwd=config.parent).returncode == 0
    db = Database(f"sqlite:///{config.parent / 'packhorse.db'}")
    now = utcnow()
    try:
        def seed(s) -> int:  # type: ignore[no-untyped-def]
            site_id = s.scalar(select(Site.id).order_by(Site.id).limit(1))
            # the worker that held it was killed on another host ten minutes ago; its
            # replacement heartbeats; the only monitor died with the first worker
            op = Operation(kind="transfer", status=Status.IN_PROGRESS.value, dedup_key="transfer:lost-lease",
                           site_id=site_id, attempt=1, lease_owner="worker:fyst@obs-host-2:4242",
                           lease_expires_at=now - dt.timedelta(minutes=10), heartbeat_at=now - dt.timedelta(minutes=15),
                           started_at=now - dt.timedelta(minutes=16), updated_at=now - dt.timedelta(minutes=15))
            s.add(op)
            s.add(ServiceHeartbeat(service="worker:fyst@obs-host-2", kind="worker", host="obs-host-2", pid=4343,
                                   site="fyst", started_at=now, last_seen=now))
            s.flush()
            return op.id
        op_id = db.transact(seed)
    finally:
        db.dispose()

    health = run_packhorse("health", "--json", "-c", str(config), cwd=config.parent)
    assert health.returncode == 1, (health.stdout, health.stderr)
    doc = json.loads(health.stdout)
    assert doc["dead"] == 0 and doc["no_monitor"] is True
    assert [i["subject"] for i in doc["leases_not_reclaimed"]] == [f"transfer {op_id}"]
    text = run_packhorse("health", "-c", str(config), cwd=config.parent)
    assert text.returncode == 1
    assert "no monitor is running" in text.stderr and f"lease not reclaimed: transfer {op_id}" in text.stderr

    status = run_packhorse("status", "--json", "-c", str(config), cwd=config.parent)
    [item] = [b for b in json.loads(status.stdout)["blocked"] if b["cause"] == "lease_not_reclaimed"]
    assert item["subject"] == f"transfer {op_id}" and item["detail"]["lease_owner"] == "worker:fyst@obs-host-2:4242"
    assert item["detail"]["lease_expired_seconds_ago"] >= 600 and "packhorse monitor" in item["release"]

    # /metrics counts it by the same rule (the alert PackhorseLeasesNotReclaimed reads this)
    assert _gauge(config) == 1

    # a monitor's first pass hands it back: nothing is left to list
    once = run_packhorse("monitor", "--once", "-c", str(config), cwd=config.parent)
    assert once.returncode == 0, once.stderr
    db = Database(f"sqlite:///{config.parent / 'packhorse.db'}")
    try:
        assert db.read(lambda s: s.get(Operation, op_id).status) == Status.PENDING.value
    finally:
        db.dispose()
    status = run_packhorse("status", "--json", "-c", str(config), cwd=config.parent)
    assert [b for b in json.loads(status.stdout)["blocked"] if b["cause"] == "lease_not_reclaimed"] == []
    assert _gauge(config) == 0


def _gauge(config) -> int:  # type: ignore[no-untyped-def]
    """``packhorse_operations_blocked{cause="lease_not_reclaimed"}`` as ``/metrics`` reads it."""
    db = Database(f"sqlite:///{config.parent / 'packhorse.db'}")
    try:
        return db.read(lambda s: collect_values(s)["blocked"]["lease_not_reclaimed"])
    finally:
        db.dispose()
