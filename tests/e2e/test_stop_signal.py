"""Stopping ``packhorse run``: SIGTERM to its whole process group (what systemd sends to a
unit's cgroup, or Ctrl-C on a terminal) lets the running operations finish, then it exits 0;
nothing is left IN_PROGRESS for lease recovery to clean up after."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import SRC, run_packhorse, write_site_config


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_to_the_process_group_lets_running_operations_finish(tmp_path: Path, sig: int) -> None:
    site = tmp_path / "site"
    cfg = write_site_config(site, bundle_max_wait_seconds=0)  # ship at once, without --until-idle
    for i in range(3):
        p = site / "source" / "cam" / f"obs{i}" / "frame.fits"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(200_000))
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    marker = tmp_path / "archiving"
    faults = [{"point": "long_term_archive.writing", "action": "pause", "seconds": 1.5, "marker": str(marker),
               "times": 1}]
    env = {**os.environ, "PYTHONPATH": str(SRC), "PACKHORSE_TEST_FAULTS": json.dumps(faults)}
    proc = subprocess.Popen([sys.executable, "-m", "packhorse", "run", "-c", str(cfg), "--quiet"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no archive write started"
            time.sleep(0.05)
        os.killpg(proc.pid, sig)  # the run and its worker processes, as systemd or a terminal would
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err.decode(errors="replace")
    status = json.loads(run_packhorse("status", "-c", str(cfg), "--json").stdout)
    archive_ops = status["operations"]["long_term_archive"]
    assert "IN_PROGRESS" not in archive_ops and archive_ops.get("COMPLETED", 0) >= 1, archive_ops
    assert not [p for p in site.rglob("*") if p.name.endswith(".packhorse-partial")]
    # and the next run finishes the job
    assert run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet").returncode == 0
    status = json.loads(run_packhorse("status", "-c", str(cfg), "--json").stdout)
    assert status["packages"] == {"total": 3, "archived": 3, "failed": 0}
