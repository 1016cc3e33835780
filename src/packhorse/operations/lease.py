"""Keeping a lease alive while an operation's bytes move (DESIGN.md "Lease", restic's lock monitor).

A :class:`LeaseKeeper` renews the claimed operation's lease every ``heartbeat_interval``
seconds. One scheduler thread per process (:class:`_HeartbeatScheduler`) keeps the renewal
times of every keeper of the process and starts a short-lived thread for each renewal that
falls due, so an operation shorter than one interval (most small ones) costs no thread at
all, and a renewal stuck on the database delays no other operation's. The work calls
:meth:`LeaseKeeper.check` between chunks and before publishing: it raises
:class:`~packhorse.errors.LeaseLostError` as soon as

* a renewal found the fencing token stale (another attempt owns the operation), or
* no renewal succeeded for ``lease_timeout − 1.5 × heartbeat_interval`` seconds — the worker
  stops *before* its lease can look expired to the stalled-task monitor (e.g. after the
  process was paused, or while the database is unreachable):
  :class:`~packhorse.errors.LeaseNotRenewedError`.

Until then the lease still means "this worker runs it": :meth:`LeaseKeeper.may_hold` tells the
attempt's units of work to ride out a database outage instead of giving up after their own
retries (:func:`packhorse.db.session.retry_while`).

Work that may block for long between two checks (a pull waiting on a stalled link) registers
:meth:`LeaseKeeper.on_lost` callbacks. They run at once when either condition above is found,
without waiting for the work's next :meth:`~LeaseKeeper.check`:

* the renewal that finds the token stale runs them, so a stale attempt stops within about one
  heartbeat interval;
* when the renewal deadline passes without a successful renewal, the scheduler thread has
  them run in a thread of their own (a deadline check is armed whenever a renewal falls due, or
  at the start when the deadline comes before the first renewal, so a renewal hanging on an
  unreachable database delays it by nothing), and so does a renewal that gives up because the
  deadline passed. An attempt cut off from the database can no longer assume it holds the
  lease and must stop writing (I3); it stops before its lease can expire, so before anyone can
  take the operation over.

Either way the attempt frees what it holds (its partial's lock) for the successor
(docs/reliability.md "Resumable transfers"). A loss, once found, stays: :meth:`~LeaseKeeper.check`
raises its error from then on (even if a renewal still in flight succeeds), and no further
renewal is made.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable

import structlog

from packhorse.db.session import Database, retry_while
from packhorse.errors import LeaseLostError, LeaseNotRenewedError
from packhorse.operations.lifecycle import Claim, heartbeat

log = structlog.get_logger(__name__)


class _HeartbeatScheduler:
    """Starts each registered keeper's renewal when it falls due, and checks its renewal
    deadline when that falls due (one daemon thread per process, started on first use; a forked
    child gets a new scheduler)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        #: (due, sequence, keeper, None for a renewal | the keeper's last renewal a deadline check is for)
        self._heap: list[tuple[float, int, "LeaseKeeper", float | None]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, keeper: "LeaseKeeper", due: float, *, deadline_of: float | None = None) -> None:
        """At ``due`` (``time.monotonic()`` seconds), unless ``keeper`` stopped by then: renew it
        or, with ``deadline_of`` (the keeper's last successful renewal the deadline counts
        from), declare its lease not renewed in time if no renewal succeeded since
        (:meth:`LeaseKeeper._deadline_due`)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="heartbeat-scheduler", daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, (due, next(self._seq), keeper, deadline_of))
            if self._heap[0][2] is keeper:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(None if not self._heap else self._heap[0][0] - time.monotonic())
                _, _, keeper, deadline_of = heapq.heappop(self._heap)
            if keeper.stopped:
                continue
            if deadline_of is None:
                threading.Thread(target=keeper._renew, name=f"heartbeat-{keeper.claim.operation_id}",
                                 daemon=True).start()
            elif keeper._last_renewal == deadline_of and keeper._loss is None:  # cheap; callbacks in their own thread
                threading.Thread(target=keeper._deadline_due, args=(deadline_of,),
                                 name=f"lease-deadline-{keeper.claim.operation_id}", daemon=True).start()


_scheduler = _HeartbeatScheduler()


def _new_scheduler_after_fork() -> None:
    global _scheduler
    _scheduler = _HeartbeatScheduler()  # the parent's thread (and maybe its lock) did not fork


os.register_at_fork(after_in_child=_new_scheduler_after_fork)


class LeaseKeeper:
    """Renews ``claim``'s lease while the work runs (a context manager); see the module docstring.

    Args:
        db: the ops database.
        claim: the granted lease.
        lease_seconds: lease length granted on every renewal (s).
        interval_seconds: time between renewals (s).
        deadline_seconds: stop working when no renewal succeeded for this long (s).
    """

    def __init__(self, db: Database, claim: Claim, *, lease_seconds: float, interval_seconds: float,
                 deadline_seconds: float) -> None:
        self.db = db
        self.claim = claim
        self.lease_seconds = lease_seconds
        self.interval = interval_seconds
        self.deadline = deadline_seconds
        self.bytes_done = 0
        self._last_renewal = time.monotonic()
        #: the loss found first (error class and message), kept for good: ``None`` while the
        #: lease may still be held
        self._loss: tuple[type[LeaseLostError], str] | None = None
        #: set when the work is over: a renewal or deadline check that falls due later is not made
        self.stopped = False
        self._callbacks_lock = threading.Lock()
        self._on_lost: list[Callable[[LeaseLostError], None]] = []

    def __enter__(self) -> "LeaseKeeper":
        self._last_renewal = time.monotonic()
        self._schedule(self._last_renewal + self.interval)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped = True

    def add_bytes(self, n: int) -> None:
        """Count progress (bytes) reported with the next heartbeat."""
        self.bytes_done += n

    def _schedule(self, due: float) -> None:
        """Schedule the next renewal at ``due`` (monotonic seconds), and the deadline check too
        if the deadline (last successful renewal + ``deadline_seconds``) comes first; otherwise that
        renewal arms the check when it starts (:meth:`_renew`)."""
        _scheduler.add(self, due)
        expires = self._last_renewal + self.deadline
        if expires < due:
            _scheduler.add(self, expires, deadline_of=self._last_renewal)

    def _renew(self) -> None:
        """One renewal (in its own thread); schedules the next one unless the lease was lost.
        It first arms the deadline check (:meth:`_deadline_due`, run by the scheduler thread at
        last successful renewal + ``deadline_seconds``), so a renewal hanging on the database
        does not delay the :meth:`on_lost` callbacks. A failed renewal (database blip) is tried
        again after the interval; one that gave up because the deadline passed declares the
        lease not renewed itself."""
        structlog.contextvars.bind_contextvars(operation_kind=self.claim.kind.value,
                                               operation_id=self.claim.operation_id, attempt=self.claim.attempt,
                                               task_id=f"{self.claim.owner}#{self.claim.attempt}")
        started = time.monotonic()
        if not self.stopped:
            _scheduler.add(self, self._last_renewal + self.deadline, deadline_of=self._last_renewal)
        try:
            # through an outage the renewal keeps trying (about once a second) while the lease
            # may hold, so it renews the moment the database is back, not after a long backoff
            with retry_while(lambda: not self.stopped and self.may_hold()):
                ok = heartbeat(self.db, self.claim, self.lease_seconds, self.bytes_done)
        except Exception as e:  # database blip: keep trying until the deadline
            log.warning("heartbeat_failed", operation_id=self.claim.operation_id, error=str(e))
            if not self.stopped and not self.may_hold():
                self._not_renewed()
        else:
            if not ok:
                self._declare_lost(LeaseLostError,
                                   f"attempt {self.claim.attempt} is no longer the operation's current attempt")
                return
            self._last_renewal = time.monotonic()
        if not self.stopped and self._loss is None:
            self._schedule(started + self.interval)

    def _deadline_due(self, deadline_of: float) -> None:
        """The deadline counted from the renewal at ``deadline_of`` (monotonic seconds) has
        passed: unless a renewal succeeded since (or the work stopped), declare the lease not
        renewed and run the :meth:`on_lost` callbacks (once). Called in its own thread by the
        scheduler."""
        if not self.stopped and self._last_renewal == deadline_of:
            self._not_renewed()

    def _not_renewed(self) -> None:
        silent = time.monotonic() - self._last_renewal
        self._declare_lost(LeaseNotRenewedError, f"lease not renewed for {silent:.1f} s "
                           f"(limit {self.deadline:.1f} s); stopping before it can look stale")

    def _declare_lost(self, error_type: type[LeaseLostError], message: str) -> None:
        """Record the loss unless one was found before (the first stays) and then run the
        :meth:`on_lost` callbacks, each once."""
        with self._callbacks_lock:
            if self._loss is not None:
                return
            self._loss = (error_type, message)
            callbacks, self._on_lost = self._on_lost, []
        for callback in callbacks:
            self._call(callback)

    def on_lost(self, callback: Callable[[LeaseLostError], None]) -> Callable[[], None]:
        """Run ``callback`` once, with the error :meth:`check` raises from then on, as soon as
        the lease is found lost:

        * a renewal finds the fencing token stale (another attempt owns the operation, I3):
          :class:`~packhorse.errors.LeaseLostError`;
        * the renewal deadline (``deadline_seconds`` after the last successful renewal) passes
          without a successful renewal, e.g. while the database is unreachable: the lease can no
          longer be assumed held, so the attempt must stop writing (I3):
          :class:`~packhorse.errors.LeaseNotRenewedError` (the worker then hands the operation
          back, :func:`packhorse.engine.worker.hand_back`). Found by the scheduler thread at the
          deadline (within its timer's precision), even while a renewal hangs on the database.

        It runs in a renewal or deadline thread, so it must be quick and thread-safe (e.g.
        :meth:`packhorse.storage.sftp.ParallelReader.abort`); an exception it raises is logged,
        never raised. Registered after the loss was found, it runs at once in the caller's
        thread. The rule's origin: DESIGN.md "Lease" (a stale attempt stops and frees what it
        holds for its successor; docs/reliability.md "Resumable transfers").

        Returns:
            a function that unregisters ``callback`` (no-op once it ran).
        """
        with self._callbacks_lock:
            lost = self._loss is not None
            if not lost:
                self._on_lost.append(callback)
        if lost:
            self._call(callback)

        def forget() -> None:
            with self._callbacks_lock:
                if callback in self._on_lost:
                    self._on_lost.remove(callback)
        return forget

    def lost_error(self) -> LeaseLostError:
        """The error :meth:`check` raises for the loss found (what :meth:`on_lost` callbacks
        get): :class:`~packhorse.errors.LeaseLostError` for a stale token,
        :class:`~packhorse.errors.LeaseNotRenewedError` for a deadline passed without renewal."""
        error_type, message = self._loss or (LeaseLostError, "the lease was lost")
        return error_type(f"operation {self.claim.operation_id}: {message}")

    def _call(self, callback: Callable[[LeaseLostError], None]) -> None:
        try:
            callback(self.lost_error())
        except Exception as e:  # noqa: BLE001 - a callback never breaks the renewal
            log.warning("lease_lost_callback_failed", operation_id=self.claim.operation_id,
                        error_type=type(e).__name__, error=str(e))

    def may_hold(self) -> bool:
        """Whether this attempt may still hold its lease: no renewal found its token stale and
        the last successful renewal (or the claim) is less than ``deadline_seconds`` ago
        (``lease_timeout − 1.5 × heartbeat_interval``, :attr:`packhorse.config.RecoveryConfig.renewal_deadline_seconds`).
        Cheap, never touches the database; the predicate of :func:`packhorse.db.session.retry_while`."""
        return self._loss is None and time.monotonic() - self._last_renewal <= self.deadline

    def check(self) -> None:
        """Raise :class:`LeaseLostError` if the work must stop (see module docstring):
        :class:`~packhorse.errors.LeaseNotRenewedError` when no renewal succeeded in time. Once
        a loss was found (:meth:`on_lost`) it raises that loss's error every time."""
        if self._loss is not None:
            raise self.lost_error()
        silent = time.monotonic() - self._last_renewal
        if silent > self.deadline:
            raise LeaseNotRenewedError(
                f"operation {self.claim.operation_id}: lease not renewed for {silent:.1f} s "
                f"(limit {self.deadline:.1f} s); stopping before it can look stale"
            )
