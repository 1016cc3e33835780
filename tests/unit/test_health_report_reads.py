"""``packhorse health`` and ``GET /api/health`` read the services' heartbeats once per report:
the cut-off sites are judged from the same rows as the services listed (they were read a second
time, a round trip more for every report across a long link, and a second reading that could
disagree with the first)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from sqlalchemy import event

from packhorse.config import load_config
from packhorse.db.models import ServiceHeartbeat, utcnow
from packhorse.db.session import Database
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from packhorse.status.health import health_report
from support import write_site_config


def test_the_heartbeats_are_read_once_and_a_silent_site_is_unreachable(tmp_path: Path) -> None:
    settings = load_config(write_site_config(tmp_path / "site"))
    db = Database(settings.database_url)
    db.upgrade()
    ctx = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    now = utcnow()
    silent = now - dt.timedelta(seconds=settings.recovery.service_dead_after_seconds + 30)

    def seed(s) -> None:  # type: ignore[no-untyped-def]
        s.add(ServiceHeartbeat(service="worker:cologne:elsewhere:1", kind="worker", host="elsewhere", pid=1,
                               site="cologne", started_at=silent, last_seen=silent))
        s.add(ServiceHeartbeat(service="worker:cornell:elsewhere:2", kind="worker", host="elsewhere", pid=2,
                               site="cornell", started_at=now, last_seen=now))

    db.transact(seed)
    reads: list[str] = []

    def seen(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        if "FROM service_heartbeats" in statement:
            reads.append(statement)

    event.listen(db.engine, "before_cursor_execute", seen)
    try:
        report = health_report(ctx)
    finally:
        event.remove(db.engine, "before_cursor_execute", seen)
    assert len(reads) == 1, reads
    assert [i.subject for i in report.sites_unreachable] == ["site cologne"]
    assert [(r["site"], r["alive"]) for r in report.services] == [("cornell", True), ("cologne", False)]
