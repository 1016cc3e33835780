"""The pipeline over time, for the dashboard's charts: throughput, backlog, disk usage, failures.

What is drawn and where it comes from (the ops database, the single source of truth):

* **throughput per stage** — bytes and raw files per minute of the operations that
  *completed* in each interval (``operations.lifecycle.finished_at``, ``bytes_done``; files: the raw
  files of the package the operation carried, or of every package of its bundle);
* **backlog per stage** — operations waiting (``PENDING``/``SCHEDULED``), running and
  ``FAILED``: a count *now* cannot be turned back into a past, so :func:`record_backlog`
  samples it every ``[api] history_interval_seconds`` (60 s) into ``backlog_samples``, from
  ``packhorse run`` and ``packhorse api`` (:class:`BacklogSampler`); samples older than
  ``[api] history_keep_days`` (7 days) are deleted at each sample, so the table holds at most
  ``keep_days × 86400 / interval`` rows per operation kind;
* **disk usage per location** — the disk monitor's samples (``disk_usage_samples``, kept
  ``[disk_usage] keep_days``), with the warning / critical / emergency thresholds;
* **failures over time** — failure events per stage (``failure_events.created_at``), counts
  only: no error text (observers may see the charts).

:func:`history` puts all four on one time grid. Times are UTC; the grid is given as Unix
seconds of each interval's start.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from packhorse.db.models import (
    BacklogSample,
    DataLocation,
    DiskUsageSample,
    FailureEvent,
    Operation,
    PhysicalCopy,
    RawDataPackage,
    utcnow,
)
from packhorse.db.session import Database
from packhorse.domain import OperationKind, Status
from packhorse.errors import HistoryWindowError

if TYPE_CHECKING:
    from packhorse.config import Settings

log = structlog.get_logger(__name__)

#: The longest window :func:`history` draws (minutes): the default backlog retention.
MAX_WINDOW_MINUTES = 7 * 24 * 60
#: At most this many points per series (the grid's step grows with the window).
MAX_POINTS = 600
_WAITING = (Status.PENDING.value, Status.SCHEDULED.value)


def interval_start(t: dt.datetime, interval_seconds: float) -> dt.datetime:
    """The start of the sampling interval holding ``t`` (UTC; intervals counted from the epoch)."""
    epoch = t.timestamp()
    return dt.datetime.fromtimestamp(epoch - math.fmod(epoch, interval_seconds), dt.timezone.utc)


def record_backlog(db: Database, *, interval_seconds: float, keep_days: float,
                   now: dt.datetime | None = None) -> dict[str, dict[str, int]]:
    """Record the backlog of every operation kind for the interval holding ``now``.

    One row per kind (zeros included, so a chart shows the backlog draining to nothing); a
    row already written for this interval (by this or another process) is overwritten: the
    latest sample of an interval stands. Deletes samples older than ``keep_days`` in the same transaction.

    Returns:
        ``{kind: {"waiting", "running", "failed"}}`` as counted now.
    """
    t = now or utcnow()
    at = interval_start(t, interval_seconds)

    def tx(s: Session) -> dict[str, dict[str, int]]:
        counts = {k.value: {"waiting": 0, "running": 0, "failed": 0} for k in OperationKind}
        for kind, status, n in s.execute(
                select(Operation.kind, Operation.status, func.count())
                .where(Operation.status.in_([*_WAITING, Status.IN_PROGRESS.value, Status.FAILED.value]))
                .group_by(Operation.kind, Operation.status)):
            col = "waiting" if status in _WAITING else "running" if status == Status.IN_PROGRESS.value else "failed"
            counts[kind][col] += int(n)
        rows = [{"measured_at": at, "kind": k, **v} for k, v in counts.items()]
        if s.get_bind().dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        stmt = insert(BacklogSample.__table__)
        s.execute(stmt.on_conflict_do_update(index_elements=["measured_at", "kind"], set_={
            "waiting": stmt.excluded.waiting, "running": stmt.excluded.running, "failed": stmt.excluded.failed}), rows)
        s.execute(delete(BacklogSample).where(BacklogSample.measured_at < t - dt.timedelta(days=keep_days)))
        return counts

    return db.transact(tx)


class BacklogSampler:
    """Samples the backlog every ``[api] history_interval_seconds`` until stopped (a thread of
    ``packhorse run`` and of ``packhorse api``)."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.interval = settings.api.history_interval_seconds
        self.keep_days = settings.api.history_keep_days

    def serve(self, stop: threading.Event) -> None:
        """Sample at once, then at every interval, until ``stop`` is set; never dies on an error."""
        while not stop.is_set():
            try:
                record_backlog(self.db, interval_seconds=self.interval, keep_days=self.keep_days)
            except Exception as e:  # a database blip: the next interval tries again
                log.error("backlog_sample_failed", error=repr(e))
            now = utcnow().timestamp()
            stop.wait(self.interval - math.fmod(now, self.interval) + 0.05)


