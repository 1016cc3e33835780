"""End-to-end: bundles pulled between sites over SSH (``method = "sftp"``) by real ``packhorse``
processes from a private OpenSSH server (``sshd_support``: 127.0.0.1, a free port, its own host
key and ``authorized_keys`` in the test's folder).

The source site's buffer is reached at a root that only the SSH account uses (``[locations.ssh]
path``, another name for the folder): the server's log shows the bundles read there over SFTP.
Judged by the bytes in the archives (GNU tar and ``bagit``), the ops database's rows and exit
codes: the archives hold the source files' exact bytes; a link cut mid-transfer (the server and
its sessions killed, then started again) is retried and resumes from the partial, keeping its
verified prefix; an unknown host key and a key the server refuses fail the transfer at once,
never retried, naming host and fingerprint, or user and key file.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from e2e_helpers import assert_archived_everywhere, assert_clean_finish, source_files

from sshd_support import PrivateSshd, keygen
from support import SRC


@pytest.fixture
def sshd(tmp_path: Path):
    server = PrivateSshd(tmp_path / "sshd").start()
    yield server
    server.stop()


def sftp_pipeline(pipeline, sshd: PrivateSshd, tmp_path: Path, *, route: str = "", key_file: Path | None = None,
                  known_hosts: Path | None = None, **overrides):
    """A three-site pipeline whose route pulls bundles from fyst's buffer over ``sshd``."""
    p = pipeline(route_extra=f'method = "sftp"\nstreams = 3\n{route}', **overrides)
    over_ssh = tmp_path / "fyst-buffer-over-ssh"  # the root as the SSH account sees it
    over_ssh.symlink_to(p.root / "sites/fyst/buffer", target_is_directory=True)
    text = p.config.read_text()
    anchor = 'path = "sites/fyst/buffer"\nretention_seconds = 0\n'
    assert anchor in text
    text = text.replace(anchor, anchor + (
        f'[locations.ssh]\nhost = "127.0.0.1"\nport = {sshd.port}\nuser = "{sshd.user}"\n'
        f'key_file = "{key_file or sshd.client_key}"\nknown_hosts_file = "{known_hosts or sshd.known_hosts}"\n'
        f'path = "{over_ssh}"\nconnect_timeout_seconds = 5\n'))
    p.config.write_text(text)
    return p, over_ssh


def write(root: Path, rel: str, data: bytes) -> None:
    f = root / rel
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(data)
    old = time.time() - 120
    os.utime(f, (old, old))


def failures(p) -> list[tuple[str, str, int]]:
    with sqlite3.connect(p.root / "packhorse.db") as db:
        return db.execute("SELECT error_type, message, operation_id FROM failure_events ORDER BY id").fetchall()


def one_destination_transfer(pipeline, sshd: PrivateSshd, tmp_path: Path, *, size: int, limit: int,
                             backoff: tuple[float, float], faults: list[dict] | None = None):
    """A pipeline whose route pulls bundles from fyst's buffer over ``sshd`` to cologne only, at
    ``limit`` bytes/s, each operation retried up to 10 times with ``backoff`` (base, max:
    seconds), and one random file of ``size`` bytes in the source; initialized, not run.

    Returns ``(pipeline, the file's bytes, the write log, the environment of a packhorse
    process)``: the environment has ``packhorse`` importable, records every write in the
    write log and, with ``faults``, plans those faults (``PACKHORSE_TEST_FAULTS``)."""
    p, _ = sftp_pipeline(pipeline, sshd, tmp_path, route=f"bandwidth_limit_bytes_per_second = {limit}",
                         max_retries=10, retry_backoff_base_seconds=backoff[0], retry_backoff_max_seconds=backoff[1])
    text = p.config.read_text().replace('destination_sites = ["cologne", "cornell"]', 'destination_sites = ["cologne"]')
    p.config.write_text(text)
    payload = os.urandom(size)
    write(p.source, "inst/obs0/frame.fits", payload)
    p.init()
    write_log = tmp_path / "writes.jsonl"
    env = {**os.environ, "PYTHONPATH": str(SRC), "PACKHORSE_TEST_WRITE_LOG": str(write_log)}
    if faults is not None:
        env["PACKHORSE_TEST_FAULTS"] = json.dumps(faults)
    return p, payload, write_log, env


def test_bundles_are_pulled_over_ssh_and_archived_with_the_source_bytes(pipeline, sshd, tmp_path):
    p, _ = sftp_pipeline(pipeline, sshd, tmp_path, group_depth=2)
    for i in range(3):
        write(p.source, f"inst/obs{i}/frame.fits", os.urandom(3 * 1024 * 1024 + i))
        write(p.source, f"inst/obs{i}/notes.txt", f"observation {i}\n".encode())
    expected = source_files(p.source)
    p.init()
    p.run()
    assert_archived_everywhere(p, expected)
    assert_clean_finish(p.status())
    with sqlite3.connect(p.root / "packhorse.db") as db:
        done = db.execute("SELECT status, count(*) FROM operations WHERE kind = 'transfer' GROUP BY status").fetchall()
    assert done == [("COMPLETED", 2)], done  # one bundle, two destination sites
    # both destinations read the bundle through the SSH server, three streams (SFTP sessions) each
    served = sshd.served()
    assert served.count("subsystem 'sftp'") >= 2 * 3, served[-3000:]
    assert failures(p) == []
    code, report = p.verify()
    assert code == 0 and report["checked"] == report["ok"] >= 1, report


