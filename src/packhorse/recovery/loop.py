"""The resilient service loop every long-running manager / monitor runs in.

One *cycle* = ``work(session)`` with a **fresh database session**; the session is closed in a
``finally`` as the **last session operation of the cycle** — everything the loop needs to
decide how long to sleep is read before (from settings, never from the database), so nothing
can re-open a transaction after the reset and leak it into the next cycle (the live bug of
seed 002 "Manager Loop Session Resilience").

A failed cycle is logged and counted, never fatal: a database blip (dropped connection,
failover, a poisoned session) costs one cycle and the next one starts clean, without a
restart. After ``max_consecutive_errors`` failed cycles in a row a CRITICAL log line and a
CRITICAL notification are written (once per streak); a successful cycle resets the count.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
from sqlalchemy.orm import Session

from packhorse.db.session import Database
from packhorse.domain import NotificationLevel
from packhorse.notify.outbox import enqueue

log = structlog.get_logger(__name__)


class ErrorCounter:
    """Counts consecutive failed cycles of one loop; CRITICAL (log + notification) when the
    streak reaches ``max_consecutive_errors`` (once per streak). Shared by :class:`ServiceLoop`
    and the embedded runner's main loop.
    """

    def __init__(self, db: Database, name: str, *, max_consecutive_errors: int = 5,
                 notification_cooldown_seconds: float = 3600.0, retry_seconds: float = 0.0) -> None:
        self.db = db
        self.name = name
        self.max_errors = max_consecutive_errors
        self.cooldown = notification_cooldown_seconds
        self.retry_seconds = retry_seconds
        self.consecutive_errors = 0
        self.failed_cycles = 0
        self.last_error: str | None = None

    def succeeded(self) -> None:
        """A cycle went through: the streak ends."""
        if self.consecutive_errors:
            log.info("service_loop_recovered", service=self.name, after_errors=self.consecutive_errors)
        self.consecutive_errors = 0

    def failed(self, exc: BaseException, where: str = "cycle") -> None:
        """A cycle failed with ``exc``: log it, count it, go CRITICAL at the threshold."""
        self.last_error = f"{type(exc).__name__}: {exc}"
        self.consecutive_errors += 1
        self.failed_cycles += 1
        log.error("service_loop_cycle_failed", service=self.name, where=where, error=self.last_error,
                  consecutive_errors=self.consecutive_errors)
        if self.consecutive_errors == self.max_errors:
            self._critical()

    def _critical(self) -> None:
        log.critical("service_loop_failing", service=self.name, consecutive_errors=self.consecutive_errors,
                     error=self.last_error)

        def tx(s: Session) -> None:
            enqueue(s, level=NotificationLevel.CRITICAL, event="service_loop_failing",
                    subject=f"{self.name}: {self.consecutive_errors} consecutive failed cycles",
                    body=(f"Service: {self.name}\nConsecutive failed cycles: {self.consecutive_errors}\n"
                          f"Last error: {self.last_error}\nThe loop keeps running and retries every "
                          f"{self.retry_seconds:g} s; it needs a human if this persists."),
                    context={"service": self.name, "consecutive_errors": self.consecutive_errors,
                             "error": self.last_error}, cooldown_seconds=self.cooldown)

        try:
            self.db.transact(tx, attempts=2)
        except Exception as e:  # the database may be what is failing: the log line stays
            log.error("service_loop_notification_failed", service=self.name, error=str(e))


class ServiceLoop:
    """Run ``work(session)`` every ``interval_seconds`` until :attr:`stop` is set.

    Args:
        db: the ops database.
        name: the service name (logs, notifications).
        work: one cycle; gets a fresh session it may use (commit is done for it on success).
        interval_seconds: time from the start of one cycle to the next (s), or a function
            returning it, asked again while the loop waits (at least every second): a runtime
            setting changed with ``packhorse config set`` shortens a wait already begun.
        max_consecutive_errors: failed cycles in a row before CRITICAL (log + notification).
        notification_cooldown_seconds: cooldown of the CRITICAL notification.
    """

    def __init__(self, db: Database, name: str, work: Callable[[Session], Any], *,
                 interval_seconds: float | Callable[[], float],
                 max_consecutive_errors: int = 5, notification_cooldown_seconds: float = 3600.0) -> None:
        self.db = db
        self.name = name
        self.work = work
        self.interval: Callable[[], float] = (interval_seconds if callable(interval_seconds)
                                              else lambda: float(interval_seconds))
        self.stop = threading.Event()
        self.cycles = 0
        self.errors = ErrorCounter(db, name, max_consecutive_errors=max_consecutive_errors,
                                   notification_cooldown_seconds=notification_cooldown_seconds,
                                   retry_seconds=self.interval())

    @property
    def consecutive_errors(self) -> int:
        return self.errors.consecutive_errors

    @property
    def failed_cycles(self) -> int:
        return self.errors.failed_cycles

    def run_cycle(self) -> bool:
        """Run one cycle; returns ``True`` if it succeeded. Never raises for a cycle's error."""
        self.cycles += 1
        session = self.db.session()
        error: BaseException | None = None
        try:
            self.work(session)
            session.commit()
        except Exception as e:
            error = e
            try:
                session.rollback()
            except Exception:  # the connection may be gone; close() below discards it
                pass
        finally:
            session.close()  # the last session operation of the cycle
        if error is None:
            self.errors.succeeded()
            return True
        self.errors.failed(error)
        return False

    def run(self, *, max_cycles: int | None = None) -> None:
        """Loop until :attr:`stop` is set (or ``max_cycles`` cycles ran)."""
        while not self.stop.is_set():
            started = time.monotonic()
            self.run_cycle()
            if max_cycles is not None and self.cycles >= max_cycles:
                return
            while not self.stop.is_set():
                left = self.interval() - (time.monotonic() - started)
                if left <= 0:
                    break
                self.stop.wait(min(left, 1.0))