def _step_seconds(minutes: int) -> int:
    """The grid step: whole minutes, at most :data:`MAX_POINTS` points."""
    return 60 * max(1, math.ceil(minutes / MAX_POINTS))


#: Ids per ``IN (…)`` list (SQLite allows 32 766 bound parameters per statement).
IN_CHUNK = 5000


def _chunks(ids: set[int]) -> list[list[int]]:
    ordered = sorted(ids)
    return [ordered[i:i + IN_CHUNK] for i in range(0, len(ordered), IN_CHUNK)]


def _files_carried(session: Session, ops: list[tuple[Any, ...]]) -> dict[int, int]:
    """``{operation id: raw files carried}`` for completed operations ``(id, rdp, dtp, copy)``."""
    copies: dict[int, tuple[int | None, int | None]] = {}
    for chunk in _chunks({o[3] for o in ops if o[3] is not None}):
        copies.update({c: (r, d) for c, r, d in session.execute(
            select(PhysicalCopy.id, PhysicalCopy.raw_data_package_id, PhysicalCopy.data_transfer_package_id)
            .where(PhysicalCopy.id.in_(chunk)))})
    subjects = []
    for op_id, rdp, dtp, copy in ops:
        if rdp is None and dtp is None and copy in copies:
            rdp, dtp = copies[copy]
        subjects.append((op_id, rdp, dtp))
    rdps = {r for _o, r, _d in subjects if r is not None}
    dtps = {d for _o, r, d in subjects if r is None and d is not None}
    per_rdp: dict[int, int] = {}
    for chunk in _chunks(rdps):
        per_rdp.update(session.execute(select(RawDataPackage.id, RawDataPackage.file_count)
                                       .where(RawDataPackage.id.in_(chunk))).all())
    per_dtp: dict[int, int] = {}
    for chunk in _chunks(dtps):
        per_dtp.update(session.execute(select(RawDataPackage.data_transfer_package_id, func.sum(RawDataPackage.file_count))
                                       .where(RawDataPackage.data_transfer_package_id.in_(chunk))
                                       .group_by(RawDataPackage.data_transfer_package_id)).all())
    return {o: int(per_rdp.get(r, 0) if r is not None else per_dtp.get(d, 0) or 0) for o, r, d in subjects}


