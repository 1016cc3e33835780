"""Service health: every long-running service records a heartbeat in the ops database.

A service is identified by *what it is*, never by its process (seed 002 "Health Check
Service"; DESIGN.md "Numbers"): its **identity** is its kind, its site (workers), the host it
runs on and, for several services of one kind on one host, an instance name
(``--instance`` / ``PACKHORSE_INSTANCE``) — :func:`service_identity`, e.g. ``runner@obs1``,
``worker:cologne@dc1``, ``monitor:b@dc1``. Consequences:

* a restarted service takes over the row of its dead predecessor (one row, alive again; its
  ``pid`` and ``started_at`` are the new process's, ``restarts`` counts the take-overs);
* the ``service`` label of ``packhorse_service_up`` is the identity, so the label set is bounded
  by the services an installation has, not by how often they crashed;
* a clean stop removes the row (a stop is not a death); a dead row (no heartbeat for
  ``recovery.service_dead_after_seconds``, 90 s) is listed and makes ``packhorse health`` exit 1
  until the service comes back, is forgotten (``packhorse health --forget NAME``) or expires
  ``recovery.service_forget_after_seconds`` (a day) after its last heartbeat — then it is
  neither listed nor counted, and the next heartbeat of any service deletes it.

A process calls :func:`record_heartbeat` every ``recovery.service_heartbeat_interval_seconds``
(30 s; :class:`HeartbeatThread` does it in the background). Times are UTC, durations seconds.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from packhorse.db import clock as db_clock
from packhorse.db.models import ServiceHeartbeat, utcnow
from packhorse.db.session import Database
from packhorse.errors import ConfigError, ServiceHealthError
from packhorse.operations.identity import proc_is_ours, process_namespace
from packhorse.operations.scan_lease import overdue_scans

log = structlog.get_logger(__name__)

#: Defaults of seed 002 (also ``[recovery]`` keys): update every 30 s, dead after 90 s; a dead
#: service is forgotten a day after its last heartbeat.
HEARTBEAT_INTERVAL_SECONDS = 30.0
DEAD_AFTER_SECONDS = 90.0
FORGET_AFTER_SECONDS = 86400.0
#: A heartbeat the database took longer than this to take (s) is made again at once: its time
#: was read before the wait (a link cut in the middle of the write), so the row would say the
#: service was last seen at a moment long past, and a site cut off would still look cut off
#: after the link came back (its ``since`` moved by the wait), until the next heartbeat.
SLOW_BEAT_SECONDS = 2.0
#: After a failed heartbeat the next is tried this soon (s; never later than the interval), so
#: a service cut off from the database shows alive again within seconds of the link's return,
#: not up to a whole interval later.
RETRY_AFTER_FAILURE_SECONDS = 5.0

#: What an instance name (and a site name inside an identity) may be.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_instance(instance: str | None) -> str:
    """``instance`` as stored (``""`` for none), or :class:`~packhorse.errors.ConfigError`
    naming the value: 1-64 letters, digits, ``_ . -``, starting with a letter or digit."""
    if instance is None or instance == "":
        return ""
    if not _NAME.fullmatch(instance):
        raise ConfigError(f"--instance / PACKHORSE_INSTANCE: {instance!r} is not a valid instance name "
                          "(1-64 letters, digits, '_', '.', '-', starting with a letter or digit)")
    return instance


def service_identity(kind: str, *, site: str | None = None, instance: str | None = None,
                     host: str | None = None) -> str:
    """The identity of a service: ``kind[:site][:instance]@host`` (host: this machine's name).

    Raises:
        ConfigError: ``instance`` is not a valid name (:func:`check_instance`).
    """
    parts = [kind, *(p for p in (site, check_instance(instance)) if p)]
    return f"{':'.join(parts)}@{host or socket.gethostname()}"


def expire_services(session: Session, now: dt.datetime, forget_after_seconds: float = FORGET_AFTER_SECONDS) -> int:
    """Delete the rows of services whose last heartbeat is older than ``forget_after_seconds``;
    returns how many."""
    cutoff = now - dt.timedelta(seconds=forget_after_seconds)
    return session.execute(delete(ServiceHeartbeat).where(ServiceHeartbeat.last_seen < cutoff)).rowcount or 0


def record_heartbeat(db: Database, service: str, *, kind: str, host: str, pid: int, site: str | None = None,
                     instance: str = "", started_at: dt.datetime | None = None, pid_namespace: str | None = None,
                     forget_after_seconds: float = FORGET_AFTER_SECONDS,
                     now: dt.datetime | None = None,
                     clock_offset_seconds: float | None = None) -> tuple[str, int] | None:
    """Record that ``service`` is alive now (one short transaction): insert its row, or update
    it — another process (another ``started_at``, or without one another ``pid``) is a restart
    that takes the row over (``restarts`` + 1). Rows expired for ``forget_after_seconds`` are
    deleted in passing.

    Args:
        service: the service's identity (:func:`service_identity`).
        kind: what the service is (``runner``, ``monitor``, ``manager``, ``worker`` ...).
        host, pid: where it runs now. site, instance: the rest of its identity.
        pid_namespace: the process namespace ``pid`` belongs to
            (:func:`~packhorse.operations.identity.process_namespace`; ``None`` where it is not known).
        started_at: when this process started serving (UTC; tells a restart from the same
            process even where every process is pid 1, as in containers); default: now.
        now: the time of the heartbeat (tests; default: the database's clock, ``utcnow``).
        clock_offset_seconds: the offset of this host's clock to the database's (s, database
            minus host; default: this process's, :func:`packhorse.db.clock.offset_seconds`,
            measured by ``db`` at most 30 s ago).

    Returns:
        ``(host, pid)`` of the predecessor whose row this heartbeat took over, else ``None``.
    """

    def tx(s: Session) -> tuple[str, int] | None:
        t = now or utcnow()
        offset = db_clock.offset_seconds() if clock_offset_seconds is None else clock_offset_seconds
        expire_services(s, t, forget_after_seconds)
        row = s.scalars(select(ServiceHeartbeat).where(ServiceHeartbeat.service == service)).first()
        if row is None:
            s.add(ServiceHeartbeat(service=service, kind=kind, host=host, pid=pid, site=site, instance=instance,
                                   pid_namespace=pid_namespace, started_at=started_at or t, last_seen=t, restarts=0,
                                   clock_offset_seconds=offset))
            return None
        previous = None
        if (row.started_at != started_at) if started_at is not None else (row.pid != pid):
            previous = (row.host, row.pid)
            log.warning("service_restarted", service=service, previous_pid=row.pid, pid=pid,
                        previous_last_seen=row.last_seen.isoformat())
            row.restarts = (row.restarts or 0) + 1
            row.started_at = started_at or t
        row.kind, row.host, row.pid, row.site, row.instance, row.last_seen = kind, host, pid, site, instance, t
        row.pid_namespace = pid_namespace
        row.clock_offset_seconds = offset
        return previous

    return db.transact(tx)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (``kill(pid, 0)``; a process of another user
    counts). A zombie (ended, not yet reaped by its parent: ``Z`` in ``/proc/<pid>/stat``) does
    not run: a killed worker process is one until its parent waits for it. ``/proc`` is read
    only when it is this pid namespace's own (:func:`~packhorse.operations.identity.proc_is_ours`)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not proc_is_ours():
        return True  # /proc shows another pid namespace's processes: kill() said it runs
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split(None, 1)[0]
    except (OSError, IndexError):
        return True  # no /proc (or it ended just now): kill() said it runs
    return state not in (b"Z", b"X")


def is_alive(host: str, pid: int, age_seconds: float, dead_after_seconds: float,
             pid_namespace: str | None = None) -> bool:
    """Whether a service whose last heartbeat is ``age_seconds`` old counts as alive: at most
    ``dead_after_seconds`` old, and, when it runs on this host and in this process namespace,
    its process ``pid`` still runs (a service killed a moment ago is dead at once, not
    ``dead_after_seconds`` later; a pid reused by another process meanwhile still counts as
    alive until the heartbeat ages). ``pid_namespace``: the one the service recorded
    (:func:`~packhorse.operations.identity.process_namespace`); another one (a container with the same
    hostname) has pids this process cannot look at, so its heartbeat's age alone decides. A row
    without one (an older version's) is judged by its host, as before."""
    if age_seconds > dead_after_seconds:
        return False
    if host != socket.gethostname():
        return True
    if pid_namespace is not None and pid_namespace != process_namespace():
        return True
    return process_alive(pid)


def list_services(session: Session, now: dt.datetime | None = None, dead_after_seconds: float = DEAD_AFTER_SECONDS,
                  forget_after_seconds: float = FORGET_AFTER_SECONDS) -> list[dict[str, Any]]:
    """Every service that recorded a heartbeat and is not forgotten, alive ones first, then by name.

    Returns:
        dicts with ``service`` (the identity), ``kind``, ``site``, ``instance``, ``host``,
        ``pid`` (the current or last process), ``started_at``, ``last_seen`` (UTC),
        ``age_seconds``, ``restarts``, ``alive`` (:func:`is_alive`: last heartbeat at most
        ``dead_after_seconds`` old, and on this host its process still runs) and
        ``clock_offset_seconds`` (how far its host's clock is from the database's, s, database
        minus host, as it measured last; ``None`` if not recorded). Every time is the database's
        clock (the heartbeat's writer's and this reader's both), so an age is never negative
        because a host's clock is off. Rows older than ``forget_after_seconds`` are left out.
    """
    now = now or utcnow()
    out = []
    for r in session.scalars(select(ServiceHeartbeat)):
        age = (now - r.last_seen).total_seconds()
        if age > forget_after_seconds:
            continue
        out.append({"service": r.service, "kind": r.kind, "site": r.site, "instance": r.instance or None,
                    "host": r.host, "pid": r.pid, "started_at": r.started_at, "last_seen": r.last_seen,
                    "age_seconds": round(age, 1), "restarts": r.restarts or 0,
                    "alive": is_alive(r.host, r.pid, age, dead_after_seconds, r.pid_namespace),
                    "clock_offset_seconds": (None if r.clock_offset_seconds is None
                                             else round(r.clock_offset_seconds, 3))})
    return sorted(out, key=lambda d: (not d["alive"], d["service"]))


def forget_service(db: Database, service: str, *, dead_after_seconds: float = DEAD_AFTER_SECONDS,
                   now: dt.datetime | None = None) -> dict[str, Any]:
    """Forget a dead service (``packhorse health --forget NAME``): delete its row, so it is no
    longer listed nor counted (a service taken out of the installation).

    Returns:
        the row as :func:`list_services` showed it.

    Raises:
        ServiceHealthError: no service ``service`` is recorded, or it is alive (it would only
            reappear at its next heartbeat: stop it first).
    """

    def tx(s: Session) -> dict[str, Any]:
        t = now or utcnow()
        row = s.scalars(select(ServiceHeartbeat).where(ServiceHeartbeat.service == service)).first()
        if row is None:
            known = ", ".join(sorted(s.scalars(select(ServiceHeartbeat.service)))) or "none"
            raise ServiceHealthError(f"--forget: no service {service!r} is recorded (recorded: {known})")
        age = (t - row.last_seen).total_seconds()
        if is_alive(row.host, row.pid, age, dead_after_seconds, row.pid_namespace):
            raise ServiceHealthError(f"--forget: {service} is alive (last heartbeat {age:.0f} s ago); stop it "
                                     "first: a clean stop removes it by itself")
        out = {"service": row.service, "kind": row.kind, "host": row.host, "pid": row.pid,
               "last_seen": row.last_seen, "age_seconds": round(age, 1)}
        s.delete(row)
        return out

    return db.transact(tx)


class HeartbeatThread:
    """Records this process's heartbeat every ``interval_seconds`` from a daemon thread.

    The service is recorded under its identity (:func:`service_identity` of ``kind``, ``site``,
    ``instance``, this host), or under ``service`` if given. A failed write (database blip) is
    logged and retried on the next tick; it never stops the service. Use as a context manager
    or call :meth:`start` / :meth:`stop`.

    Raises:
        ConfigError: ``instance`` is not a valid name.
    """

    def __init__(self, db: Database, kind: str, *, interval_seconds: float = HEARTBEAT_INTERVAL_SECONDS,
                 site: str | None = None, instance: str | None = None, service: str | None = None,
                 forget_after_seconds: float = FORGET_AFTER_SECONDS,
                 clock: Callable[[], dt.datetime] | None = None) -> None:
        self.db = db
        self.kind = kind
        self.site = site
        self.instance = check_instance(instance)
        self.service = service or service_identity(kind, site=site, instance=self.instance)
        self.interval = interval_seconds
        self.forget_after_seconds = forget_after_seconds
        self._clock = clock
        self._warned_duplicate = False
        if clock is None:
            db.follow_clock()  # the database's time, even for the first timestamp of a process
        #: when this process started serving: its incarnation (a restart has another one)
        self.started_at = clock() if clock else utcnow()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"health-{kind}", daemon=True)

    #: see :data:`SLOW_BEAT_SECONDS` and :data:`RETRY_AFTER_FAILURE_SECONDS` (seconds)
    slow_beat_seconds = SLOW_BEAT_SECONDS
    retry_after_failure_seconds = RETRY_AFTER_FAILURE_SECONDS

    def beat(self, *, quiet: bool = False) -> bool:
        """Record one heartbeat now; ``False`` (logged: an ERROR, or DEBUG when ``quiet``, for a
        failure that repeats one logged already) if the database refused it."""
        try:
            host = socket.gethostname()
            previous = record_heartbeat(self.db, self.service, kind=self.kind, host=host, pid=os.getpid(),
                                        site=self.site, instance=self.instance, started_at=self.started_at,
                                        pid_namespace=process_namespace(),
                                        forget_after_seconds=self.forget_after_seconds,
                                        now=self._clock() if self._clock else None)
            if (previous is not None and previous[0] == host and previous[1] != os.getpid()
                    and process_alive(previous[1]) and not self._warned_duplicate):
                # not a restart: two live processes share one identity and take the row from
                # each other at every heartbeat
                self._warned_duplicate = True
                log.error("service_identity_shared", service=self.service, other_pid=previous[1], pid=os.getpid(),
                          hint="give each service of one kind on one host its own --instance NAME")
            return True
        except Exception as e:  # never let health reporting kill the service
            (log.debug if quiet else log.error)("health_heartbeat_failed", service=self.service, error=str(e))
            return False

    def _run(self) -> None:
        """Beat every interval; a slow beat is made again at once, a failed one is tried again
        after :attr:`retry_after_failure_seconds` (one ERROR per run of failures, one INFO
        ``health_heartbeat_back`` when it ends)."""
        failing = False
        while True:
            started = time.monotonic()
            ok = self.beat(quiet=failing)
            if ok and time.monotonic() - started > self.slow_beat_seconds:
                ok = self.beat(quiet=failing)  # the first one's time is from before the wait
            if ok and failing:
                log.info("health_heartbeat_back", service=self.service)
            failing = not ok
            if self._stop.wait(self.interval if ok else min(self.interval, self.retry_after_failure_seconds)):
                return

    def start(self) -> "HeartbeatThread":
        self._thread.start()
        return self

    def stop(self, *, remove: bool = False) -> None:
        """Stop beating; ``remove``: delete this service's row (a clean shutdown is not a
        death) — only while it is still this process's (a successor may have taken it over)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if remove:
            try:
                self.db.transact(lambda s: s.execute(
                    delete(ServiceHeartbeat).where(ServiceHeartbeat.service == self.service,
                                                   ServiceHeartbeat.started_at == self.started_at)))
            except Exception as e:
                log.error("health_unregister_failed", service=self.service, error=str(e))

    def __enter__(self) -> "HeartbeatThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def scan_health(session: Session, *, overdue_seconds: float) -> list[dict[str, Any]]:
    """The scans ``packhorse health`` lists as a problem: source locations whose scan has not
    completed for longer than ``overdue_seconds`` (s) (:func:`packhorse.operations.scan_lease.overdue_scans`;
    distributed mode, where scans hold a scan lease). Same shape as that function's."""
    return overdue_scans(session, overdue_seconds=overdue_seconds)

