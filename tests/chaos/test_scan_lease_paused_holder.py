"""A scan holder that stops renewing loses the scan lease (real processes, PostgreSQL, Redis).

Two workers of the source site. The first takes the scan lease of the source location and is
then paused as a whole (SIGSTOP of its process group: a hung NFS mount, a stopped VM) before it
registered anything. What an operator checks: within about a lease the second worker's scan
takes the lease over (``scan_lease_taken_over``) and registers and packages the site's files,
while the first is still paused — registration at the site does not stop for as long as a
paused holder lives. When the first resumes, its lease is gone (fenced out): once the other
sites' workers are up, every source file is archived once at each destination with its bytes.
The seconds from the pause until both packages were built are reported (``HEAL`` line).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from distributed_support import (
    CLEAN,
    ArchiveWatch,
    Cluster,
    postgres_database,
    report_heal,
    source_digests,
    wait_for,
    write_source,
)
from packhorse.db.models import Operation, RawDataFile
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_a_paused_scan_holder_loses_the_lease_to_another_worker_of_the_site(broker: str, broker_url: str, site_config,
                                                                           tmp_path: Path) -> None:
    pg, drop = postgres_database()
    config = site_config(bundle_max_wait_seconds=0.5, poll_interval_seconds=0.5)  # 2 s leases
    write_source(config.parent / "source", groups=2, files_per_group=1, size=32 << 10)
    cluster = Cluster(config, pg, broker_url)
    cluster.init()
    watch = ArchiveWatch(config.parent)
    db = Database(pg, pool_size=1, max_overflow=0)
    marker = tmp_path / "holding"
    hold = json.dumps([{"point": "scan.started", "action": "wait_for", "path": str(tmp_path / "never"),
                        "seconds": 600, "marker": str(marker), "times": 1}])

    def count(q) -> int:  # type: ignore[no-untyped-def]
        return db.read(lambda s: s.scalar(q)) or 0

    paused = None
    try:
        first = cluster.start_worker("fyst", env={"PACKHORSE_TEST_FAULTS": hold})
        cluster.start("manager", "manager")
        wait_for(marker.exists, 90, "the first worker's scan holding the lease")
        os.killpg(first.pid, signal.SIGSTOP)  # the holder stops as a whole: no more renewals
        paused = first
        stopped = time.monotonic()  # the holder stays paused until the work is done: counted from the pause
        assert count(select(func.count()).select_from(RawDataFile)) == 0
        cluster.start_worker("fyst", name="worker-fyst-2")
        wait_for(lambda: count(select(func.count()).select_from(Operation).where(
            Operation.kind == OperationKind.RAW_DATA_PACKAGE.value,
            Operation.status == Status.COMPLETED.value)) >= 2, 120,
            "the second worker to register and package the files while the holder is paused")
        healed = time.monotonic() - stopped
        assert first.poll() is None  # still there, still paused
        second_log = cluster.log("worker-fyst-2")
        # the holder resumes (its scan goes on, fenced out) and the other sites archive everything
        (tmp_path / "never").write_text("")
        os.killpg(first.pid, signal.SIGCONT)
        paused = None
        cluster.start_worker("cologne")
        cluster.start_worker("cornell")
        cluster.wait_finished(240, packages=2, watch=watch)
    finally:
        if paused is not None:
            os.killpg(paused.pid, signal.SIGCONT)
        cluster.stop_all()
        db.dispose()
        drop()
    assert "scan_lease_taken_over" in second_log
    counts = watch.tally(source_digests(config.parent / "source"))
    report_heal("scan lease holder paused", broker, healed, counts, since="the pause (until both packages built)")
    assert counts == CLEAN, counts
