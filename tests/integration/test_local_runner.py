"""The embedded runner keeps its pool busy: a freed worker takes the next runnable operation
without waiting for the main loop, and a skipped delivery never loops."""

from __future__ import annotations

import threading
import time
import types
from pathlib import Path

import pytest
from sqlalchemy import select, update

from packhorse.config import settings_from_dict
from packhorse.db.models import Operation, Site
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status
from packhorse.engine.worker import Outcome
from packhorse.executors.local import LocalRunner
from packhorse.operations.lifecycle import create_operation
from packhorse.runtime.hooks import NO_HOOKS


@pytest.fixture
def db(tmp_path: Path) -> Database:
    d = Database(f"sqlite:///{tmp_path}/t.db")
    d.upgrade()
    d.transact(lambda s: s.add(Site(id=1, name="fyst")))
    yield d
    d.dispose()


def _pending(db: Database, n: int) -> list[int]:
    def tx(s):  # type: ignore[no-untyped-def]
        return [create_operation(s, kind=OperationKind.DELETION, dedup_key=f"deletion:{i}", site_id=1,
                                 max_retries=3).id for i in range(n)]

    return db.transact(tx)


def _runner(db: Database, outcome: Outcome, prefetch: int = 1) -> tuple[LocalRunner, list[int], threading.Event]:
    executor = {"workers": 1, "pool": "thread", "prefetch_multiplier": prefetch}
    runner = LocalRunner(types.SimpleNamespace(settings=settings_from_dict({"executor": executor}, environ={}),
                                               db=db, hooks=NO_HOOKS))  # type: ignore[arg-type]
    ran: list[int] = []
    idle = threading.Event()

    def run_one(op_id: int, token: int | None = None) -> Outcome:  # stands in for execute_operation
        ran.append(op_id)
        if outcome is Outcome.COMPLETED:
            db.transact(lambda s: s.execute(update(Operation).where(Operation.id == op_id)
                                            .values(status=Status.COMPLETED.value)))
        return outcome

    runner._run_one = run_one  # type: ignore[method-assign]
    return runner, ran, idle


def _wait_completed(runner: LocalRunner, n: int, timeout: float = 10) -> None:
    """Wait (at most ``timeout`` s) until ``n`` operations completed."""
    deadline = time.monotonic() + timeout
    while runner.outcomes[Outcome.COMPLETED] < n and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_finished_operation_dispatches_the_next_without_the_main_loop(db: Database) -> None:
    ids = _pending(db, 5)
    runner, ran, _ = _runner(db, Outcome.COMPLETED)
    try:
        assert runner.dispatch() == 1  # one worker: one operation now, the rest from completions
        _wait_completed(runner, 5)
    finally:
        runner.pool.shutdown(wait=True)
        runner.hash_pool.shutdown(wait=True)
    assert sorted(ran) == sorted(ids)
    assert runner.outcomes[Outcome.COMPLETED] == 5


def test_prefetch_keeps_the_pool_queue_filled(db: Database) -> None:
    # workers × prefetch_multiplier operations are handed to the pool at once, and the queue
    # is refilled from completions once only a worker's worth is left: every operation runs
    ids = _pending(db, 10)
    runner, ran, _ = _runner(db, Outcome.COMPLETED, prefetch=3)
    try:
        assert runner.dispatch() == 3
        statuses = db.read(lambda s: sorted(s.scalars(select(Operation.status))))
        assert statuses.count("PENDING") <= 7  # the rest were handed over (SCHEDULED, then run)
        _wait_completed(runner, 10)
    finally:
        runner.pool.shutdown(wait=True)
        runner.hash_pool.shutdown(wait=True)
    assert sorted(ran) == sorted(ids)


def test_a_skipped_delivery_does_not_redispatch(db: Database) -> None:
    _pending(db, 3)
    runner, ran, _ = _runner(db, Outcome.SKIPPED)
    try:
        assert runner.dispatch() == 1
        time.sleep(0.5)  # time for a (wrong) re-dispatch to happen
    finally:
        runner.pool.shutdown(wait=True)
        runner.hash_pool.shutdown(wait=True)
    assert len(ran) == 1


