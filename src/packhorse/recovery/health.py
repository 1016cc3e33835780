"""Service health: every service and worker process records a heartbeat in the ops database.

A process calls :func:`record_heartbeat` every ``recovery.service_heartbeat_interval_seconds``
(30 s; :class:`HeartbeatThread` does it in the background); a service whose last heartbeat is
older than ``recovery.service_dead_after_seconds`` (90 s) is reported dead (seed 002 "Health
Check Service"; DESIGN.md "Numbers"). ``packhorse health [--json]`` lists them.

Service names are unique per process, e.g. ``runner@obs1:4242``; ``kind`` says what the
process is (``runner``, ``monitor``, ``worker``, ``api``, ``notifier``, ...).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import threading
from typing import Any

import structlog
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from ..db.models import ServiceHeartbeat, utcnow
from ..db.session import Database

log = structlog.get_logger(__name__)

#: Defaults of seed 002 (also ``[recovery]`` keys): update every 30 s, dead after 90 s.
HEARTBEAT_INTERVAL_SECONDS = 30.0
DEAD_AFTER_SECONDS = 90.0


def service_name(kind: str) -> str:
    """The unique name of this process as a service of ``kind``: ``kind@host:pid``."""
    return f"{kind}@{socket.gethostname()}:{os.getpid()}"


def record_heartbeat(db: Database, service: str, *, kind: str, host: str, pid: int) -> None:
    """Record that ``service`` is alive now (insert or update its row; one short transaction).

    Args:
        service: unique service name (see :func:`service_name`).
        kind: what the service is (``runner``, ``monitor``, ``worker`` ...).
        host, pid: where it runs.
    """

    def tx(s: Session) -> None:
        now = utcnow()
        row = s.scalars(select(ServiceHeartbeat).where(ServiceHeartbeat.service == service)).first()
        if row is None:
            s.add(ServiceHeartbeat(service=service, kind=kind, host=host, pid=pid, started_at=now, last_seen=now))
        else:
            row.kind, row.host, row.pid, row.last_seen = kind, host, pid, now

    db.transact(tx)


def list_services(session: Session, now: dt.datetime | None = None,
                  dead_after_seconds: float = DEAD_AFTER_SECONDS) -> list[dict[str, Any]]:
    """Every service that ever recorded a heartbeat, alive ones first, then by name.

    Returns:
        dicts with ``service``, ``kind``, ``host``, ``pid``, ``started_at``, ``last_seen`` (UTC),
        ``age_seconds`` and ``alive`` (last heartbeat at most ``dead_after_seconds`` old).
    """
    now = now or utcnow()
    out = []
    for r in session.scalars(select(ServiceHeartbeat)):
        age = (now - r.last_seen).total_seconds()
        out.append({"service": r.service, "kind": r.kind, "host": r.host, "pid": r.pid, "started_at": r.started_at,
                    "last_seen": r.last_seen, "age_seconds": round(age, 1), "alive": age <= dead_after_seconds})
    return sorted(out, key=lambda d: (not d["alive"], d["service"]))


class HeartbeatThread:
    """Records this process's heartbeat every ``interval_seconds`` from a daemon thread.

    A failed write (database blip) is logged and retried on the next tick; it never stops the
    service. Use as a context manager or call :meth:`start` / :meth:`stop`.
    """

    def __init__(self, db: Database, kind: str, *, interval_seconds: float = HEARTBEAT_INTERVAL_SECONDS,
                 service: str | None = None) -> None:
        self.db = db
        self.kind = kind
        self.service = service or service_name(kind)
        self.interval = interval_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"health-{kind}", daemon=True)

    def beat(self) -> bool:
        """Record one heartbeat now; ``False`` (logged) if the database refused it."""
        try:
            record_heartbeat(self.db, self.service, kind=self.kind, host=socket.gethostname(), pid=os.getpid())
            return True
        except Exception as e:  # never let health reporting kill the service
            log.error("health_heartbeat_failed", service=self.service, error=str(e))
            return False

    def _run(self) -> None:
        while True:
            self.beat()
            if self._stop.wait(self.interval):
                return

    def start(self) -> "HeartbeatThread":
        self._thread.start()
        return self

    def stop(self, *, remove: bool = False) -> None:
        """Stop beating; ``remove``: delete this service's row (a clean shutdown is not a death)."""
        self._stop.set()
        self._thread.join(timeout=10)
        if remove:
            try:
                self.db.transact(lambda s: s.execute(
                    delete(ServiceHeartbeat).where(ServiceHeartbeat.service == self.service)))
            except Exception as e:
                log.error("health_unregister_failed", service=self.service, error=str(e))

    def __enter__(self) -> "HeartbeatThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
