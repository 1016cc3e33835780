"""A database outage longer than a unit of work's own retries (8 attempts, about 6–13 s) costs
neither a lease nor a stall (docs/recovery.md "Layer 2", issue "Nothing stuck in silence" item 5).

Real processes on a private PostgreSQL cluster — ``packhorse run`` (embedded executor, worker
processes), and for the hand-back also Celery workers, a manager and a monitor (distributed:
both executors take the same path) — with a short lease: a long-term-archive write is held at its first chunk, the server is stopped, the
write goes on and reaches its completion with the database away:

* ``continues``: lease 30 s, heartbeat 2 s (the worker may go on for 27 s without a renewal), an
  outage of about 16 s: the completion waits for the database and commits once it is back;
* ``handed_back``: lease 30 s, heartbeat 10 s (it stops after 15 s without a renewal), an outage
  of about 17 s: the worker stops before its lease could look expired and, as soon as the
  database answers, hands the operation back (fenced, a failure event saying why, no stall),
  where it is run again at once.

Either way the operation held during the outage is completed within seconds of the restart,
long before its lease (30 s from its claim) would have run out and the monitor could take it;
no stall is counted on any operation or breaker; every file is archived once everywhere. The
seconds from the restart until the held operations completed are reported (``HEAL`` line) with
the source files lost, duplicated or corrupt and the archive objects overwritten, counted from
the archives' bytes (all 0). Before the fix the completion gave up after its 8 attempts, left the operation ``IN_PROGRESS`` until
its lease expired, and the monitor counted a stall.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))  # the archive checks of the e2e suite

from e2e_helpers import Pipeline, assert_archived_everywhere, assert_clean_finish, source_files  # noqa: E402

from distributed_support import (  # noqa: E402
    CLEAN,
    ArchiveWatch,
    Cluster,
    PrivatePostgres,
    rabbitmq_vhost,
    redis_url,
    report_heal,
    source_digests,
    wait_for,
    write_source,
)
from packhorse.db.models import CircuitBreaker, FailureEvent, Operation
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status
from support import SRC

pytestmark = pytest.mark.slow

LEASE = 30.0


@pytest.mark.parametrize("executor, case, heartbeat, outage, broker", [
    ("embedded", "continues", 2.0, 16.0, "none"), ("embedded", "handed_back", 10.0, 17.0, "none"),
    ("celery", "handed_back", 10.0, 17.0, "redis"), ("celery", "handed_back", 10.0, 17.0, "rabbitmq")])
def test_a_database_restart_costs_no_lease_and_no_stall(executor: str, case: str, heartbeat: float, outage: float,
                                                         broker: str, site_config, cli, tmp_path: Path) -> None:
    server = PrivatePostgres()
    delete_vhost = None
    run: subprocess.Popen[str] | None = None
    cluster: Cluster | None = None
    db: Database | None = None
    try:
        url = server.new_database()
        config = site_config(bundle_max_wait_seconds=0.5, poll_interval_seconds=0.5, lease_timeout_seconds=LEASE,
                             heartbeat_interval_seconds=heartbeat, monitor_interval_seconds=0.5)
        write_source(config.parent / "source", groups=1, files_per_group=1, size=256 << 10)
        held, go = tmp_path / "held", tmp_path / "go"
        # the first archive write of each worker process waits at its first chunk until `go`
        faults = json.dumps([{"point": "long_term_archive.writing", "action": "wait_for", "marker": str(held),
                              "path": str(go), "seconds": 120, "unless_exists": str(go)}])
        env = {"PACKHORSE_DATABASE__URL": url, "PACKHORSE_TEST_FAULTS": faults}
        p = Pipeline(config, cli, tmp_path / "scratch")
        expected = source_files(p.source)
        watch = ArchiveWatch(config.parent)
        if executor == "celery":
            if broker == "redis":
                broker_url = redis_url()
            else:
                broker_url, delete_vhost = rabbitmq_vhost()
            cluster = Cluster(config, url, broker_url, env=env)
            cluster.init()
            env = {k: v for k, v in cluster.env.items() if k.startswith("PACKHORSE_")}
            cluster.start_all(monitor=True)
        else:
            r = p.cli("init", env=env)
            assert r.returncode == 0, r.stderr
            log = (tmp_path / "run.log").open("w")
            run = subprocess.Popen([sys.executable, "-m", "packhorse", "run", "--until-idle", "-c", str(config)],
                                   cwd=config.parent, stdout=log, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, "PYTHONPATH": str(SRC), **env})
        db = Database(url, pool_size=1, max_overflow=0)
        wait_for(held.exists, 60, "an archive write in flight")
        watch.look()
        held_ops: dict[int, int] = dict(db.read(lambda s: s.execute(select(Operation.id, Operation.attempt).where(
            Operation.kind == OperationKind.LONG_TERM_ARCHIVE.value,
            Operation.status == Status.IN_PROGRESS.value)).all()))
        assert held_ops
        db.dispose()
        server.stop("fast")  # every connection dropped, the server gone
        go.touch()  # the write goes on and meets the outage at its completion
        time.sleep(outage)
        server.start()
        back = time.monotonic()
        # the operation held during the outage is done within seconds of the restart, long
        # before its lease (LEASE s from its claim, which was `outage` s ago) could run out
        wait_for(lambda: db.read(lambda s: s.scalar(select(func.count()).select_from(Operation).where(
            Operation.id.in_(held_ops), Operation.status == Status.COMPLETED.value))) == len(held_ops),
                 LEASE, f"long_term_archive {sorted(held_ops)} completed after the restart")
        healed = time.monotonic() - back
        print(f"{executor} {case}: outage {outage:.0f} s, long_term_archive {sorted(held_ops)} completed "
              f"{healed:.1f} s after the restart")
        assert healed < LEASE - outage - 3, f"{case}: {healed:.1f} s after the restart: it waited for its lease"
        if cluster is not None:
            cluster.wait_finished(120, packages=1, watch=watch)
            dead = {n: pr.returncode for n, pr in cluster.procs.items() if pr.poll() is not None}
            assert not dead, f"services died instead of recovering: {dead}"
        else:
            assert run is not None and run.wait(120) == 0, (tmp_path / "run.log").read_text()[-6000:]
            run = None

        def facts(s):  # type: ignore[no-untyped-def]
            events = s.execute(select(FailureEvent.operation_id, FailureEvent.attempt, FailureEvent.error_type,
                                      FailureEvent.will_retry)).all()
            stalls = s.scalar(select(func.coalesce(func.sum(Operation.stall_count), 0)))
            breakers = s.scalar(select(func.coalesce(func.sum(CircuitBreaker.stall_count), 0)))
            attempts = dict(s.execute(select(Operation.id, Operation.attempt).where(Operation.id.in_(held_ops))).all())
            return events, stalls, breakers, attempts

        events, stalls, breakers, final = db.read(facts)
        assert stalls == 0 and breakers == 0, f"{case}: a stall was counted: {stalls}, breakers {breakers}"
        assert [e for e in events if e.error_type == "Stalled"] == [], events
        if case == "continues":
            assert events == [] and final == held_ops, f"the attempts should have gone on: {events}"
        else:
            # each handed back once, saying why, then run again at once (the next attempt)
            assert sorted((e.operation_id, e.attempt, e.error_type, e.will_retry) for e in events) == sorted(
                (i, a, "TransientDatabaseError", True) for i, a in held_ops.items()), events
            assert final == {i: a + 1 for i, a in held_ops.items()}
        assert_clean_finish(_status(p, env))
        assert_archived_everywhere(p, expected)
        counts = watch.tally(source_digests(p.source))
        report_heal(f"PostgreSQL outage {outage:.0f} s, write {case.replace('_', ' ')}",
                    broker if executor == "celery" else "embedded", healed, counts,
                    since="the restart (until the held operation completed)")
        assert counts == CLEAN, counts
    finally:
        if cluster is not None:
            cluster.stop_all()
        if run is not None:
            run.kill()
            run.wait(30)
        if db is not None:
            db.dispose()
        server.close()
        if delete_vhost is not None:
            delete_vhost()


def _status(p: Pipeline, env: dict[str, str]) -> dict:  # type: ignore[type-arg]
    r = p.cli("status", "--json", env=env)
    assert r.returncode in (0, 4), r.stderr
    return json.loads(r.stdout)
