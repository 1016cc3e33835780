"""Disk monitoring: samples are recorded per active disk location; crossing warning,
critical and emergency notifies once per crossing; falling below recovery notifies recovery."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from sqlalchemy import select

from packhorse.config import load_config
from packhorse.db.models import Notification
from packhorse.db.session import Database
from packhorse.rules.disk_usage import latest_usage, measure_all, usage_history
from packhorse.runtime.topology import sync_topology
from packhorse.storage.usage import Usage
from support import write_site_config

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
    from packhorse.storage.usage import filesystem_usage

    with pytest.raises(FileNotFoundError, match="fyst-buffer"):
        filesystem_usage("fyst-buffer", tmp_path / "not-mounted")
