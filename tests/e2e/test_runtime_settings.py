"""Runtime settings change a running ``packhorse run --api`` without a restart:
``packhorse config set`` stores the value in the database and the running process picks it
up within ``managers.runtime_settings_refresh_seconds``; the embedded API serves meanwhile."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from api_support import start_serving, stop
from packhorse.db.models import Operation, Site, utcnow
from packhorse.db.session import Database
from packhorse.domain import Status
from packhorse.status.metrics import collect_values
from support import SRC, run_packhorse, write_site_config

REFRESH = 0.5


def _wait(pred, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _archived(cfg: Path) -> int:
    r = run_packhorse("status", "-c", str(cfg), "--json")
    return json.loads(r.stdout)["packages"]["archived"] if r.returncode == 0 else 0


def test_a_shorter_poll_interval_set_at_run_time_is_picked_up_without_restart(tmp_path: Path) -> None:
    site = tmp_path / "site"
    # a poll interval of 1000 s: without the runtime setting, a new file would wait that long
    cfg = write_site_config(site, poll_interval_seconds=f"1000\nruntime_settings_refresh_seconds = {REFRESH}",
                            bundle_max_wait_seconds=0)
    (site / "source" / "cam" / "obs1").mkdir(parents=True)
    (site / "source" / "cam" / "obs1" / "a.dat").write_bytes(b"first")
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    token = run_packhorse("token", "create", "--role", "observer", "--name", "t", "-c", str(cfg)).stdout.splitlines()[-1]
    proc, base = start_serving(["run", "--api", "--api-port", "0", "-c", str(cfg), "--quiet"], tmp_path / "run.log")
    try:
        _wait(lambda: _archived(cfg) == 1, 120, "the first package to be archived")
        metrics = httpx.get(f"{base}/metrics").text
        assert 'packhorse_operations{kind="long_term_archive",status="COMPLETED"} 2.0' in metrics
        ov = httpx.get(f"{base}/api/transfer/overview", headers={"Authorization": f"Bearer {token}"}).json()
        assert ov["totals"]["COMPLETED"] >= 5 and ov["totals"]["FAILED"] == 0

        (site / "source" / "cam" / "obs2").mkdir()
        (site / "source" / "cam" / "obs2" / "b.dat").write_bytes(b"second")
        time.sleep(3 * REFRESH + 1)
        assert _archived(cfg) == 1  # not seen: the next scan is 1000 s away
        r = run_packhorse("config", "set", "managers.poll_interval_seconds", "0.2", "-c", str(cfg))
        assert r.returncode == 0, r.stderr
        t0 = time.monotonic()
        _wait(lambda: _archived(cfg) == 2, 60, "the second package after the runtime change")
        picked_up = time.monotonic() - t0
        assert picked_up < 30, picked_up
        shown = json.loads(run_packhorse("config", "show", "-c", str(cfg), "--json").stdout)
        row = next(x for x in shown if x["key"] == "managers.poll_interval_seconds")
        assert row["value"] == 0.2 and row["source"] == "runtime" and row["default"] == 1000.0
        bad = run_packhorse("config", "set", "managers.poll_interval_seconds", "0", "-c", str(cfg))
        assert bad.returncode == 2 and "positive" in bad.stderr
        unknown = run_packhorse("config", "set", "managers.colour", "red", "-c", str(cfg))
        assert unknown.returncode == 2 and "unknown runtime setting" in unknown.stderr
        audit = json.loads(run_packhorse("audit", "-c", str(cfg), "--json").stdout)
        changes = [(a["target"], a["result"]) for a in audit if a["action"] == "settings.set"]
        assert changes == [("managers.colour", "refused"), ("managers.poll_interval_seconds", "refused"),
                           ("managers.poll_interval_seconds", "ok")]
    finally:
        code = stop(proc)
    assert code == 0, (tmp_path / "run.log").read_text()[-3000:]



def test_a_running_monitor_and_the_views_follow_the_monitor_interval_set_at_run_time(tmp_path: Path) -> None:
    # `packhorse monitor` read its interval from the file once: a shorter one set with `config set`
    # never reached it; and status and the gauge judged "lease not reclaimed" by the file's
    # interval while the monitors used another
    site = tmp_path / "site"
    cfg = write_site_config(site, monitor_interval_seconds=3600,
                            poll_interval_seconds=f"1\nruntime_settings_refresh_seconds = {REFRESH}")
    assert run_packhorse("init", "-c", str(cfg), cwd=site).returncode == 0
    db = Database(f"sqlite:///{site / 'packhorse.db'}")

    def seed(s: Session) -> int:
        now = utcnow()
        op = Operation(kind="transfer", status=Status.IN_PROGRESS.value, dedup_key="transfer:expired",
                       site_id=s.scalar(select(Site.id).order_by(Site.id).limit(1)), attempt=1,
                       lease_owner="worker:fyst@gone:1", lease_expires_at=now - dt.timedelta(minutes=60),
                       heartbeat_at=now - dt.timedelta(minutes=61), started_at=now - dt.timedelta(minutes=62),
                       updated_at=now - dt.timedelta(minutes=61))
        s.add(op)
        s.flush()
        return op.id

    def not_reclaimed() -> tuple[list[str], int]:
        """(``status --json``'s lease_not_reclaimed subjects, the /metrics gauge's value as served
        with the file's interval)."""
        r = run_packhorse("status", "--json", "-c", str(cfg), cwd=site)
        listed = [b["subject"] for b in json.loads(r.stdout)["blocked"] if b["cause"] == "lease_not_reclaimed"]
        gauge = db.read(lambda s: collect_values(s, monitor_interval_seconds=3600)["blocked"]["lease_not_reclaimed"])
        return listed, gauge

    log = (tmp_path / "monitor.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "packhorse", "monitor", "-c", str(cfg)], cwd=site,
                            env={**os.environ, "PYTHONPATH": str(SRC)}, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: "monitor" in run_packhorse("health", "--json", "-c", str(cfg), cwd=site).stdout, 60,
              "the monitor's first pass")
        op_id = db.transact(seed)
        # expired an hour ago: two passes of 3600 s have not gone by, nothing to list
        assert not_reclaimed() == ([], 0)
        # (the running monitor's next pass is 600 s after its first: it takes nothing meanwhile)
        r = run_packhorse("config", "set", "recovery.monitor_interval_seconds", "600", "-c", str(cfg), cwd=site)
        assert r.returncode == 0, r.stderr
        # two passes of 600 s have gone by: listed by status and counted by the gauge alike
        assert not_reclaimed() == ([f"transfer {op_id}"], 1)
        r = run_packhorse("config", "set", "recovery.monitor_interval_seconds", "0.5", "-c", str(cfg), cwd=site)
        assert r.returncode == 0, r.stderr
        _wait(lambda: db.read(lambda s: s.get(Operation, op_id).status) == Status.PENDING.value, 30,
              "the running monitor to take the expired lease back at its new interval")
    finally:
        proc.terminate()
        code = proc.wait(30)
        log.close()
        db.dispose()
    assert code == 0, (tmp_path / "monitor.log").read_text()[-3000:]


def test_a_running_distributed_manager_follows_the_poll_interval_set_at_run_time(tmp_path: Path) -> None:
    # `packhorse manager` read its poll interval from the file once: `config set` never reached it
    import redis

    from distributed_support import Cluster, postgres_database, redis_url

    site = tmp_path / "site"
    cfg = write_site_config(site, poll_interval_seconds=f"1000\nruntime_settings_refresh_seconds = {REFRESH}")
    url, drop = postgres_database()
    broker = redis_url()
    cluster = Cluster(cfg, url, broker)
    queue = redis.Redis.from_url(broker)
    # the scan queue of fyst's source: no worker runs here, the test takes the requests itself
    # (a manager sends none while one still waits there)
    scans = "fyst_fyst-source_scan"
    taken: list[bytes] = []

    def take() -> int:
        message = queue.rpop(scans)
        if message is not None:
            taken.append(message)
        return len(taken)

    try:
        cluster.init()
        cluster.start("manager", "manager")
        _wait(lambda: take() >= 1, 60, "the manager's first scan request")
        time.sleep(3)
        assert take() == 1  # the next poll is 1000 s away
        r = cluster.cli("config", "set", "managers.poll_interval_seconds", "0.3")
        assert r.returncode == 0, r.stderr
        _wait(lambda: take() >= 4, 30, "scan requests at the new poll interval")
    finally:
        cluster.stop_all()
        queue.close()
        drop()
