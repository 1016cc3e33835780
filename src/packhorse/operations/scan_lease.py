"""The scan's exclusion: one lease per source data location, renewed by heartbeats.

At most one worker scans a source location at a time (two would hash the same files twice and
race to register them). The exclusion used to be a PostgreSQL session advisory lock held as
long as the scanning process lived: a paused or hung holder (SIGSTOP, a process in D state on
an NFS mount) stopped all registration at the site for as long as it lived, every other scan
skipping with ``scan_skipped_already_running`` and nothing listed anywhere. Now it is a lease
like an operation's (DESIGN.md "Lease", I5):

* :func:`acquire` takes the lease of a location when nobody holds it or its holder's lease
  expired, and increments its fencing ``token`` (:class:`~packhorse.db.models.ScanLease`);
* :class:`ScanLeaseKeeper` renews it every ``heartbeat_seconds`` (a compare-and-set on the
  token); a holder that stops renewing loses it after ``lease_seconds`` and the next scan of
  another worker of the site takes it over; the old holder's renewals and release then change
  nothing (:attr:`ScanLeaseKeeper.lost` is set and logged once);
* :func:`release` ends it, recording ``completed_at`` when the scan completed;
* a scan request that arrives while the last completed scan rests (:func:`rest_until`: at
  least the managers' poll interval, and :data:`SCAN_REST_FACTOR` times as long as that scan
  worked, the time its holder could not reach the database left out;
  :func:`scan_rest_seconds`, the rule embedded mode paces its scans by too) is skipped
  too: every manager sends every site a scan request each poll, and a site's worker processes
  must not spend themselves walking an unchanged tree back to back while packaging waits for
  a free process (docs/benchmarks.md, "20,000 small files over a long thin link");
* :func:`overdue_scans`: locations whose scan has not completed for longer than
  ``[recovery] scan_overdue_seconds`` (listed by ``status`` as blocked work, cause
  ``scan_overdue``, and by ``health``).

Times are UTC; durations are seconds.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy import case, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from packhorse.db.models import ScanLease, utcnow
from packhorse.db.session import Database, insert_ignoring_conflicts

log = structlog.get_logger(__name__)

#: A completed scan rests this many times as long as it took before the next one starts (so
#: the scans of a location take at most about a quarter of one worker process).
SCAN_REST_FACTOR = 3.0


@dataclass(frozen=True)
class ScanClaim:
    """One holder's acquisition of the scan lease of ``location``; ``token`` is its fencing token."""

    location: str
    holder: str
    token: int


def scan_rest_seconds(took_seconds: float, *, min_rest_seconds: float) -> float:
    """How long (s) a completed scan of a source rests before the next one may start: the
    longer of ``min_rest_seconds`` (the managers' poll interval, s) and :data:`SCAN_REST_FACTOR`
    × ``took_seconds`` (how long that scan took, s). The one pacing rule of both modes:
    distributed, on the scan lease's row (:func:`rest_until`, by the database's clock);
    embedded, in :class:`packhorse.executors.local.ScanPacing` (by this process's monotonic
    clock, a scan there covering every source location)."""
    return max(min_rest_seconds, SCAN_REST_FACTOR * took_seconds)


def rest_until(started_at: dt.datetime | None, completed_at: dt.datetime | None, *,
               min_rest_seconds: float, worked_seconds: float | None = None) -> dt.datetime | None:
    """When the next scan of a location may start after its last completed one (UTC; ``None``:
    at once): ``completed_at`` plus :func:`scan_rest_seconds` of how long that scan worked
    (``worked_seconds``, the time its holder could not reach the database left out; where it
    was not recorded, ``completed_at − started_at``) and ``min_rest_seconds`` (s). A location
    never completed, or a scan under way since (``started_at`` after ``completed_at``; a failed
    scan records no completion either), does not rest."""
    if completed_at is None or (started_at is not None and started_at > completed_at):
        return None
    if worked_seconds is not None:
        took = max(0.0, worked_seconds)
    else:
        took = (completed_at - started_at).total_seconds() if started_at is not None else 0.0
    return completed_at + dt.timedelta(seconds=scan_rest_seconds(took, min_rest_seconds=min_rest_seconds))


