"""Service lifecycle notifications: started, daily still-alive, stopped with reason and uptime
(seed 002). One :class:`ServiceLifecycle` per long-running service process."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any

import structlog

from packhorse.db.models import utcnow
from packhorse.db.session import Database
from packhorse.notify import messages

log = structlog.get_logger(__name__)


class ServiceLifecycle:
    """Queues the lifecycle notifications of one service (``run``, ``notifier``, ``monitor``, …).

    Args:
        db: the ops database.
        service: the service's name, e.g. ``"notifier"``.
        still_alive_interval_seconds: time between still-alive messages (86400 s: daily).
        settings: the main settings, shown in the "started" message.
        clock: a monotonic clock in seconds (``time.monotonic``; tests hand their own).
    """

    def __init__(self, db: Database, service: str, *, still_alive_interval_seconds: float = 86400.0,
                 settings: dict[str, Any] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.db = db
        self.service = service
        self.interval = still_alive_interval_seconds
        self.settings = settings
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.started_at = utcnow()
        self._clock = clock
        self._next_alive = clock() + self.interval

    def _queue(self, fn: Any, **kw: Any) -> None:
        try:
            self.db.transact(lambda s: fn(s, service=self.service, host=self.host, pid=self.pid,
                                          started_at=self.started_at, **kw))
        except Exception as e:  # a lifecycle message must never stop the service
            log.error("lifecycle_notification_failed", service=self.service, error=repr(e))

    def started(self) -> None:
        """Queue "Service started"."""
        self._queue(messages.service_started, settings=self.settings)

    def tick(self, status: dict[str, Any] | None = None) -> None:
        """Queue "Service still alive" when the interval has passed since start or the last one."""
        if self._clock() >= self._next_alive:
            self._next_alive = self._clock() + self.interval
            self._queue(messages.service_still_alive, now=utcnow(), status=status)

    def stopped(self, reason: str) -> None:
        """Queue "Service stopped" with ``reason`` and the uptime."""
        self._queue(messages.service_stopped, now=utcnow(), reason=reason)