def _partials(folder: Path) -> list[Path]:
    return [q for q in folder.rglob("*") if q.name.endswith(".packhorse-partial") and q.is_file()]


def _payload_sha(archive: Path, rel: str) -> str:
    for tar_path in sorted(archive.rglob("*.tar")):
        with tarfile.open(tar_path) as tar:
            for m in tar:
                if m.name.partition("/")[2] == f"data/{rel}" and m.isreg():
                    f = tar.extractfile(m)
                    assert f is not None
                    return hashlib.sha256(f.read()).hexdigest()
    raise AssertionError(f"{rel} is not archived under {archive}")


@pytest.mark.slow
def test_a_link_cut_mid_transfer_resumes_from_the_partial(pipeline, sshd, tmp_path):
    size = 24 * 1024 * 1024
    limit = 4 * 1024 * 1024  # bytes/s: the transfer takes about 6 s, long enough to cut
    p, payload, write_log, env = one_destination_transfer(pipeline, sshd, tmp_path, size=size, limit=limit,
                                                          backoff=(0.5, 1.0))
    run = subprocess.Popen([sys.executable, "-m", "packhorse", "run", "-c", str(p.config), "--until-idle", "--quiet"],
                           cwd=p.root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dest = p.root / "sites/cologne/buffer"
    try:
        deadline = time.monotonic() + 120
        while True:  # cut the link once the partial holds 40 % of the bundle
            sizes = [q.stat().st_size for q in _partials(dest) if q.exists()] if dest.exists() else []
            if sizes and max(sizes) >= 0.4 * size:
                break
            assert run.poll() is None, run.stderr.read().decode()[-3000:] if run.stderr else ""
            assert time.monotonic() < deadline, "the transfer did not reach 40 % in time"
            time.sleep(0.05)
        sshd.cut()
        time.sleep(2.0)  # down: the attempts meanwhile fail to connect, and are retried
        cut_at = max(q.stat().st_size for q in _partials(dest))
        assert 0.4 * size <= cut_at < size  # the partial stayed on the disk
        sshd.start()
        assert run.wait(timeout=180) == 0, run.stderr.read().decode()[-3000:] if run.stderr else ""
    finally:
        if run.poll() is None:
            run.kill()
    # the cut was a retryable failure of the transfer, recorded as such
    types = [t for t, _m, _op in failures(p)]
    assert "SshConnectionError" in types and set(types) == {"SshConnectionError"}, failures(p)
    # the attempt after the cut took the partial over and kept (at least) what it held at the cut
    records = [json.loads(line) for line in write_log.read_text().splitlines()]
    mine = [r for r in records if r["location"] == "cologne-buffer" and r["key"].startswith("bundles/")]
    assert len(mine) == 1, records
    rec = mine[0]
    with sqlite3.connect(p.root / "packhorse.db") as db:
        (bundle_size, bundle_sha), = db.execute("SELECT size, sha256 FROM data_transfer_packages").fetchall()
        ops = db.execute("SELECT status FROM operations WHERE kind = 'transfer'").fetchall()
    assert ops == [("COMPLETED",)]
    assert rec["taken_over_bytes"] >= cut_at * 0.99 and rec["kept_bytes"] >= 0.4 * size, rec
    assert rec["kept_bytes"] + rec["written_bytes"] == bundle_size
    assert rec["written_bytes"] < 0.65 * bundle_size, rec  # not sent again from byte 0
    assert rec["seconds"] >= 0.85 * rec["written_bytes"] / limit, rec  # the route's limit held after the cut
    # every byte verified: the archive holds the source file's exact bytes
    assert _payload_sha(p.root / "sites/cologne/archive", "inst/obs0/frame.fits") == hashlib.sha256(payload).hexdigest()
    assert not _partials(p.root / "sites")
    assert bundle_sha


def test_an_unknown_host_key_fails_the_transfer_at_once_naming_host_and_fingerprint(pipeline, sshd, tmp_path):
    empty = tmp_path / "known_hosts_without_it"
    empty.write_text("")
    p, _ = sftp_pipeline(pipeline, sshd, tmp_path, known_hosts=empty)
    write(p.source, "inst/obs0/a.dat", b"a" * 1000)
    p.init()
    r = p.run(expect=3)
    assert "HostKeyError" in r.stderr
    events = failures(p)
    assert {t for t, _m, _op in events} == {"HostKeyError"}
    assert len(events) == len({op for _t, _m, op in events}) == 2  # one attempt per destination: never retried
    for _t, message, _op in events:
        assert "127.0.0.1" in message and str(sshd.port) in message and sshd.host_key_fingerprint() in message
    assert "Accepted publickey" not in sshd.served()  # refused before logging in
    assert p.objects("cologne-buffer") == {} and p.objects("cornell-buffer") == {}


def test_a_key_the_source_site_does_not_accept_fails_naming_user_and_key(pipeline, sshd, tmp_path):
    wrong = keygen(tmp_path / "not_authorized")
    p, _ = sftp_pipeline(pipeline, sshd, tmp_path, key_file=wrong)
    write(p.source, "inst/obs0/a.dat", b"a" * 1000)
    p.init()
    p.run(expect=3)
    events = failures(p)
    assert {t for t, _m, _op in events} == {"SshAuthenticationError"} and len(events) == 2
    for _t, message, _op in events:
        assert sshd.user in message and str(wrong) in message and "127.0.0.1" in message
    assert p.objects("cologne-buffer") == {}


def test_a_worker_that_loses_the_database_mid_transfer_keeps_its_partial_for_the_next_attempt(
        pipeline, sshd, tmp_path):
    # a site cut off from the centre for longer than a lease: its worker stops the attempt
    # (the lease could not be renewed) and removed the partial, so every such cut sent the
    # bundle again from byte 0
    size = 8 * 1024 * 1024
    limit = 4 * 1024 * 1024  # bytes/s
    p, payload, write_log, env = one_destination_transfer(
        pipeline, sshd, tmp_path, size=size, limit=limit, backoff=(0.2, 0.5),
        faults=[{"point": "transfer.writing", "action": "db_error", "times": 1}])
    r = subprocess.run([sys.executable, "-m", "packhorse", "run", "-c", str(p.config), "--until-idle", "--quiet"],
                       cwd=p.root, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "TransientDatabaseError" in [t for t, _m, _op in failures(p)], failures(p)
    records = [json.loads(line) for line in write_log.read_text().splitlines()]
    mine = [r for r in records if r["location"] == "cologne-buffer" and r["key"].startswith("bundles/")]
    assert mine and mine[-1]["taken_over_bytes"] > 0 and mine[-1]["kept_bytes"] > 0, records  # resumed, not resent
    assert _payload_sha(p.root / "sites/cologne/archive", "inst/obs0/frame.fits") == hashlib.sha256(payload).hexdigest()
    assert not _partials(p.root / "sites")


def test_run_until_idle_ends_with_exit_4_on_a_link_cut_past_its_grace_and_the_next_run_resumes(
        pipeline, sshd, tmp_path):
    """The source site's SSH server away for longer than the grace (``service_dead_after_seconds``,
    2 s here): the transfer is retried without limit, so ``run --until-idle`` used to wait for
    as long as the link stayed cut. It now ends with exit 4 once the cut link is recorded
    (notified, listed by ``status``), and the next run, with the link back, archives the bundle."""
    p, _ = sftp_pipeline(pipeline, sshd, tmp_path, retry_backoff_base_seconds=0.2, retry_backoff_max_seconds=0.5,
                         extra="service_dead_after_seconds = 2")
    p.config.write_text(p.config.read_text().replace('destination_sites = ["cologne", "cornell"]',
                                                     'destination_sites = ["cologne"]'))
    payload = os.urandom(512 * 1024)
    write(p.source, "inst/obs0/frame.fits", payload)
    p.init()
    sshd.cut()  # the link to fyst is down before the first transfer
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "packhorse", "run", "-c", str(p.config), "--until-idle", "--quiet"],
                         cwd=p.root, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 4, run.stderr[-3000:]
    assert time.monotonic() - started < 90
    assert "blocked: link fyst-buffer → cologne-buffer" in run.stderr, run.stderr[-3000:]
    [link] = [b for b in p.status()["blocked"] if b["cause"] == "link_unreachable"]
    assert link["detail"]["source"] == "fyst-buffer" and link["since"]
    with sqlite3.connect(p.root / "packhorse.db") as db:
        assert db.execute("SELECT status FROM operations WHERE kind = 'transfer'").fetchall() == [("PENDING",)]
        notes = db.execute("SELECT level, event FROM notification_outbox WHERE event LIKE 'link%' ORDER BY id").fetchall()
    assert notes == [("WARNING", "link_unreachable")]

    sshd.start()  # the link is back: the next run resumes
    p.run()
    assert _payload_sha(p.root / "sites/cologne/archive", "inst/obs0/frame.fits") == hashlib.sha256(payload).hexdigest()
    assert not [b for b in p.status()["blocked"] if b["cause"] == "link_unreachable"]
    with sqlite3.connect(p.root / "packhorse.db") as db:
        notes = db.execute("SELECT level, event FROM notification_outbox WHERE event LIKE 'link%' ORDER BY id").fetchall()
    assert notes == [("WARNING", "link_unreachable"), ("INFO", "link_reachable")]
