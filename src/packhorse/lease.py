"""Keeping a lease alive while an operation's bytes move (DESIGN.md "Lease", restic's lock monitor).

A :class:`LeaseKeeper` renews the claimed operation's lease from a background thread every
``heartbeat_interval`` seconds (checking for stop at least every 10 s). The work calls
:meth:`LeaseKeeper.check` between chunks and before publishing: it raises
:class:`~packhorse.errors.LeaseLostError` as soon as

* a renewal found the fencing token stale (another attempt owns the operation), or
* no renewal succeeded for ``lease_timeout − 1.5 × heartbeat_interval`` seconds — the worker
  stops *before* its lease can look expired to the stalled-task monitor (e.g. after the
  process was paused, or while the database is unreachable).
"""

from __future__ import annotations

import threading
import time

import structlog

from . import faults
from .db.session import Database
from .errors import LeaseLostError
from .operations import Claim, heartbeat

log = structlog.get_logger(__name__)


class LeaseKeeper:
    """Renews ``claim``'s lease in a thread; see the module docstring.

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
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{claim.operation_id}", daemon=True)

    def __enter__(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=max(self.interval, 10.0) + 5)

    def add_bytes(self, n: int) -> None:
        """Count progress (bytes) reported with the next heartbeat."""
        self.bytes_done += n

    def _run(self) -> None:
        structlog.contextvars.bind_contextvars(operation_kind=self.claim.kind.value,
                                               operation_id=self.claim.operation_id, attempt=self.claim.attempt,
                                               task_id=f"{self.claim.owner}#{self.claim.attempt}")
        step = min(self.interval, 10.0)
        next_at = time.monotonic() + self.interval
        while not self._stop.wait(max(0.0, min(step, next_at - time.monotonic()))):
            if time.monotonic() < next_at:
                continue
            next_at = time.monotonic() + self.interval
            try:
                ok = heartbeat(self.db, self.claim, self.lease_seconds, self.bytes_done)
            except Exception as e:  # database blip: keep trying until the deadline
                log.warning("heartbeat_failed", operation_id=self.claim.operation_id, error=str(e))
                continue
            if ok:
                self._last_renewal = time.monotonic()
            else:
                self._lost = f"attempt {self.claim.attempt} is no longer the operation's current attempt"
                return

    def check(self) -> None:
        """Raise :class:`LeaseLostError` if the work must stop (see module docstring)."""
        if faults.fencing_disabled():  # test-only switch of the chaos harness
            return
        if self._lost:
            raise LeaseLostError(f"operation {self.claim.operation_id}: {self._lost}")
        silent = time.monotonic() - self._last_renewal
        if silent > self.deadline:
            raise LeaseLostError(
                f"operation {self.claim.operation_id}: lease not renewed for {silent:.1f} s "
                f"(limit {self.deadline:.1f} s); stopping before it can look stale"
            )
