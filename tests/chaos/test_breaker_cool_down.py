"""A worker killed three times by something outside it (an OOM killer, a reboot) opens the
operation's circuit breaker; the work it holds is visible and releases itself.

Real ``packhorse`` processes and a real SIGKILL of the worker process (as the OOM killer sends
it): the packaging worker is killed three times in the middle of its write, the circuit breaker
opens, ``status --json`` lists the held operation with the command that releases it, and
``run --until-idle`` exits 4 while the breaker is open. Once the (short, configured) cool-down
has passed, the next plain ``packhorse run --until-idle`` lets one attempt through, it succeeds,
the breaker closes, every source file is in both archives and the run exits 0 — no reset, no SQL.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from support import SRC, run_packhorse

COOL_DOWN = 10.0


def _payloads(archive: Path) -> dict[str, str]:
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


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = path.read_text()
            if text:
                return int(text)
        except FileNotFoundError:
            pass
        assert proc.poll() is None, f"packhorse run exited {proc.returncode} before the worker paused"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def test_worker_killed_three_times_opens_the_breaker_and_the_next_run_after_the_cool_down_archives_it(
        site_config, tmp_path):
    cfg = site_config(extra=f"max_stall_count = 3\ncircuit_breaker_cooldown_seconds = {COOL_DOWN}\n")
    src = cfg.parent / "source"
    for i in range(2):
        p = src / "inst" / "obs0" / f"f{i}.dat"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(200_000))
    expected = {p.relative_to(src).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in src.rglob("*") if p.is_file()}
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    marker, healed = tmp_path / "packaging", tmp_path / "healed"
    # the packaging worker pauses in its write (until the neighbour's OOM killer is gone)
    faults = [{"point": "raw_data_package.write", "action": "pause", "seconds": 300, "marker": str(marker),
               "unless_exists": str(healed)}]
    env = {**os.environ, "PYTHONPATH": str(SRC), "PACKHORSE_TEST_FAULTS": json.dumps(faults)}
    proc = subprocess.Popen([sys.executable, "-m", "packhorse", "run", "-c", str(cfg), "--until-idle", "--quiet"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = []
    try:
        for _ in range(3):
            pid = _wait_for(marker, proc)
            marker.unlink()
            assert pid != proc.pid  # a worker process, not the run
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(set(killed)) == 3  # three different worker processes, each killed once
    assert proc.returncode == 4, err
    assert "circuit breaker open" in err and "release: packhorse retry raw_data_package" in err

    status = json.loads(run_packhorse("status", "-c", str(cfg), "--json").stdout)
    [item] = [b for b in status["blocked"] if b["cause"] == "circuit_breaker"]
    op_id = item["detail"]["operation_id"]
    assert item["subject"] == f"raw_data_package {op_id}"
    assert item["release"] == f"packhorse retry raw_data_package {op_id}"
    assert item["exit_code"] == 4 and item["detail"]["state"] == "open"
    assert item["detail"]["package"] and item["detail"]["stall_count"] == 3
    next_attempt = dt.datetime.fromisoformat(item["detail"]["next_attempt_at"])
    assert status["packages"]["archived"] == 0
    text = run_packhorse("status", "-c", str(cfg))
    assert f"raw_data_package {op_id}" in text.stdout and "circuit_breaker" in text.stdout

    healed.write_text("")  # the neighbour is gone; from now on a worker survives the write
    still_open = run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet", env={"PACKHORSE_TEST_FAULTS": "[]"})
    if dt.datetime.now(dt.timezone.utc) < next_attempt:  # the cool-down did not pass meanwhile
        assert still_open.returncode == 4, still_open.stderr
        assert f"blocked: raw_data_package {op_id}" in still_open.stderr

    wait = (next_attempt - dt.datetime.now(dt.timezone.utc)).total_seconds()
    if wait > 0:
        time.sleep(wait + 0.2)
    final = run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet")
    assert final.returncode == 0, final.stderr
    for lta in ("sites/cologne/archive", "sites/cornell/archive"):
        assert _payloads(cfg.parent / lta) == expected
    after = json.loads(run_packhorse("status", "-c", str(cfg), "--json").stdout)
    assert after["blocked"] == [] and after["packages"]["archived"] == 1
    assert json.loads(run_packhorse("breaker", "list", "-c", str(cfg), "--json").stdout) == []  # closed
    audit = json.loads(run_packhorse("audit", "-c", str(cfg), "--json").stdout)
    assert audit == []  # nobody reset or retried anything
