"""Resumable transfers with real processes: a 1 GiB bundle's transfer (the ``copy`` method;
512 MiB for the others, which resume by the same rules and would only double the suite's time)
is SIGKILLed at about 60 % and ``packhorse run`` is started again.

For the ``copy`` method and for the ``command`` method with ``rsync --partial --append-verify
{source} {partial}`` the rerun takes over the partial file the killed attempt left, verifies it
against the source, and writes less than half of the bundle again; the bundle at the destination
has the sha256 recorded at the source, the whole pipeline archives the package, ``packhorse
verify`` passes, no partial file is left, and the route's bandwidth limit held for the resumed
transfer (the source was read, prefix verification included, no faster than the limit).

The 60 % point is made deterministic by the route's bandwidth limit: the transfer cannot run
faster than the limit, and the test kills ``packhorse run`` as soon as the partial file reaches
60 % of the bundle (docs/reliability.md "Resumable transfers"; the measured numbers are in
docs/benchmarks.md "Bytes rewritten on resume").
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from chaos_helpers import context
from sqlalchemy import select

from packhorse.db.models import DataTransferPackage, PhysicalCopy, RawDataPackage
from packhorse.runtime.topology import bundle_key
from support import SRC, run_packhorse, write_site_config

GIB = 1024**3
HALF_GIB = GIB // 2
LIMIT = 96 * 1024**2  # route bandwidth limit, bytes/s: a 1 GiB transfer takes about 11 s
KILL_AT = 0.60


def _big_source(root: Path, size: int = GIB) -> tuple[str, str]:
    """One raw file of ``size`` random bytes; returns (relative path, sha256)."""
    rel = "inst/obs00/frame_00.fits"
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    block = 64 * 1024**2
    with open(p, "wb") as f:
        for _ in range(size // block):
            data = os.urandom(block)
            h.update(data)
            f.write(data)
    old = time.time() - 60
    os.utime(p, (old, old))
    return rel, h.hexdigest()


def _config(folder: Path, route_extra: str) -> Path:
    cfg = write_site_config(folder, route_extra=route_extra, bundle_target_bytes=256 * 1024**2,
                            bundle_max_wait_seconds=1, workers=2)
    text = cfg.read_text(encoding="utf-8")
    text = text.replace('destination_sites = ["cologne", "cornell"]', 'destination_sites = ["cologne"]')
    cfg.write_text(text, encoding="utf-8")
    return cfg


def _partials(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".packhorse-partial") and p.is_file()] \
        if folder.exists() else []


def _run_and_kill_at(cfg: Path, dest: Path, threshold: int, env: dict[str, str], timeout: float = 900) -> int:
    """Start ``packhorse run``, SIGKILL it once a partial file under ``dest`` holds at least
    ``threshold`` bytes; returns that partial's size just after the kill."""
    proc = subprocess.Popen([sys.executable, "-m", "packhorse", "run", "-c", str(cfg), "--until-idle", "--quiet"],
                            env={**os.environ, "PYTHONPATH": str(SRC), **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    try:
        while True:
            sizes = [p.stat().st_size for p in _partials(dest) if p.exists()]
            if sizes and max(sizes) >= threshold:
                proc.send_signal(signal.SIGKILL)
                break
            if proc.poll() is not None:
                raise AssertionError(f"packhorse run ended (exit {proc.returncode}) before the transfer reached "
                                     f"{threshold} bytes: {proc.stderr.read().decode()[-3000:] if proc.stderr else ''}")
            if time.monotonic() > deadline:
                raise AssertionError("the transfer did not reach the kill point in time")
            time.sleep(0.05)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    time.sleep(1.0)  # the worker processes die with the run (they watch it); let them go
    left = max(p.stat().st_size for p in _partials(dest))
    time.sleep(2.0)
    # killed means killed: nothing (no orphaned transfer command) writes on into the partial
    assert max(p.stat().st_size for p in _partials(dest)) == left
    return left


def _archived_payload_sha(lta: Path, rel: str) -> str:
    for tar_path in sorted(lta.rglob("*.tar")):
        with tarfile.open(tar_path) as tar:
            for m in tar:
                top, _, rest = m.name.partition("/")
                if rest == f"data/{rel}" and m.isreg():
                    f = tar.extractfile(m)
                    assert f is not None
                    h = hashlib.sha256()
                    while chunk := f.read(1 << 20):
                        h.update(chunk)
                    return h.hexdigest()
    raise AssertionError(f"{rel} is not in any archived package under {lta}")


def _resume_and_check(site: Path, cfg: Path, tmp_path: Path, rel: str, source_sha: str, size: int = GIB) -> dict:
    """Kill the transfer of a ``size``-byte source file's bundle at 60 %, rerun, check the
    outcome; returns the rerun's write record."""
    write_log = tmp_path / "writes.jsonl"
    env = {"PACKHORSE_TEST_WRITE_LOG": str(write_log)}
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    dest = site / "sites/cologne/buffer"
    left = _run_and_kill_at(cfg, dest, int(KILL_AT * size), env)
    assert KILL_AT * size <= left < 0.8 * size, left
    assert not write_log.exists()  # the killed attempt published nothing

    rerun = run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet", env=env, timeout=1200)
    assert rerun.returncode == 0, rerun.stderr[-3000:]

    ctx = context(cfg)
    try:
        with ctx.db.session() as s:
            dtp = s.scalars(select(DataTransferPackage)).one()
            key = bundle_key(dtp.name)
            records = [json.loads(line) for line in write_log.read_text().splitlines()]
            mine = [r for r in records if r["location"] == "cologne-buffer" and r["key"] == key]
            assert len(mine) == 1, records
            rec = mine[0]
            # the rerun took over the killed attempt's partial and kept all of it (verified)
            assert rec["taken_over_bytes"] >= KILL_AT * size * 0.98
            assert rec["kept_bytes"] >= KILL_AT * size * 0.98
            assert rec["kept_bytes"] + rec["written_bytes"] == dtp.size
            assert rec["written_bytes"] >= 0.2 * dtp.size  # the rerun copied the rest itself
            # the rerun wrote less than half of the bundle again (counted at the backend, and by the kernel)
            assert rec["written_bytes"] < dtp.size / 2
            assert rec["io_write_bytes"] < dtp.size / 2
            # the bandwidth limit held: the whole source was read (prefix verification included)
            assert rec["seconds"] >= 0.85 * dtp.size / LIMIT, rec
            # the copy at the destination verified against the sha256 recorded at the source
            loc_id = ctx.topology.location_ids["cologne-buffer"]
            copy = s.scalars(select(PhysicalCopy).where(PhysicalCopy.data_transfer_package_id == dtp.id,
                                                        PhysicalCopy.location_id == loc_id)).one()
            assert copy.sha256 == dtp.sha256 and copy.verified_at is not None
            bundle_file = dest / key
            if bundle_file.exists():  # not yet freed by the buffer's deletion
                h = hashlib.sha256()
                with open(bundle_file, "rb") as f:
                    while chunk := f.read(1 << 20):
                        h.update(chunk)
                assert h.hexdigest() == dtp.sha256
            pkgs = s.scalars(select(RawDataPackage)).all()
            assert pkgs and all(p.archived_at is not None for p in pkgs)
    finally:
        ctx.db.dispose()
    assert _archived_payload_sha(site / "sites/cologne/archive", rel) == source_sha
    verify = run_packhorse("verify", "-c", str(cfg), "--json")
    assert verify.returncode == 0, verify.stdout
    report = json.loads(verify.stdout)
    assert report["checked"] == report["ok"] >= 1
    assert not _partials(site)
    return rec


@pytest.fixture
def big_site(tmp_path):
    """A site folder for 1 GiB runs, removed afterwards (the disk is shared)."""
    site = tmp_path / "site"
    yield site
    shutil.rmtree(site, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_copy_transfer_killed_at_60_percent_resumes(big_site, tmp_path):
    cfg = _config(big_site, f"bandwidth_limit_bytes_per_second = {LIMIT}")
    rel, sha = _big_source(big_site / "source")
    rec = _resume_and_check(big_site, cfg, tmp_path, rel, sha)
    print(f"copy: rewritten on resume {rec}")


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed")
def test_rsync_command_transfer_killed_at_60_percent_resumes(big_site, tmp_path):
    template = "rsync --partial --append-verify --bwlimit={bandwidth_limit_kib} {source} {partial}"
    cfg = _config(big_site, f'method = "command"\ncommand = "{template}"\n'
                            f"bandwidth_limit_bytes_per_second = {LIMIT}")
    rel, sha = _big_source(big_site / "source", HALF_GIB)
    rec = _resume_and_check(big_site, cfg, tmp_path, rel, sha, HALF_GIB)
    print(f"rsync: rewritten on resume {rec}")


def _parts_requested(upload_log: Path, key: str) -> int:
    """``UploadPart`` requests of ``key`` the store has received (``--upload-log``; serialised)."""
    if not upload_log.exists():
        return 0
    return sum(1 for line in upload_log.read_text().splitlines() if line.split()[0].endswith(key))


def _parts_uploaded(client, bucket: str, key: str) -> int:  # type: ignore[no-untyped-def]
    uploads = [u for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) if u["Key"] == key]
    if not uploads:
        return 0
    return max(len(client.list_parts(Bucket=bucket, Key=key, UploadId=u["UploadId"]).get("Parts", []))
               for u in uploads)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_s3_multipart_archive_killed_at_60_percent_resumes(big_site, tmp_path):
    """The long-term archive's 512 MiB multipart upload to S3 (moto's server over HTTP) is killed
    with about 60 % of its parts uploaded; the rerun continues that upload, sends less than half
    of the package again (counted by the store), and the archived object verifies."""
    from s3_support import S3Server, s3_location, start_or_skip

    start_or_skip().stop()  # skips without moto
    upload_log = tmp_path / "uploads.log"
    server = S3Server(upload_log=str(upload_log), real_initiated_times=True)
    try:
        bucket = server.new_bucket()
        cfg = _config(big_site, "")
        text = cfg.read_text(encoding="utf-8")
        disk_block = ('[[locations]]\nname = "cologne-lta"\nsite = "cologne"\nrole = "long_term_archive"\n'
                      'path = "sites/cologne/archive"\n')
        assert disk_block in text
        cfg.write_text(text.replace(disk_block, s3_location("cologne-lta", server, bucket, prefix="lta")),
                       encoding="utf-8")
        _big_source(big_site / "source", HALF_GIB)
        assert run_packhorse("init", "-c", str(cfg)).returncode == 0
        client = server.client()
        key = "lta/raw/inst/obs00.tar"
        part = 64 * 1024**2  # the location's default multipart_part_bytes
        n_parts = -(-(HALF_GIB + 64 * 1024) // part)  # a 512 MiB payload's bag tar: 9 parts
        kill_at = round(KILL_AT * n_parts)

        proc = subprocess.Popen([sys.executable, "-m", "packhorse", "run", "-c", str(cfg), "--until-idle",
                                 "--quiet"], env={**os.environ, "PYTHONPATH": str(SRC)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 900
            # the kill point from the store's request log, not from ListParts: moto computes a
            # part's ETag (its MD5) lazily over a buffer that a concurrent ListParts reads too, and
            # keeps a wrong one when the two meet; a real store's ETags do not depend on who asks
            while _parts_requested(upload_log, key) <= kill_at:  # part kill_at + 1 arrived: kill_at are stored
                assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
                assert time.monotonic() < deadline, "the archive upload did not reach the kill point"
                time.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == -signal.SIGKILL
        time.sleep(1.0)
        before = _parts_uploaded(client, bucket, key)
        assert kill_at <= before < 0.8 * n_parts
        sent_before = len(upload_log.read_text().splitlines())

        rerun = run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet", timeout=1200)
        assert rerun.returncode == 0, rerun.stderr[-3000:]

        lines = upload_log.read_text().splitlines()[sent_before:]
        resent = sum(int(line.split()[2]) for line in lines if line.split()[0].endswith(key))
        ctx = context(cfg)
        try:
            with ctx.db.session() as s:
                pkg = s.scalars(select(RawDataPackage)).one()
                assert pkg.archived_at is not None
                assert resent < pkg.size / 2, (resent, pkg.size, rerun.stderr[-4000:])
                loc_id = ctx.topology.location_ids["cologne-lta"]
                copy = s.scalars(select(PhysicalCopy).where(PhysicalCopy.raw_data_package_id == pkg.id,
                                                            PhysicalCopy.location_id == loc_id)).one()
                assert copy.sha256 == pkg.sha256 and copy.verified_at is not None
                h = hashlib.sha256()
                body = client.get_object(Bucket=bucket, Key=key)["Body"]
                while chunk := body.read(1 << 20):
                    h.update(chunk)
                assert h.hexdigest() == pkg.sha256
        finally:
            ctx.db.dispose()
        assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
        verify = run_packhorse("verify", "-c", str(cfg), "--json")
        assert verify.returncode == 0, verify.stdout
        print(f"s3: parts before the kill {before}/{n_parts}, bytes sent again on resume {resent} "
              f"of {pkg.size} ({resent / pkg.size:.1%})")
    finally:
        server.stop()
