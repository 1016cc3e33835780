"""Helpers for chaos tests: a source tree, and driving the pipeline step by step in-process."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sqlalchemy import select

from packhorse.config import load_config
from packhorse.db.models import Operation
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status
from packhorse.engine.worker import execute_operation
from packhorse.executors.local import LocalRunner
from packhorse.managers.scan import scan_all
from packhorse.rules.availability import mark_locations
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology


def make_source(root: Path, groups: int = 3, files_per_group: int = 3, size: int = 3 << 20) -> dict[str, bytes]:
    """Write ``groups`` observation units of incompressible files; returns {relative path: bytes}."""
    out: dict[str, bytes] = {}
    for g in range(groups):
        for i in range(files_per_group):
            rel = f"inst/obs{g:02d}/frame_{i:02d}.fits"
            data = os.urandom(size + g * 1000 + i)
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            out[rel] = data
    return out


def context(config: Path) -> ProcessContext:
    """An initialized process context for ``config`` (creates the schema)."""
    settings = load_config(config)
    db = Database(settings.database_url)
    db.upgrade()
    ctx = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    mark_locations(ctx)  # as `packhorse init` does: every location root exists and is marked
    return ctx


def drive_until_kind_exists(ctx: ProcessContext, kind: OperationKind, max_cycles: int = 50) -> list[int]:
    """Run managers and every other operation synchronously until operations of ``kind`` exist.

    Returns their ids (still PENDING).
    """
    runner = LocalRunner(ctx)
    with ThreadPoolExecutor(2) as pool:
        scan = scan_all(ctx, pool)
    for _ in range(max_cycles):
        runner.manage(scan.unsettled_groups, flush=True)
        ops = ctx.db.transact(lambda s: list(s.scalars(select(Operation).where(
            Operation.status.in_([Status.PENDING.value, Status.SCHEDULED.value])))))
        wanted = [o.id for o in ops if o.kind == kind.value]
        if wanted:
            runner.pool.shutdown()
            runner.hash_pool.shutdown()
            return wanted
        for o in ops:
            execute_operation(ctx, o.id, "test-driver")
    raise AssertionError(f"no {kind.value} operation appeared")


def stop_outside_a_write(pid: int, ctx: ProcessContext) -> None:
    """SIGSTOP process ``pid`` at a moment it holds no SQLite write transaction.

    A process stopped in the middle of one (its heartbeat thread renewing the lease, say)
    would keep the database locked for every other process until SIGCONT, which is not the
    fault under test (a stuck worker) and made these tests flaky on a loaded machine. Holding
    the database's writer queue lock (:class:`~packhorse.db.session.WriterQueue`) while
    stopping it guarantees it is not inside a write: every write transaction takes that lock
    first.
    """
    import fcntl
    import signal

    db_path = ctx.db.engine.url.database
    assert db_path, "an SQLite database"
    fd = os.open(db_path + ".writer-lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.kill(pid, signal.SIGSTOP)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
