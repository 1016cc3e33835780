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
from prometheus_client.parser import text_string_to_metric_families

from api_support import Api, api_for
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


def _metrics(api: Api) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of ``/metrics`` of the installation's API (in process, as a scrape sees them)."""
    text = api.client.get("/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_an_archive_remounted_read_only_during_a_run_waits_and_resumes_when_writable(pipeline) -> None:
    p = pipeline(bundle_max_wait_seconds=0, extra="[disk_usage]\ninterval_seconds = 0.5\n")
    _source(p, groups=3)
    expected = source_files(p.source)
    archive = p.location("cologne-lta")
    with mount_tmpfs(archive, 64):
        p.init()
        # bytes an earlier repair moved aside at the other archive: measured with its disk usage
        aside = p.location("cornell-lta") / "_packhorse" / "quarantine" / "raw" / "old.tar.20261201T000000.000000Z-0a1b"
        aside.parent.mkdir(parents=True)
        aside.write_bytes(b"q" * 4096)
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
            # what a scrape says meanwhile: the cause, the location, the backlog and its age
            api = api_for(p.config)
            m = _metrics(api)
            assert m[("packhorse_operations_blocked", (("cause", "location_unavailable"),))] >= 1
            assert m[("packhorse_operations_blocked", (("cause", "failed"),))] == 0
            assert m[("packhorse_location_unavailable", (("location", "cologne-lta"),))] == 1
            assert m[("packhorse_location_unavailable", (("location", "cornell-lta"),))] == 0
            assert m[("packhorse_location_unavailable_seconds", (("location", "cologne-lta"),))] > 0
            assert m[("packhorse_packages_not_archived", ())] >= 3
            assert m[("packhorse_oldest_not_archived_age_seconds", ())] > 0
            assert m[("packhorse_quarantined_bytes", (("location", "cornell-lta"),))] == 4096

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
        m = _metrics(api)
        assert m[("packhorse_location_unavailable", (("location", "cologne-lta"),))] == 0
        assert m[("packhorse_packages_not_archived", ())] == 0
        assert m[("packhorse_oldest_not_archived_age_seconds", ())] == 0
        assert {v for (name, _), v in m.items() if name == "packhorse_operations_blocked"} == {0}
