"""``packhorse api`` serves the dashboard, /metrics and the API on its own, and stops cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from support import SRC, run_packhorse, write_site_config


def test_packhorse_api_serves_until_sigterm(tmp_path: Path) -> None:
    cfg = write_site_config(tmp_path / "site")
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    admin = run_packhorse("token", "create", "--role", "admin", "--name", "a", "-c", str(cfg)).stdout.splitlines()[-1]
    log_path = tmp_path / "api.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "packhorse", "api", "--port", "0", "-c", str(cfg)],
                                stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "PYTHONPATH": str(SRC)})
        try:
            deadline = time.monotonic() + 60
            while not (m := re.search(r"serving on (http://127\.0\.0\.1:\d+)", log_path.read_text())):
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.1)
            base = m.group(1)
            assert "packhorse" in httpx.get(f"{base}/").text
            assert "packhorse_database_up 1.0" in httpx.get(f"{base}/metrics").text
            assert httpx.get(f"{base}/api/transfer/overview").status_code == 401
            h = {"Authorization": f"Bearer {admin}"}
            r = httpx.put(f"{base}/api/admin/settings/log_level", headers=h, json={"value": "info"})
            assert r.status_code == 200 and next(x for x in r.json() if x["key"] == "log_level")["value"] == "INFO"
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    assert proc.returncode == 0
    assert "settings.set" in run_packhorse("audit", "-c", str(cfg)).stdout
