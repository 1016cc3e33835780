"""Every query ``packhorse run`` makes on a growing table is an index search.

The managers derive all work from the database every cycle; a query that reads a whole table
that grows with the archive (files, packages, bundles, copies, operations, ...) makes each
cycle cost O(archive size), and the whole run O(n²): before migration 0007 the deletion manager
scanned ``operations`` once per buffer copy, the packaging stage scanned ``raw_data_files``
once per package and the packaging manager read the whole backlog once per group. This test
runs the embedded pipeline on SQLite, records every statement it executes and asks SQLite
for each one's query plan: none may ``SCAN`` (read in full) one of those tables.
"""

from __future__ import annotations

import os
import re
import sqlite3
from typing import Any

from sqlalchemy import event, func, select

from packhorse.db.models import RawDataPackage
from packhorse.executors.local import LocalRunner
from packhorse.runtime.context import ProcessContext
from support import write_settled

#: tables whose rows grow with the data archived (or kept for days): never read in full by a run
GROWING = {"raw_data_files", "raw_data_packages", "data_transfer_packages", "physical_copies", "operations",
           "failure_events", "notification_outbox", "notification_deliveries", "disk_usage_samples",
           "skipped_files", "audit_log", "object_leases", "live_checks"}


def test_a_run_reads_no_growing_table_in_full(pipeline_ctx: ProcessContext) -> None:
    ctx = pipeline_ctx
    statements: dict[str, Any] = {}

    @event.listens_for(ctx.db._engine, "before_cursor_execute")
    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if not executemany and statement.lstrip().split(None, 1)[0].upper() in {"SELECT", "UPDATE", "DELETE",
                                                                                  "INSERT", "WITH"}:
            statements.setdefault(statement, parameters)

    source = ctx.settings.location_path("fyst-source")
    for g in range(3):
        for i in range(4):
            write_settled(source / "night-1" / f"obs-{g}" / f"frame-{i}.dat", os.urandom(100 + i))
    write_settled(source / "top.txt", b"shallower than group_depth")
    LocalRunner(ctx).run(until_idle=True)
    # late files in a packaged group: a suffixed package (the name lookups), and every stage again
    write_settled(source / "night-1" / "obs-0" / "late.dat", b"late")
    LocalRunner(ctx).run(until_idle=True)
    event.remove(ctx.db._engine, "before_cursor_execute", capture)
    names = ctx.db.read(lambda s: set(s.scalars(select(RawDataPackage.name))))
    assert "night-1/obs-0+2" in names
    assert ctx.db.read(lambda s: s.scalar(select(func.count()).select_from(RawDataPackage)
                                          .where(RawDataPackage.archived_at.is_(None)))) == 0

    scans: list[str] = []
    con = sqlite3.connect(ctx.settings.database_url[len("sqlite:///"):])
    try:
        for statement, parameters in statements.items():
            for row in con.execute("EXPLAIN QUERY PLAN " + statement, parameters or ()):
                m = re.match(r"SCAN (\w+)", row[3])
                if m and m.group(1) in GROWING:
                    scans.append(f"{row[3]}\n    in: {' '.join(statement.split())[:400]}")
    finally:
        con.close()
    assert len(statements) > 50  # the whole pipeline ran through this engine
    assert not scans, "full table scans:\n" + "\n".join(scans)


def test_the_dashboards_queries_read_no_growing_table_in_full(pipeline_ctx: ProcessContext) -> None:
    """The charts' history, the backlog sample, failures by cause and "where is my file" run on
    every dashboard refresh or search: index searches too (migration 0008 adds what they need)."""
    from packhorse.actions.failure_groups import failure_groups
    from packhorse.status.history import history, record_backlog
    from packhorse.status.locate import locate

    ctx = pipeline_ctx
    source = ctx.settings.location_path("fyst-source")
    for i in range(3):
        write_settled(source / "night-1" / "obs-0" / f"frame-{i}.dat", os.urandom(100 + i))
    LocalRunner(ctx).run(until_idle=True)
    statements: dict[str, Any] = {}

    @event.listens_for(ctx.db._engine, "before_cursor_execute")
    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if not executemany:
            statements.setdefault(statement, parameters)

    record_backlog(ctx.db, interval_seconds=60, keep_days=7)
    ctx.db.read(lambda s: history(s, ctx.settings, minutes=60))
    ctx.db.read(failure_groups)
    for q in ("night-1/obs-0", "night-1/obs-0/frame-1.dat", "night-1", "fyst-source:night-1/obs-0/frame-0.dat"):
        assert ctx.db.read(lambda s: locate(s, q, settings=ctx.settings))["matched"], q
    event.remove(ctx.db._engine, "before_cursor_execute", capture)
    scans: list[str] = []
    con = sqlite3.connect(ctx.settings.database_url[len("sqlite:///"):])
    try:
        for statement, parameters in statements.items():
            if statement.lstrip().split(None, 1)[0].upper() not in {"SELECT", "UPDATE", "DELETE", "WITH"}:
                continue
            for row in con.execute("EXPLAIN QUERY PLAN " + statement, parameters or ()):
                m = re.match(r"SCAN (\w+)", row[3])
                if m and m.group(1) in GROWING | {"backlog_samples"}:
                    scans.append(f"{row[3]}\n    in: {' '.join(statement.split())[:400]}")
    finally:
        con.close()
    assert len(statements) > 10
    assert not scans, "full table scans:\n" + "\n".join(scans)


def test_an_idle_manager_cycle_derives_the_repair_plan_once(pipeline_ctx: ProcessContext) -> None:
    """Every manager asks the desired state for its repairs: one derivation per cycle, shared
    (each manager deriving it again made every cycle cost one copy query per manager)."""
    from packhorse.engine.pipeline import CycleInput, manager_cycle

    ctx = pipeline_ctx
    bad_copy_queries: list[str] = []

    @event.listens_for(ctx.db._engine, "before_cursor_execute")
    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        flat = " ".join(statement.split())
        if flat.startswith("SELECT physical_copies.id, physical_copies.raw_data_package_id, "
                           "physical_copies.data_transfer_package_id, physical_copies.location_id FROM "
                           "physical_copies WHERE physical_copies.location_id IN (SELECT"):
            bad_copy_queries.append(flat)

    try:
        for _ in range(3):
            result = manager_cycle(ctx, CycleInput(unsettled={}))
            assert result.total == 0
    finally:
        event.remove(ctx.db._engine, "before_cursor_execute", capture)
    assert len(bad_copy_queries) == 3, bad_copy_queries
