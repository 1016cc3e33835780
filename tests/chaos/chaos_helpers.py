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
from packhorse.executors.local import LocalRunner
from packhorse.managers.scan import scan_all
from packhorse.stages.base import StageContext
from packhorse.topology import sync_topology
from packhorse.worker import execute_operation


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


def context(config: Path) -> StageContext:
    """An initialized stage context for ``config`` (creates the schema)."""
    settings = load_config(config)
    db = Database(settings.database_url)
    db.upgrade()
    return StageContext(settings=settings, db=db, topology=sync_topology(db, settings))


def drive_until_kind_exists(ctx: StageContext, kind: OperationKind, max_cycles: int = 50) -> list[int]:
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
