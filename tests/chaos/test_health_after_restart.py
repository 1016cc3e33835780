"""Service health after real crashes: a ``packhorse run`` SIGKILLed and started again is one
row in ``packhorse health`` (alive, the new process, restarts counted), ``health`` exits 0 and
the ``packhorse_service_up`` label set stays one label however often it crashes; a monitor
killed and never restarted is dead (exit 1) until ``health --forget`` removes it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from support import SRC, run_packhorse

HOST = socket.gethostname()


def _start(cfg, *args: str) -> subprocess.Popen[bytes]:  # type: ignore[no-untyped-def]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.Popen([sys.executable, "-m", "packhorse", *args, "-c", str(cfg)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _health(cfg) -> tuple[int, dict[str, Any]]:  # type: ignore[no-untyped-def]
    r = run_packhorse("health", "-c", str(cfg), "--json")
    return r.returncode, json.loads(r.stdout)


def _until(cfg, want, what: str, timeout: float = 60) -> tuple[int, dict[str, Any]]:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        code, report = _health(cfg)
        if want(code, report):
            return code, report
        assert time.monotonic() < deadline, f"{what}: {code} {report}"
        time.sleep(0.2)


def _service_up_labels(cfg) -> set[str]:  # type: ignore[no-untyped-def]
    from packhorse.config import load_config
    from packhorse.db.session import Database
    from packhorse.status.metrics import registry_for, render

    db = Database(load_config(cfg).database_url)
    try:
        text = render(registry_for(db, dead_after_seconds=1.5)).decode()
    finally:
        db.dispose()
    return {line.split("{", 1)[1].split("}", 1)[0] for line in text.splitlines()
            if line.startswith("packhorse_service_up{")}


def test_a_killed_and_restarted_runner_is_one_live_row_and_the_labels_stay_bounded(site_config):
    cfg = site_config(extra="service_heartbeat_interval_seconds = 0.2\nservice_dead_after_seconds = 1.5\n")
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    me = f"runner@{HOST}"
    pids = []
    proc = _start(cfg, "run", "--quiet")
    try:
        for _crash in range(3):
            _until(cfg, lambda c, r: c == 0 and [(s["service"], s["alive"], s["pid"]) for s in r["services"]]
                   == [(me, True, proc.pid)], "the runner is not recorded alive")
            proc.send_signal(signal.SIGKILL)  # a host reboot, the OOM killer
            proc.wait(timeout=30)
            pids.append(proc.pid)
            code, report = _until(cfg, lambda c, r: r["dead"] == 1, "the killed runner is not dead")
            assert code == 1 and [s["service"] for s in report["services"]] == [me]
            proc = _start(cfg, "run", "--quiet")  # restarted
        code, report = _until(cfg, lambda c, r: r["services"] and r["services"][0]["pid"] == proc.pid,
                              "the restarted runner did not take its row over")
        [row] = report["services"]
        assert code == 0 and report["dead"] == 0
        assert (row["service"], row["alive"], row["restarts"]) == (me, True, 3)
        assert _service_up_labels(cfg) == {f'kind="runner",service="{me}"'}  # one label, three crashes later
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert len(set(pids)) == 3
    code, report = _health(cfg)
    assert (code, report["services"]) == (0, [])  # a clean stop is not a death


def test_a_dead_monitor_counts_until_it_is_forgotten(site_config):
    cfg = site_config(extra="service_heartbeat_interval_seconds = 0.2\nservice_dead_after_seconds = 1.5\n")
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    name = f"monitor:b@{HOST}"
    mon = _start(cfg, "monitor", "--instance", "b")
    try:
        _until(cfg, lambda c, r: [s["service"] for s in r["services"]] == [name], "the monitor is not recorded")
        live = run_packhorse("health", "-c", str(cfg), "--forget", name)
        assert live.returncode == 1 and "is alive" in live.stderr
    finally:
        mon.send_signal(signal.SIGKILL)
        mon.wait(timeout=30)
    code, report = _until(cfg, lambda c, r: r["dead"] == 1, "the killed monitor is not dead")
    assert code == 1
    text = run_packhorse("health", "-c", str(cfg))
    assert text.returncode == 1 and f"packhorse health --forget {name}" in text.stderr
    unknown = run_packhorse("health", "-c", str(cfg), "--forget", "monitor:nope@x")
    assert unknown.returncode == 1 and name in unknown.stderr
    forgot = run_packhorse("health", "-c", str(cfg), "--forget", name)
    assert forgot.returncode == 0, forgot.stderr
    assert _health(cfg) == (0, {"services": [], "dead": 0, "scans_overdue": [], "no_monitor": False,
                                "leases_not_reclaimed": [], "sites_unreachable": []})
    bad = run_packhorse("monitor", "-c", str(cfg), "--instance", "two words")
    assert bad.returncode == 2 and "--instance" in bad.stderr
    audit = json.loads(run_packhorse("audit", "-c", str(cfg), "--json").stdout)
    assert [(a["action"], a["target"], a["result"]) for a in audit][:2] == [
        ("service.forget", name, "ok"), ("service.forget", "monitor:nope@x", "refused")]