_LEASE = ScanLease.__table__
#: what :func:`acquire` decides by: the lease's holder, expiry, fencing token and last scan
_BEFORE = select(_LEASE.c.holder, _LEASE.c.expires_at, _LEASE.c.token, _LEASE.c.started_at, _LEASE.c.completed_at,
                 _LEASE.c.worked_seconds)


def acquire(db: Database, location: str, holder: str, *, lease_seconds: float, min_rest_seconds: float = 0.0,
            now: dt.datetime | None = None) -> ScanClaim | None:
    """Take the scan lease of ``location`` for ``holder`` for ``lease_seconds`` (s), if nobody
    holds it or the holder's lease expired (then it is taken over: WARNING
    ``scan_lease_taken_over``), and the last completed scan has rested (:func:`rest_until` with
    ``min_rest_seconds``; ``0``: only :data:`SCAN_REST_FACTOR` × its duration). Returns the
    claim, or ``None`` when the caller skips its scan: another holder's lease is live (INFO
    ``scan_skipped_already_running``) or the last scan rests (DEBUG ``scan_skipped_resting``).
    Times are the database's clock (``utcnow``).

    One read decides, and the take is a compare-and-set on what it read
    (:meth:`packhorse.db.session.Database.statements`: on PostgreSQL each statement one round
    trip, no transaction around them; every manager sends a scan request each poll, and across
    a long link the five round trips of a locking transaction kept a worker process from its
    work for half a second a request): the update applies only while the row still has the
    fencing token and the last completion that were read and the lease is still free. A
    holder's release or renewal committed between the read and the update changes one of
    them, so the update finds nothing and the request skips, as it would had it read after
    (found on the multi-site test bed: a release slipped in, and a scan started with no rest
    and warned of a takeover that never happened).
    """
    def once(conn: Connection) -> tuple[ScanClaim | None, str | None, dt.datetime | None]:
        t = now or utcnow()
        read = _BEFORE.where(_LEASE.c.location == location)
        before = conn.execute(read).first()
        if before is None:  # the location's first scan: its row, once
            conn.execute(insert_ignoring_conflicts(conn, _LEASE, _LEASE.c.location),
                         [{"location": location, "token": 0}])
            before = conn.execute(read).one()
        if before.expires_at is not None and before.expires_at > t:
            return None, None, None  # another holder's lease is live
        rest = rest_until(before.started_at, before.completed_at, min_rest_seconds=min_rest_seconds,
                          worked_seconds=before.worked_seconds)
        if rest is not None and rest > t:
            return None, None, rest
        got = conn.execute(update(_LEASE).where(
            _LEASE.c.location == location, _LEASE.c.token == before.token,
            _LEASE.c.completed_at.is_not_distinct_from(before.completed_at),
            or_(_LEASE.c.expires_at.is_(None), _LEASE.c.expires_at <= t))
            .values(holder=holder, token=_LEASE.c.token + 1, expires_at=t + dt.timedelta(seconds=lease_seconds),
                    heartbeat_at=t, started_at=case(
                        (_LEASE.c.completed_at.is_(None) & _LEASE.c.started_at.is_not(None), _LEASE.c.started_at),
                        else_=t)).returning(_LEASE.c.token)).first()
        if got is None:
            return None, None, None
        return ScanClaim(location, holder, int(got[0])), (before.holder if before.expires_at is not None else None), None

    claim, previous, resting = db.statements(once)
    if resting is not None:
        log.debug("scan_skipped_resting", location=location, until=resting.isoformat())
    elif claim is None:
        log.info("scan_skipped_already_running", location=location)
    if claim is not None and previous is not None:
        log.warning("scan_lease_taken_over", location=location, previous_holder=previous, holder=holder,
                    token=claim.token)
    return claim


