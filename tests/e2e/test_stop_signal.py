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


@pytest.mark.parametrize(("sig", "older_failure"), [(signal.SIGTERM, False), (signal.SIGINT, False),
                                                    (signal.SIGTERM, True)],
                         ids=["SIGTERM", "SIGINT", "SIGTERM-with-an-older-failed-operation"])
def test_a_stop_signal_to_the_process_group_lets_running_operations_finish(tmp_path: Path, sig: int,
                                                                           older_failure: bool) -> None:
    # a service stopped exits 0 whatever it reports (a FAILED or blocked operation is printed, not
    # the exit code: systemd would take a stop for a crash; found by a trial: it exited 3)
    site = tmp_path / "site"
    cfg = write_site_config(site, bundle_max_wait_seconds=0)  # ship at once, without --until-idle
    for i in range(3):
        p = site / "source" / "cam" / f"obs{i}" / "frame.fits"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(200_000))
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    if older_failure:
        _add_failed_operation(cfg)
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
    if older_failure:
        assert b"FAILED" in err, err.decode(errors="replace")  # reported all the same
    # and the next run finishes the job
    assert run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet").returncode == (3 if older_failure else 0)
    status = json.loads(run_packhorse("status", "-c", str(cfg), "--json").stdout)
    assert status["packages"] == {"total": 3, "archived": 3, "failed": 0}


@pytest.mark.parametrize("older_failure", [False, True], ids=["clean", "with-an-older-failed-operation"])
def test_run_until_idle_stopped_by_a_signal_does_not_exit_0(tmp_path: Path, older_failure: bool) -> None:
    # cron must be able to tell an interrupted run from a finished one, also when an older
    # FAILED operation would make a finished run exit 3 (found by a new-user trial: it exited 3)
    site = tmp_path / "site"
    cfg = write_site_config(site)
    p = site / "source" / "cam" / "obs0" / "frame.fits"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(os.urandom(100_000))
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    if older_failure:
        _add_failed_operation(cfg)
    marker = tmp_path / "archiving"
    faults = [{"point": "long_term_archive.writing", "action": "pause", "seconds": 1.0, "marker": str(marker),
               "times": 1}]
    env = {**os.environ, "PYTHONPATH": str(SRC), "PACKHORSE_TEST_FAULTS": json.dumps(faults)}
    proc = subprocess.Popen([sys.executable, "-m", "packhorse", "run", "-c", str(cfg), "--until-idle", "--quiet"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no archive write started"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, err.decode(errors="replace")
    assert b"interrupted by signal 15" in err
    assert run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet").returncode == (3 if older_failure else 0)


def _add_failed_operation(cfg: Path) -> None:
    """An operation FAILED before the run (a deletion of nothing, as a human left it)."""
    from sqlalchemy import update

    from packhorse.config import load_config
    from packhorse.db.models import Operation, Site
    from packhorse.db.session import Database
    from packhorse.domain import OperationKind, Status
    from packhorse.operations.lifecycle import create_operation

    db = Database(load_config(cfg).database_url)

    def tx(s):  # type: ignore[no-untyped-def]
        site_id = s.query(Site.id).filter(Site.name == "fyst").scalar()
        op = create_operation(s, kind=OperationKind.DELETION, dedup_key="deletion:older", site_id=site_id,
                              max_retries=0)
        s.execute(update(Operation).where(Operation.id == op.id).values(
            status=Status.FAILED.value, error_context={"error_type": "DeletionNotSafeError", "message": "older"}))

    db.transact(tx)
    db.dispose()
