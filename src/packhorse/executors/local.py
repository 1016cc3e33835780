"""Embedded mode: managers, a local thread pool of workers and lease recovery in one process.

:class:`LocalRunner` loops: scan (every poll interval, or when unsettled files settle), run the
managers in pipeline order, reset stalled leases (every monitor interval), dispatch runnable
operations to the pool. A finished operation wakes the loop at once, so the next stage starts
without waiting for the poll interval (issue #2).

``until_idle``: the loop keeps going while work can become runnable by itself (a retry
backoff, an expiring lease, files settling, a partial bundle — shipped at once when nothing
else is pending) and stops when the only work left waits on a retention period or a human.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import structlog
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from ..db.models import Operation, utcnow
from ..domain import ACTIVE_STATUSES, LocationRole, OperationKind, Status, StorageType
from ..managers import archives, bundles, deletions, fixity, packages, transfers, unpacks
from ..managers.scan import ScanResult, scan_all
from ..operations import reset_stalled, worker_identity
from ..stages.base import StageContext
from ..storage.disk import DiskBackend
from ..worker import Outcome, execute_operation

log = structlog.get_logger(__name__)

#: Age after which an incomplete S3 multipart upload counts as abandoned (seconds).
S3_PARTIAL_AGE_SECONDS = 86400.0

#: Dispatch order: downstream first, so buffers drain before new packages fill them.
PRIORITY = [OperationKind.DELETION, OperationKind.LONG_TERM_ARCHIVE, OperationKind.UNPACK, OperationKind.TRANSFER,
            OperationKind.DATA_TRANSFER_PACKAGE, OperationKind.RAW_DATA_PACKAGE, OperationKind.STAGING,
            OperationKind.FIXITY_CHECK]


class LocalRunner:
    """Runs the whole pipeline in this process.

    Args:
        ctx: the stage context (settings, database, topology).
        on_tick: called after every loop iteration (progress display).
    """

    def __init__(self, ctx: StageContext, *, on_tick: Callable[[], None] | None = None) -> None:
        self.ctx = ctx
        self.settings = ctx.settings
        self.workers = ctx.settings.executor.workers
        self.pool = ThreadPoolExecutor(self.workers, thread_name_prefix="worker")
        self.hash_pool = ThreadPoolExecutor(self.workers, thread_name_prefix="scan")
        self.in_flight: dict[int, Future[Outcome]] = {}
        self.wake = threading.Event()
        self.stop_requested = threading.Event()
        self.on_tick = on_tick
        self.outcomes: dict[Outcome, int] = {o: 0 for o in Outcome}
        self._lock = threading.Lock()
        self._owner = worker_identity()
        self._swept = False
        #: operations finished so far (an idle check is only valid if none finished since the
        #: managers last looked at the database)
        self.finished = 0

    # -- pieces ----------------------------------------------------------------------
    def _done(self, op_id: int, fut: Future[Outcome]) -> None:
        outcome: Outcome | None = None
        with self._lock:
            self.in_flight.pop(op_id, None)
            self.finished += 1
            try:
                outcome = fut.result()
                self.outcomes[outcome] += 1
            except Exception as e:  # a bug or a database outage outside the failure path
                log.error("operation_crashed", operation_id=op_id, error=repr(e))
        # keep the pool busy: the freed worker slot takes the next runnable operation at once,
        # without waiting for the main loop (which only has to create new operations). A
        # skipped operation changed nothing, so it does not re-dispatch (no busy loop).
        if outcome not in (None, Outcome.SKIPPED) and not self.stop_requested.is_set():
            try:
                self.dispatch()
            except Exception as e:  # the main loop dispatches again anyway
                log.warning("dispatch_failed", error=repr(e))
        self.wake.set()

    def _run_one(self, op_id: int) -> Outcome:
        return execute_operation(self.ctx, op_id, f"{self._owner}:{threading.current_thread().name}")

    def dispatch(self) -> int:
        """Hand runnable operations to free workers; returns how many were dispatched."""
        with self._lock:
            free = self.workers - len(self.in_flight)
            busy = set(self.in_flight)
        if free <= 0:
            return 0
        order = {k.value: i for i, k in enumerate(PRIORITY)}

        def tx(s: Session) -> list[int]:
            now = utcnow()
            rows = s.execute(
                select(Operation.id, Operation.kind).where(
                    Operation.status.in_([Status.PENDING.value, Status.SCHEDULED.value]),
                    (Operation.not_before.is_(None)) | (Operation.not_before <= now))
                .order_by(Operation.id)
            ).all()
            picked = sorted((r for r in rows if r.id not in busy), key=lambda r: (order.get(r.kind, 99), r.id))[:free]
            ids = [r.id for r in picked]
            if ids:
                s.execute(update(Operation).where(Operation.id.in_(ids), Operation.status == Status.PENDING.value)
                          .values(status=Status.SCHEDULED.value, scheduled_at=now, updated_at=now))
            return ids

        ids = self.ctx.db.transact(tx)
        for op_id in ids:
            with self._lock:
                fut = self.pool.submit(self._run_one, op_id)
                self.in_flight[op_id] = fut
            fut.add_done_callback(lambda f, i=op_id: self._done(i, f))
        return len(ids)

    def manage(self, unsettled: dict[str, set[str]], *, flush: bool) -> tuple[int, float | None]:
        """Run every manager once; returns ``(operations created, seconds until more is due)``."""
        created = packages.manage(self.ctx, unsettled)
        n, bundle_wait = bundles.manage(self.ctx, flush=flush)
        created += n + transfers.manage(self.ctx) + unpacks.manage(self.ctx) + archives.manage(self.ctx)
        n, _retention_wait = deletions.manage(self.ctx)
        return created + n + fixity.manage(self.ctx), bundle_wait

    def recover(self) -> None:
        """Lease recovery: reset expired leases. On the first call also sweep every disk location
        (except sources) for partial writes older than a lease, left by a crashed process; later
        partials are removed by the next attempt at the same object, so the (possibly long)
        walk of an archive runs once per start, not every monitor interval."""
        reset = reset_stalled(self.ctx.db)
        if reset:
            log.warning("stalled_operations_reset", operation_ids=reset)
        if self._swept:
            return
        self._swept = True
        for loc in self.settings.locations:
            if loc.storage is StorageType.DISK and loc.role is not LocationRole.SOURCE:
                b = self.ctx.backend(loc.name)
                if isinstance(b, DiskBackend):
                    b.cleanup_partials(self.settings.recovery.lease_timeout_seconds)
            elif loc.storage is StorageType.S3 and loc.active:
                # incomplete multipart uploads of crashed publishers (invisible; they only cost
                # storage). A day, not a lease: a large upload in flight may take longer.
                self.ctx.backend(loc.name).cleanup_partials(S3_PARTIAL_AGE_SECONDS)

    def _active_summary(self) -> tuple[int, float | None]:
        """(active operations, seconds until one of them may become runnable by itself)."""

        def tx(s: Session) -> tuple[int, float | None]:
            n = s.scalar(select(func.count()).select_from(Operation).where(
                Operation.status.in_([x.value for x in ACTIVE_STATUSES]))) or 0
            now = utcnow()
            nb = s.scalar(select(func.min(Operation.not_before)).where(
                Operation.status == Status.PENDING.value, Operation.not_before > now))
            le = s.scalar(select(func.min(Operation.lease_expires_at)).where(
                Operation.status == Status.IN_PROGRESS.value))
            soon = [t for t in (nb, le) if t is not None]
            return n, (max(0.0, (min(soon) - now).total_seconds()) if soon else None)

        return self.ctx.db.read(tx)

    # -- main loop -------------------------------------------------------------------
    def run(self, *, until_idle: bool = False) -> None:
        """Run until stopped (or, with ``until_idle``, until no work can become runnable)."""
        poll = self.settings.managers.poll_interval_seconds
        monitor_every = self.settings.recovery.monitor_interval_seconds
        next_scan = 0.0
        next_monitor = 0.0
        scan = ScanResult()
        flush = False
        last_manage = manage_cost = 0.0
        try:
            while not self.stop_requested.is_set():
                now = time.monotonic()
                if now >= next_monitor:
                    self.recover()
                    next_monitor = now + monitor_every
                settle_due = scan.next_settle_at is not None and time.time() >= scan.next_settle_at
                if now >= next_scan or settle_due:
                    scan = scan_all(self.ctx, self.hash_pool)
                    next_scan = time.monotonic() + poll
                self.wake.clear()
                # Coalesce wake-ups: a burst of finished operations is handled by one manager
                # cycle; the gap is twice the last cycle's cost, so managers never take more
                # than about a third of this thread while workers are busy.
                gap = last_manage + 2 * manage_cost - time.monotonic()
                if gap > 0:
                    self.dispatch()
                    time.sleep(min(gap, 0.5))
                t0 = time.monotonic()
                with self._lock:
                    finished_before_manage = self.finished
                created, bundle_wait = self.manage(scan.unsettled_groups, flush=flush)
                last_manage = time.monotonic()
                manage_cost = last_manage - t0
                dispatched = self.dispatch()
                if self.on_tick:
                    self.on_tick()
                timeout = poll
                if until_idle:
                    active, soon = self._active_summary()
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
                            final = scan_all(self.ctx, self.hash_pool)  # files that arrived meanwhile
                            if not final.registered and not final.pending_settle:
                                break
                            scan = final
                            flush = False
                            continue
                    elif not running and not dispatched and soon is not None:
                        timeout = min(timeout, soon + 0.05)
                        next_monitor = min(next_monitor, time.monotonic() + soon + 0.05)
                    if bundle_wait is not None:
                        timeout = min(timeout, bundle_wait + 0.05)
                if self.on_tick:
                    timeout = min(timeout, 0.5)
                self.wake.wait(timeout)
        finally:
            self.pool.shutdown(wait=True, cancel_futures=False)
            self.hash_pool.shutdown(wait=True)
            if self.on_tick:
                self.on_tick()

