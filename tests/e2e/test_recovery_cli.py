"""Recovery from the operator's side, with real ``packhorse`` processes and a real SIGKILL.

A worker process is killed in the middle of a long-term archive write (as an OOM killer would).
With ``max_stall_count = 1`` the run's monitor finds the stalled operation, its circuit breaker
opens, everything else is archived and the run exits 4 (blocked on a human). ``breaker list``
shows the open breaker, ``health`` no dead runner, ``retry`` hands the operation back and a
last run archives it: every source file ends in both archives. The whole run killed in the
middle of a write, three times, is no fault of the operation: no breaker opens, even at
``max_stall_count = 1``, and the next run archives everything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from e2e_helpers import sha256_file

from support import SRC, run_packhorse


def _wait_for(path: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def _payloads(archive: Path) -> dict[str, str]:
    import hashlib
    import tarfile

    out: dict[str, str] = {}
    for tar_path in archive.rglob("*.tar"):
        with tarfile.open(tar_path) as tar:
            for m in tar:
                _, _, rest = m.name.partition("/")
                if rest.startswith("data/") and m.isreg():
                    f = tar.extractfile(m)
                    assert f is not None
                    out[rest[5:]] = hashlib.sha256(f.read()).hexdigest()
    return out


def _two_packages(cfg: Path) -> Path:
    src = cfg.parent / "source"
    for g in range(2):
        for i in range(2):
            p = src / "inst" / f"obs{g}" / f"f{i}.dat"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(os.urandom(2 << 20))
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    return src


def _archived_everywhere(cfg: Path, src: Path) -> None:
    expected = {p.relative_to(src).as_posix(): sha256_file(p) for p in src.rglob("*")
                if p.is_file() and p.relative_to(src).parts[0] != "_packhorse"}  # not the identity marker
    for lta in ("sites/cologne/archive", "sites/cornell/archive"):
        assert _payloads(cfg.parent / lta) == expected


def test_open_breaker_blocks_run_with_exit_4_until_an_admin_retries(site_config, tmp_path):
    cfg = site_config(extra="max_stall_count = 1\nservice_heartbeat_interval_seconds = 0.2\n"
                            "service_dead_after_seconds = 1\n")
    src = _two_packages(cfg)
    marker = tmp_path / "writing"
    # one archive write pauses (the first to get there: no other fires once the marker exists)
    faults = [{"point": "long_term_archive.writing", "action": "pause", "seconds": 300, "marker": str(marker),
               "unless_exists": str(marker)}]
    env = {**os.environ, "PYTHONPATH": str(SRC), "PACKHORSE_TEST_FAULTS": json.dumps(faults)}
    proc = subprocess.Popen([sys.executable, "-m", "packhorse", "run", "-c", str(cfg), "--until-idle", "--quiet"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(marker)
        pid = int(marker.read_text())
        assert pid != proc.pid  # the worker process writing, not the run
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # the run lives on: its monitor finds the stall, the breaker opens, the rest is archived
    assert proc.returncode == 4, err[-4000:]
    assert "circuit breaker open" in err

    blocked = run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet", timeout=600)
    assert blocked.returncode == 4, blocked.stderr
    assert "circuit breaker open" in blocked.stderr

    listed = run_packhorse("breaker", "list", "-c", str(cfg), "--json")
    assert listed.returncode == 0, listed.stderr
    opened = json.loads(listed.stdout)
    assert [(b["kind"], b["state"], b["stall_count"]) for b in opened] == [("long_term_archive", "open", 1)]

    h = run_packhorse("health", "-c", str(cfg), "--json")
    report = json.loads(h.stdout)
    # both runs removed their row at their clean stop: no dead service, no current problem
    assert h.returncode == 0 and report == {"services": [], "dead": 0, "scans_overdue": [], "no_monitor": False,
                                         "leases_not_reclaimed": [], "sites_unreachable": []}
    said = run_packhorse("health", "-c", str(cfg))
    assert said.returncode == 0 and said.stdout.startswith("no packhorse service is running")

    b = opened[0]
    wrong = run_packhorse("retry", "deletion", str(b["operation_id"]), "-c", str(cfg))
    assert wrong.returncode == 1 and (f"no deletion operation with id {b['operation_id']}: operation "
                                      f"{b['operation_id']} is of kind long_term_archive") in wrong.stderr
    r = run_packhorse("retry", b["kind"], str(b["operation_id"]), "--reason", "writer hang fixed",
                      "-c", str(cfg), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["previous_status"] == "IN_PROGRESS"

    final = run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet", timeout=600)
    assert final.returncode == 0, final.stderr
    _archived_everywhere(cfg, src)
    listed = json.loads(run_packhorse("breaker", "list", "-c", str(cfg), "--json").stdout)
    assert listed == []  # closed by the retry (stall count 0)


def test_a_run_killed_three_times_mid_write_opens_no_breaker(site_config, tmp_path):
    # a crash loop or repeated reboots: the whole service dies with the operation's lease; the
    # operation is no suspect, so even max_stall_count = 1 holds nothing
    cfg = site_config(extra="max_stall_count = 1\n")
    src = _two_packages(cfg)
    for round_ in range(3):
        marker = tmp_path / f"writing-{round_}"
        faults = [{"point": "long_term_archive.writing", "action": "pause", "seconds": 300, "marker": str(marker),
                   "unless_exists": str(marker)}]
        env = {**os.environ, "PYTHONPATH": str(SRC), "PACKHORSE_TEST_FAULTS": json.dumps(faults)}
        proc = subprocess.Popen([sys.executable, "-m", "packhorse", "run", "-c", str(cfg), "--until-idle",
                                 "--quiet"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            _wait_for(marker)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the run and its worker processes
            proc.wait(timeout=30)

    # status says the IN_PROGRESS work has no one running it, and when it is handed out again
    # (a trial saw it as plain IN_PROGRESS after kill -9)
    # (the writing archive operation, and whatever else the kill caught in flight)
    orphans = json.loads(run_packhorse("status", "-c", str(cfg), "--json").stdout)["orphaned"]
    writing = [o for o in orphans if o["kind"] == "long_term_archive"]
    assert writing and {o["taken_over"] for o in orphans} == {"next_recovery_pass"}, orphans
    text = run_packhorse("status", "-c", str(cfg)).stdout
    assert f"ORPHANED long_term_archive {writing[0]['id']}: IN_PROGRESS, but its holder" in text, text
    assert "handed out again at the next recovery pass" in text, text

    final = run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet", timeout=600)
    assert final.returncode == 0, final.stderr
    _archived_everywhere(cfg, src)
    assert json.loads(run_packhorse("breaker", "list", "-c", str(cfg), "--json").stdout) == []
    status = json.loads(run_packhorse("status", "-c", str(cfg), "--json").stdout)
    assert status["blocked"] == [] and status["failed_operations"] == []


def test_log_format_json_lines_of_a_task_carry_its_identity(site_config):
    cfg = site_config()
    p = cfg.parent / "source" / "inst" / "obs0" / "f.dat"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"x" * 1000)
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    out = run_packhorse("--log-format", "json", "run", "-c", str(cfg), "--until-idle",
                        env={"PACKHORSE_LOG_LEVEL": "DEBUG"})
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stderr.splitlines() if line.startswith("{")]
    task_lines = [x for x in lines if x.get("event") in ("operation_claimed", "operation_completed")]
    assert len(task_lines) >= 2 * 6  # claimed + completed for package, bundle, 2 transfers, ...
    for x in task_lines:
        assert {"operation_kind", "operation_id", "attempt", "task_id", "timestamp", "level"} <= set(x), x
        assert x["task_id"].endswith(f"#{x['attempt']}")
    bad = run_packhorse("--log-format", "xml", "status", "-c", str(cfg))
    assert bad.returncode == 2 and "--log-format" in bad.stderr


def test_monitor_service_recovers_stalled_work_reports_health_and_stops_cleanly(site_config):
    import datetime as dt

    from sqlalchemy import update

    from packhorse.config import load_config
    from packhorse.db.models import Operation, utcnow
    from packhorse.db.session import Database
    from packhorse.domain import OperationKind
    from packhorse.operations.lifecycle import claim, create_operation

    cfg = site_config(extra="service_heartbeat_interval_seconds = 0.2\nservice_dead_after_seconds = 2\n")
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    db = Database(load_config(cfg).database_url)
    op = db.transact(lambda s: create_operation(s, kind=OperationKind.TRANSFER, dedup_key="t", site_id=1,
                                                max_retries=3))
    assert claim(db, op.id, "dead-worker", 30) is not None
    db.transact(lambda s: s.execute(update(Operation).values(lease_expires_at=utcnow() - dt.timedelta(seconds=1))))

    env = {**os.environ, "PYTHONPATH": str(SRC)}
    mon = subprocess.Popen([sys.executable, "-m", "packhorse", "--log-format", "json", "monitor", "-c", str(cfg)],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while db.read(lambda s: s.get(Operation, op.id)).status != "PENDING":
            assert time.monotonic() < deadline and mon.poll() is None, "the monitor did not recover the operation"
            time.sleep(0.1)
        h = json.loads(run_packhorse("health", "-c", str(cfg), "--json").stdout)
        assert [(s["kind"], s["alive"]) for s in h["services"]] == [("monitor", True)]
    finally:
        mon.send_signal(signal.SIGTERM)
        _out, errs = mon.communicate(timeout=30)
    assert mon.returncode == 0, errs
    assert any(json.loads(l).get("event") == "stalled_operation_reset" for l in errs.splitlines() if l.startswith("{"))
    h = run_packhorse("health", "-c", str(cfg), "--json")
    assert h.returncode == 0 and json.loads(h.stdout)["services"] == []  # a clean stop is not a death
    once = run_packhorse("monitor", "--once", "--json", "-c", str(cfg))
    assert once.returncode == 0 and json.loads(once.stdout)["reset"] == []
    db.dispose()


def test_run_survives_database_errors_in_the_middle_of_manager_cycles(site_config):
    cfg = site_config()
    src = cfg.parent / "source"
    for g in range(2):
        p = src / "inst" / f"obs{g}" / "f.dat"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(50_000))
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    faults = [{"point": "manager.cycle", "action": "db_error", "times": 3}]
    out = run_packhorse("--log-format", "json", "run", "-c", str(cfg), "--until-idle",
                        env={"PACKHORSE_TEST_FAULTS": json.dumps(faults), "PACKHORSE_LOG_LEVEL": "WARNING"})
    assert out.returncode == 0, out.stderr
    failed = [json.loads(l) for l in out.stderr.splitlines()
              if l.startswith("{") and "service_loop_cycle_failed" in l]
    assert len(failed) == 3 and all(f["where"] == "managers" for f in failed)
    expected = {p.relative_to(src).as_posix(): sha256_file(p) for p in src.rglob("*")
                if p.is_file() and p.relative_to(src).parts[0] != "_packhorse"}  # not the identity marker
    for lta in ("sites/cologne/archive", "sites/cornell/archive"):
        assert _payloads(cfg.parent / lta) == expected


def test_the_notifier_and_the_disk_monitor_are_listed_by_health_while_they_run(site_config):
    # `packhorse health` listed api, managers, monitors and workers; a running notifier and disk
    # monitor recorded no heartbeat, so a dead one was nobody's to see
    cfg = site_config(extra="service_heartbeat_interval_seconds = 0.2\nservice_dead_after_seconds = 2\n"
                            "[notifications.smtp]\nhost = \"127.0.0.1\"\nport = 9\n"
                            "from_address = \"packhorse@example.org\"\nrecipients = [\"ops@example.org\"]\n")
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    procs = [subprocess.Popen([sys.executable, "-m", "packhorse", kind, "-c", str(cfg)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for kind in ("notifier", "disk-monitor")]

    def kinds() -> list[tuple[str, bool]]:
        h = json.loads(run_packhorse("health", "-c", str(cfg), "--json").stdout)
        return sorted((s["kind"], s["alive"]) for s in h["services"])

    try:
        deadline = time.monotonic() + 60
        while kinds() != [("disk-monitor", True), ("notifier", True)]:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), kinds()
            time.sleep(0.2)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert kinds() == []  # a clean stop is not a death
