"""What an operator gets from notifications, with a real SMTP server (aiosmtpd) and real
processes: a permanent failure says what, where, why and what to do next; ten failures of one
cause are one digest; repeats after it are reported when the cooldown ends; an unreachable
server holds neither ``run --until-idle`` nor a stopping ``packhorse notifier``; a private CA."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from smtp_server import SilentServer, SmtpServer, smtp_server, smtp_settings, toml_table  # noqa: F401 (fixture)
from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.config import settings_from_dict
from packhorse.db.models import Notification, Site
from packhorse.db.session import Database
from packhorse.domain import OperationKind
from packhorse.engine.outcome import record_failure
from packhorse.errors import DestinationWriteError
from packhorse.notify.notifier import Notifier
from packhorse.operations.lifecycle import claim, create_operation, dedup_key
from support import SRC, run_packhorse, write_site_config

# real `packhorse run` processes waiting on mail servers: long (out of the default selection)
pytestmark = [pytest.mark.timeout(240), pytest.mark.long]


@pytest.fixture
def empty_db(tmp_path: Path):
    """A migrated SQLite ops database of this test alone."""
    d = Database(f"sqlite:///{tmp_path / 'ops.db'}")
    d.upgrade()
    yield d
    d.dispose()


def _text(mail: Any) -> str:
    """The decoded text of a received mail (long lines arrive quoted-printable)."""
    return mail.get_payload(decode=True).decode("utf-8")


def _outbox(db: Database) -> list[Notification]:
    return db.read(lambda s: list(s.scalars(select(Notification).order_by(Notification.id))))


def test_a_permanent_failure_says_what_where_why_and_the_commands(tmp_path: Path, smtp_server: SmtpServer) -> None:
    site = tmp_path / "site"
    cfg = write_site_config(site, max_retries=0, extra=toml_table("notifications", smtp_settings(smtp_server.port)))
    (site / "source" / "cam" / "obs1").mkdir(parents=True)
    (site / "source" / "cam" / "obs1" / "a.dat").write_bytes(b"alpha")
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    faults = [{"point": "long_term_archive.write", "action": "fail", "times": 1}]
    r = run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet", env={"PACKHORSE_TEST_FAULTS": json.dumps(faults)})
    assert r.returncode == 3, r.stderr
    mails = [(r_, m) for r_, m in smtp_server.inbox.messages if "Permanent failure" in m["Subject"]]
    assert mails, smtp_server.inbox.subjects()
    rcpts, mail = mails[0]  # one per archive that failed (each worker process counts its faults)
    assert rcpts == ["ops@example.org"]
    op_id = int(mail["Subject"].rsplit(" ", 1)[1])
    body = _text(mail)
    # what
    assert f"What failed: long_term_archive operation {op_id} of package cam/obs1 failed permanently" in body
    # where
    assert "Package: cam/obs1" in body
    assert "Site: cologne" in body or "Site: cornell" in body
    dest = "cologne-lta" if "Destination location: cologne-lta" in body else "cornell-lta"
    assert f"Destination location: {dest}" in body
    assert "Source location: " in body and "Key: " in body and "Host: " in body and f"Host: {dest}" not in body
    # why
    assert "Error type: RuntimeError" in body and "Error: " in body
    # what next, the exact commands
    assert f"packhorse diagnose long_term_archive {op_id}" in body
    assert "packhorse diagnose --package cam/obs1" in body
    assert f'packhorse reset long_term_archive {op_id} --reason "<what you fixed>"' in body
    assert "Traceback:" in body
    # and the commands it names work as written
    d = run_packhorse("diagnose", "long_term_archive", str(op_id), "-c", str(cfg))
    assert d.returncode == 1 and "RuntimeError" in d.stdout + d.stderr
    # the outbox shows the message as it was delivered, not only its subject
    listed = json.loads(run_packhorse("notifications", "--json", "-c", str(cfg)).stdout)
    [nid] = [n["id"] for n in listed if n["operation_id"] == op_id and n["event"] == "permanent_failure"]
    shown = run_packhorse("notifications", "--show", str(nid), "-c", str(cfg))
    assert shown.returncode == 0, shown.stderr
    assert f"subject: {mail['Subject']}" in shown.stdout and "delivered to smtp" in shown.stdout, shown.stdout
    assert f'packhorse reset long_term_archive {op_id} --reason "<what you fixed>"' in shown.stdout
    assert [line for line in shown.stdout.splitlines() if line.startswith("What failed: ")] == \
        [line for line in body.splitlines() if line.startswith("What failed: ")]
    full = json.loads(run_packhorse("notifications", "--show", str(nid), "--json", "-c", str(cfg)).stdout)
    assert full["body"].splitlines()[0] in body and full["id"] == nid
    missing = run_packhorse("notifications", "--show", "99999", "-c", str(cfg))
    assert missing.returncode == 1 and "no notification with id 99999" in missing.stderr, missing.stderr


def _failing_ops(db: Database, n: int) -> list[int]:
    def tx(s: Session) -> list[int]:
        s.add(Site(name="cologne"))
        s.flush()
        sid = s.scalar(select(Site.id))
        out = []
        for i in range(n):
            op = create_operation(s, kind=OperationKind.LONG_TERM_ARCHIVE,
                                  dedup_key=dedup_key(OperationKind.LONG_TERM_ARCHIVE, f"pkg{i}"), site_id=sid,
                                  max_retries=0)
            assert op is not None
            out.append(op.id)
        return out

    return db.transact(tx)


def _disk_full(db: Database, op_id: int, i: int, *, cooldown: float, gather: float) -> None:
    c = claim(db, op_id, f"w{i}", 30)
    assert c is not None
    key = f"raw/cam/obs{i}.tar"
    exc = DestinationWriteError(f"cologne-lta: writing {key!r} failed after {1000 + i * 37:,} bytes, the file system "
                                "is full: No space left on device (partial file removed)",
                                step="write", side="destination", path=key, host="cologne-lta",
                                diagnosis="data location cologne-lta is out of space")
    record_failure(db, c, exc, backoff_base=0, backoff_max=0, notification_cooldown_seconds=cooldown,
                   notification_gather_seconds=gather)


def test_ten_failures_of_one_cause_are_one_digest_and_later_ones_come_when_the_cooldown_ends(
        empty_db: Database, smtp_server: SmtpServer) -> None:
    settings = settings_from_dict({"notifications": smtp_settings(smtp_server.port)}, environ={})
    notifier = Notifier(settings.notifications, empty_db)
    ops = _failing_ops(empty_db, 13)
    cooldown = 4.0
    for i, op_id in enumerate(ops[:10]):
        _disk_full(empty_db, op_id, i, cooldown=cooldown, gather=1.0)
    assert len(_outbox(empty_db)) == 1
    notifier.drain()
    [first] = smtp_server.inbox.messages
    sent_at = time.monotonic()
    mail = first[1]
    assert " ".join(mail["Subject"].split()) == "[packhorse] Permanent failure x10 (long_term_archive): DestinationWriteError at cologne-lta"
    body = _text(mail)
    for i, op_id in enumerate(ops[:10]):
        assert f"  long_term_archive {op_id}  key raw/cam/obs{i}.tar" in body
    assert "Diagnosis: data location cologne-lta is out of space" in body
    assert 'packhorse reset long_term_archive --all-failed --reason "<what you fixed>"' in body
    # three more of the same cause inside the window: nothing now, one follow-up at its end
    for i, op_id in enumerate(ops[10:], start=10):
        _disk_full(empty_db, op_id, i, cooldown=cooldown, gather=1.0)
    assert notifier.run_once() == {}
    assert len(smtp_server.inbox.messages) == 1
    notifier.drain()
    assert len(smtp_server.inbox.messages) == 2
    assert time.monotonic() - sent_at >= cooldown - 1.5  # the window began when the digest was due
    follow = smtp_server.inbox.messages[1][1]
    assert " ".join(follow["Subject"].split()) == "[packhorse] Permanent failure x3 (long_term_archive): DestinationWriteError at cologne-lta"
    assert "since the last message about it" in _text(follow)


def test_run_until_idle_returns_within_seconds_when_the_mail_server_does_not_answer(tmp_path: Path) -> None:
    silent = SilentServer()
    try:
        site = tmp_path / "site"
        notifications = smtp_settings(silent.port, until_idle_delivery_seconds=2, digest_gather_seconds=30,
                                      smtp={"timeout_seconds": 120})
        cfg = write_site_config(site, max_retries=0, extra=toml_table("notifications", notifications))
        (site / "source" / "cam" / "obs1").mkdir(parents=True)
        (site / "source" / "cam" / "obs1" / "a.dat").write_bytes(b"alpha")
        assert run_packhorse("init", "-c", str(cfg)).returncode == 0
        faults = [{"point": "long_term_archive.write", "action": "fail", "times": 2}]
        t0 = time.monotonic()
        r = run_packhorse("run", "-c", str(cfg), "--until-idle",  # not --quiet: that leaves only errors
                          env={"PACKHORSE_TEST_FAULTS": json.dumps(faults)})
        took = time.monotonic() - t0
        assert r.returncode == 3, r.stderr
        assert took < 30, took  # one SMTP timeout alone is 120 s
        assert silent.accepted >= 1  # it did try
        assert "notification(s) still queued in the outbox" in r.stderr
        listed = json.loads(run_packhorse("notifications", "--json", "-c", str(cfg)).stdout)
        failures = [n for n in listed if n["event"] == "permanent_failure"]
        assert failures and all(n["status"] == "pending" and n["attempts"] <= 1 for n in failures)
        assert f"{len([n for n in listed if n['status'] == 'pending'])} notification(s)" in r.stderr
    finally:
        silent.close()


@pytest.mark.parametrize("notifications", [None, {"enabled": False, "apprise_urls": ["json://127.0.0.1:9/"]}],
                         ids=["no-channel", "disabled"])
def test_run_until_idle_without_a_channel_says_nothing_can_send_the_notifications(
        tmp_path: Path, notifications: dict[str, Any] | None) -> None:
    # no channel, or notifications disabled: "the next run delivers them" would be false; the
    # line says why they stay
    site = tmp_path / "site"
    extra = toml_table("notifications", notifications) if notifications else ""
    cfg = write_site_config(site, max_retries=0, extra=extra)
    (site / "source" / "cam" / "obs1").mkdir(parents=True)
    (site / "source" / "cam" / "obs1" / "a.dat").write_bytes(b"alpha")
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    faults = [{"point": "long_term_archive.write", "action": "fail", "times": 2}]
    r = run_packhorse("run", "-c", str(cfg), "--until-idle", env={"PACKHORSE_TEST_FAULTS": json.dumps(faults)})
    assert r.returncode == 3, r.stderr
    assert "not sent: notifications are disabled or no channel is configured" in r.stderr, r.stderr[-2000:]
    assert "delivers them" not in r.stderr
    listed = json.loads(run_packhorse("notifications", "--json", "-c", str(cfg)).stdout)
    assert any(n["event"] == "permanent_failure" and n["status"] == "pending" for n in listed)
    # the outbox does not promise attempts that no notifier makes: kept, not "next attempt at"
    why = "no notification channel is configured" if notifications is None else "notifications are disabled"
    pending = [n for n in listed if n["status"] == "pending"]
    assert all(n["next_attempt_at"] is None and n["kept_because"].startswith(why) for n in pending), pending
    text = run_packhorse("notifications", "-c", str(cfg), env={"COLUMNS": "250"})
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"{why} (") and f"the {len(pending)} waiting notification(s) are kept in the " \
        "outbox, not sent" in text.stdout, text.stdout
    rows = [line for line in text.stdout.splitlines() if "permanent" in line.lower() or "│ kept" in line]
    assert rows and all("│ pending" not in line for line in rows), text.stdout


def test_notifier_stops_within_five_seconds_of_sigterm_mid_delivery(tmp_path: Path) -> None:
    silent = SilentServer()
    try:
        cfg = write_site_config(tmp_path / "site", extra=toml_table("notifications", smtp_settings(
            silent.port, smtp={"timeout_seconds": 120})))
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        assert run_packhorse("init", "-c", str(cfg)).returncode == 0
        proc = subprocess.Popen([sys.executable, "-m", "packhorse", "notifier", "-c", str(cfg)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while silent.accepted == 0:  # it is inside an SMTP session the server never answers
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline
                time.sleep(0.05)
            time.sleep(0.5)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
            stopped_in = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
        assert stopped_in < 5.0, stopped_in
        db = Database(f"sqlite:///{tmp_path / 'site' / 'packhorse.db'}")
        try:
            rows = {n.event: n for n in _outbox(db)}
            assert rows["service_started"].status == "pending"  # not lost: the next notifier sends it
            assert rows["service_stopped"].status == "pending" and "signal 15" in rows["service_stopped"].body
        finally:
            db.dispose()
    finally:
        silent.close()


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"openssl cannot make a test certificate: {r.stderr[-200:]}")
    return cert, key


def test_starttls_with_a_private_ca_file(empty_db: Database, tmp_path: Path) -> None:
    import ssl

    from aiosmtpd.controller import Controller
    from smtp_server import Inbox, free_port

    from packhorse.domain import NotificationLevel
    from packhorse.notify.outbox import enqueue

    cert, key = _self_signed(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(str(cert), str(key))
    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port, tls_context=tls, require_starttls=True)
    controller.start()
    try:
        def queue(subject: str) -> None:
            empty_db.transact(lambda s: enqueue(s, level=NotificationLevel.ERROR, event="t", subject=subject, body="b",
                                                cooldown_seconds=0))

        without = settings_from_dict({"notifications": smtp_settings(port, smtp={"starttls": True})}, environ={})
        queue("no ca file")
        assert Notifier(without.notifications, empty_db).drain() == {"dead": 1}  # permanent: never retried
        [row] = _outbox(empty_db)
        assert "ca_file" in (row.last_error or "") and "certificate" in (row.last_error or "")
        with_ca = settings_from_dict({"notifications": smtp_settings(port, smtp={"starttls": True,
                                                                               "ca_file": str(cert)})}, environ={})
        queue("with the private ca")
        assert Notifier(with_ca.notifications, empty_db).drain() == {"sent": 1}
        assert inbox.subjects() == ["[packhorse] with the private ca"]
    finally:
        controller.stop()


def test_ca_file_must_exist_and_needs_tls(tmp_path: Path) -> None:
    from packhorse.errors import ConfigError

    with pytest.raises(ConfigError, match="ca_file"):
        settings_from_dict({"notifications": smtp_settings(25, smtp={"starttls": True,
                                                                     "ca_file": str(tmp_path / "nope.pem")})},
                           environ={})
    with pytest.raises(ConfigError, match="ca_file"):
        settings_from_dict({"notifications": smtp_settings(25, smtp={"ca_file": str(tmp_path)})}, environ={})


def test_a_flush_waits_for_a_retry_falling_due_within_its_budget(empty_db: Database, smtp_server: SmtpServer) -> None:
    """The end of ``run --until-idle``: the notifier thread's delivery was just aborted by the
    stop, so that row is due again a moment later; the flush delivers it rather than leaving it."""
    import datetime as dt

    from packhorse.db.models import utcnow
    from packhorse.domain import NotificationLevel
    from packhorse.notify.outbox import enqueue

    def queue(s: Session) -> None:
        row = enqueue(s, level=NotificationLevel.ERROR, event="t", subject="aborted once", body="b", cooldown_seconds=0)
        assert row is not None
        row.attempts, row.next_attempt_at = 1, utcnow() + dt.timedelta(seconds=0.5)

    empty_db.transact(queue)
    settings = settings_from_dict({"notifications": smtp_settings(smtp_server.port)}, environ={})
    counts = Notifier(settings.notifications, empty_db).flush(5.0)
    assert counts == {"sent": 1, "queued": 0}
    assert smtp_server.inbox.subjects() == ["[packhorse] aborted once"]
