"""``packhorse run --until-idle`` delivers its notifications before it exits, and apprise URLs
receive them. Real processes, a real SMTP server and a real HTTP endpoint."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from smtp_server import SmtpServer, smtp_server, smtp_settings, toml_table  # noqa: F401 (fixture)
from sqlalchemy import select

from packhorse.config import settings_from_dict
from packhorse.db.models import Notification
from packhorse.db.session import Database
from packhorse.domain import NotificationLevel
from packhorse.notify.notifier import Notifier
from packhorse.notify.outbox import enqueue
from support import run_packhorse, write_site_config

# real `packhorse run` processes and a mail server: long (out of the default selection)
pytestmark = [pytest.mark.timeout(240), pytest.mark.long]


def test_run_until_idle_delivers_retry_and_permanent_failure_mails_before_exiting(
        tmp_path: Path, smtp_server: SmtpServer) -> None:
    site = tmp_path / "site"
    extra = toml_table("notifications", smtp_settings(
        smtp_server.port, development_mode=True, smtp={"recipients_by_level": {"DEBUG": ["dev@example.org"]}}))
    cfg = write_site_config(site, max_retries=1, extra=extra)
    (site / "source" / "cam" / "obs1").mkdir(parents=True)
    (site / "source" / "cam" / "obs1" / "a.dat").write_bytes(b"alpha")
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    faults = [{"point": "long_term_archive.write", "action": "fail", "times": 4}]
    r = run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet", env={"PACKHORSE_TEST_FAULTS": json.dumps(faults)})
    assert r.returncode == 3, r.stderr  # both archive operations failed twice: FAILED
    # nothing waits for a later notifier: both mails are there when run exits
    by_subject = {m["Subject"]: (rcpts, m) for rcpts, m in smtp_server.inbox.messages}
    retry = [s for s in by_subject if s.startswith("[packhorse] [DEV] Retry: long_term_archive ")]
    failed = [s for s in by_subject if s.startswith("[packhorse] [DEV] Permanent failure: long_term_archive ")]
    assert len(retry) == 2 and len(failed) == 2, list(by_subject)
    assert by_subject[retry[0]][0] == ["dev@example.org"]
    assert by_subject[failed[0]][0] == ["ops@example.org"]
    body = by_subject[failed[0]][1].get_payload()
    assert "Error type: RuntimeError" in body and "Traceback:" in body and "Retry count: 1" in body
    listed = json.loads(run_packhorse("notifications", "--json", "-c", str(cfg)).stdout)
    assert {n["status"] for n in listed} == {"sent"} and all(n["delivered_to"] == ["smtp"] for n in listed)


class _Hook(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802
        data = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(json.loads(data))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a: Any) -> None:
        pass


def test_apprise_url_receives_its_levels_and_is_retried_alone(tmp_path: Path, smtp_server: SmtpServer) -> None:
    _Hook.received = []
    httpd = HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    db = Database(f"sqlite:///{tmp_path / 'ops.db'}")
    db.upgrade()
    try:
        hook = f"json://127.0.0.1:{httpd.server_port}/hook"
        down = "json://127.0.0.1:9/nothing-listens"
        settings = settings_from_dict({"notifications": {
            "retry_backoff_base_seconds": 0.02, "retry_backoff_max_seconds": 0.05, "max_retries": 2,
            "apprise_urls": [hook], "apprise_urls_by_level": {"CRITICAL": [hook, down]},
            "smtp": {"host": "127.0.0.1", "port": smtp_server.port, "from_address": "p@example.org",
                     "recipients": ["ops@example.org"]}}}, environ={})

        def q(level: NotificationLevel, subject: str) -> int:
            return db.transact(lambda s: enqueue(s, level=level, event="t", subject=subject, body="b").id)

        info = q(NotificationLevel.INFO, "Service started: run on fyst")
        crit = q(NotificationLevel.CRITICAL, "Disk usage emergency: fyst-buffer at 97.0%")
        assert Notifier(settings.notifications, db).drain() == {"sent": 1, "retry": 2, "dead": 1}
        titles = [r["title"] for r in _Hook.received]
        # the working URL took each message once, although the CRITICAL one was retried twice
        assert titles == ["[packhorse] Service started: run on fyst",
                          "[packhorse] Disk usage emergency: fyst-buffer at 97.0%"]
        assert sorted(smtp_server.inbox.subjects()) == sorted(titles)
        rows = db.read(lambda s: {n.id: n for n in s.scalars(select(Notification))})
        assert rows[info].status == "sent"
        assert rows[crit].status == "dead" and "127.0.0.1:9" in (rows[crit].last_error or "")
        assert "nothing-listens" not in (rows[crit].last_error or "")  # URLs are redacted
    finally:
        httpd.shutdown()
        db.dispose()


def test_run_as_a_service_announces_start_still_alive_and_stop(tmp_path: Path, smtp_server: SmtpServer) -> None:
    import os
    import signal
    import subprocess
    import sys

    from support import SRC

    site = tmp_path / "site"
    cfg = write_site_config(site, extra=toml_table("notifications", smtp_settings(
        smtp_server.port, still_alive_interval_seconds=1)))
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "packhorse", "run", "-q", "-c", str(cfg)],
                            env={**os.environ, "PYTHONPATH": str(SRC)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        inbox = smtp_server.inbox
        inbox.wait_for(lambda: any(s.startswith("[packhorse] Service still alive: run on ") for s in inbox.subjects()))
        assert any(s.startswith("[packhorse] Service started: run on ") for s in inbox.subjects())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, proc.communicate()[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    stopped = [m for _, m in inbox.messages if m["Subject"].startswith("[packhorse] Service stopped: run on ")]
    assert len(stopped) == 1
    body = stopped[0].get_payload()
    assert "Reason: signal 15" in body and "Uptime (s): " in body
