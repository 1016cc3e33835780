"""Disk monitoring: measure every active disk location, record it, notify threshold crossings.

Every ``[disk_usage] interval_seconds`` (60 s, seed 002) :func:`measure_all` records one
:class:`~packhorse.db.models.DiskUsageSample` per active disk location, stamped with the UTC
time it was measured: total, used and free bytes and ``percent`` as ``df`` computes it,
``used / (used + available) × 100`` — blocks reserved for root count as unavailable, so a
file system whose writes already fail for packhorse does not read as 5 % free. Crossing warning (70 %), critical (85 %) or
emergency (95 %) upwards queues one notification per crossing, in the same transaction as the
sample; the alert state then stays until usage falls below recovery (60 %), which queues a
"recovered" notification (so usage hovering around a threshold does not notify again and
again). The deletion manager reads the latest sample (:func:`latest_usage`) to choose its
order and retention (:mod:`packhorse.managers.deletions`).

Where the numbers come from is a :data:`~packhorse.storage.usage.UsageProvider`: the file system (``os.statvfs`` of
the location's root folder; a missing root is not measured — the folder it would be in may be
another file system, e.g. an unmounted disk's mount point's parent), unless the caller passes
another one, or the process's hooks (:meth:`packhorse.runtime.hooks.Hooks.disk_usage`, handed in by
tests) supply one.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import structlog
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from packhorse.config import DiskUsageConfig, Settings
from packhorse.db.models import DataLocation, DiskUsageSample, utcnow
from packhorse.db.session import Database
from packhorse.domain import DiskLevel, StorageType
from packhorse.notify import messages
from packhorse.storage.usage import Usage, UsageHooks, UsageProvider, provider_for, quarantined_bytes

log = structlog.get_logger(__name__)


def level_for(percent: float, cfg: DiskUsageConfig) -> DiskLevel:
    """The band of ``percent``: emergency ≥ 95, critical ≥ 85, warning ≥ 70, else normal."""
    if percent >= cfg.emergency_percent:
        return DiskLevel.EMERGENCY
    if percent >= cfg.critical_percent:
        return DiskLevel.CRITICAL
    if percent >= cfg.warning_percent:
        return DiskLevel.WARNING
    return DiskLevel.NORMAL


def next_alert(previous: DiskLevel, percent: float, cfg: DiskUsageConfig) -> tuple[DiskLevel, str | None]:
    """The alert state after a measurement and the notification it causes, if any.

    Rising into a higher band than ``previous`` notifies that band (once); falling below
    ``recovery_percent`` from a raised state notifies ``"recovered"``; anything else keeps the
    state silently.
    """
    band = level_for(percent, cfg)
    if band.rank > previous.rank:
        return band, band.value
    if previous is not DiskLevel.NORMAL and percent < cfg.recovery_percent:
        return DiskLevel.NORMAL, "recovered"
    return previous, None


def _threshold(event: str, cfg: DiskUsageConfig) -> float:
    return {"warning": cfg.warning_percent, "critical": cfg.critical_percent,
            "emergency": cfg.emergency_percent, "recovered": cfg.recovery_percent}[event]


def monitored_locations(settings: Settings) -> list[str]:
    """Names of the active disk locations (every role)."""
    return [l.name for l in settings.locations if l.active and l.storage is StorageType.DISK and l.path]


def record_sample(db: Database, settings: Settings, location_id: int, name: str, usage: Usage,
                  now: dt.datetime | None = None, *, quarantined: int | None = None) -> DiskUsageSample:
    """Record one measurement of location ``name`` and queue its crossing notification in the
    same transaction; prunes samples older than ``keep_days``. ``quarantined``: bytes under
    its quarantine (:func:`packhorse.storage.usage.quarantined_bytes`; ``None``: not measured).
    Returns the new sample."""
    cfg = settings.disk_usage

    def tx(s: Session) -> DiskUsageSample:
        t = now or utcnow()
        prev = s.scalar(select(DiskUsageSample.alert_level).where(DiskUsageSample.location_id == location_id)
                        .order_by(DiskUsageSample.measured_at.desc(), DiskUsageSample.id.desc()).limit(1))
        alert, event = next_alert(DiskLevel(prev) if prev else DiskLevel.NORMAL, usage.percent, cfg)
        sample = DiskUsageSample(location_id=location_id, measured_at=t, total_bytes=usage.total,
                                 used_bytes=usage.used, free_bytes=usage.free, percent=usage.percent,
                                 level=level_for(usage.percent, cfg).value, alert_level=alert.value,
                                 quarantined_bytes=quarantined)
        s.add(sample)
        if event is not None:
            messages.disk_level(s, location=name, event=event, percent=usage.percent, used_bytes=usage.used,
                                total_bytes=usage.total, free_bytes=usage.free, threshold_percent=_threshold(event, cfg),
                                measured_at=t)
            log.warning("disk_usage_" + event, location=name, percent=round(usage.percent, 1))
        s.execute(delete(DiskUsageSample).where(DiskUsageSample.location_id == location_id,
                                                DiskUsageSample.measured_at < t - dt.timedelta(days=cfg.keep_days)))
        s.flush()
        return sample

    return db.transact(tx)


def measure_all(db: Database, settings: Settings, location_ids: dict[str, int],
                provider: UsageProvider | None = None, *, hooks: "UsageHooks | None" = None) -> list[dict[str, Any]]:
    """Measure and record every active disk location once, with ``provider`` (default:
    :func:`provider_for` ``hooks``).

    A location that cannot be measured (folder unreadable, provider error) is logged and
    skipped; the others are still recorded.

    Returns:
        one dict per recorded location (see :func:`sample_dict`).
    """
    provider = provider or provider_for(hooks)
    out = []
    for name in monitored_locations(settings):
        try:
            usage = provider(name, settings.location_path(name))
        except FileNotFoundError as e:  # nothing written there yet (roots are made on first write)
            log.info("disk_usage_root_missing", location=name, error=str(e))
            continue
        except (OSError, ValueError, KeyError) as e:
            log.error("disk_usage_unmeasurable", location=name, error=str(e))
            continue
        try:
            quarantined: int | None = quarantined_bytes(settings.location_path(name))
        except OSError as e:
            log.info("quarantine_unmeasurable", location=name, error=str(e))
            quarantined = None
        sample = record_sample(db, settings, location_ids[name], name, usage, quarantined=quarantined)
        out.append(sample_dict(name, sample))
    return out


def sample_dict(location: str, s: DiskUsageSample, now: dt.datetime | None = None) -> dict[str, Any]:
    """A sample as plain data: location, measured_at (ISO 8601 UTC), age_seconds (how long
    before ``now`` it was measured), total/used/free bytes, percent, level, alert_level,
    quarantined_bytes (bytes under the location's ``_packhorse/quarantine/``, part of used;
    ``None``: not measured)."""
    measured = s.measured_at if s.measured_at.tzinfo else s.measured_at.replace(tzinfo=dt.timezone.utc)
    age = ((now or utcnow()) - measured).total_seconds()
    return {"location": location, "measured_at": measured.isoformat(), "age_seconds": round(max(age, 0.0), 1),
            "total_bytes": s.total_bytes, "used_bytes": s.used_bytes, "free_bytes": s.free_bytes,
            "percent": round(s.percent, 3), "level": s.level, "alert_level": s.alert_level,
            "quarantined_bytes": s.quarantined_bytes}


def latest_usage(session: Session, *, max_age_seconds: float | None = None) -> dict[str, DiskUsageSample]:
    """The latest sample of every location, by location name (the query for the deletion
    manager, ``packhorse usage``, the dashboard and the metrics).

    Args:
        max_age_seconds: leave out samples older than this (``None``: any age).
    """
    # per location, one search on (location_id, measured_at): this runs every deletion
    # manager cycle, and a GROUP BY would read every sample kept (keep_days of them)
    newest = (select(DiskUsageSample.id).where(DiskUsageSample.location_id == DataLocation.id)
              .order_by(DiskUsageSample.measured_at.desc(), DiskUsageSample.id.desc()).limit(1)
              .correlate(DataLocation).scalar_subquery())
    q = select(DataLocation.name, DiskUsageSample).join(DiskUsageSample, DiskUsageSample.id == newest)
    if max_age_seconds is not None:
        q = q.where(DiskUsageSample.measured_at >= utcnow() - dt.timedelta(seconds=max_age_seconds))
    return {name: sample for name, sample in session.execute(q).all()}


def usage_history(session: Session, location: str, since: dt.datetime) -> list[DiskUsageSample]:
    """Samples of data location ``location`` measured at or after ``since`` (UTC), oldest first."""
    return list(session.scalars(
        select(DiskUsageSample).join(DataLocation, DataLocation.id == DiskUsageSample.location_id)
        .where(DataLocation.name == location, DiskUsageSample.measured_at >= since)
        .order_by(DiskUsageSample.measured_at, DiskUsageSample.id)))


class DiskMonitor:
    """Measures every ``interval_seconds`` until stopped (a thread of ``packhorse run``, or the
    ``packhorse disk-monitor`` service)."""

    def __init__(self, db: Database, settings: Settings, location_ids: dict[str, int], *,
                 hooks: "UsageHooks | None" = None) -> None:
        self.db = db
        self.settings = settings
        self.location_ids = location_ids
        self.hooks = hooks

    def serve(self, stop: threading.Event) -> None:
        """Measure at once, then every interval, until ``stop`` is set; never dies on an error."""
        while not stop.is_set():
            try:
                measure_all(self.db, self.settings, self.location_ids, hooks=self.hooks)
            except Exception as e:  # a database blip: the next interval tries again
                log.error("disk_monitor_cycle_failed", error=repr(e))
            stop.wait(self.settings.disk_usage.interval_seconds)
