"""Storage that refuses writes waits, never fails (DESIGN.md "Architecture": storage that is absent
is not empty), with real mounts: an archive disk remounted read-only during ``packhorse run``
(``EROFS``) makes the location unavailable — the work waits, ``status`` names the location and
the errno, one notification is queued — and once the disk is remounted read-write the same run
finishes everything by itself: no ``reset``, no FAILED operation, no failure counted.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from e2e_helpers import Pipeline, assert_archived_everywhere, source_files

from support import SRC
from tmpfs_support import mount_tmpfs


def _source(p: Pipeline, groups: int) -> None:
    for g in range(groups):
        for f in range(2):
            path = p.source / "cam" / f"obs{g}" / f"frame{f}.fits"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(200_000))


def _remount(folder: Path, mode: str) -> None:
    r = subprocess.run(["mount", "-o", f"remount,{mode}", str(folder)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _query(p: Pipeline, sql: str) -> list[tuple]:
    with sqlite3.connect(p.root / "packhorse.db", timeout=30) as db:
        return db.execute(sql).fetchall()


def _wait(what: str, check, proc: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert proc.poll() is None, f"packhorse run ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.2)


def test_an_archive_remounted_read_only_during_a_run_waits_and_resumes_when_writable(pipeline) -> None:
    p = pipeline(bundle_max_wait_seconds=0)
    _source(p, groups=3)
    expected = source_files(p.source)
    archive = p.location("cologne-lta")
    with mount_tmpfs(archive, 64):
        p.init()
        _remount(archive, "ro")
        proc = subprocess.Popen([sys.executable, "-m", "packhorse", "run", "-c", str(p.config), "--quiet"],
                                env={**os.environ, "PYTHONPATH": str(SRC)}, cwd=p.root, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            _wait("outage of cologne-lta for EROFS", lambda: _query(
                p, "SELECT o.fault FROM location_outages o JOIN data_locations l ON l.id = o.location_id "
                   "WHERE l.name = 'cologne-lta'") == [("EROFS",)], proc)
            # let the workers meet the read-only disk again and again: waiting never turns into failing
            _wait("archive operations waiting for cologne-lta", lambda: _query(
                p, "SELECT count(*) FROM operations WHERE kind = 'long_term_archive' AND status = 'PENDING' "
                   "AND json_extract(error_context, '$.waiting') = 'location'")[0][0] >= 1, proc)
            time.sleep(3)
            assert _query(p, "SELECT count(*) FROM operations WHERE status = 'FAILED'") == [(0,)]
            status = p.status()
            blocked = [b for b in status["blocked"] if b["cause"] == "location_unavailable"]
            assert [b["detail"]["location"] for b in blocked] == ["cologne-lta"], status["blocked"]
            assert blocked[0]["detail"]["fault"] == "EROFS" and "Read-only file system" in blocked[0]["reason"]
            assert "writable again" in blocked[0]["release"] and "resumes by itself" in blocked[0]["release"]
            text = p.cli("status").stdout
            assert "BLOCKED location cologne-lta" in text and "EROFS" in text, text
            assert os.listdir(archive) == ["_packhorse"]  # nothing written (it could not be)

            _remount(archive, "rw")
            total = _query(p, "SELECT count(*) FROM raw_data_packages")[0][0]
            assert total >= 3
            _wait("every package archived", lambda: _query(
                p, "SELECT count(*) FROM raw_data_packages WHERE archived_at IS NOT NULL")[0][0] == total
                and _query(p, "SELECT count(*) FROM location_outages") == [(0,)], proc, seconds=180)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            _remount(archive, "rw")
        assert_archived_everywhere(p, expected)
        # no failure, no retry counted, no reset needed
        assert _query(p, "SELECT count(*) FROM operations WHERE status = 'FAILED' OR retry_count > 0") == [(0,)]
        assert _query(p, "SELECT count(*) FROM failure_events") == [(0,)]
        # one notification names the location and the errno; one says it is back
        events = _query(p, "SELECT body, context FROM notification_outbox WHERE event = 'location_unavailable'")
        assert len(events) == 1 and json.loads(events[0][1])["location"] == "cologne-lta", events
        assert "EROFS" in events[0][0] and "cologne-lta" in events[0][0], events[0][0]
        back = _query(p, "SELECT context FROM notification_outbox WHERE event = 'location_available'")
        assert [json.loads(c)["location"] for (c,) in back] == ["cologne-lta"]
        assert p.status()["blocked"] == []