def renew(db: Database, claim: ScanClaim, *, lease_seconds: float) -> bool:
    """Extend ``claim``'s lease by ``lease_seconds`` (s) from now; ``False`` if it is no longer
    the holder's (taken over: its token is stale). One statement, a compare-and-set on the
    token (:meth:`packhorse.db.session.Database.statements`)."""
    def once(conn: Connection) -> bool:
        t = utcnow()
        return conn.execute(update(_LEASE).where(_LEASE.c.location == claim.location, _LEASE.c.token == claim.token)
                            .values(expires_at=t + dt.timedelta(seconds=lease_seconds), heartbeat_at=t)
                            .returning(_LEASE.c.token)).first() is not None

    return bool(db.statements(once))


def release(db: Database, claim: ScanClaim, *, completed: bool, worked_seconds: float | None = None) -> bool:
    """End ``claim``'s lease (fenced on its token); with ``completed`` record ``completed_at``
    and ``worked_seconds`` (how long the scan worked, s, the time its holder could not reach the
    database left out; :func:`rest_until`). ``False`` if the lease was taken over meanwhile
    (nothing changed). One statement, a compare-and-set on the token."""
    def once(conn: Connection) -> bool:
        values: dict[str, Any] = {"holder": None, "expires_at": None}
        if completed:
            values["completed_at"] = utcnow()
            values["worked_seconds"] = worked_seconds
        return conn.execute(update(_LEASE).where(_LEASE.c.location == claim.location, _LEASE.c.token == claim.token)
                            .values(**values).returning(_LEASE.c.token)).first() is not None

    return bool(db.statements(once))


