"""The disk-usage commands as real processes: ``packhorse usage --measure --json`` and the
``packhorse disk-monitor`` service (figures from the tests' fault hooks, ``PACKHORSE_TEST_DISK_USAGE``)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from sqlalchemy import select

from packhorse.config import load_config
from packhorse.db.models import Notification
from packhorse.db.session import Database
from packhorse.rules.disk_usage import usage_history
from support import run_packhorse, write_site_config

EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)


def test_usage_command_measures_and_prints_json(tmp_path: Path) -> None:
    cfg = write_site_config(tmp_path / "site")
    figures = tmp_path / "usage.json"
    figures.write_text(json.dumps({"cornell-buffer": {"total": 2000, "used": 1800}}))
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    empty = run_packhorse("usage", "-c", str(cfg))
    assert empty.returncode == 0 and "no disk usage recorded yet" in empty.stderr
    out = run_packhorse("usage", "--measure", "--json", "-c", str(cfg),
                        env={"PACKHORSE_TEST_DISK_USAGE": str(figures)})
    assert out.returncode == 0, out.stderr
    rows = {r["location"]: r for r in json.loads(out.stdout)}
    assert rows["cornell-buffer"]["percent"] == 90.0
    assert (rows["cornell-buffer"]["level"], rows["cornell-buffer"]["alert_level"]) == ("critical", "critical")
    assert rows["cornell-buffer"]["free_bytes"] == 200
    listed = run_packhorse("notifications", "--json", "-c", str(cfg))
    assert [n["subject"] for n in json.loads(listed.stdout)] == ["Disk usage critical: cornell-buffer at 90.0%"]


def test_disk_monitor_service_records_every_interval_until_stopped(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from support import SRC

    cfg = write_site_config(tmp_path / "site", extra="[disk_usage]\ninterval_seconds = 0.2\n")
    figures = tmp_path / "usage.json"
    figures.write_text(json.dumps({"fyst-buffer": {"total": 100, "used": 71}}))
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "packhorse", "disk-monitor", "-c", str(cfg)],
                            env={**os.environ, "PYTHONPATH": str(SRC), "PACKHORSE_TEST_DISK_USAGE": str(figures)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    db = Database(load_config(cfg).database_url)
    try:
        deadline = time.monotonic() + 60
        while db.read(lambda s: len(usage_history(s, "fyst-buffer", EPOCH))) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        subjects = db.read(lambda s: [n.subject for n in s.scalars(select(Notification).order_by(Notification.id))])
        assert subjects[0].startswith("Service started: disk-monitor on ")
        assert subjects.count("Disk usage warning: fyst-buffer at 71.0%") == 1  # once, however many samples
        assert subjects[-1].startswith("Service stopped: disk-monitor on ")
    finally:
        if proc.poll() is None:
            proc.kill()
        db.dispose()
