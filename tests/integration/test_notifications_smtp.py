"""Notification delivery against a real SMTP server on loopback (aiosmtpd): recipients per
level, retry after an outage, dead letters, and a notifier killed mid-delivery."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from smtp_server import SmtpServer, free_port, smtp_server, toml_table  # noqa: F401 (fixture)
from sqlalchemy import select

from packhorse.config import settings_from_dict
from packhorse.db.models import Notification, NotificationDelivery
from packhorse.db.session import Database
from packhorse.domain import NotificationLevel
from packhorse.notify.notifier import Notifier
from packhorse.notify.outbox import enqueue
from support import SRC, write_site_config

# notifiers killed mid-delivery and restarted: long (out of the default selection)
pytestmark = [pytest.mark.timeout(180), pytest.mark.long]


@pytest.fixture
def empty_db(tmp_path: Path):
    """A migrated SQLite ops database of this test alone."""
    d = Database(f"sqlite:///{tmp_path / 'ops.db'}")
    d.upgrade()
    yield d
    d.dispose()


def notif_config(port: int, **extra: object) -> dict:
    cfg = {"development_mode": False, "retry_backoff_base_seconds": 0.05, "retry_backoff_max_seconds": 0.2,
           "poll_interval_seconds": 0.05, "lease_seconds": 2,
           "smtp": {"host": "127.0.0.1", "port": port, "from_address": "packhorse@fyst.example.org",
                    "recipients": ["ops@example.org"], "timeout_seconds": 5,
                    "recipients_by_level": {"ERROR": ["oncall@example.org", "ops@example.org"],
                                            "CRITICAL": ["director@example.org"]}}}
    cfg.update(extra)
    return cfg


def queue(db: Database, level: NotificationLevel, subject: str) -> int:
    return db.transact(lambda s: enqueue(s, level=level, event="test", subject=subject, body=f"body of {subject}",
                                         cooldown_seconds=0).id)


def rows(db: Database) -> dict[int, Notification]:
    return db.read(lambda s: {n.id: n for n in s.scalars(select(Notification))})


def test_each_level_reaches_its_recipients(empty_db: Database, smtp_server: SmtpServer) -> None:
    settings = settings_from_dict({"notifications": notif_config(smtp_server.port)}, environ={})
    ids = {lvl: queue(empty_db, lvl, f"Test {lvl.value}") for lvl in
           (NotificationLevel.INFO, NotificationLevel.ERROR, NotificationLevel.CRITICAL)}
    counts = Notifier(settings.notifications, empty_db).drain()
    assert counts == {"sent": 3}
    got = {m["Subject"]: (sorted(rcpts), m) for rcpts, m in smtp_server.inbox.messages}
    assert sorted(got) == ["[packhorse] Test CRITICAL", "[packhorse] Test ERROR", "[packhorse] Test INFO"]
    assert got["[packhorse] Test INFO"][0] == ["ops@example.org"]
    assert got["[packhorse] Test ERROR"][0] == ["oncall@example.org", "ops@example.org"]
    assert got["[packhorse] Test CRITICAL"][0] == ["director@example.org"]
    msg = got["[packhorse] Test ERROR"][1]
    assert msg["From"] == "packhorse@fyst.example.org"
    assert msg["Message-ID"].startswith(f"<packhorse.notification.{ids[NotificationLevel.ERROR]}.")
    assert msg.get_payload().strip() == "body of Test ERROR"
    assert {n.status for n in rows(empty_db).values()} == {"sent"}


def test_server_down_is_retried_and_delivered_when_it_comes_back(empty_db: Database) -> None:
    port = free_port()  # nothing listens yet: connection refused
    settings = settings_from_dict({"notifications": notif_config(port, retry_backoff_base_seconds=0.3,
                                                                 retry_backoff_max_seconds=0.6)}, environ={})
    nid = queue(empty_db, NotificationLevel.ERROR, "Permanent failure: transfer 7")
    n = Notifier(settings.notifications, empty_db)
    assert n.run_once() == {"retry": 1}
    row = rows(empty_db)[nid]
    assert (row.status, row.attempts) == ("pending", 1)
    assert "Connection refused" in (row.last_error or "") or "ConnectionRefused" in (row.last_error or "")
    assert row.next_attempt_at is not None
    server = SmtpServer(port).start()  # the server comes back
    try:
        assert n.drain() == {"sent": 1}
        assert server.inbox.subjects() == ["[packhorse] Permanent failure: transfer 7"]
    finally:
        server.stop()
    row = rows(empty_db)[nid]
    assert (row.status, row.attempts, row.last_error) == ("sent", 2, None)


def test_a_4xx_reply_is_retried_five_times_then_dead_lettered(empty_db: Database, smtp_server: SmtpServer) -> None:
    smtp_server.inbox.reject_with = "451 4.3.0 mailbox busy, try later"
    settings = settings_from_dict({"notifications": notif_config(smtp_server.port)}, environ={})
    first = queue(empty_db, NotificationLevel.ERROR, "Doomed")
    assert Notifier(settings.notifications, empty_db).drain() == {"retry": 5, "dead": 1}
    row = rows(empty_db)[first]
    assert (row.status, row.attempts) == ("dead", 6) and "451" in (row.last_error or "")


def test_a_5xx_reply_is_permanent_and_dead_letters_at_once(
        empty_db: Database, smtp_server: SmtpServer, tmp_path: Path) -> None:
    smtp_server.inbox.reject_with = "554 5.7.1 relaying denied"
    settings = settings_from_dict({"notifications": notif_config(smtp_server.port)}, environ={})
    first = queue(empty_db, NotificationLevel.ERROR, "Doomed")
    assert Notifier(settings.notifications, empty_db).drain() == {"dead": 1}
    row = rows(empty_db)[first]
    assert (row.status, row.attempts) == ("dead", 1)
    assert "554" in (row.last_error or "") and "relaying denied" in (row.last_error or "")
    assert smtp_server.inbox.messages == []
    # the retry queue goes first: a retried row is taken before an older fresh one
    smtp_server.inbox.reject_with = None
    cfg = write_site_config(tmp_path / "site", extra=toml_table("notifications", notif_config(smtp_server.port)))
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-m", "packhorse", "notifications", "--dead", "--json", "-c", str(cfg)],
                         capture_output=True, text=True, env={**env, "PACKHORSE_DATABASE__URL": str(empty_db.url)})
    assert out.returncode == 0, out.stderr
    [dead] = json.loads(out.stdout)
    assert (dead["id"], dead["status"], dead["attempts"]) == (first, "dead", 1)


def test_retried_notifications_go_before_fresh_ones(empty_db: Database, smtp_server: SmtpServer) -> None:
    settings = settings_from_dict({"notifications": notif_config(smtp_server.port, retry_backoff_base_seconds=0,
                                                                 retry_backoff_max_seconds=0)}, environ={})
    n = Notifier(settings.notifications, empty_db)
    smtp_server.inbox.reject_with = "451 try later"
    old = queue(empty_db, NotificationLevel.INFO, "older, will fail once")
    assert n.run_once(limit=1) == {"retry": 1}
    smtp_server.inbox.reject_with = None
    queue(empty_db, NotificationLevel.INFO, "fresh")
    time.sleep(0.01)
    c = n.claim_next()
    assert c is not None and c.notification_id == old


def _start_notifier(cfg: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "packhorse", "notifier", "-c", str(cfg)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("kill_at", ["notify.smtp.session", "notify.delivered"])
def test_notifier_killed_mid_delivery_delivers_after_restart(tmp_path: Path, smtp_server: SmtpServer,
                                                             kill_at: str) -> None:
    """SIGKILL a real ``packhorse notifier`` process mid-delivery, then start another one.

    ``notify.smtp.session``: killed inside the SMTP session before the message went: delivered
    exactly once after the restart. ``notify.delivered``: killed after the server accepted the
    message but before the delivery record was written — the one window at-least-once cannot
    close — it is delivered again, with the same Message-ID, so a receiver can drop it.
    """
    cfg = write_site_config(tmp_path / "site",
                            extra=toml_table("notifications", notif_config(smtp_server.port, lease_seconds=1.5)))
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    init = subprocess.run([sys.executable, "-m", "packhorse", "init", "-c", str(cfg)], env=env, capture_output=True,
                          text=True)
    assert init.returncode == 0, init.stderr
    db = Database(f"sqlite:///{tmp_path / 'site' / 'packhorse.db'}")
    try:
        nid = queue(db, NotificationLevel.ERROR, "Permanent failure: long_term_archive 17")
        marker = tmp_path / "paused"
        faults = [{"point": kill_at, "action": "pause", "seconds": 120, "marker": str(marker)}]
        first = _start_notifier(cfg, {**env, "PACKHORSE_TEST_FAULTS": json.dumps(faults)})
        try:
            deadline = time.monotonic() + 60
            while not marker.exists():
                assert first.poll() is None, first.communicate()[1]
                assert time.monotonic() < deadline, "the notifier never reached the fault point"
                time.sleep(0.05)
            # the first fault point hit is the "Service started" message (id after ours? no: ours is older)
            first.send_signal(signal.SIGKILL)
            first.wait(30)
        finally:
            if first.poll() is None:
                first.kill()
        target = "[packhorse] Permanent failure: long_term_archive 17"
        before = smtp_server.inbox.subjects().count(target)
        assert before == (1 if kill_at == "notify.delivered" else 0)
        assert rows(db)[nid].status == "pending"
        second = _start_notifier(cfg, env)
        try:
            smtp_server.inbox.wait_for(lambda: rows(db)[nid].status == "sent", timeout=60)
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(30)
        copies = [m for _, m in smtp_server.inbox.messages if m["Subject"] == target]
        if kill_at == "notify.smtp.session":
            assert len(copies) == 1
        else:
            assert len(copies) == 2 and copies[0]["Message-ID"] == copies[1]["Message-ID"]
        deliveries = db.read(lambda s: list(s.scalars(select(NotificationDelivery)
                                                      .where(NotificationDelivery.notification_id == nid))))
        assert [d.channel for d in deliveries] == ["smtp"]
        assert deliveries[0].message_id == copies[0]["Message-ID"]
        # the notifier service announced itself and its stop (reason = the signal)
        subjects = smtp_server.inbox.subjects()
        assert any(s.startswith("[packhorse] Service started: notifier on ") for s in subjects)
        stopped = [m for _, m in smtp_server.inbox.messages if m["Subject"].startswith("[packhorse] Service stopped")]
        assert stopped and "Reason: signal 15" in stopped[-1].get_payload()
        assert "Uptime (s): " in stopped[-1].get_payload()
    finally:
        db.dispose()
