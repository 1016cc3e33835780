"""Disk monitoring (issue #7): samples are recorded per active disk location; crossing warning,
critical and emergency notifies once per crossing; falling below recovery notifies recovery."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from sqlalchemy import select

from packhorse.config import load_config
from packhorse.db.models import Notification
from packhorse.db.session import Database
from packhorse.diskusage import Usage, latest_usage, measure_all, usage_history
from packhorse.topology import sync_topology
from support import run_packhorse, write_site_config

EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)


@pytest.fixture
def monitored(tmp_path: Path):
    settings = load_config(write_site_config(tmp_path / "site"))
    db = Database(settings.database_url)
    db.upgrade()
    ids = sync_topology(db, settings).location_ids
    figures: dict[str, float] = {}

    def simulated(name: str, root: Path) -> Usage:
        return Usage(1000, int(figures.get(name, 10) * 10), 1000 - int(figures.get(name, 10) * 10))

    figures["provider"] = simulated  # type: ignore[assignment]
    yield db, settings, ids, figures
    db.dispose()


def test_each_crossing_notifies_once_and_recovery_below_sixty_percent(monitored) -> None:
    db, settings, ids, figures = monitored
    seen = []
    for percent in [50, 72, 75, 69, 88, 97, 99, 90, 65, 61, 59, 58, 72]:
        figures["cologne-buffer"] = percent
        measure_all(db, settings, ids, figures["provider"])
        seen.append(db.read(lambda s: latest_usage(s)["cologne-buffer"].alert_level))
    assert seen == ["normal", "warning", "warning", "warning", "critical", "emergency", "emergency", "emergency",
                    "emergency", "emergency", "normal", "normal", "warning"]
    notes = db.read(lambda s: [(n.level, n.event, n.subject) for n in s.scalars(select(Notification)
                                                                                 .order_by(Notification.id))])
    assert notes == [
        ("WARNING", "disk_warning", "Disk usage warning: cologne-buffer at 72.0%"),
        ("ERROR", "disk_critical", "Disk usage critical: cologne-buffer at 88.0%"),
        ("CRITICAL", "disk_emergency", "Disk usage emergency: cologne-buffer at 97.0%"),
        ("INFO", "disk_recovered", "Disk usage recovered: cologne-buffer at 59.0%"),
        ("WARNING", "disk_warning", "Disk usage warning: cologne-buffer at 72.0%"),
    ]


def test_every_active_disk_location_is_recorded_with_total_used_free_percent(monitored) -> None:
    db, settings, ids, figures = monitored
    figures["fyst-buffer"] = 42.5
    out = measure_all(db, settings, ids, figures["provider"])
    assert sorted(r["location"] for r in out) == sorted(l.name for l in settings.locations)
    latest = db.read(latest_usage)
    s = latest["fyst-buffer"]
    assert (s.total_bytes, s.used_bytes, s.free_bytes, round(s.percent, 1), s.level) == (1000, 425, 575, 42.5, "normal")
    measure_all(db, settings, ids, figures["provider"])
    hist = db.read(lambda x: usage_history(x, "fyst-buffer", EPOCH))
    assert len(hist) == 2 and hist[0].measured_at <= hist[1].measured_at


def test_real_file_system_figure_is_dfs_used_over_used_plus_available(tmp_path: Path) -> None:
    import os

    settings = load_config(write_site_config(tmp_path / "site"))
    for loc in settings.locations:
        settings.location_path(loc.name).mkdir(parents=True, exist_ok=True)
    db = Database(settings.database_url)
    db.upgrade()
    try:
        out = measure_all(db, settings, sync_topology(db, settings).location_ids)
        assert sorted(r["location"] for r in out) == sorted(l.name for l in settings.locations)
        st = os.statvfs(tmp_path)
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        df = 100.0 * used / (used + st.f_bavail * st.f_frsize)
        for r in out:
            assert r["total_bytes"] == st.f_blocks * st.f_frsize
            assert abs(r["percent"] - df) < 0.5  # the same file system, measured a moment apart
            assert r["age_seconds"] < 60
    finally:
        db.dispose()


def test_reserved_blocks_count_as_unavailable() -> None:
    # 1000 bytes, 400 used, 100 reserved for root: df says 400 / (400 + 500) = 44 %
    assert round(Usage(total=1000, used=400, free=500).percent, 1) == 44.4


def test_a_missing_root_is_not_measured_as_its_parent(tmp_path: Path) -> None:
    from packhorse.diskusage import filesystem_usage

    with pytest.raises(FileNotFoundError, match="fyst-buffer"):
        filesystem_usage("fyst-buffer", tmp_path / "not-mounted")


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
