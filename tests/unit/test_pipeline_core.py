"""One pipeline for both modes: the embedded runner and the distributed manager run the same
managers, take the same runnable work in the same order, and sweep the same partial files
(:mod:`packhorse.engine.pipeline`). Against a real (SQLite) ops database; the broker is replaced by
an object that records what would be published."""

from __future__ import annotations

import datetime as dt
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from packhorse.config import load_config
from packhorse.db.models import Operation, PhysicalCopy, RawDataPackage, utcnow
from packhorse.db.session import Database
from packhorse.domain import CopyStatus, OperationKind, Status
from packhorse.engine import pipeline
from packhorse.engine.worker import Outcome
from packhorse.executors import celery_app
from packhorse.executors.local import LocalRunner
from packhorse.operations.lifecycle import create_operation
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.topology import sync_topology
from packhorse.storage.base import PARTIAL_SUFFIX
from support import write_site_config


class RecordingBroker:
    """Stands in for the Celery app: records every message instead of publishing it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Any], str]] = []

    def send_task(self, name: str, *, args: list[Any], queue: str, **_kw: Any) -> None:
        self.sent.append((name, list(args), queue))


@pytest.fixture
def ctx(tmp_path: Path):
    cfg = write_site_config(tmp_path)
    cfg.write_text(cfg.read_text().replace('kind = "local"', 'kind = "celery"\nbroker_url = "memory://"'))
    settings = load_config(cfg)
    db = Database(settings.database_url)
    db.upgrade()
    c = ProcessContext(settings=settings, db=db, topology=sync_topology(db, settings))
    yield c
    db.dispose()
    celery_app._CONTEXTS.clear()


def _archived_copy(ctx: ProcessContext, *, age_days: float) -> int:
    """A raw package with one present copy at cologne-lta, last verified ``age_days`` ago."""

    def tx(s: Session) -> int:
        then = utcnow() - dt.timedelta(days=age_days)
        pkg = RawDataPackage(name="inst/obs01", group_path="inst/obs01", bagging_date="2026-01-01", file_count=1,
                             payload_bytes=10, size=100, sha256="0" * 64, created_at=then, archived_at=then,
                             source_location_id=ctx.topology.location_ids["fyst-source"])
        s.add(pkg)
        s.flush()
        copy = PhysicalCopy(raw_data_package_id=pkg.id, location_id=ctx.topology.location_ids["cologne-lta"],
                            path="raw/inst/obs01.tar", size=100, sha256="0" * 64, status=CopyStatus.PRESENT.value,
                            created_at=then, verified_at=then)
        s.add(copy)
        s.flush()
        return copy.id

    return ctx.db.transact(tx)


def test_the_distributed_manager_cycle_runs_the_fixity_audit(ctx: ProcessContext) -> None:
    # the distributed manager once ran its own list of managers, without the fixity audit
    copy_id = _archived_copy(ctx, age_days=40)  # past the default 30-day fixity interval
    broker = RecordingBroker()
    dispatched = celery_app.Manager(ctx.settings, app=broker).cycle(scan=False)  # type: ignore[arg-type]
    ops = ctx.db.read(lambda s: s.execute(select(Operation.id, Operation.kind, Operation.physical_copy_id,
                                                 Operation.status)).all())
    assert [(o.kind, o.physical_copy_id, o.status) for o in ops] == [
        (OperationKind.FIXITY_CHECK.value, copy_id, Status.SCHEDULED.value)]
    assert dispatched == 1
    assert broker.sent == [(celery_app.RUN_OPERATION_TASK, [ops[0].id, 1], "cologne_cologne-lta_fixity_check")]


def test_both_modes_run_the_same_steps_through_manager_cycle(ctx: ProcessContext, monkeypatch) -> None:
    ran: list[tuple[str, str]] = []

    def spy(step: pipeline.Step, mode: str) -> pipeline.Step:
        def manage(c: ProcessContext, inp: pipeline.CycleInput, out: pipeline.CycleResult) -> int:
            ran.append((mode, step.name))
            return 0

        return pipeline.Step(step.name, step.kind, manage if step.manage else None)

    for mode in ("embedded", "distributed"):
        monkeypatch.setattr(pipeline, "STEPS", tuple(spy(s, mode) for s in pipeline.STEPS))
        if mode == "embedded":
            runner = LocalRunner(ctx)
            try:
                runner.manage({}, flush=False)
            finally:
                runner.hash_pool.shutdown(wait=True)
        else:
            celery_app.Manager(ctx.settings, app=RecordingBroker()).cycle(scan=False)  # type: ignore[arg-type]
    steps = ["package", "bundle", "transfer", "unpack", "archive", "deletion", "fixity"]
    assert ran == [("embedded", s) for s in steps] + [("distributed", s) for s in steps]


def _ops_of_every_kind(ctx: ProcessContext) -> dict[OperationKind, int]:
    lta = ctx.topology.location_ids["cologne-lta"]
    site = ctx.topology.site_ids["cologne"]

    def tx(s: Session) -> dict[OperationKind, int]:
        ids = {}
        for k in reversed(pipeline.DISPATCH_ORDER):  # oldest first is the upstream kind
            op = create_operation(s, kind=k, dedup_key=f"{k.value}:x", site_id=site, max_retries=3,
                                  destination_location_id=lta)
            assert op is not None
            ids[k] = op.id
        # not runnable in either mode: not due yet, finished
        later = create_operation(s, kind=OperationKind.TRANSFER, dedup_key="later", site_id=site, max_retries=3,
                                 destination_location_id=lta)
        done = create_operation(s, kind=OperationKind.TRANSFER, dedup_key="done", site_id=site, max_retries=3,
                                destination_location_id=lta)
        assert later is not None and done is not None
        s.execute(update(Operation).where(Operation.id == later.id)
                  .values(not_before=utcnow() + dt.timedelta(hours=1)))
        s.execute(update(Operation).where(Operation.id == done.id).values(status=Status.COMPLETED.value))
        return ids

    return ctx.db.transact(tx)


def test_both_executors_take_the_same_runnable_work_in_the_same_order(ctx: ProcessContext) -> None:
    ids = _ops_of_every_kind(ctx)
    expected = [ids[k] for k in pipeline.DISPATCH_ORDER]  # downstream first

    broker = RecordingBroker()
    published = [d.operation_id for d in celery_app.dispatch_pending(ctx, broker)]  # type: ignore[arg-type]
    assert published == expected
    assert [queue for _, _, queue in broker.sent] == [f"cologne_cologne-lta_{k.value}" for k in pipeline.DISPATCH_ORDER]

    # the same rows, handed back, are what the embedded runner takes, in the same order
    ctx.db.transact(lambda s: s.execute(update(Operation).where(Operation.id.in_(expected))
                                        .values(status=Status.PENDING.value)))
    runner = LocalRunner(ctx)
    ran: list[int] = []
    runner._run_one = lambda op_id, token=None: (ran.append(op_id), Outcome.SKIPPED)[1]  # type: ignore[method-assign]
    runner.pool = ThreadPoolExecutor(1)  # one thread: runs in dispatch order
    runner.queue_limit = len(expected)  # room for every runnable operation at once
    try:
        runner.dispatch()
    finally:
        runner.pool.shutdown(wait=True)
        runner.hash_pool.shutdown(wait=True)
    assert ran == expected


def test_only_the_embedded_runner_takes_back_scheduled_work(ctx: ProcessContext) -> None:
    # a SCHEDULED row the embedded runner does not hold is queued nowhere; a broker may still
    # hold one (the reconciler decides, after the visibility timeout)
    op_id = ctx.db.transact(lambda s: create_operation(s, kind=OperationKind.TRANSFER, dedup_key="t", max_retries=3,
                                                       site_id=ctx.topology.site_ids["cologne"],
                                                       destination_location_id=ctx.topology.location_ids["cologne-buffer"]).id)
    ctx.db.transact(lambda s: s.execute(update(Operation).values(status=Status.SCHEDULED.value)))
    assert celery_app.dispatch_pending(ctx, RecordingBroker()) == []  # type: ignore[arg-type]
    taken = ctx.db.transact(lambda s: pipeline.take_runnable(
        s.connection(), limit=10, statuses=pipeline.runnable_statuses(executor_knows_its_queue=True)))
    assert [r.id for r in taken] == [op_id]
    # and never one it holds itself
    assert ctx.db.transact(lambda s: pipeline.take_runnable(
        s.connection(), limit=10, statuses=pipeline.runnable_statuses(executor_knows_its_queue=True),
        exclude={op_id})) == []


def _partial(root: Path, name: str, age: float) -> Path:
    p = root / "raw" / f"{name}{PARTIAL_SUFFIX}"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"half")
    then = time.time() - age
    os.utime(p, (then, then))
    return p


def test_sweep_removes_old_partials_of_the_chosen_sites_only(ctx: ProcessContext) -> None:
    path = ctx.settings.location_path
    lease = ctx.settings.recovery.lease_timeout_seconds
    for loc in ("fyst-buffer", "cologne-buffer", "cologne-lta", "cornell-lta"):
        path(loc).mkdir(parents=True, exist_ok=True)
    old_cologne = _partial(path("cologne-lta"), "a.tar", lease + 60)
    old_buffer = _partial(path("cologne-buffer"), "b.tar", lease + 60)
    fresh = _partial(path("cologne-lta"), "c.tar", 0)  # a writer may still be at it
    other_site = _partial(path("cornell-lta"), "d.tar", lease + 60)
    source = _partial(path("fyst-source"), "e.tar", lease + 60)  # sources are never touched

    assert pipeline.sweep_partials(ctx, sites={"cologne"}) == 2
    assert not old_cologne.exists() and not old_buffer.exists()
    assert fresh.exists() and other_site.exists() and source.exists()
    assert celery_app.cleanup_site_partials(ctx.settings, "cornell") == 1  # a worker's start
    assert not other_site.exists() and source.exists()


def test_the_embedded_runner_sweeps_every_site_once_per_start(ctx: ProcessContext) -> None:
    lease = ctx.settings.recovery.lease_timeout_seconds
    first = _partial(ctx.settings.location_path("cornell-lta"), "a.tar", lease + 60)
    runner = LocalRunner(ctx)
    try:
        runner.recover()
        assert not first.exists()
        second = _partial(ctx.settings.location_path("cornell-lta"), "b.tar", lease + 60)
        runner.recover()  # later partials are the next attempt's to remove
        assert second.exists()
    finally:
        runner.hash_pool.shutdown(wait=True)
