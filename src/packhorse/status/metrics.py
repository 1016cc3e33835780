"""Prometheus metrics, read from the ops database at scrape time.

The database is the single source of truth (DESIGN.md "Architecture"), so ``/metrics`` of any
process — ``packhorse api`` on its own or embedded in ``packhorse run --api`` — reports the
whole installation, not what one process happened to see. One collector
(:class:`DatabaseCollector`) runs a handful of aggregate queries per scrape.

Metrics (label values are the names used everywhere: operation kinds, statuses, locations,
the ``cause`` names of :mod:`packhorse.status.blocked_work`). ``/metrics`` answers without a
token, so a label that names what went wrong — ``error_type`` — is only in the answer to a
caller with an API token (``observer`` or ``admin``), who may see failures in the API anyway:
:func:`registry_for` ``error_types``.

==============================================  =========  =====================================
``packhorse_operations``                        gauge      operations by ``kind``, ``status``
``packhorse_operations_stalled``                gauge      IN_PROGRESS with an expired lease, by ``kind``
``packhorse_queue_depth``                       gauge      PENDING/SCHEDULED runnable now, by ``kind``
``packhorse_stage_bytes_total``                 counter    payload bytes of completed operations, by ``kind``
``packhorse_stage_duration_seconds``            histogram  last-attempt duration of completed operations, by ``kind``
``packhorse_failure_events_total``              counter    failure events by ``kind`` (and ``error_type`` for a caller with a token)
``packhorse_operations_blocked``                gauge      operations that wait on something outside the pipeline, by ``cause``
``packhorse_location_unavailable``              gauge      1 while a data location is unavailable (its work waits), by ``location``
``packhorse_location_unavailable_seconds``      gauge      how long it has been unavailable (0 when available), by ``location``
``packhorse_site_unreachable``                  gauge      1 while a site is cut off from the centre (as ``status`` lists it), by ``site``
``packhorse_site_unreachable_seconds``          gauge      how long since its workers' last heartbeat (0 when reachable), by ``site``
``packhorse_links_unreachable``                 gauge      links between sites cut now (as ``status`` lists them)
``packhorse_link_unreachable_seconds``          gauge      how long a link has been cut, by ``source``, ``destination`` (only links cut now)
``packhorse_packages_not_archived``             gauge      raw data packages without every required verified archive copy
``packhorse_oldest_not_archived_age_seconds``   gauge      age of the oldest of them (0 when none)
``packhorse_quarantined_bytes``                 gauge      bytes in a location's quarantine (latest disk usage sample), by ``location``
``packhorse_source_audit_changed_total``        counter    source files the source audit found changed behind an unchanged size and mtime, by ``location``
``packhorse_source_audit_completed_timestamp_seconds`` gauge when the last source audit pass completed (Unix s, UTC), by ``location``
``packhorse_physical_copies``                   gauge      copies by ``location``, ``status``
``packhorse_physical_copy_bytes``               gauge      bytes of present copies by ``location``
``packhorse_notifications``                     gauge      notification outbox rows by ``status``
``packhorse_circuit_breakers_open``             gauge      open circuit breakers by ``kind``
``packhorse_dispatch_lost``                     gauge      operations the reconciler gave up on (blocked, ``dispatch_lost``), by ``kind``
``packhorse_disk_usage_bytes``                  gauge      latest disk usage by ``location``, ``kind`` (total/used/free)
``packhorse_disk_usage_ratio``                  gauge      latest used / (used + available) by ``location`` (0-1, df)
``packhorse_database_up``                       gauge      1 when the scrape could read the database
==============================================  =========  =====================================
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Float, case, cast, func, literal_column, select
from sqlalchemy.orm import Session

from packhorse.db.models import (
    CircuitBreaker,
    DataLocation,
    FailureEvent,
    LocationOutage,
    Notification,
    Operation,
    PhysicalCopy,
    RawDataPackage,
    Site,
    SourceAudit,
    utcnow,
)
from packhorse.db.session import Database
from packhorse.domain import (
    ACTIVE_STATUSES,
    WAITING_DELETION_RULE,
    BreakerState,
    CopyStatus,
    OperationKind,
    Status,
)
from packhorse.recovery.health import list_services
from packhorse.recovery.link_reachability import cut_links
from packhorse.recovery.reconciler import dispatch_given_up
from packhorse.recovery.site_reachability import unreachable_sites
from packhorse.rules.availability import waiting_for
from packhorse.rules.disk_usage import latest_usage
from packhorse.rules.space import waiting_for_space
from packhorse.runtime.settings import stored_value
from packhorse.status.blocked_work import not_reclaimed_where

#: The ``cause`` label values of ``packhorse_operations_blocked`` (every one is always
#: exported, 0 when nothing waits on it, so an alert on it never goes absent): an unavailable
#: data location (missing, unmarked, refusing writes), a full one, a deletion waiting for its
#: safety rule, an open or half-open circuit breaker, FAILED (a human must act), and an expired
#: lease that no monitor took back (:func:`~packhorse.status.blocked_work.not_reclaimed_where`).
BLOCKED_CAUSES = ("location_unavailable", "location_full", "deletion_rule", "circuit_breaker", "failed",
                  "lease_not_reclaimed")

#: Histogram buckets of stage durations (seconds): 1 s … 1 day.
DURATION_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 86400.0)


def _duration_expr(dialect: str) -> Any:
    if dialect == "sqlite":
        return (func.julianday(Operation.finished_at) - func.julianday(Operation.started_at)) * 86400.0
    return cast(func.extract("epoch", Operation.finished_at - Operation.started_at), Float)


def blocked_counts(session: Session, monitor_interval_seconds: float = 60.0) -> dict[str, int]:
    """Operations that wait on something outside the pipeline, by cause (:data:`BLOCKED_CAUSES`;
    read-only): ``PENDING`` ones waiting for an unavailable data location (its source or
    destination, or the location it was handed back for:
    :func:`~packhorse.rules.availability.waiting_for`), for space
    (:func:`~packhorse.rules.space.waiting_for_space`), for a deletion's safety rule; active ones
    held by an open or half-open circuit breaker; ``FAILED`` ones. An operation may count under
    two causes (waiting for a location behind an open breaker). ``lease_not_reclaimed``: expired
    leases no monitor took back within two passes of ``monitor_interval_seconds`` (seconds; the
    definition ``status`` and ``health`` use; the runtime setting ``recovery.monitor_interval_seconds``
    overrides it when one is set, as it does for the running monitors)."""
    override = stored_value(session, "recovery.monitor_interval_seconds")
    if override is not None:
        monitor_interval_seconds = float(override)

    def count(*where: Any) -> int:
        return int(session.scalar(select(func.count()).select_from(Operation).where(*where)) or 0)

    outages = select(LocationOutage.location_id)
    return {
        "location_unavailable": count(waiting_for(outages)),
        "location_full": count(waiting_for_space(in_backoff=False)),
        "deletion_rule": count(Operation.status == Status.PENDING.value,
                               Operation.error_context["waiting"].as_string() == WAITING_DELETION_RULE),
        "circuit_breaker": int(session.scalar(
            select(func.count()).select_from(Operation).join(CircuitBreaker, CircuitBreaker.operation_id == Operation.id)
            .where(CircuitBreaker.state.in_([BreakerState.OPEN.value, BreakerState.HALF_OPEN.value]),
                   Operation.status.in_([st.value for st in ACTIVE_STATUSES]))) or 0),
        "failed": count(Operation.status == Status.FAILED.value),
        "lease_not_reclaimed": count(*not_reclaimed_where(utcnow(), monitor_interval_seconds)),
    }


def collect_values(session: Session, dead_after_seconds: float = 90.0,
                   forget_after_seconds: float = 86400.0, *, error_types: bool = False,
                   monitor_interval_seconds: float = 60.0) -> dict[str, Any]:
    """Every metric value as plain data (one read-only unit of work). With ``error_types``
    failure events are counted by ``(kind, error_type)``, else by ``(kind, None)``;
    ``monitor_interval_seconds`` is ``[recovery] monitor_interval_seconds`` (the
    ``lease_not_reclaimed`` cause: :func:`blocked_counts`).

    Returns:
        ``{"operations": {(kind, status): n}, "stalled": {kind: n}, "queue": {kind: n},
        "bytes": {kind: n}, "durations": {kind: (bucket counts list, sum, count)},
        "failures": {(kind, error_type): n}, "copies": {(location, status): n},
        "copy_bytes": {location: n}, "notifications": {status: n}, "breakers_open": {kind: n},
        "dispatch_lost": {kind: n},
        "services": [(service, kind, alive)], "clock_offsets": [(service, kind, seconds: database
        clock minus the service host's, for services that recorded one)], "disk": {location: (total, used, free, percent)},
        "blocked": {cause: n}, "locations": [active location names],
        "unavailable": {location: seconds since the outage began}, "sites": [site names],
        "sites_unreachable": {site: seconds since its workers' last heartbeat},
        "links_unreachable": {(source, destination): seconds since the cut began}, "not_archived": n,
        "oldest_not_archived_seconds": s (0 when none), "quarantined": {location: bytes},
        "source_audits": {location: (changed found in all, last pass completed at Unix s or None)}}``.
        ``service`` is the service's identity (kind, site, instance, host; never a PID), so the
        label set is bounded by the installation's services; forgotten ones are left out.
    """
    now = utcnow()
    out: dict[str, Any] = {}
    out["operations"] = {(k, s): int(n) for k, s, n in session.execute(
        select(Operation.kind, Operation.status, func.count()).group_by(Operation.kind, Operation.status))}
    out["stalled"] = {k: int(n) for k, n in session.execute(
        select(Operation.kind, func.count()).where(Operation.status == Status.IN_PROGRESS.value,
                                                   Operation.lease_expires_at < now).group_by(Operation.kind))}
    out["queue"] = {k: int(n) for k, n in session.execute(
        select(Operation.kind, func.count()).where(
            Operation.status.in_([Status.PENDING.value, Status.SCHEDULED.value]),
            (Operation.not_before.is_(None)) | (Operation.not_before <= now)).group_by(Operation.kind))}
    done = Operation.status == Status.COMPLETED.value
    out["bytes"] = {k: int(b or 0) for k, b in session.execute(
        select(Operation.kind, func.sum(Operation.bytes_done)).where(done).group_by(Operation.kind))}
    dur = _duration_expr(session.get_bind().dialect.name)
    cols = [func.sum(case((dur <= b, 1), else_=0)) for b in DURATION_BUCKETS]
    out["durations"] = {}
    for row in session.execute(
        select(Operation.kind, func.count(), func.coalesce(func.sum(dur), literal_column("0")), *cols)
        .where(done, Operation.started_at.is_not(None), Operation.finished_at.is_not(None)).group_by(Operation.kind)):
        out["durations"][row[0]] = ([int(x or 0) for x in row[3:]], float(row[2] or 0.0), int(row[1]))
    if error_types:
        out["failures"] = {(k, e): int(n) for k, e, n in session.execute(
            select(FailureEvent.kind, FailureEvent.error_type, func.count())
            .group_by(FailureEvent.kind, FailureEvent.error_type))}
    else:
        out["failures"] = {(k, None): int(n) for k, n in session.execute(
            select(FailureEvent.kind, func.count()).group_by(FailureEvent.kind))}
    out["blocked"] = blocked_counts(session, monitor_interval_seconds)
    out["locations"] = list(session.scalars(select(DataLocation.name).where(DataLocation.active.is_(True))
                                            .order_by(DataLocation.name)))
    out["unavailable"] = {name: max(0.0, (now - since).total_seconds()) for name, since in session.execute(
        select(DataLocation.name, LocationOutage.since).join(DataLocation, DataLocation.id == LocationOutage.location_id))}
    # sites and links cut off as `status` lists them (the same readers), from the first moment
    rows = list_services(session, now, dead_after_seconds=dead_after_seconds, forget_after_seconds=forget_after_seconds)
    out["sites"] = list(session.scalars(select(Site.name).order_by(Site.name)))
    out["sites_unreachable"] = {u["site"]: float(u["seconds"]) for u in unreachable_sites(
        session, dead_after_seconds=dead_after_seconds, forget_after_seconds=forget_after_seconds, now=now,
        services=rows)}
    out["links_unreachable"] = {(c["source"], c["destination"]): max(0.0, (now - c["since"]).total_seconds())
                                for c in cut_links(session)
                                if c["source"] is not None and c["destination"] is not None and c["since"] is not None}
    n, oldest = session.execute(select(func.count(), func.min(RawDataPackage.created_at))
                                .where(RawDataPackage.archived_at.is_(None))).one()
    out["not_archived"] = int(n or 0)
    out["oldest_not_archived_seconds"] = max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0
    out["copies"] = {(l, s): int(n) for l, s, n in session.execute(
        select(DataLocation.name, PhysicalCopy.status, func.count()).join(
            DataLocation, DataLocation.id == PhysicalCopy.location_id).group_by(DataLocation.name, PhysicalCopy.status))}
    out["copy_bytes"] = {l: int(b or 0) for l, b in session.execute(
        select(DataLocation.name, func.sum(PhysicalCopy.size)).join(
            DataLocation, DataLocation.id == PhysicalCopy.location_id)
        .where(PhysicalCopy.status == CopyStatus.PRESENT.value).group_by(DataLocation.name))}
    out["notifications"] = {s: int(n) for s, n in session.execute(
        select(Notification.status, func.count()).group_by(Notification.status))}
    out["breakers_open"] = {k: int(n) for k, n in session.execute(
        select(CircuitBreaker.kind, func.count()).where(CircuitBreaker.state == BreakerState.OPEN.value)
        .group_by(CircuitBreaker.kind))}
    out["dispatch_lost"] = {k: int(n) for k, n in session.execute(
        select(Operation.kind, func.count()).where(dispatch_given_up()).group_by(Operation.kind))}

    usage = latest_usage(session)
    out["disk"] = {name: (int(u.total_bytes), int(u.used_bytes), int(u.free_bytes), float(u.percent))
                   for name, u in usage.items()}
    out["quarantined"] = {name: int(u.quarantined_bytes) for name, u in usage.items()
                          if u.quarantined_bytes is not None}
    out["source_audits"] = {a.location: (int(a.changed_total), a.completed_at.timestamp() if a.completed_at else None)
                            for a in session.scalars(select(SourceAudit))}

    out["services"] = [(r["service"], r["kind"], r["alive"]) for r in rows]
    out["clock_offsets"] = [(r["service"], r["kind"], r["clock_offset_seconds"]) for r in rows
                            if r["clock_offset_seconds"] is not None]
    return out


class DatabaseCollector(Collector):
    """A prometheus-client collector that reads :func:`collect_values` on every scrape.

    A database error yields ``packhorse_database_up 0`` and no other metric (never a 500).
    With ``error_types`` the failure events carry their ``error_type`` label (for callers who
    may see failures: see the module docstring).
    """

    def __init__(self, db: Database, dead_after_seconds: float = 90.0, forget_after_seconds: float = 86400.0,
                 *, error_types: bool = False, monitor_interval_seconds: float = 60.0) -> None:
        self.db = db
        self.monitor_interval_seconds = monitor_interval_seconds
        self.dead_after_seconds = dead_after_seconds
        self.forget_after_seconds = forget_after_seconds
        self.error_types = error_types

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("packhorse_database_up", "1 when the ops database could be read for this scrape")
        try:
            v = self.db.read(lambda s: collect_values(s, self.dead_after_seconds, self.forget_after_seconds,
                                                      error_types=self.error_types,
                                                      monitor_interval_seconds=self.monitor_interval_seconds))
        except Exception:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        kinds = [k.value for k in OperationKind]
        ops = GaugeMetricFamily("packhorse_operations", "Operations by kind and status", labels=["kind", "status"])
        for k in kinds:
            for s in Status:
                ops.add_metric([k, s.value], v["operations"].get((k, s.value), 0))
        yield ops
        for name, doc, key in (("packhorse_operations_stalled", "IN_PROGRESS operations whose lease expired", "stalled"),
                               ("packhorse_queue_depth", "PENDING or SCHEDULED operations runnable now", "queue")):
            g = GaugeMetricFamily(name, doc, labels=["kind"])
            for k in kinds:
                g.add_metric([k], v[key].get(k, 0))
            yield g
        b = CounterMetricFamily("packhorse_stage_bytes", "Payload bytes of completed operations", labels=["kind"])
        for k in kinds:
            b.add_metric([k], v["bytes"].get(k, 0))
        yield b
        h = HistogramMetricFamily("packhorse_stage_duration_seconds",
                                  "Duration of the completing attempt of operations", labels=["kind"])
        for k, (buckets, total, count) in sorted(v["durations"].items()):
            pairs = [(str(le), n) for le, n in zip(DURATION_BUCKETS, buckets)] + [("+Inf", count)]
            h.add_metric([k], pairs, total)
        yield h
        if self.error_types:
            f = CounterMetricFamily("packhorse_failure_events", "Failure events by kind and error type",
                                    labels=["kind", "error_type"])
            for (k, e), n in sorted(v["failures"].items()):
                f.add_metric([k, e], n)
        else:
            f = CounterMetricFamily("packhorse_failure_events", "Failure events by kind", labels=["kind"])
            for (k, _), n in sorted(v["failures"].items()):
                f.add_metric([k], n)
        yield f
        yield from self._waiting(v)
        c = GaugeMetricFamily("packhorse_physical_copies", "Physical copies by location and status",
                              labels=["location", "status"])
        for (l, s), n in sorted(v["copies"].items()):
            c.add_metric([l, s], n)
        yield c
        cb = GaugeMetricFamily("packhorse_physical_copy_bytes", "Bytes of present copies by location", labels=["location"])
        for l, n in sorted(v["copy_bytes"].items()):
            cb.add_metric([l], n)
        yield cb
        nt = GaugeMetricFamily("packhorse_notifications", "Notification outbox rows by status", labels=["status"])
        for s, n in sorted(v["notifications"].items()):
            nt.add_metric([s], n)
        yield nt
        bo = GaugeMetricFamily("packhorse_circuit_breakers_open", "Open circuit breakers (recovery blocked)",
                               labels=["kind"])
        for k in kinds:
            bo.add_metric([k], v["breakers_open"].get(k, 0))
        yield bo
        dl = GaugeMetricFamily("packhorse_dispatch_lost",
                               "Operations the reconciler gave up on after lost dispatches (blocked until they move)",
                               labels=["kind"])
        for k in kinds:
            dl.add_metric([k], v["dispatch_lost"].get(k, 0))
        yield dl
        du = GaugeMetricFamily("packhorse_disk_usage_bytes", "Latest disk usage sample of a data location (bytes)",
                               labels=["location", "kind"])
        dr = GaugeMetricFamily("packhorse_disk_usage_ratio", "Latest used / (used + available) of a data location (0-1, as df)",
                               labels=["location"])
        for loc, (total, used, free, percent) in sorted(v["disk"].items()):
            du.add_metric([loc, "total"], total)
            du.add_metric([loc, "used"], used)
            du.add_metric([loc, "free"], free)
            dr.add_metric([loc], percent / 100.0)
        yield du
        yield dr
        yield from self._services(v)

    @staticmethod
    def _waiting(v: dict[str, Any]) -> Iterator[Metric]:
        """The families of what waits: blocked operations by cause, unavailable locations, the
        packages not archived yet and the age of the oldest, quarantined bytes."""
        bl = GaugeMetricFamily("packhorse_operations_blocked",
                               "Operations waiting on something outside the pipeline, by cause", labels=["cause"])
        for cause in BLOCKED_CAUSES:
            bl.add_metric([cause], v["blocked"].get(cause, 0))
        yield bl
        un = GaugeMetricFamily("packhorse_location_unavailable",
                               "1 while the data location is unavailable (its work waits), else 0", labels=["location"])
        us = GaugeMetricFamily("packhorse_location_unavailable_seconds",
                               "Seconds since the data location became unavailable (0 when available)",
                               labels=["location"])
        for loc in sorted(set(v["locations"]) | set(v["unavailable"])):
            un.add_metric([loc], 1 if loc in v["unavailable"] else 0)
            us.add_metric([loc], v["unavailable"].get(loc, 0.0))
        yield un
        yield us
        su = GaugeMetricFamily("packhorse_site_unreachable",
                               "1 while the site is cut off from the centre (no worker heartbeat for "
                               "service_dead_after_seconds), else 0", labels=["site"])
        ss = GaugeMetricFamily("packhorse_site_unreachable_seconds",
                               "Seconds since the last heartbeat of the unreachable site's workers (0 when reachable)",
                               labels=["site"])
        for site in sorted(set(v["sites"]) | set(v["sites_unreachable"])):
            su.add_metric([site], 1 if site in v["sites_unreachable"] else 0)
            ss.add_metric([site], v["sites_unreachable"].get(site, 0.0))
        yield su
        yield ss
        yield GaugeMetricFamily("packhorse_links_unreachable",
                                "Links between sites cut now: transfers wait on a lost SSH connection", value=len(v["links_unreachable"]))
        ls = GaugeMetricFamily("packhorse_link_unreachable_seconds",
                               "Seconds since the link from the source to the destination data location was cut "
                               "(only links cut now)", labels=["source", "destination"])
        for (src, dst), seconds in sorted(v["links_unreachable"].items()):
            ls.add_metric([src, dst], seconds)
        yield ls
        yield GaugeMetricFamily("packhorse_packages_not_archived",
                                "Raw data packages without every required verified archive copy yet",
                                value=v["not_archived"])
        yield GaugeMetricFamily("packhorse_oldest_not_archived_age_seconds",
                                "Age of the oldest raw data package not archived yet (0 when none)",
                                value=v["oldest_not_archived_seconds"])
        q = GaugeMetricFamily("packhorse_quarantined_bytes",
                              "Bytes in the data location's quarantine (latest disk usage sample)", labels=["location"])
        for loc, n in sorted(v["quarantined"].items()):
            q.add_metric([loc], n)
        yield q
        sc = CounterMetricFamily("packhorse_source_audit_changed",
                                 "Source files the source audit found changed behind an unchanged size and mtime "
                                 "(registered as new versions)", labels=["location"])
        st = GaugeMetricFamily("packhorse_source_audit_completed_timestamp_seconds",
                               "When the last source audit pass of the source location completed (Unix seconds, UTC)",
                               labels=["location"])
        for loc, (changed, completed) in sorted(v["source_audits"].items()):
            sc.add_metric([loc], changed)
            if completed is not None:
                st.add_metric([loc], completed)
        yield sc
        yield st

    def _services(self, v: dict[str, Any]) -> Iterator[Metric]:
        """The ``packhorse_service_up`` and ``packhorse_service_clock_offset_seconds`` families."""
        up = GaugeMetricFamily("packhorse_service_up", "1 if the service's last heartbeat is recent, else 0",
                               labels=["service", "kind"])
        for service, kind, alive in v["services"]:
            up.add_metric([service, kind], 1 if alive else 0)
        yield up
        offset = GaugeMetricFamily("packhorse_service_clock_offset_seconds",
                                   "The database server's clock minus the service host's, as the service measured "
                                   "it last (s; packhorse times everything by the database's clock)",
                                   labels=["service", "kind"])
        for service, kind, seconds in v["clock_offsets"]:
            offset.add_metric([service, kind], seconds)
        yield offset


def registry_for(db: Database, *, dead_after_seconds: float = 90.0,
                 forget_after_seconds: float = 86400.0, error_types: bool = False,
                 monitor_interval_seconds: float = 60.0) -> CollectorRegistry:
    """A fresh registry holding one :class:`DatabaseCollector` for ``db`` (a service is dead
    when its last heartbeat is older than ``dead_after_seconds``, forgotten after
    ``forget_after_seconds``; ``error_types``: failure events by ``error_type`` too, for a
    caller who may see failures; ``monitor_interval_seconds``: ``[recovery]
    monitor_interval_seconds``, for the ``lease_not_reclaimed`` cause)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(DatabaseCollector(db, dead_after_seconds, forget_after_seconds, error_types=error_types,
                                   monitor_interval_seconds=monitor_interval_seconds))
    return reg


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition format of ``registry``."""
    return generate_latest(registry)
