"""Work that waits on something other than the pipeline: one list, one shape, every surface.

One job: answer "what is stuck, why, and what releases it?" for ``packhorse status`` (text and
``--json`` field ``blocked``), the overview, the dashboard and the exit code of
``run --until-idle``. Every state a package or operation can be left in only by a human or by
the world outside (a mount coming back) appears here, each item with the reason and the
command that releases it (DESIGN.md I5, every state has an owner: here the owner is named).

Providers are small functions ``(session, ctx) -> list[BlockedItem]``, one per cause, listed in
:data:`PROVIDERS`; a new cause adds one function there, never a second list elsewhere.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from packhorse.db.models import CircuitBreaker, LocationOutage, Operation, ScanLease, utcnow
from packhorse.domain import ACTIVE_STATUSES, BreakerState, LocationRole, Status
from packhorse.operations.scan_lease import overdue_scans
from packhorse.recovery.health import list_services
from packhorse.recovery.link_reachability import cut_links
from packhorse.recovery.reconciler import dispatch_given_up
from packhorse.recovery.site_reachability import source_sites, unreachable_sites
from packhorse.rules.availability import release_of, root_of, waiting_for
from packhorse.rules.convergence import dead_end_release, plan
from packhorse.rules.space import waiting_for_space
from packhorse.runtime.settings import effective
from packhorse.status.operation_names import package_and_location

if TYPE_CHECKING:
    from packhorse.runtime.context import ProcessContext

#: ``run --until-idle`` exit code for work that waits on a human with nothing to wait for
#: (a FAILED operation, a package with no good source left).
EXIT_NEEDS_HUMAN = 3
#: ``run --until-idle`` exit code for work that waits and may resume by itself or on one
#: command (an open circuit breaker, an unavailable data location).
EXIT_WAITING = 4


@dataclass(frozen=True)
class BlockedItem:
    """One piece of blocked work.

    Attributes:
        cause: short machine name of the cause: ``"circuit_breaker"``, ``"location_unavailable"``,
            ``"no_good_source"``, … (stable; scripts match on it).
        subject: what is blocked, as an operator names it: ``"transfer 17"``,
            ``"location archive-a"``, ``"package site-x_obs1_…"``.
        reason: one sentence: why it waits.
        release: the command that releases it (``"packhorse breaker close transfer 17"``), or
            what a human must do when no command can (``"put the bytes back …"``).
        exit_code: :data:`EXIT_NEEDS_HUMAN` or :data:`EXIT_WAITING`.
        since: ISO 8601 UTC time it has been blocked since, or ``None`` if unknown.
        detail: extra machine-readable fields (ids, locations, counts behind it).
    """

    cause: str
    subject: str
    reason: str
    release: str
    exit_code: int = EXIT_WAITING
    since: str | None = None
    detail: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        """The item as the ``status --json`` ``blocked`` list holds it (every attribute)."""
        return asdict(self)


Provider = Callable[[Session, "ProcessContext"], list[BlockedItem]]

def location_unavailable(session: Session, ctx: "ProcessContext") -> list[BlockedItem]:
    """One item per data location with an open outage (:mod:`packhorse.rules.availability`): its
    root or identity marker is missing. Cause ``location_unavailable``, :data:`EXIT_WAITING`:
    the work resumes by itself when the location is back (or after ``packhorse init`` when only
    the marker is missing). ``detail``: ``location``, ``location_id``, ``path`` (its root),
    ``marker_only``, ``fault`` (the storage's refusal: ``EROFS``, ``EIO``, ``EACCES``,
    ``AccessDenied``, or ``None`` for a missing root or marker), ``operations_waiting`` (``PENDING`` and ``SCHEDULED`` operations waiting for it:
    :func:`~packhorse.rules.availability.waiting_for`), ``checked_at`` (last seen unavailable, ISO
    8601 UTC)."""
    items = []
    for row in session.scalars(select(LocationOutage).order_by(LocationOutage.since)):
        name = ctx.topology.location_names.get(row.location_id)
        if name is None:
            continue  # a location no longer configured
        waiting = session.scalar(select(func.count()).select_from(Operation).where(
            waiting_for([row.location_id], (Status.PENDING, Status.SCHEDULED)))) or 0
        items.append(BlockedItem(
            cause="location_unavailable", subject=f"location {name}",
            reason=f"data location {name} is unavailable: {row.reason}; {waiting} operation(s) wait for it",
            release=release_of(ctx, name, row.marker_only, row.fault), exit_code=EXIT_WAITING,
            since=row.since.isoformat(),
            detail={"location": name, "location_id": row.location_id, "path": root_of(ctx, name),
                    "marker_only": row.marker_only, "fault": row.fault, "operations_waiting": waiting,
                    "checked_at": row.checked_at.isoformat()}))
    return items


def location_full(session: Session, ctx: "ProcessContext") -> list[BlockedItem]:
    """One item per data location that operations wait for space at
    (:func:`~packhorse.rules.space.waiting_for_space`): their write met a full file system.
    Cause ``location_full``, :data:`EXIT_WAITING`: they go on by themselves once there is space
    (deletions under disk pressure, or an operator). ``detail``: ``location``,
    ``operations_waiting``, ``since`` (the oldest wait, ISO 8601 UTC), ``last_error``."""
    from sqlalchemy import select


    by_location: dict[str, list[Operation]] = {}
    for op in session.scalars(select(Operation).where(waiting_for_space(in_backoff=False))
                              .order_by(Operation.updated_at)):
        by_location.setdefault(str((op.error_context or {}).get("location") or "?"), []).append(op)
    items = []
    for name, ops in sorted(by_location.items()):
        last = (ops[-1].error_context or {}).get("message") or ""
        if ctx.topology.location_role.get(name) is LocationRole.BUFFER:
            frees = ("packhorse frees its own buffer copies once they are archived and safe to delete (under disk "
                     "pressure first, docs/deletion.md), and the work waiting goes on as soon as it did; when nothing "
                     "of packhorse's is left to free there (bundles whose unpack needs more room than that), only "
                     "more space releases it: remove other files or enlarge it")
        else:
            frees = "packhorse never deletes what it archived: remove other files or enlarge it"
        items.append(BlockedItem(
            cause="location_full", subject=f"location {name}",
            reason=f"data location {name} is full: {len(ops)} operation(s) wait for space (last: {last})",
            release=(f"free space at {name} ({frees}); the operations go on by themselves once there is space "
                     "(at once when packhorse freed some; after its backoff, at most [recovery] "
                     "retry_backoff_max_seconds, or at the next `packhorse run`, when you did)"),
            exit_code=EXIT_WAITING, since=_wait_began(ops),
            detail={"location": name, "operations_waiting": len(ops), "last_error": last}))
    return items


def _wait_began(ops: list[Operation]) -> str | None:
    """When the first of ``ops`` began to wait (ISO 8601 UTC): the earliest ``waiting_since`` of
    their notes (kept across hand-backs: :func:`packhorse.engine.worker._waiting_note`), else,
    for a note from before it was kept, the earliest ``updated_at``."""
    began = [str((op.error_context or {}).get("waiting_since") or "") or
             (op.updated_at.isoformat() if op.updated_at else "") for op in ops]
    return min((b for b in began if b), default=None)


def no_good_source(session: Session, ctx: "ProcessContext") -> list[BlockedItem]:
    """Cause ``no_good_source``: raw data packages with no good source of their bytes left
    anywhere — every copy bad and no copy or source files to rebuild from
    (:func:`packhorse.rules.convergence.plan`, DESIGN.md "Converging": the one true dead end). Exit
    code :data:`EXIT_NEEDS_HUMAN`; ``release`` says which bytes to put back and what to run."""
    out = []
    for d in plan(session, ctx).dead_ends:
        failed = ", ".join(f"{c['location']}:{c['path']} {c['status']}" for c in d.bad_copies) or "none recorded"
        out.append(BlockedItem(
            cause="no_good_source", subject=f"package {d.name}",
            reason=f"no good copy of its bytes is left anywhere (bad copies: {failed}) and it cannot be rebuilt: "
                   + "; ".join(d.tried[2:] or d.tried),
            release=dead_end_release(d), exit_code=EXIT_NEEDS_HUMAN,
            since=d.since.isoformat() if d.since else None,
            detail={"package_id": d.package_id, "bad_copies": d.bad_copies, "tried": d.tried,
                    "failed_operation": list(d.failed_operation) if d.failed_operation else None}))
    return out


def circuit_breakers(session: Session, ctx: "ProcessContext") -> list[BlockedItem]:
    """Cause ``circuit_breaker``: every active
    operation whose breaker is open (held for its cool-down) or half-open (its one attempt
    let through), with the package and data location behind it.

    Each item: subject ``"<kind> <id>"``, release ``packhorse retry <kind> <id>``, exit code
    :data:`EXIT_WAITING` (it resumes by itself after the cool-down), since
    = when the breaker opened, detail ``{"kind", "operation_id", "state", "stall_count",
    "trips", "next_attempt_at", "package", "location", "operation_status"}``.
    """
    package, location, join = package_and_location()
    rows = session.execute(join(
        select(CircuitBreaker, Operation.status, package, location).select_from(Operation)
        .join(CircuitBreaker, CircuitBreaker.operation_id == Operation.id))
        .where(CircuitBreaker.state.in_([BreakerState.OPEN.value, BreakerState.HALF_OPEN.value]),
               Operation.status.in_([st.value for st in ACTIVE_STATUSES]))
        .order_by(CircuitBreaker.id)).all()
    out: list[BlockedItem] = []
    for b, status, pkg, loc in rows:
        nxt = b.next_attempt_at if b.state == BreakerState.OPEN.value else None
        if b.state == BreakerState.OPEN.value:
            when = nxt.isoformat() if nxt else "-"
            reason = (f"circuit breaker open after {b.stall_count} stall(s) (workers died or hung on it); "
                      f"held until the next automatic attempt at {when} UTC")
        else:
            reason = (f"circuit breaker half-open after {b.stall_count} stall(s): one attempt let through "
                      f"at {b.half_open_at.isoformat() if b.half_open_at else '-'} UTC; it closes if that "
                      "attempt succeeds")
        out.append(BlockedItem(
            cause="circuit_breaker", subject=f"{b.kind} {b.operation_id}", reason=reason,
            release=f"packhorse retry {b.kind} {b.operation_id}", exit_code=EXIT_WAITING,
            since=b.opened_at.isoformat() if b.opened_at else None,
            detail={"kind": b.kind, "operation_id": b.operation_id, "state": b.state,
                    "stall_count": b.stall_count, "trips": b.trips,
                    "next_attempt_at": nxt.isoformat() if nxt else None,
                    "package": pkg, "location": loc, "operation_status": status}))
    return out


def dispatch_lost(session: Session, ctx: "ProcessContext") -> list[BlockedItem]:
    """Cause ``dispatch_lost``: operations whose dispatch was lost ``reconcile_max_resets`` times in
    one window without a worker claiming them, which the reconciler gave up on and which have not
    moved since (:func:`packhorse.recovery.reconciler.dispatch_given_up`: still ``SCHEDULED``, or
    ``IN_PROGRESS`` with no lease). :data:`EXIT_WAITING`: the reconciler re-dispatches each once
    more when its cool-down (``[recovery] reconcile_cooldown_seconds``) ends, and ``packhorse
    retry`` releases it now. Each item: subject ``"<kind> <id>"``, since = when the reconciler
    gave up (ISO 8601 UTC), detail ``{"kind", "operation_id", "operation_status",
    "reconcile_count", "next_attempt_at", "site", "package", "location"}``."""
    package, location, join = package_and_location()
    rows = session.execute(join(select(Operation, package, location).select_from(Operation))
                           .where(dispatch_given_up()).order_by(Operation.id)).all()
    if not rows:
        return []
    cooldown = dt.timedelta(seconds=ctx.settings.recovery.reconcile_cooldown_seconds)
    sites = {i: name for name, i in ctx.topology.site_ids.items()}
    out: list[BlockedItem] = []
    for op, pkg, loc in rows:
        given_up = op.reconcile_given_up_at
        nxt = given_up + cooldown
        site = sites.get(op.site_id)
        out.append(BlockedItem(
            cause="dispatch_lost", subject=f"{op.kind} {op.id}",
            reason=(f"its dispatch was lost {op.reconcile_count} time(s) without a worker of site {site} claiming "
                    f"it; the reconciler gave up and re-dispatches it once more at "
                    f"{nxt.isoformat(timespec='seconds')} UTC (check that the site's workers serve its queue)"),
            release=f"packhorse retry {op.kind} {op.id} --reason '<why it was lost>'", exit_code=EXIT_WAITING,
            since=given_up.isoformat(),
            detail={"kind": op.kind, "operation_id": op.id, "operation_status": op.status,
                    "reconcile_count": op.reconcile_count, "next_attempt_at": nxt.isoformat(),
                    "site": site, "package": pkg, "location": loc}))
    return out


def not_reclaimed_where(now: dt.datetime, monitor_interval_seconds: float) -> tuple[Any, ...]:
    """The one definition of a lease not reclaimed, as SQL conditions on :class:`Operation`:
    ``IN_PROGRESS``, its lease expired before ``now - 2 × monitor_interval_seconds`` (UTC,
    seconds), and not held by an open or half-open circuit breaker. Used by
    :func:`lease_not_reclaimed` (``status``, ``health``) and by the
    ``packhorse_operations_blocked{cause="lease_not_reclaimed"}`` gauge
    (:mod:`packhorse.status.metrics`), so the three surfaces and the alert agree."""
    limit = now - dt.timedelta(seconds=2 * monitor_interval_seconds)
    held = (select(CircuitBreaker.operation_id)
            .where(CircuitBreaker.state.in_([BreakerState.OPEN.value, BreakerState.HALF_OPEN.value])))
    return (Operation.status == Status.IN_PROGRESS.value, Operation.lease_expires_at < limit,
            Operation.id.not_in(held))


def lease_not_reclaimed(session: Session, ctx: "ProcessContext") -> list[BlockedItem]:
    """Cause ``lease_not_reclaimed``: ``IN_PROGRESS`` operations whose lease expired more than two
    recovery passes ago (``2 × recovery.monitor_interval_seconds``, the runtime setting when one
    is set, as the running monitors use it) and that no process took
    back: no monitor (``packhorse monitor``; in embedded mode ``packhorse run``) is running, or
    each one is stuck. The stalled-task monitor would have reset them to ``PENDING`` within one
    pass (:mod:`packhorse.recovery.monitor`); one whose breaker is open is held on purpose and
    listed by :func:`circuit_breakers` instead. Without this cause a crashed worker's operation
    sits ``IN_PROGRESS`` for ever while every view says all is well (DESIGN.md I5).

    :data:`EXIT_WAITING`: a monitor that starts takes it back at its first pass, and ``packhorse
    retry`` hands it back now. Each item: subject ``"<kind> <id>"``, since = the lease's expiry
    (ISO 8601 UTC), detail ``{"kind", "operation_id", "lease_owner", "lease_expired_seconds_ago",
    "package", "location"}``."""
    interval = float(effective(session, ctx.settings, "recovery.monitor_interval_seconds"))
    now = utcnow()
    package, location, join = package_and_location()
    rows = session.execute(join(select(Operation, package, location).select_from(Operation))
                           .where(*not_reclaimed_where(now, interval))
                           .order_by(Operation.id)).all()
    out: list[BlockedItem] = []
    for op, pkg, loc in rows:
        ago = int((now - op.lease_expires_at).total_seconds())
        out.append(BlockedItem(
            cause="lease_not_reclaimed", subject=f"{op.kind} {op.id}",
            reason=(f"its lease (held by {op.lease_owner or 'nobody'}) expired {ago} s ago and no process took it "
                    f"back: a running monitor hands an expired lease back within "
                    f"{interval:g} s, so none is running or each one is stuck"),
            release=(f"start packhorse monitor (packhorse health lists the services), or packhorse retry "
                     f"{op.kind} {op.id} --reason '<why>'"),
            exit_code=EXIT_WAITING, since=op.lease_expires_at.isoformat(),
            detail={"kind": op.kind, "operation_id": op.id, "lease_owner": op.lease_owner,
                    "lease_expired_seconds_ago": ago, "package": pkg, "location": loc}))
    return out


def site_unreachable(session: Session, ctx: "ProcessContext", *, services: list[dict[str, Any]] | None = None,
                     now: dt.datetime | None = None) -> list[BlockedItem]:
    """Cause ``site_unreachable``: sites with workers none of which is alive
    (:func:`packhorse.recovery.site_reachability.unreachable_sites`; ``services`` and ``now``: the
    services the caller read at ``now`` with the recovery settings' ages, else read here): cut off
    from the centre, or their workers down. :data:`EXIT_WAITING`: its work resumes by itself once a worker of the site
    heartbeats again. Subject ``"site <name>"``, since = the last heartbeat of its workers,
    detail ``{"site", "seconds", "workers"}``."""
    rec = ctx.settings.recovery
    sources = source_sites(ctx.settings)
    return [BlockedItem(
        cause="site_unreachable", subject=f"site {u['site']}",
        reason=(f"no worker of site {u['site']} has sent a heartbeat for {u['seconds']} s: it is cut off from the "
                "centre (its link, or the database and broker out of its reach) or its workers are down; its "
                "work waits" + (", its instruments' files stay at its source location" if u["site"] in sources
                                else "")),
        release=(f"restore the site's link or start its workers (packhorse worker --site {u['site']}); its work "
                 "resumes by itself"),
        exit_code=EXIT_WAITING, since=u["since"],
        detail={"site": u["site"], "seconds": u["seconds"], "workers": u["workers"]})
        for u in unreachable_sites(session, dead_after_seconds=rec.service_dead_after_seconds,
                                   forget_after_seconds=rec.service_forget_after_seconds, now=now,
                                   services=services)]


#: The central services distributed mode cannot go on without, and what stops without each.
CENTRAL_SERVICES = {
    "manager": ("no new work is made and nothing is dispatched (scan requests, packages, bundles, transfers, "
                "archive copies, deletions)"),
    "monitor": ("expired leases are not handed back, circuit breakers do not half-open, lost messages are not "
                "sent again, and cut sites and links are not notified"),
}


def service_missing(session: Session, ctx: "ProcessContext", *, services: list[dict[str, Any]] | None = None,
                    now: dt.datetime | None = None) -> list[BlockedItem]:
    """Cause ``service_missing``: in distributed mode (workers or managers send health
    heartbeats), no alive service of a kind in :data:`CENTRAL_SERVICES` (``manager``,
    ``monitor``): the work it alone moves on waits in silence (a trial killed both managers and
    ``status`` said "no problems"). :data:`EXIT_NEEDS_HUMAN`: someone (or a supervisor) must
    start one. Subject ``"service <kind>"``, since = the last heartbeat of a service of that kind
    (``None`` if none ever ran), detail ``{"kind", "services": [identities of the dead ones]}``.
    ``services`` and ``now``: as :func:`site_unreachable`'s."""
    rec = ctx.settings.recovery
    now = now or utcnow()
    if services is None:
        services = list_services(session, now, dead_after_seconds=rec.service_dead_after_seconds,
                                 forget_after_seconds=rec.service_forget_after_seconds)
    if not any(r["kind"] in ("worker", "manager") for r in services):
        return []  # embedded mode (or nothing has run yet): `packhorse run` does all of it
    items = []
    for kind, stops in CENTRAL_SERVICES.items():
        rows = [r for r in services if r["kind"] == kind]
        if any(r["alive"] for r in rows):
            continue
        last = max((r["last_seen"] for r in rows), default=None)
        items.append(BlockedItem(
            cause="service_missing", subject=f"service {kind}",
            reason=(f"no {kind} is running" + (f" (the last one was seen {last.isoformat()})" if last else
                                               " (none has ever run against this database)") + f": {stops}"),
            release=(f"start one: packhorse {kind} -c CONFIG (under systemd or another supervisor, "
                     "docs/deployment.md); packhorse health lists the services"),
            exit_code=EXIT_NEEDS_HUMAN, since=last.isoformat() if last else None,
            detail={"kind": kind, "services": sorted(r["service"] for r in rows)}))
    return items


def link_unreachable(session: Session, ctx: "ProcessContext") -> list[BlockedItem]:
    """Cause ``link_unreachable``: transfers waiting for a cut link between sites, one item per
    source data location and destination data location
    (:func:`packhorse.recovery.link_reachability.cut_links`: the latest failure is a lost SSH
    connection, retried for as long as the link stays cut). :data:`EXIT_WAITING`: each resumes
    from its partial by itself once the link is back. Since = the first failure of the cut still
    going on; detail ``{"source", "destination", "host" (the SSH server as the error named it),
    "operations": [ids], "message" (the latest)}``."""
    items = []
    for link in cut_links(session):
        source = link["source"] or "its source"
        destination = link["destination"] or "its destination"
        host = link["host"] or source
        ops = link["operations"]
        items.append(BlockedItem(
            cause="link_unreachable", subject=f"link {source} → {destination}",
            reason=(f"{len(ops)} transfer(s) from {source} to {destination} cannot reach {host} over SSH (the link "
                    f"between the sites is cut, or its SSH server is down): {link['message']}; they try again for "
                    "as long as it stays cut"),
            release=(f"restore the link or the SSH server of {source}'s site; the transfers resume from their "
                     "partials by themselves"),
            exit_code=EXIT_WAITING, since=link["since"].isoformat() if link["since"] else None,
            detail={"source": source, "destination": destination, "host": host, "operations": ops,
                    "message": link["message"]}))
    return items


def scan_overdue(session: Session, ctx: "ProcessContext") -> list[BlockedItem]:
    """Cause ``scan_overdue``: source locations whose scan has not completed for longer than
    ``[recovery] scan_overdue_seconds`` (:func:`packhorse.operations.scan_lease.overdue_scans`;
    distributed mode): new files there are not registered. :data:`EXIT_WAITING`: a scan that
    completes releases it (a holder that stopped renewing loses the scan lease to the next
    worker of the site by itself). Subject ``"location <name>"``, since = the last completion
    (or the first start), detail = the scan lease's fields."""
    if session.scalar(select(ScanLease.location).limit(1)) is None:
        return []  # no scan ever ran under a lease (embedded mode)
    overdue = ctx.settings.recovery.scan_overdue_seconds
    return [BlockedItem(
        cause="scan_overdue", subject=f"location {sc['location']}",
        reason=(f"no scan of {sc['location']} completed for {sc['overdue_seconds']} s (last completed "
                f"{sc['completed_at'] or 'never'}; lease holder {sc['holder'] or 'none'}): new files are not registered"),
        release=("start or fix a worker of its site (packhorse health); a scan that completes releases it"),
        exit_code=EXIT_WAITING, since=sc["completed_at"] or sc["started_at"], detail=sc)
        for sc in overdue_scans(session, overdue_seconds=overdue)]


#: One provider per cause, in the order ``status`` lists them.
PROVIDERS: list[Provider] = [no_good_source, service_missing, circuit_breakers, dispatch_lost, lease_not_reclaimed,
                             site_unreachable, link_unreachable, scan_overdue, location_unavailable, location_full]


def blocked_items(session: Session, ctx: "ProcessContext") -> list[BlockedItem]:
    """Every blocked item from every provider of :data:`PROVIDERS` (read-only)."""
    out: list[BlockedItem] = []
    for provider in PROVIDERS:
        out.extend(provider(session, ctx))
    return out
