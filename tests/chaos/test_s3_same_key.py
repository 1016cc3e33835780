"""Seed 003 on S3: two workers archive the same package to the same key; the first
one got stuck *after* its last lease check, its lease expired, a second worker took the
operation over and archived the package. When the first one wakes up it publishes late.

Expected: exactly one object under the key, it verifies, the late writer's conditional
create is refused by the store (HTTP 412) and resolved as "already there" by reading the
object back, neither worker raises, and only the second attempt's completion counts.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from chaos_helpers import context, drive_until_kind_exists, make_source, stop_outside_a_write
from sqlalchemy import select
from test_crash_and_stale import _wait_for

from packhorse.db.models import FailureEvent, Operation, PhysicalCopy, RawDataPackage
from packhorse.domain import OperationKind, Status
from packhorse.recovery.monitor import check_stalled
from s3_support import bucket_objects, s3_site_config
from support import SRC, run_packhorse


@pytest.mark.slow
@pytest.mark.parametrize("write_once_probe", [True, False], ids=["conditional-create", "object-lease"])
def test_stuck_worker_publishes_late_to_the_same_key(moto_s3, tmp_path, write_once_probe):
    # moto only: the test counts the store's 412 answers in moto's request log (SeaweedFS
    # keeps none); the conditional create itself is checked on SeaweedFS by the conformance suite
    s3_server = moto_s3
    cfg, bucket = s3_site_config(tmp_path / "site", s3_server, s3_extra={"write_once_probe": write_once_probe},
                                 lease_timeout_seconds=2, heartbeat_interval_seconds=0.3)
    make_source(cfg.parent / "source", groups=1, files_per_group=2, size=2 << 20)
    ctx = context(cfg)
    lta_id = ctx.topology.location_ids["cologne-lta"]
    op_id = next(i for i in drive_until_kind_exists(ctx, OperationKind.LONG_TERM_ARCHIVE)
                 if ctx.db.read(lambda s: s.get(Operation, i).destination_location_id) == lta_id)
    marker = tmp_path / "stuck"
    faults = [{"point": "long_term_archive.publishing", "action": "pause", "seconds": 0.5, "marker": str(marker)}]
    env = {**os.environ, "PYTHONPATH": str(SRC), "PACKHORSE_TEST_FAULTS": json.dumps(faults)}
    first = subprocess.Popen([sys.executable, "-m", "packhorse", "run-operation", "long_term_archive", str(op_id),
                              "-c", str(cfg)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(marker)  # past its last lease check, about to publish
        stop_outside_a_write(first.pid, ctx)  # stuck: no heartbeats either
        time.sleep(2.5)  # past the 2 s lease
        assert check_stalled(ctx.db, ctx.settings).reset == [op_id]  # what the monitor does
        second = run_packhorse("run-operation", "long_term_archive", str(op_id), "-c", str(cfg))
        assert second.returncode == 0 and second.stdout.strip() == "completed", second.stderr
        puts_before = Path(s3_server.log.name).read_text(errors="replace").count(" 412 ")
    finally:
        os.kill(first.pid, signal.SIGCONT)
    out, errs = first.communicate(timeout=120)
    assert out.strip() == "stale", errs  # its completion is rejected by the fencing token (I3)
    assert "Traceback" not in errs and "Traceback" not in second.stderr

    with ctx.db.session() as s:
        op = s.get(Operation, op_id)
        assert op is not None and op.status == Status.COMPLETED.value and op.attempt == 2
        pkg = s.get(RawDataPackage, op.raw_data_package_id)
        assert pkg is not None
        copies = s.scalars(select(PhysicalCopy).where(PhysicalCopy.raw_data_package_id == pkg.id,
                                                      PhysicalCopy.location_id == lta_id)).all()
        assert len(copies) == 1 and copies[0].path == f"raw/{pkg.name}.tar"
        events = s.scalars(select(FailureEvent).where(FailureEvent.operation_id == op_id)).all()
        assert (1, "Stalled") in {(e.attempt, e.error_type) for e in events}
        pkg_sha, key = pkg.sha256, copies[0].path
    objects = bucket_objects(s3_server, bucket)
    assert list(objects) == [f"lta/{key}"]  # one object; no probe or partial left behind
    assert hashlib.sha256(objects[f"lta/{key}"]).hexdigest() == pkg_sha
    assert ctx.backend("cologne-lta").sha256(key) == pkg_sha
    if write_once_probe:
        # the late writer really wrote: the store refused its conditional create
        assert Path(s3_server.log.name).read_text(errors="replace").count(" 412 ") > puts_before
