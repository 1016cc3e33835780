"""The one clock of every packhorse process: the ops database's.

Leases, heartbeats, claims, stalls, circuit-breaker cool-downs, failure events and service
health ages are written by one process and judged by another, often on another host. Judged
with each host's own clock, a host whose clock runs ahead declares every live lease expired,
and one whose clock runs behind (or ahead, as the writer) keeps a dead worker's lease for as
long as its clock is off. So every timestamp packhorse writes or compares is the database
server's time, seen from this process: :func:`now` is this host's clock (:func:`host_now`, the
one place that reads it) plus this process's measured offset to the database clock
(:func:`offset_seconds`).

The offset is measured by :class:`packhorse.db.session.Database` with :func:`measure` (on
PostgreSQL ``SELECT clock_timestamp()``, the server's wall clock at the moment the statement
runs, compensated by half the round trip; the best of a few samples) before the first unit of
work of a process and again at most every ``clock_refresh_seconds`` (30 s), so a host clock
stepped by NTP is followed within that time. An embedded SQLite database lives on this host:
its offset is 0 and it is never measured. The offset is process-wide (one value per process;
a forked child inherits it and measures again). A process whose offset exceeds a threshold
(``[database] clock_offset_warn_seconds``, 2 s) logs one ``clock_offset`` WARNING; services
record their offset with their health heartbeat and ``packhorse health`` shows it.

What stays on the host's clock on purpose: file modification times compared with a file
system's (the scan's settle time, partial-file sweeps), intervals a process measures for itself
(``time.monotonic``), and identity markers' informational dates.

All times are timezone-aware UTC; offsets are seconds (database clock minus host clock).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable

import structlog

log = structlog.get_logger(__name__)

#: Default of ``[database] clock_offset_warn_seconds``: a process farther than this from the
#: database's clock logs one WARNING and is marked in ``packhorse health``.
DEFAULT_WARN_SECONDS = 2.0
#: How often a process measures its offset again (s).
DEFAULT_REFRESH_SECONDS = 30.0
#: Samples per measurement; the one with the shortest round trip is kept.
SAMPLES = 3

_lock = threading.Lock()
_offset_seconds = 0.0
_measured = False
_warned = False


def host_now() -> dt.datetime:
    """This host's clock, timezone-aware UTC: the one read of it that database timestamps are
    derived from (:func:`now` adds the offset). Tests of the project shift it in subprocesses
    (``tests/clock_shift``) to play a host whose clock is off."""
    return dt.datetime.now(dt.timezone.utc)


def now() -> dt.datetime:
    """The database's clock as seen from this process, timezone-aware UTC: :func:`host_now`
    plus :func:`offset_seconds`. Use it for every timestamp that another process may compare
    (leases, heartbeats, failure events, breakers, health)."""
    return host_now() + dt.timedelta(seconds=_offset_seconds)


def offset_seconds() -> float:
    """This process's offset to the database clock (s; database minus host; 0.0 until measured,
    and always for SQLite)."""
    return _offset_seconds


def measured() -> bool:
    """Whether this process has measured its offset (False for SQLite, whose offset is 0)."""
    return _measured


def measure(read_database_clock: Callable[[], dt.datetime], *, samples: int = SAMPLES) -> float:
    """Measure the offset of the database clock to this host's: ``read_database_clock()`` runs
    one statement returning the server's current time (PostgreSQL ``SELECT clock_timestamp()``);
    the server read it about half-way through the round trip, so the offset is the server's time
    minus the host's time at the midpoint of the call. Of ``samples`` calls the one with the
    shortest round trip is kept (the least uncertain: at most half its round trip off).

    Returns:
        the offset (s, database minus host), not stored (:func:`record` stores it).

    Raises:
        whatever ``read_database_clock`` raises (a database error): the stored offset is kept.
    """
    best: tuple[float, float] | None = None  # (round trip, offset)
    for _ in range(max(1, samples)):
        t0 = host_now()
        server = read_database_clock()
        t1 = host_now()
        if server.tzinfo is None:  # a server answering without a zone answers in UTC
            server = server.replace(tzinfo=dt.timezone.utc)
        round_trip = (t1 - t0).total_seconds()
        offset = (server - (t0 + (t1 - t0) / 2)).total_seconds()
        if best is None or round_trip < best[0]:
            best = (round_trip, offset)
    assert best is not None
    return best[1]


def record(offset: float, *, warn_above_seconds: float = DEFAULT_WARN_SECONDS, database: str = "") -> None:
    """Store ``offset`` (s, database minus host) as this process's; the first time in this
    process that ``|offset|`` exceeds ``warn_above_seconds`` log one ``clock_offset`` WARNING
    naming ``database`` (a URL without password)."""
    global _offset_seconds, _measured, _warned
    with _lock:
        _offset_seconds = offset
        _measured = True
        warn = abs(offset) > warn_above_seconds and not _warned
        if warn:
            _warned = True
    if warn:
        log.warning("clock_offset", offset_seconds=round(offset, 3), warn_above_seconds=warn_above_seconds,
                    database=database,
                    hint="this host's clock is off from the database server's: packhorse times leases, heartbeats "
                         "and health with the database's clock, so it goes on correctly, but logs, file times and "
                         "other programs here use this host's: synchronize it (NTP, chrony)")


def reset() -> None:
    """Forget the measured offset (back to 0, unmeasured, not warned): a process that starts
    over with another database (tests)."""
    global _offset_seconds, _measured, _warned
    with _lock:
        _offset_seconds, _measured, _warned = 0.0, False, False