def test_until_idle_does_not_stop_when_an_operation_finished_after_the_managers_looked(db: Database) -> None:
    # X finishes right after a manager cycle saw nothing to do; the work X made possible (Y)
    # must still be created and run before `run --until-idle` stops.
    (x_id,) = _pending(db, 1)
    settings = settings_from_dict({"executor": {"workers": 2, "pool": "thread"}, "managers": {"poll_interval_seconds": 0.05}},
                                  environ={})
    runner = LocalRunner(types.SimpleNamespace(settings=settings, db=db, hooks=NO_HOOKS))  # type: ignore[arg-type]
    release_x = threading.Event()
    ran: list[int] = []
    state = {"y": None}

    def run_one(op_id: int, token: int | None = None) -> Outcome:
        if op_id == x_id:
            release_x.wait(10)
        ran.append(op_id)
        db.transact(lambda s: s.execute(update(Operation).where(Operation.id == op_id)
                                        .values(status=Status.COMPLETED.value)))
        return Outcome.COMPLETED

    def manage(unsettled, *, flush):  # type: ignore[no-untyped-def]
        x_done = x_id in ran
        if runner.in_flight and x_id in runner.in_flight and not release_x.is_set():
            before = runner.finished
            release_x.set()  # X completes now, after this cycle looked at the database
            deadline = time.monotonic() + 10
            while runner.finished == before and time.monotonic() < deadline:
                time.sleep(0.005)
            return 0, None
        if x_done and state["y"] is None:
            def tx(s):  # type: ignore[no-untyped-def]
                return create_operation(s, kind=OperationKind.DELETION, dedup_key="deletion:y", site_id=1,
                                        max_retries=3).id
            state["y"] = db.transact(tx)
            return 1, None
        return 0, None

    runner._run_one = run_one  # type: ignore[method-assign]
    runner.manage = manage  # type: ignore[method-assign]
    runner.run(until_idle=True)
    assert state["y"] is not None and ran == [x_id, state["y"]]


def test_a_database_outage_is_never_recorded_as_the_operations_failure(db: Database, monkeypatch) -> None:
    from sqlalchemy import select

    import packhorse.engine.worker as worker
    from packhorse.db.models import FailureEvent
    from packhorse.errors import TransientDatabaseError
    from packhorse.runtime.context import ProcessContext
    from packhorse.runtime.topology import Topology

    (op_id,) = _pending(db, 1)

    def outage(work):  # type: ignore[no-untyped-def]
        raise TransientDatabaseError("database unavailable after 8 attempts")

    monkeypatch.setitem(worker.STAGES, OperationKind.DELETION, outage)
    ctx = ProcessContext(settings=settings_from_dict({}, environ={}), db=db, topology=Topology())
    # handed back at once when the database answers again: PENDING, no retry spent, no stall
    assert worker.execute_operation(ctx, op_id, "w") is Outcome.DEFERRED
    op = db.read(lambda s: s.get(Operation, op_id))
    assert op.status == Status.PENDING.value and op.retry_count == 0 and op.stall_count == 0
    assert op.lease_owner is None
    assert all(e.will_retry for e in db.read(lambda s: s.scalars(select(FailureEvent)).all()))


def test_concurrent_dispatches_never_hand_out_an_operation_twice(db: Database) -> None:
    # the main loop and a completion callback dispatch at the same time; a slow hand-over
    # (a busy pool's queue) must not let the second select what the first is handing over
    _pending(db, 6)
    runner, _, _ = _runner(db, Outcome.COMPLETED, prefetch=6)
    handed: list[int] = []
    real_submit = runner._submit

    def slow_submit(task):  # type: ignore[no-untyped-def]
        handed.extend(op_id for op_id, _token in task)
        time.sleep(0.05)
        return real_submit(task)

    runner._submit = slow_submit  # type: ignore[method-assign]
    release = threading.Event()
    runner._run_one = lambda op_id, token=None: (release.wait(10), Outcome.SKIPPED)[1]  # type: ignore[method-assign]
    try:
        threads = [threading.Thread(target=runner.dispatch) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    finally:
        release.set()
        runner.pool.shutdown(wait=True)
        runner.hash_pool.shutdown(wait=True)
    assert sorted(handed) == sorted(set(handed)) and len(handed) == 6


def test_while_the_worker_processes_start_dispatch_waits_and_the_warm_up_dispatches_after(db: Database) -> None:
    # the first scan's chunks dispatch as they are registered; a pool whose processes are still
    # starting (the fork server importing packhorse) would hold each of those dispatches, and
    # the scan with them, until they are up. Dispatch hands nothing out meanwhile; the warm-up
    # dispatches once they are started.
    from concurrent.futures import ThreadPoolExecutor

    from packhorse.executors import local

    ids = _pending(db, 3)
    runner, ran, _ = _runner(db, Outcome.COMPLETED)
    started = threading.Event()

    class SlowToStart(ThreadPoolExecutor):
        def submit(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
            if fn is local._worker_ready:  # the warm-up's: the processes start this slowly
                started.wait(10)
            return super().submit(fn, *args, **kwargs)

    # a "process" pool, so that warm_up starts it; its processes stand in as threads here
    runner.settings = runner.settings.model_copy(update={"executor": runner.settings.executor.model_copy(
        update={"pool": "process"})})
    runner.pool = SlowToStart(1)
    try:
        warming = runner.warm_up()
        assert warming is not None
        t = time.monotonic()
        assert runner.dispatch() == 0  # nothing handed out, and nothing held up
        assert time.monotonic() - t < 1
        assert ran == [] and db.read(lambda s: set(s.scalars(select(Operation.status)))) == {Status.PENDING.value}
        started.set()
        warming.join(10)
        _wait_completed(runner, 3)
    finally:
        started.set()
        runner.pool.shutdown(wait=True)
        runner.hash_pool.shutdown(wait=True)
    assert sorted(ran) == sorted(ids)
    assert db.read(lambda s: set(s.scalars(select(Operation.status)))) == {Status.COMPLETED.value}
