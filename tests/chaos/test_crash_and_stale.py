"""Crash and stale-worker scenarios with real processes.

* ``packhorse run`` SIGKILLed while a long-term archive write is in progress, then restarted:
  exactly one copy per package per archive, all verified, no partial files left.
* The same archive operation run by two processes, the first paused (SIGSTOP) past its lease
  and resumed after the second finished: one object, one COMPLETED, the stale attempt's
  writes rejected and its failure recorded as an event.
* A fault hook corrupts the destination between publish and verification: the operation
  does not complete (verification re-reads through the backend).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from chaos_helpers import context, drive_until_kind_exists, make_source, stop_outside_a_write
from sqlalchemy import select

from packhorse.db.models import FailureEvent, Operation, PhysicalCopy, RawDataPackage
from packhorse.domain import CopyStatus, OperationKind, Status
from packhorse.recovery.monitor import check_stalled
from support import SRC, run_packhorse

LTA_DIRS = ("sites/cologne/archive", "sites/cornell/archive")


def _partials(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".packhorse-partial")]


def _wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.05)


def _archived_payloads(lta: Path) -> dict[str, str]:
    """{payload path: sha256} over every bag tar in an archive folder."""
    out: dict[str, str] = {}
    for tar_path in sorted(lta.rglob("*.tar")):
        with tarfile.open(tar_path) as tar:
            for m in tar:
                top, _, rest = m.name.partition("/")
                if rest.startswith("data/") and m.isreg():
                    f = tar.extractfile(m)
                    assert f is not None
                    path = rest[len("data/"):]
                    assert path not in out, f"{path} archived twice in {lta}"
                    out[path] = hashlib.sha256(f.read()).hexdigest()
    return out


def _archive_heartbeats(cfg) -> dict[int, object]:
    ctx = context(cfg)
    try:
        with ctx.db.session() as s:
            return {o.id: o.heartbeat_at for o in s.scalars(select(Operation).where(
                Operation.kind == OperationKind.LONG_TERM_ARCHIVE.value, Operation.status == Status.IN_PROGRESS.value))}
    finally:
        ctx.db.dispose()


def _kill_mid_archive_write(cfg: Path, marker: Path) -> dict[str, bytes]:
    """Start ``packhorse run`` on a new source, SIGKILL it while a long-term archive write is in
    progress (paused by a fault hook); returns the source files."""
    site = cfg.parent
    files = make_source(site / "source")
    faults = [{"point": "long_term_archive.writing", "action": "pause", "seconds": 120, "marker": str(marker),
               "times": 1}]
    assert run_packhorse("init", "-c", str(cfg)).returncode == 0
    env = {**os.environ, "PYTHONPATH": str(SRC), "PACKHORSE_TEST_FAULTS": json.dumps(faults)}
    proc = subprocess.Popen([sys.executable, "-m", "packhorse", "run", "-c", str(cfg), "--until-idle", "--quiet"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for(marker)
        # the writer is mid-write: its partial file exists and nothing is published under its key
        assert any(_partials(site / d) for d in LTA_DIRS)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    return files


@pytest.mark.slow
def test_sigkill_during_archive_write_then_restart(site_config, tmp_path):
    cfg = site_config()
    site = cfg.parent
    files = _kill_mid_archive_write(cfg, tmp_path / "writing")
    # the run's worker processes died with it: nobody renews the paused writer's lease any more
    # (heartbeats every 0.3 s in this configuration)
    time.sleep(1.0)
    beats = _archive_heartbeats(cfg)
    time.sleep(1.5)
    assert _archive_heartbeats(cfg) == beats

    rerun = run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet")
    assert rerun.returncode == 0, rerun.stderr

    expected = {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}
    for d in LTA_DIRS:
        assert _archived_payloads(site / d) == expected
    assert not [p for p in site.rglob("*") if p.name.endswith(".packhorse-partial")]
    ctx = context(cfg)
    with ctx.db.session() as s:
        pkgs = s.scalars(select(RawDataPackage)).all()
        assert pkgs and all(p.archived_at is not None for p in pkgs)
        for lta in ("cologne-lta", "cornell-lta"):
            loc_id = ctx.topology.location_ids[lta]
            for p in pkgs:
                copies = s.scalars(select(PhysicalCopy).where(PhysicalCopy.raw_data_package_id == p.id,
                                                              PhysicalCopy.location_id == loc_id)).all()
                assert len(copies) == 1 and copies[0].status == CopyStatus.PRESENT.value
        lta_ops = s.scalars(select(Operation).where(Operation.kind == OperationKind.LONG_TERM_ARCHIVE.value)).all()
        assert len(lta_ops) == 2 * len(pkgs)
        assert all(o.status == Status.COMPLETED.value for o in lta_ops)
        # the killed attempt was found by lease recovery
        assert s.scalars(select(FailureEvent).where(FailureEvent.error_type == "Stalled")).first() is not None
    verify = run_packhorse("verify", "-c", str(cfg), "--json")
    assert verify.returncode == 0, verify.stdout
    report = json.loads(verify.stdout)
    assert report["checked"] == report["ok"] == 2 * len(pkgs)


@pytest.mark.slow
def test_a_restart_takes_over_the_killed_runs_leases_without_waiting_them_out(site_config, tmp_path):
    """``packhorse run`` killed (SIGKILL, an OOM kill, a power cut of the process) and started
    again on the same host: the operations its worker processes held are taken over at the
    restart's first recovery pass, not after their 10-minute leases expire (the holders' pids,
    in this pid namespace, no longer run: recovery.monitor.provably_gone)."""
    cfg = site_config(lease_timeout_seconds=600, heartbeat_interval_seconds=60, monitor_interval_seconds=60)
    site = cfg.parent
    files = _kill_mid_archive_write(cfg, tmp_path / "writing")
    ctx = context(cfg)
    try:
        with ctx.db.session() as s:
            held = s.scalars(select(Operation).where(Operation.status == Status.IN_PROGRESS.value)).all()
    finally:
        ctx.db.dispose()
    assert held and all(o.lease_expires_at is not None for o in held)  # leases of 600 s, far from expired

    started = time.monotonic()
    rerun = run_packhorse("run", "-c", str(cfg), "--until-idle", "--quiet", timeout=240)
    assert rerun.returncode == 0, rerun.stderr
    assert time.monotonic() - started < 120

    expected = {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}
    for d in LTA_DIRS:
        assert _archived_payloads(site / d) == expected
    ctx = context(cfg)
    try:
        with ctx.db.session() as s:
            assert all(o.status == Status.COMPLETED.value for o in s.scalars(select(Operation)))
            taken = {e.operation_id: e.message for e in s.scalars(select(FailureEvent).where(
                FailureEvent.error_type == "Stalled"))}
    finally:
        ctx.db.dispose()
    assert set(taken) == {o.id for o in held}
    assert all("taken over before it expired" in m for m in taken.values())


@pytest.mark.slow
def test_stale_worker_paused_past_its_lease(site_config, tmp_path):
    cfg = site_config(lease_timeout_seconds=2, heartbeat_interval_seconds=0.3)
    site = cfg.parent
    make_source(site / "source", groups=1, files_per_group=2, size=4 << 20)
    ctx = context(cfg)
    op_ids = drive_until_kind_exists(ctx, OperationKind.LONG_TERM_ARCHIVE)
    op_id = op_ids[0]
    marker = tmp_path / "paused"
    faults = [{"point": "long_term_archive.writing", "action": "pause", "seconds": 1.0, "marker": str(marker)}]
    env = {**os.environ, "PYTHONPATH": str(SRC), "PACKHORSE_TEST_FAULTS": json.dumps(faults)}
    first = subprocess.Popen([sys.executable, "-m", "packhorse", "run-operation", "long_term_archive", str(op_id),
                              "-c", str(cfg)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(marker)
        stop_outside_a_write(first.pid, ctx)  # stuck: no heartbeats either
        time.sleep(2.5)  # past the 2 s lease
        assert check_stalled(ctx.db, ctx.settings).reset == [op_id]  # what the monitor does
        second = run_packhorse("run-operation", "long_term_archive", str(op_id), "-c", str(cfg))
        assert second.returncode == 0 and second.stdout.strip() == "completed", second.stderr
    finally:
        os.kill(first.pid, signal.SIGCONT)
    out, errs = first.communicate(timeout=60)
    assert out.strip() == "stale", errs

    with ctx.db.session() as s:
        op = s.get(Operation, op_id)
        assert op is not None and op.status == Status.COMPLETED.value and op.attempt == 2
        events = s.scalars(select(FailureEvent).where(FailureEvent.operation_id == op_id)).all()
        assert {(e.attempt, e.error_type) for e in events} >= {(1, "Stalled"), (1, "LeaseLostError")}
        copies = s.scalars(select(PhysicalCopy).where(PhysicalCopy.raw_data_package_id == op.raw_data_package_id,
                                                      PhysicalCopy.location_id == op.destination_location_id)).all()
        assert len(copies) == 1
        lta = ctx.location_name(op.destination_location_id)
        key = copies[0].path
    backend = ctx.backend(lta)
    assert backend.sha256(key) == copies[0].sha256
    lta_root = Path(ctx.settings.location_path(lta))
    assert [p.relative_to(lta_root).as_posix() for p in lta_root.rglob("*")
            if p.is_file() and p.relative_to(lta_root).parts[0] != "_packhorse"] == [key]  # besides its identity marker


@pytest.mark.parametrize("kind, point", [(OperationKind.LONG_TERM_ARCHIVE, "long_term_archive.publishing"),
                                         (OperationKind.UNPACK, "unpack.publishing")], ids=["archive", "unpack"])
def test_bytes_damaged_between_write_and_publication_are_refused_and_nothing_is_published(
        site_config, monkeypatch, kind, point):
    cfg = site_config(max_retries=0)
    site = cfg.parent
    make_source(site / "source", groups=1, files_per_group=1, size=1 << 20)
    ctx = context(cfg)
    op_id = drive_until_kind_exists(ctx, kind)[0]
    # the archive copy's bytes, or the raw package an unpack took out of its bundle, are damaged
    # on the disk after they were written, just before they are published: the read-back before
    # publication refuses them (I4), so the write-once archive, or the buffer, never holds them
    # under the package's key (I2), and nothing is recorded or moved to quarantine
    monkeypatch.setenv("PACKHORSE_TEST_FAULTS", json.dumps([{"point": point, "action": "corrupt_partial"}]))
    from packhorse.engine.worker import Outcome, execute_operation

    assert execute_operation(ctx, op_id, "test") == Outcome.FAILED
    with ctx.db.session() as s:
        op = s.get(Operation, op_id)
        assert op is not None and op.status == Status.FAILED.value
        assert op.error_context["error_type"] == "VerificationError"
        assert "before publishing" in op.error_context["message"]
        # in the buffer the intact bundle and its copy stay; nothing else anywhere
        kept = ("_packhorse", "bundles") if kind is OperationKind.UNPACK else ("_packhorse",)
        rows = select(PhysicalCopy).where(PhysicalCopy.location_id == op.destination_location_id)
        if kind is OperationKind.UNPACK:
            rows = rows.where(PhysicalCopy.raw_data_package_id.is_not(None))
        assert s.scalars(rows).first() is None
        root = Path(ctx.settings.location_path(ctx.location_name(op.destination_location_id)))
    # nothing besides the identity marker: no raw package, published or quarantined
    assert [p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and p.relative_to(root).parts[0] not in kept] == []
