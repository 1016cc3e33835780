"""Disk pressure inside ``packhorse run`` (issue #7): the disk monitor records the injected usage,
notifies the crossing, and the deletion manager frees the critical buffer before its 7-day
retention while buffers below warning keep their copies."""

from __future__ import annotations

import json
from pathlib import Path

from support import run_packhorse, write_site_config


def test_critical_buffer_is_freed_before_retention_and_normal_buffers_wait(tmp_path: Path) -> None:
    site = tmp_path / "site"
    cfg = write_site_config(site)
    cfg.write_text(cfg.read_text().replace("retention_seconds = 0", "retention_seconds = 604800"))
    for unit in ("obs1", "obs2"):
        (site / "source" / "cam" / unit).mkdir(parents=True)
        (site / "source" / "cam" / unit / "a.dat").write_bytes(unit.encode() * 1000)
    usage = tmp_path / "usage.json"
    usage.write_text(json.dumps({"fyst-buffer": {"total": 10_000_000, "used": 9_000_000}}))
    env = {"PACKHORSE_TEST_DISK_USAGE": str(usage)}
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    r = run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet", env=env)
    assert r.returncode == 0, r.stderr
    status = json.loads(run_packhorse("status", "-c", str(cfg), "--json").stdout)
    assert status["packages"] == {"total": 2, "archived": 2, "failed": 0}
    copies = status["copies"]
    assert copies.get("fyst-buffer", {"count": 0})["count"] == 0  # critical: gone before the retention
    assert copies["cologne-buffer"]["count"] >= 2 and copies["cornell-buffer"]["count"] >= 2  # normal: kept
    assert copies["cologne-lta"]["count"] == 2 and copies["cornell-lta"]["count"] == 2
    assert not list((site / "sites" / "fyst" / "buffer").rglob("*.tar"))
    rows = {u["location"]: u for u in json.loads(run_packhorse("usage", "--json", "-c", str(cfg), env=env).stdout)}
    assert rows["fyst-buffer"]["level"] == "critical" and rows["cologne-buffer"]["level"] == "normal"
    notes = json.loads(run_packhorse("notifications", "--json", "-c", str(cfg)).stdout)
    assert [n["subject"] for n in notes if n["event"].startswith("disk_")] == [
        "Disk usage critical: fyst-buffer at 90.0%"]
