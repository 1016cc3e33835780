"""A message waiting behind a busy worker is queued, not lost (real processes, Redis, PostgreSQL).

One Celery worker per destination site with a single pool process; every long-term-archive
write takes 8 s, so the archives of three packages wait in their queue for up to 16 s, far past
the reconciler's floor (3 s: the broker visibility timeout). The monitor runs its recovery cycle
every 0.2 s meanwhile. The reconciler must see, from the broker, that those messages are still
in their queue: nothing is re-dispatched, no operation's ``reconcile_count`` moves, no failure
event and no notification is written, and the run finishes with one archive copy per package
and archive.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))  # the archive checks of the e2e suite

from e2e_helpers import Pipeline, assert_archived_everywhere, assert_clean_finish, source_files  # noqa: E402

from distributed_support import Cluster, PrivateRedis, postgres_database, write_source  # noqa: E402
from packhorse.db.models import FailureEvent, Notification, Operation
from packhorse.db.session import Database
from packhorse.domain import OperationKind

pytestmark = pytest.mark.slow


def _events(log: str, event: str) -> list[dict]:
    out = []
    for line in log.splitlines():
        if f'"{event}"' in line and "{" in line:
            try:
                out.append(json.loads(line[line.index("{"):]))
            except ValueError:
                continue
    return out


def test_messages_queued_behind_a_busy_worker_are_not_reconciled(site_config, cli, tmp_path: Path) -> None:
    pg, drop = postgres_database()
    redis = PrivateRedis()
    config = site_config(bundle_max_wait_seconds=0.5, poll_interval_seconds=0.5)
    write_source(config.parent / "source", groups=3, files_per_group=1, size=64 << 10)
    slow = json.dumps([{"point": "long_term_archive.writing", "action": "pause", "seconds": 8}])
    cluster = Cluster(config, pg, redis.url, visibility_timeout=3, env={"PACKHORSE_TEST_FAULTS": slow})
    cluster.init()
    try:
        for site in ("fyst", "cologne", "cornell"):
            cluster.start_worker(site, concurrency=1)
        cluster.start("manager", "manager")
        cluster.start("monitor", "monitor")
        st = cluster.wait_finished(240, packages=3)
    finally:
        cluster.stop_all()
        redis.close()
    try:
        assert_clean_finish(st)
        assert_archived_everywhere(Pipeline(config, cli, tmp_path / "x"), source_files(config.parent / "source"))
        db = Database(pg, pool_size=1, max_overflow=0)
        try:
            ops = db.read(lambda s: [(o.id, o.kind, o.reconcile_count, o.attempt) for o in s.scalars(select(Operation))])
            events = db.read(lambda s: [(e.kind, e.error_type) for e in s.scalars(select(FailureEvent))])
            notes = db.read(lambda s: [(n.event, n.subject) for n in s.scalars(select(Notification))])
        finally:
            db.dispose()
    finally:
        drop()
    monitor_log = cluster.log("monitor")
    assert [o for o in ops if o[2] != 0] == [], "queued messages were counted as lost (reconcile_count)"
    assert _events(monitor_log, "reconciler_redispatched") == []
    assert [o for o in ops if o[1] == OperationKind.LONG_TERM_ARCHIVE.value and o[3] != 1] == []  # one attempt each
    assert events == []
    assert [n for n in notes if n[0] == "reconcile_cap"] == [], notes
    # the archives really waited in their queue past the floor while the monitor looked at them
    waited = {i for e in _events(monitor_log, "reconciler_still_queued")
              if e.get("operation_kind") == OperationKind.LONG_TERM_ARCHIVE.value for i in e["operation_ids"]}
    assert waited, f"no archive waited past the floor in its queue (test not exercised):\n{monitor_log[-3000:]}"
