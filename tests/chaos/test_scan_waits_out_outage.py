"""A scan under way when the database goes away waits it out within its lease (real processes, a
private PostgreSQL cluster, Redis): what a site cut off from the centre sees mid-scan.

The source site's worker takes the scan lease and holds at the scan's start; the server is then
stopped for 20 s (longer than a unit of work's own 8 attempts, about 6–13 s) and the scan goes
on into the outage: its first read, of the location's registrations, meets a dead connection.
What an operator checks: once the server is back, the scan that was under way registers and
packages the files within seconds, in the same task (no ``task_database_unavailable``), and its
lease is released as completed. Before, the read's driver error ended the scan at once, its
lease could not be released with the database away, and the next scan waited for that lease to
expire (40 s here, 5 minutes by default) before anything was registered.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from distributed_support import Cluster, PrivatePostgres, redis_url, wait_for, write_source
from packhorse.db.models import Operation, RawDataFile, ScanLease
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status

pytestmark = pytest.mark.slow

LEASE, HEARTBEAT, OUTAGE = 40.0, 2.0, 20.0


def test_a_scan_under_way_waits_out_a_database_outage_within_its_lease(site_config, tmp_path: Path) -> None:
    server = PrivatePostgres()
    cluster: Cluster | None = None
    db: Database | None = None
    try:
        url = server.new_database()
        config = site_config(bundle_max_wait_seconds=0.5, poll_interval_seconds=0.5, lease_timeout_seconds=LEASE,
                             heartbeat_interval_seconds=HEARTBEAT)
        write_source(config.parent / "source", groups=2, files_per_group=2, size=16 << 10)
        held, go = tmp_path / "held", tmp_path / "go"
        hold = json.dumps([{"point": "scan.started", "action": "wait_for", "marker": str(held), "path": str(go),
                            "seconds": 120, "times": 1}])
        cluster = Cluster(config, url, redis_url())
        cluster.init()
        cluster.start_worker("fyst", env={"PACKHORSE_TEST_FAULTS": hold})
        cluster.start("manager", "manager")
        wait_for(held.exists, 90, "the scan holding at its start, lease taken")
        server.stop("fast")
        go.touch()  # the scan goes on into the outage
        time.sleep(OUTAGE)
        server.start()
        back = time.monotonic()
        db = Database(url, pool_size=1, max_overflow=0)

        def built() -> bool:
            return db.read(lambda s: s.scalar(select(func.count()).select_from(Operation).where(
                Operation.kind == OperationKind.RAW_DATA_PACKAGE.value,
                Operation.status == Status.COMPLETED.value))) == 2

        wait_for(built, 60, "both packages built after the restart")
        healed = time.monotonic() - back
        registered = db.read(lambda s: s.scalar(select(func.count()).select_from(RawDataFile)))
        lease = db.read(lambda s: s.execute(select(ScanLease.completed_at, ScanLease.worked_seconds)).one())
        log = cluster.log("worker-fyst")
        print(f"scan under a {OUTAGE:.0f} s outage: packages built {healed:.1f} s after the restart")
        assert registered == 4
        # in the same scan, within seconds: not after the held lease expired (LEASE s after its
        # last renewal, which was before the outage)
        assert healed < LEASE - OUTAGE - 5, f"{healed:.1f} s after the restart: the scan waited for its own lease"
        assert "task_database_unavailable" not in log, log[-4000:]
        assert lease.completed_at is not None
        # the outage is not counted as the scan's work (its rest is measured by what it worked)
        assert lease.worked_seconds is not None and lease.worked_seconds < OUTAGE
    finally:
        if cluster is not None:
            cluster.stop_all()
        if db is not None:
            db.dispose()
        server.close()