class ScanLeaseKeeper:
    """Renews a scan lease in a daemon thread every ``heartbeat_seconds`` (s) until
    :meth:`stop`. :attr:`lost` is set (and logged once, WARNING ``scan_lease_lost``) when a
    renewal finds the token stale, or when no renewal succeeded for ``lease_seconds − 1.5 ×
    heartbeat_seconds`` (the database unreachable): from then on another worker may scan.

    :attr:`unreachable_seconds` adds up the time the holder could not reach the database: each
    gap between two successful renewals beyond two heartbeats (renewals that failed, or hung on
    a link that went silent), less the one heartbeat a renewal is due after. :meth:`worked_seconds`
    is the scan's time less that: what its rest is measured by, so that a scan held up by a
    site cut off from the centre does not rest three times the cut once the link is back
    (found by a trial: new files waited minutes after a 132 s cut)."""

    def __init__(self, db: Database, claim: ScanClaim, *, lease_seconds: float, heartbeat_seconds: float) -> None:
        self.db = db
        self.claim = claim
        self.lease_seconds = lease_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.lost = threading.Event()
        self.started = self.last_ok = time.monotonic()
        self.unreachable_seconds = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"scan-lease-{claim.location}", daemon=True)

    def start(self) -> ScanLeaseKeeper:
        """Start renewing; returns ``self``."""
        self.started = self.last_ok = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing (waits for the thread)."""
        self._stop.set()
        self._thread.join(timeout=self.heartbeat_seconds + 5)

    def renewed(self, now: float) -> None:
        """Account a successful renewal at ``now`` (``time.monotonic()`` seconds): a gap since
        the last one (or the start) beyond two heartbeats was time the database could not be
        reached (:attr:`unreachable_seconds`)."""
        self.unreachable_seconds += self._beyond(now)
        self.last_ok = now

    def _beyond(self, now: float) -> float:
        gap = now - self.last_ok
        return gap - self.heartbeat_seconds if gap > 2 * self.heartbeat_seconds else 0.0

    def worked_seconds(self, now: float | None = None) -> float:
        """How long the scan has worked (s) until ``now`` (``time.monotonic()``; default: now):
        since :meth:`start`, less :attr:`unreachable_seconds` and the gap since the last
        renewal if that is already beyond two heartbeats (a scan ending while the database is
        still out of reach, or before a renewal came through after it returned)."""
        now = time.monotonic() if now is None else now
        return max(0.0, now - self.started - self.unreachable_seconds - self._beyond(now))

    def _lose(self, why: str) -> None:
        if not self.lost.is_set():
            self.lost.set()
            log.warning("scan_lease_lost", location=self.claim.location, holder=self.claim.holder,
                        token=self.claim.token, reason=why)

    def _run(self) -> None:
        give_up = max(self.heartbeat_seconds, self.lease_seconds - 1.5 * self.heartbeat_seconds)
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                if not renew(self.db, self.claim, lease_seconds=self.lease_seconds):
                    self._lose("taken over by another worker (token stale)")
                    return
                self.renewed(time.monotonic())
            except Exception as e:  # noqa: BLE001 - the database may be down for a while
                if time.monotonic() - self.last_ok > give_up:
                    self._lose(f"no renewal for {give_up:.0f} s: {e!r}")
                    return


@contextlib.contextmanager
def scan_lease(db: Database, location: str, holder: str, *, lease_seconds: float,
               heartbeat_seconds: float, min_rest_seconds: float = 0.0) -> Iterator[ScanLeaseKeeper | None]:
    """Hold the scan lease of ``location`` while the block runs, renewed by a
    :class:`ScanLeaseKeeper`; yields ``None`` (the caller skips its scan) while another
    holder's lease is live or the last scan rests (:func:`acquire`). A block that returns
    records ``completed_at``; one that raises releases the lease without it."""
    claim = acquire(db, location, holder, lease_seconds=lease_seconds, min_rest_seconds=min_rest_seconds)
    if claim is None:
        yield None
        return
    keeper = ScanLeaseKeeper(db, claim, lease_seconds=lease_seconds, heartbeat_seconds=heartbeat_seconds).start()
    completed = False
    try:
        yield keeper
        completed = True
    finally:
        keeper.stop()
        with contextlib.suppress(Exception):  # an unreachable database: the lease expires by itself
            release(db, claim, completed=completed and not keeper.lost.is_set(),
                    worked_seconds=keeper.worked_seconds())


def overdue_scans(session: Session, *, overdue_seconds: float, now: dt.datetime | None = None) -> list[dict[str, Any]]:
    """Source locations whose scan has not completed for longer than ``overdue_seconds`` (s):
    the last completion (or, before the first, the first start) is older than that. Each:
    ``{"location", "completed_at", "started_at", "holder", "expires_at", "overdue_seconds"}``
    (times ISO 8601 UTC or ``None``; ``overdue_seconds`` how long since the last completion or
    first start). Locations never scanned through a lease are not known here."""
    t = now or utcnow()
    limit = t - dt.timedelta(seconds=overdue_seconds)
    out = []
    for r in session.scalars(select(ScanLease).order_by(ScanLease.location)):
        since = r.completed_at or r.started_at
        if since is None or since > limit:
            continue
        out.append({"location": r.location, "completed_at": r.completed_at.isoformat() if r.completed_at else None,
                    "started_at": r.started_at.isoformat() if r.started_at else None, "holder": r.holder,
                    "expires_at": r.expires_at.isoformat() if r.expires_at else None,
                    "overdue_seconds": round((t - since).total_seconds())})
    return out


def not_due(session: Session, locations: Collection[str], *, min_rest_seconds: float,
            now: dt.datetime | None = None) -> dict[str, str]:
    """The source locations among ``locations`` a scan request would now only be skipped at,
    and why: ``{location: "running"}`` while a holder's lease is live, ``{location: "resting"}``
    while its last completed scan rests (:func:`rest_until` with ``min_rest_seconds``, s).
    :func:`acquire` decides again when a request arrives; this is the sender's look, so that a
    request it would skip is not sent (each costs the receiving worker a pool process and the
    broker's round trips; :func:`packhorse.executors.celery_app.dispatch_scans`). Locations
    without a lease row are due. Times are the database's clock (``utcnow``)."""
    t = now or utcnow()
    out: dict[str, str] = {}
    if not locations:
        return out
    for r in session.execute(select(ScanLease.location, ScanLease.expires_at, ScanLease.started_at,
                                    ScanLease.completed_at, ScanLease.worked_seconds)
                             .where(ScanLease.location.in_(list(locations)))):
        if r.expires_at is not None and r.expires_at > t:
            out[r.location] = "running"
            continue
        rest = rest_until(r.started_at, r.completed_at, min_rest_seconds=min_rest_seconds,
                          worked_seconds=r.worked_seconds)
        if rest is not None and rest > t:
            out[r.location] = "resting"
    return out
