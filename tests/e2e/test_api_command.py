"""``packhorse api`` serves the dashboard, /metrics and the API on its own, and stops cleanly."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from api_support import start_serving, stop
from support import run_packhorse, write_site_config


def test_packhorse_api_serves_until_sigterm(tmp_path: Path) -> None:
    cfg = write_site_config(tmp_path / "site")
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    admin = run_packhorse("token", "create", "--role", "admin", "--name", "a", "-c", str(cfg)).stdout.splitlines()[-1]
    proc, base = start_serving(["api", "--port", "0", "-c", str(cfg)], tmp_path / "api.log")
    try:
        assert "packhorse" in httpx.get(f"{base}/").text
        assert "packhorse_database_up 1.0" in httpx.get(f"{base}/metrics").text
        assert httpx.get(f"{base}/api/transfer/overview").status_code == 401
        h = {"Authorization": f"Bearer {admin}"}
        r = httpx.put(f"{base}/api/admin/settings/log_level", headers=h, json={"value": "info"})
        assert r.status_code == 200 and next(x for x in r.json() if x["key"] == "log_level")["value"] == "INFO"
        # the API server is a service like the monitor: health lists it while it serves
        health = run_packhorse("health", "--json", "-c", str(cfg))
        assert [(x["kind"], x["alive"]) for x in json.loads(health.stdout)["services"]] == [("api", True)], health
    finally:
        code = stop(proc)
    assert code == 0
    health = run_packhorse("health", "--json", "-c", str(cfg))
    assert json.loads(health.stdout)["services"] == []  # a clean stop is not a death
    assert "settings.set" in run_packhorse("audit", "-c", str(cfg)).stdout