def history(session: Session, settings: Settings, *, minutes: int = 60, now: dt.datetime | None = None) -> dict[str, Any]:
    """The last ``minutes`` of throughput, backlog, disk usage and failures on one time grid.

    Returns:
        ``{"since", "until" (ISO UTC), "step_seconds", "times": [Unix seconds of each
        interval's start], "throughput": {kind: {"bytes_per_minute": [float], "files_per_minute":
        [float]}}, "backlog": {kind: {"waiting": [int | None], "running": [...], "failed":
        [...]}}, "failures": {kind: [int]}, "disk": {location: {"percent": [float | None],
        "used_bytes": [int | None], "total_bytes": int | None}}, "thresholds": {"warning",
        "critical", "emergency", "recovery"} (percent)}``; a ``None`` is an interval without a
        sample (before sampling began, or while nothing ran); every series has one value per
        grid time; kinds and locations without any data in the window are left out.

    Raises:
        HistoryWindowError: ``minutes`` is not in 1 … :data:`MAX_WINDOW_MINUTES`.
    """
    if not 1 <= minutes <= MAX_WINDOW_MINUTES:
        raise HistoryWindowError(f"minutes: give 1 to {MAX_WINDOW_MINUTES}, not {minutes}")
    now = now or utcnow()
    step = _step_seconds(minutes)
    end = interval_start(now, step) + dt.timedelta(seconds=step)
    n = math.ceil(minutes * 60 / step)
    since = end - dt.timedelta(seconds=n * step)
    base = since.timestamp()
    times = [int(base + i * step) for i in range(n)]
    per_minute = 60.0 / step

    def slot(t: dt.datetime) -> int | None:
        i = int((t.timestamp() - base) // step)
        return i if 0 <= i < n else None

    ops = session.execute(select(Operation.id, Operation.kind, Operation.finished_at, Operation.bytes_done,
                                 Operation.raw_data_package_id, Operation.data_transfer_package_id,
                                 Operation.physical_copy_id)
                          .where(Operation.status == Status.COMPLETED.value, Operation.finished_at >= since,
                                 Operation.finished_at < end)).all()
    files = _files_carried(session, [(o.id, o.raw_data_package_id, o.data_transfer_package_id, o.physical_copy_id)
                                     for o in ops])
    throughput: dict[str, dict[str, list[float]]] = {}
    for o in ops:
        i = slot(o.finished_at)
        if i is None:
            continue
        series = throughput.setdefault(o.kind, {"bytes_per_minute": [0.0] * n, "files_per_minute": [0.0] * n})
        series["bytes_per_minute"][i] += (o.bytes_done or 0) * per_minute
        series["files_per_minute"][i] += files.get(o.id, 0) * per_minute

    backlog: dict[str, dict[str, list[int | None]]] = {}
    for b in session.scalars(select(BacklogSample).where(BacklogSample.measured_at >= since,
                                                         BacklogSample.measured_at < end)
                             .order_by(BacklogSample.measured_at)):
        i = slot(b.measured_at)
        if i is None:
            continue
        series_b = backlog.setdefault(b.kind, {"waiting": [None] * n, "running": [None] * n, "failed": [None] * n})
        series_b["waiting"][i], series_b["running"][i], series_b["failed"][i] = b.waiting, b.running, b.failed
    backlog = {k: v for k, v in backlog.items()
               if any(x for col in v.values() for x in col)}  # a kind that never had work is noise

    failures: dict[str, list[int]] = {}
    for kind, at in session.execute(select(FailureEvent.kind, FailureEvent.created_at)
                                    .where(FailureEvent.created_at >= since, FailureEvent.created_at < end)):
        i = slot(at)
        if i is not None:
            failures.setdefault(kind, [0] * n)[i] += 1

    disk: dict[str, dict[str, Any]] = {}
    for loc_id, name in session.execute(select(DataLocation.id, DataLocation.name).order_by(DataLocation.id)):
        # per location: a range of the (location_id, measured_at) index, not every sample kept
        for d in session.scalars(select(DiskUsageSample).where(
                DiskUsageSample.location_id == loc_id, DiskUsageSample.measured_at >= since,
                DiskUsageSample.measured_at < end).order_by(DiskUsageSample.measured_at, DiskUsageSample.id)):
            i = slot(d.measured_at)
            if i is None:
                continue
            series_d = disk.setdefault(name, {"percent": [None] * n, "used_bytes": [None] * n, "total_bytes": None})
            series_d["percent"][i] = round(float(d.percent), 3)  # the last sample of an interval
            series_d["used_bytes"][i] = int(d.used_bytes)
            series_d["total_bytes"] = int(d.total_bytes)
    du = settings.disk_usage
    return {"since": since.isoformat(), "until": end.isoformat(), "step_seconds": step, "times": times,
            "throughput": throughput, "backlog": backlog, "failures": failures, "disk": disk,
            "thresholds": {"warning": du.warning_percent, "critical": du.critical_percent,
                           "emergency": du.emergency_percent, "recovery": du.recovery_percent}}
