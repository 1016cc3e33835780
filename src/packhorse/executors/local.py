"""Embedded mode: managers, a local pool of worker processes and recovery, one command.

Operations run in ``[executor] workers`` worker processes (``pool = "process"``, the default):
each has its own database engine and runs :func:`~packhorse.engine.worker.execute_task`, so
packaging, unpacking and the database work of many small operations use every core instead
of queueing on one interpreter lock. ``pool = "thread"`` runs them in threads of this process
(debugging, tests that replace the stage). Worker processes die with ``packhorse run``: a
SIGKILLed run leaves no worker writing on (its leases expire and are recovered).

:class:`LocalRunner` loops: scan (paced by the rule of distributed mode, :class:`ScanPacing`,
or when unsettled files settle), run the managers (:func:`packhorse.engine.pipeline.manager_cycle`),
run the stalled-task monitor and the reconciler (every monitor interval,
:func:`packhorse.engine.pipeline.recover`), dispatch the runnable
operations :func:`packhorse.engine.pipeline.take_runnable` picks to the pool. What runs and in which
order is the pipeline's (:mod:`packhorse.engine.pipeline`); this module only decides that it runs here.
A finished operation wakes the loop at once, so the next stage starts without waiting for the
poll interval. The pool holds up to ``workers ×
prefetch_multiplier`` tasks, refilled from completions once only a worker's worth is left; a
task is one operation, up to :data:`~packhorse.operations.batching.DELETION_BATCH` buffer-copy deletions,
or up to :data:`~packhorse.operations.batching.SMALL_BATCH` builds or long-term-archive copies of small raw data
packages (:data:`~packhorse.operations.batching.SMALL_BATCH_BYTES` in all) run together
(:mod:`packhorse.operations.batching`, :func:`~packhorse.engine.worker.execute_task`): small operations go to a task together only when
more of them are runnable than there are free task slots, so a few packages still go one to a
worker.

``until_idle``: the loop keeps going while work can become runnable by itself (a retry
backoff, an expiring lease, files settling, a partial bundle — shipped at once when nothing
else is pending) and stops when the only work left waits on a retention period, a human (a
FAILED operation), the cool-down of an open circuit breaker (the next run lets one attempt
through once it passed), an unavailable or full data location, or a link between sites recorded
cut (:func:`~packhorse.recovery.link_reachability.waiting_for_cut_link`).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import select as select_module
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import structlog
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from packhorse import logs
from packhorse.config import Settings
from packhorse.db.models import CircuitBreaker, LocationOutage, Operation, utcnow
from packhorse.db.session import Database
from packhorse.domain import ACTIVE_STATUSES, BreakerState, Status
from packhorse.engine import pipeline
from packhorse.engine.worker import Outcome, execute_operation, execute_task
from packhorse.managers import packages as packages_manager
from packhorse.managers.deletions import waiting_on_rule
from packhorse.managers.scan import ScanCache, ScanResult, scan_all
from packhorse.operations.batching import DELETION_BATCH, group_tasks, small_operations
from packhorse.operations.identity import runner_worker_identity, worker_identity
from packhorse.operations.scan_lease import scan_rest_seconds
from packhorse.recovery.link_reachability import waiting_for_cut_link
from packhorse.recovery.loop import ErrorCounter
from packhorse.rules.availability import waiting_for
from packhorse.rules.space import look_for_space_again, waiting_for_space
from packhorse.runtime.context import ProcessContext
from packhorse.runtime.settings import RuntimeSettings
from packhorse.runtime.topology import Topology

log = structlog.get_logger(__name__)

#: The statuses this runner dispatches from: it is the only dispatcher of its database and
#: knows every task it queued (:func:`packhorse.engine.pipeline.runnable_statuses`).
_STATUSES = pipeline.runnable_statuses(executor_knows_its_queue=True)


class ScanPacing:
    """When the runner scans its source locations next: a completed scan rests
    :func:`~packhorse.operations.scan_lease.scan_rest_seconds` (at least the poll interval, and
    three times as long as it took), the rule a distributed site's scans rest by
    (:func:`~packhorse.operations.scan_lease.rest_until`); a failed scan waits the poll interval.
    Times are ``time.monotonic()`` seconds. (Files settling start a scan sooner:
    :meth:`LocalRunner.run`.)"""

    def __init__(self) -> None:
        self.ended = float("-inf")  # the latest scan's end; none yet: the first is due at once
        self.took = 0.0  # how long it took if it completed; 0 if it failed (the poll interval only)

    def scanned(self, started: float, ended: float, *, completed: bool) -> None:
        """Record a scan from ``started`` to ``ended``; ``completed``: it succeeded."""
        self.ended = ended
        self.took = ended - started if completed else 0.0

    def due_at(self, poll_seconds: float) -> float:
        """When the next scan is due, with ``poll_seconds`` the poll interval in force now (s)."""
        return self.ended + scan_rest_seconds(self.took, min_rest_seconds=poll_seconds)


# ------------------------------------------------------------------------------ worker processes

#: the process context of a worker process (set by :func:`_init_worker_process`)
_process_ctx: ProcessContext | None = None


def _die_with(parent_pid: int) -> None:
    """Kill this process (SIGKILL) the moment process ``parent_pid`` exits, as if it had been
    killed together with it: a SIGKILLed ``packhorse run`` must not leave workers writing on.
    (The pool's processes are children of the forkserver, and hold its liveness pipe open
    themselves, so neither ``PR_SET_PDEATHSIG`` nor the forkserver notices.) Linux pidfd."""
    try:
        pidfd = os.pidfd_open(parent_pid)
    except ProcessLookupError:
        os.kill(os.getpid(), signal.SIGKILL)
        return
    except (OSError, AttributeError):  # no pidfd (not Linux ≥ 5.3): poll instead
        pidfd = None

    def watch() -> None:
        if pidfd is not None:
            select_module.select([pidfd], [], [])
        else:
            while True:
                try:
                    os.kill(parent_pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(1)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _init_worker_process(settings: Settings, topology: Topology, log_config: dict[str, object],
                         parent_pid: int) -> None:
    """Set up one worker process: its own database engine (never one inherited across a fork;
    DESIGN.md "Architecture"), the parent's logging, death with the parent (:func:`_die_with`).
    SIGINT and SIGTERM (Ctrl-C on a terminal, systemd stopping the unit's whole cgroup) are
    left to the parent, which lets running operations finish and then ends the pool."""
    global _process_ctx, _runner_pid
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _runner_pid = parent_pid
    _die_with(parent_pid)
    logs.configure(**log_config)  # type: ignore[arg-type]
    _process_ctx = ProcessContext(settings=settings, db=Database.from_settings(settings), topology=topology)
    global _process_runtime
    _process_runtime = RuntimeSettings(_process_ctx.db, settings)


#: runtime settings of a worker process (a changed log_level applies here too)
_process_runtime: RuntimeSettings | None = None
#: the pid of the runner a worker process serves: its leases name it (operations.worker_identity)
_runner_pid: int | None = None


def _start_forkserver() -> None:
    """Start multiprocessing's fork server (the parent of the worker processes) with SIGINT and
    SIGTERM ignored, if this is the main thread and it is not running yet: a stop signal sent
    to ``packhorse run``'s whole process group (systemd, a terminal) must reach the run alone,
    which lets running operations finish; a fork server killed by it would break the pool under
    them. Ignored dispositions survive the fork server's exec; its children inherit them."""
    # workers fork with packhorse already imported; the CLI too: a worker process re-runs the
    # `packhorse` console script as __mp_main__, which would import typer and rich in each
    # (and forkserver_exit: the fork server itself exits at once; see that module)
    multiprocessing.set_forkserver_preload([__name__, "packhorse.cli", "packhorse.managers.scanshards",
                                            "packhorse.executors.forkserver_exit"])
    if threading.current_thread() is not threading.main_thread():
        multiprocessing.forkserver.ensure_running()
        return
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _worker_ready() -> int:
    """A task that does nothing: submitted once per worker when the run starts, so the pool's
    processes fork and initialize while the first scan runs (:meth:`LocalRunner.warm_up`)."""
    return os.getpid()


def _run_task_in(ctx: ProcessContext, task: tuple[tuple[int, int], ...], owner: str) -> list[Outcome]:
    """Run one task: ``((operation id, dispatched token), …)`` — an operation, or a batch
    (:func:`~packhorse.engine.worker.execute_task`). Each claim is fenced on the token the dispatch
    read (I3)."""
    return execute_task(ctx, list(task), owner)


def _run_in_worker_process(task: tuple[tuple[int, int], ...]) -> list[Outcome]:
    """One task of the pool (:func:`_run_task_in`), in a worker process."""
    assert _process_ctx is not None, "worker process not initialized"
    if _process_runtime is not None:
        _process_runtime.refresh()  # reads the table at most every refresh interval
    assert _runner_pid is not None
    owner = f"{runner_worker_identity(_runner_pid)}:{threading.current_thread().name}"
    return _run_task_in(_process_ctx, task, owner)


class LocalRunner:
    """Runs the whole pipeline from this process (operations in its worker pool).

    Args:
        ctx: the process context (settings, database, topology).
        on_tick: called after every loop iteration (progress display).
    """

    def __init__(self, ctx: ProcessContext, *, on_tick: Callable[[], None] | None = None) -> None:
        self.ctx = ctx
        self.settings = ctx.settings
        self.started_at = time.time()  # bad copies with nothing to repair them from: read back once per start
        self.workers = ctx.settings.executor.workers
        #: processes a full listing of a large source location may use (managers.scanshards)
        self.scan_processes = max(1, min(self.workers, os.cpu_count() or 1))
        #: tasks handed to the pool at once (running + queued in it): a worker that
        #: finishes one takes the next from the pool's queue, not after a round trip through
        #: this process's dispatch (which competes with the managers for the interpreter)
        self.queue_limit = self.workers * ctx.settings.executor.prefetch_multiplier
        self._pool: Executor | None = None  # made on first use (tests build runners without one)
        self.hash_pool = ThreadPoolExecutor(self.workers, thread_name_prefix="scan")
        self.scan_cache = ScanCache()  # unchanged source folders are not listed again
        #: operations handed to the pool, by id -> their task; and the tasks themselves
        self.in_flight: dict[int, Future[list[Outcome]]] = {}
        self._tasks: set[Future[list[Outcome]]] = set()
        self.wake = threading.Event()
        #: set while no operation is in the pool (cleared when one is dispatched)
        self.drained = threading.Event()
        self.drained.set()
        self.stop_requested = threading.Event()
        #: set when a worker process died: the main loop runs lease recovery at its next turn
        self.recover_soon = threading.Event()
        self.on_tick = on_tick
        self.outcomes: dict[Outcome, int] = {o: 0 for o in Outcome}
        self._lock = threading.Lock()
        self._dispatch_lock = threading.RLock()
        #: cleared while :meth:`warm_up` starts the worker processes (dispatch waits for it)
        self._workers_up = threading.Event()
        self._workers_up.set()
        self._owner = worker_identity()
        rec = ctx.settings.recovery
        #: failed cycles of the main loop (logged, counted, CRITICAL after max_consecutive_errors)
        self.errors = ErrorCounter(ctx.db, f"runner@{self._owner}",
                                   max_consecutive_errors=ctx.settings.managers.max_consecutive_errors,
                                   notification_cooldown_seconds=rec.notification_cooldown_seconds,
                                   retry_seconds=min(ctx.settings.managers.poll_interval_seconds, 1.0))
        self.scan_errors = ErrorCounter(ctx.db, f"scan@{self._owner}",
                                        max_consecutive_errors=ctx.settings.managers.max_consecutive_errors,
                                        notification_cooldown_seconds=rec.notification_cooldown_seconds)
        self._swept = False
        self._running = False  # inside run(): managers' new operations are dispatched at once
        #: poll intervals and log level changed at run time (``packhorse config set``)
        self.runtime = RuntimeSettings(ctx.db, ctx.settings)
        #: operations finished so far (an idle check is only valid if none finished since the
        #: managers last looked at the database)
        self.finished = 0

    # -- pieces ----------------------------------------------------------------------
    @property
    def pool(self) -> Executor:
        """The worker pool: ``[executor] workers`` processes (or threads with ``pool = "thread"``)."""
        if self._pool is None:
            self._pool = self._new_pool()
        return self._pool

    @pool.setter
    def pool(self, value: Executor) -> None:
        self._pool = value

    def _discard_broken_pool(self) -> None:
        pool = self._pool
        if isinstance(pool, ProcessPoolExecutor) and getattr(pool, "_broken", False):
            self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)

    def _new_pool(self) -> Executor:
        if self.settings.executor.pool == "thread":
            return ThreadPoolExecutor(self.workers, thread_name_prefix="worker")
        mp = multiprocessing.get_context("forkserver")
        _start_forkserver()
        return ProcessPoolExecutor(self.workers, mp_context=mp, initializer=_init_worker_process,
                                   initargs=(self.settings, self.ctx.topology, logs.current_config(), os.getpid()))

    def warm_up(self) -> threading.Thread | None:
        """Start the worker processes now, in a background thread, instead of at the first
        dispatch: a process pool forks its workers one per task, each only once the fork server
        has imported packhorse (about a second), so the first packages would otherwise wait for
        all of that after the first scan instead of during it. Returns the thread (None with
        ``pool = "thread"``). A failure here is left to the first real dispatch, which meets it
        again and handles it (:meth:`_done`).

        Meanwhile :meth:`dispatch` hands nothing out (the operations stay ``PENDING``): a
        submit would wait for the fork server's imports under the pool's lock, and with it the
        scan, whose chunks call it. Once the processes are started this thread dispatches and
        wakes the main loop."""
        if self.settings.executor.pool != "process":
            return None
        pool = self.pool
        self._workers_up.clear()

        def spawn() -> None:
            try:
                for _ in range(self.workers):
                    pool.submit(_worker_ready)
            except Exception as e:  # noqa: BLE001 - the first dispatch reports it
                log.debug("worker_warm_up_failed", error=repr(e))
            finally:
                self._workers_up.set()
            if not self.stop_requested.is_set():
                try:
                    self.dispatch()
                except Exception as e:  # noqa: BLE001 - the main loop dispatches again anyway
                    log.warning("dispatch_failed", error=repr(e))
                self.wake.set()

        t = threading.Thread(target=spawn, name="pool-warm-up", daemon=True)
        t.start()
        return t

    def _done(self, op_ids: tuple[int, ...], fut: Future[list[Outcome]]) -> None:
        outcomes: list[Outcome] = []
        with self._lock:
            self._tasks.discard(fut)
            for op_id in op_ids:
                self.in_flight.pop(op_id, None)
            if not self.in_flight:
                self.drained.set()
            self.finished += len(op_ids)
            try:
                outcomes = fut.result()
                for outcome in outcomes:
                    self.outcomes[outcome] += 1
            except BrokenProcessPool as e:
                # a worker process died (killed, out of memory): its operations stay IN_PROGRESS
                # until lease recovery hands them out again, at the next pass (asked for here):
                # their holder is gone, so their leases are not waited out
                # (recovery.monitor.provably_gone); operations queued behind it are still
                # SCHEDULED and are dispatched to a new pool
                log.error("worker_process_died", operation_ids=list(op_ids), error=repr(e))
                self._discard_broken_pool()
                self.recover_soon.set()  # its leases are taken over at once (monitor.provably_gone)
            except Exception as e:  # a bug or a database outage outside the failure path
                log.error("operation_crashed", operation_ids=list(op_ids), error=repr(e))
            # keep the pool busy: once only a worker's worth of tasks is left in it, refill it
            # at once, without waiting for the main loop (which only has to create new
            # operations); one refill takes several (fewer dispatch transactions in this
            # process, whose interpreter the managers need). Skipped operations changed
            # nothing, so they do not re-dispatch (no busy loop).
            low = len(self._tasks) <= self.workers
        changed = any(o is not Outcome.SKIPPED for o in outcomes)
        if low and changed and not self.stop_requested.is_set():
            try:
                self.dispatch()
            except Exception as e:  # the main loop dispatches again anyway
                log.warning("dispatch_failed", error=repr(e))
        self.wake.set()

    def _submit(self, task: tuple[tuple[int, int], ...]) -> Future[list[Outcome]]:
        if isinstance(self.pool, ProcessPoolExecutor):
            return self.pool.submit(_run_in_worker_process, task)
        return self.pool.submit(self._run_task, task)

    def _run_task(self, task: tuple[tuple[int, int], ...]) -> list[Outcome]:
        if len(task) == 1:
            return [self._run_one(*task[0])]
        return _run_task_in(self.ctx, task, f"{self._owner}:{threading.current_thread().name}")

    def _run_one(self, op_id: int, token: int | None = None) -> Outcome:
        """One operation in a thread of this process (``pool = "thread"``), claimed at ``token``."""
        return execute_operation(self.ctx, op_id, f"{self._owner}:{threading.current_thread().name}", token=token)

    def dispatch(self) -> int:
        """Hand runnable operations to the pool until ``queue_limit`` tasks are in it (running
        or queued); returns how many operations were dispatched. A task is one operation, or up
        to :data:`~packhorse.operations.batching.DELETION_BATCH` buffer-copy deletions run together
        (:func:`~packhorse.engine.worker.execute_deletions`)."""
        # one dispatch at a time (the main loop and completion callbacks both dispatch): two
        # could otherwise select the same operations before either had queued them
        with self._dispatch_lock:
            return self._dispatch()

    def _dispatch(self) -> int:
        if not self._workers_up.is_set():
            return 0  # the warm-up dispatches once the worker processes are started
        with self._lock:
            free = self.queue_limit - len(self._tasks)
            busy = set(self.in_flight)
        if free <= 0:
            return 0

        def tx(s: Session) -> list[tuple[tuple[int, int], ...]]:
            tasks: list[list[int]] = []

            def choose(rows: list[Any]) -> list[int]:
                # fill the free task slots in dispatch order, small operations batched
                # (packhorse.operations.batching, as the distributed executor's messages are)
                tasks[:] = group_tasks(rows, small_operations(s, rows), slots=free)
                return [i for task in tasks for i in task]

            # the token each was dispatched at: its claim is fenced on it (I3)
            taken = {r.id: r.attempt for r in pipeline.take_runnable(
                s.connection(), limit=free * DELETION_BATCH, statuses=_STATUSES, exclude=busy, choose=choose)}
            return [tuple((i, taken[i]) for i in task if i in taken) for task in tasks if any(i in taken for i in task)]

        tasks = self.ctx.db.transact(tx)
        twice = self.ctx.hooks.active("dispatch", "duplicate")  # hooks: at-least-once delivery
        submitted = []
        for task in tasks:
            op_ids = tuple(i for i, _ in task)
            with self._lock:
                try:
                    fut = self._submit(task)
                except BrokenProcessPool:
                    self._discard_broken_pool()
                    fut = self._submit(task)
                self._tasks.add(fut)
                self.drained.clear()
                for op_id in op_ids:
                    self.in_flight[op_id] = fut
            submitted.append((op_ids, fut))
            if twice:
                self._submit(task)
        # callbacks only once every task is registered: a task already done runs its callback
        # (which may dispatch again, re-entering the lock) right here
        for op_ids, fut in submitted:
            fut.add_done_callback(lambda f, i=op_ids: self._done(i, f))
        return sum(len(t) for t in tasks)

    def manage(self, unsettled: dict[str, set[str]] | None, *, flush: bool) -> tuple[int, float | None]:
        """Run every manager once; returns ``(operations created, seconds until more is due)``.

        ``unsettled``: the groups still settling, per source location, from the latest scan;
        ``None`` (that scan failed) skips packaging this cycle.

        While :meth:`run` is going, operations a manager created are dispatched at once, so
        free workers start on them while the later managers run; otherwise (a caller driving
        the managers itself) nothing is dispatched here."""

        def dispatch_now() -> None:
            if self._running:
                self._guard("dispatch", self.dispatch, default=0)

        def after_step(name: str, n: int) -> None:
            if n and name != "package":  # packaging dispatches after each of its commits
                dispatch_now()

        result = pipeline.manager_cycle(
            self.ctx, pipeline.CycleInput(unsettled=unsettled, flush=flush, on_commit=dispatch_now,
                                         look_at_all_locations=True, started_at=self.started_at),
            after_step=after_step)
        return result.total, result.bundle_wait

    def _package_registered(self, location: str, groups: list[str]) -> None:
        """The scan's ``on_registered``: package the groups it has just registered and dispatch
        them at once, so workers build the first packages while the scan hashes the rest. A
        failure here is the scan's (counted; the cycle after the scan packages them)."""
        dispatch = (lambda: self._guard("dispatch", self.dispatch, default=0)) if self._running else None
        packages_manager.manage(self.ctx, {}, locations={location}, groups=groups, on_commit=dispatch)

    def recover(self) -> None:
        """Recovery (:func:`packhorse.engine.pipeline.recover`): the stalled-task monitor (circuit
        breakers) and the reconciler, as ``packhorse monitor`` runs them. On the first call also
        :func:`packhorse.engine.pipeline.sweep_partials` (every site: this runner writes to all of
        them); later partials are removed by the next attempt at the same object, so the
        (possibly long) walk of an archive runs once per start, not every monitor interval."""
        # no dispatch meanwhile: an operation handed to the pool after the list of those queued
        # here was taken would look lost to the reconciler (SCHEDULED, not queued here) and be
        # reset and reported needlessly
        with self._dispatch_lock:
            with self._lock:
                queued_here = set(self.in_flight)
            pipeline.recover(self.ctx, exclude=queued_here)
        if self._swept:
            return
        self._swept = True
        pipeline.sweep_partials(self.ctx)

    def _active_summary(self) -> tuple[int, float | None]:
        """(active operations, seconds until one of them may become runnable by itself)."""

        # an operation whose circuit breaker is open waits for the cool-down (or a human): a
        # run --until-idle does not wait for it (it exits 4; the next run lets one attempt through)
        blocked = select(CircuitBreaker.operation_id).where(CircuitBreaker.state == BreakerState.OPEN.value)
        # one waiting on an unavailable location waits for the world outside: `status` lists it
        # (exit 4); the next run resumes it (the managers' cycle looks at the location first)
        waiting = select(Operation.id).where(or_(waiting_for(select(LocationOutage.location_id)), waiting_for_space()))
        # a deletion handed back because its rule (I1) does not hold yet waits on other work (a
        # copy being made again): counted only while other work is active; alone, nothing in
        # this run can make it safe, and the deletion manager makes it due once it is
        rule = select(Operation.id).where(waiting_on_rule())

        def tx(s: Session) -> tuple[int, float | None]:
            now = utcnow()
            # likewise a transfer in its backoff over a link between sites recorded cut (past its grace)
            cut = waiting_for_cut_link(now)
            n = s.scalar(select(func.count()).select_from(Operation).where(
                Operation.status.in_([x.value for x in ACTIVE_STATUSES]), Operation.id.not_in(blocked),
                Operation.id.not_in(waiting), Operation.id.not_in(cut), Operation.id.not_in(rule))) or 0
            if n:
                n += s.scalar(select(func.count()).select_from(Operation).where(Operation.id.in_(rule))) or 0
            nb = s.scalar(select(func.min(Operation.not_before)).where(
                Operation.status == Status.PENDING.value, Operation.not_before > now, Operation.id.not_in(cut)))
            le = s.scalar(select(func.min(Operation.lease_expires_at)).where(
                Operation.status == Status.IN_PROGRESS.value, Operation.id.not_in(blocked)))
            soon = [t for t in (nb, le) if t is not None]
            return n, (max(0.0, (min(soon) - now).total_seconds()) if soon else None)

        return self.ctx.db.read(tx)

    def _guard(self, where: str, fn: Callable[..., Any], *args: Any, default: Any) -> Any:
        """``fn(*args)``; an error (a database outage outlasting the unit of work's retries) is
        logged and counted instead of ending the run, and ``default`` is returned. Scans have
        their own streak: a scan failing every time must reach CRITICAL even while the
        managers' cycles succeed."""
        counter = self.scan_errors if where == "scan" else self.errors
        try:
            result = fn(*args)
        except Exception as e:
            counter.failed(e, where)
            return default
        if counter is self.scan_errors:
            counter.succeeded()
        return result

    # -- main loop -------------------------------------------------------------------
    def run(self, *, until_idle: bool = False) -> None:
        """Run until stopped (or, with ``until_idle``, until no work can become runnable)."""
        if self.settings.executor.pool == "process":
            _start_forkserver()  # from the main thread, before any signal handler matters
            self.warm_up()
        # work that waited for space when the last run ended looks again now, not after its backoff
        self._guard("space", look_for_space_again, self.ctx, default=0)
        rt = self.runtime
        self._running = True
        last_monitor = float("-inf")
        pacing = ScanPacing()
        monitor_due: float | None = None  # an earlier monitor pass (lease about to expire)
        scan = ScanResult()
        scan_failed = True  # until the first scan succeeds
        flush = False
        last_manage = manage_cost = 0.0
        try:
            while not self.stop_requested.is_set():
                rt.refresh()
                poll = rt.poll_interval_seconds
                now = time.monotonic()
                if (now >= last_monitor + rt.monitor_interval_seconds or (monitor_due is not None and now >= monitor_due)
                        or self.recover_soon.is_set()):
                    self.recover_soon.clear()
                    try:
                        self.recover()
                    except Exception as e:  # counted; the next monitor interval tries again
                        self.errors.failed(e, "recovery")
                    last_monitor, monitor_due = now, None
                settle_due = scan.next_settle_at is not None and time.time() >= scan.next_settle_at
                if now >= pacing.due_at(poll) or settle_due:
                    scan_started = time.monotonic()
                    looked = self._guard("scan", scan_all, self.ctx, self.hash_pool, self.scan_cache,
                                         self._package_registered, self.scan_processes, default=None)
                    scan_failed = looked is None
                    scan = scan if looked is None else looked
                    pacing.scanned(scan_started, time.monotonic(), completed=not scan_failed)
                self.wake.clear()
                # Coalesce wake-ups: a burst of finished operations is handled by one manager
                # cycle; the gap is twice the last cycle's cost, so managers never take more
                # than about a third of this thread while workers are busy.
                # The pause ends early once nothing is running: no burst is left to coalesce
                # (the last operations of a run, a pipeline stage's only operation).
                gap = last_manage + 2 * manage_cost - time.monotonic()
                if gap > 0:
                    self._guard("dispatch", self.dispatch, default=0)
                    self.drained.wait(min(gap, 0.5))
                t0 = time.monotonic()
                with self._lock:
                    finished_before_manage = self.finished
                try:
                    # after a failed scan nobody knows which groups are still settling: no
                    # packaging until a scan succeeds (a half-registered group would be split)
                    created, bundle_wait = self.manage(None if scan_failed else scan.unsettled_groups, flush=flush)
                    self.errors.succeeded()
                except Exception as e:  # a database blip must not end the run
                    self.errors.failed(e, "managers")
                    self.wake.wait(min(poll, 1.0))
                    continue
                last_manage = time.monotonic()
                manage_cost = last_manage - t0
                dispatched = self._guard("dispatch", self.dispatch, default=0)
                if self.on_tick:
                    self.on_tick()
                timeout = poll
                if until_idle:
                    # a failed look counts as "not idle, look again soon"
                    active, soon = self._guard("idle check", self._active_summary, default=(1, 1.0))
                    with self._lock:
                        running = len(self.in_flight)
                        # an operation that finished after the managers looked may have made
                        # new work that they have not seen yet: look again before stopping
                        unseen = self.finished != finished_before_manage
                    if not running and not active and not created and not dispatched and not unseen:
                        if scan.pending_settle:
                            timeout = max(0.05, (scan.next_settle_at or time.time()) - time.time())
                        elif bundle_wait is not None and not flush:
                            flush = True  # nothing else pending: ship the partial bundle now
                            continue
                        else:
                            final = self._guard("scan", scan_all, self.ctx, self.hash_pool, self.scan_cache, None,
                                                self.scan_processes, default=None)
                            if final is None:  # files that arrived meanwhile: could not look
                                self.wake.wait(min(poll, 1.0))  # counted; try again, not in a busy loop
                                continue
                            if not final.registered and not final.pending_settle:
                                break
                            scan, scan_failed = final, False
                            flush = False
                            continue
                    elif not running and not dispatched and soon is not None:
                        timeout = min(timeout, soon + 0.05)
                        due = time.monotonic() + soon + 0.05
                        monitor_due = due if monitor_due is None else min(monitor_due, due)
                    if bundle_wait is not None:
                        timeout = min(timeout, bundle_wait + 0.05)
                if self.on_tick:
                    timeout = min(timeout, 0.5)
                # wake for the next runtime-settings read: a shorter poll interval set meanwhile
                # applies within managers.runtime_settings_refresh_seconds
                self.wake.wait(min(timeout, rt.seconds_until_refresh() + 0.01))
        finally:
            self._running = False
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=False)
            self.hash_pool.shutdown(wait=True)
            if self.on_tick:
                self.on_tick()

