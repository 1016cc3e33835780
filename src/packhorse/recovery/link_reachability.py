"""Links between sites that are cut: one line and one notification per cut link, not one per
transfer (DESIGN.md I5; the SSH path between two sites can be cut while both still reach the
centre, and then every transfer over it waits, retried without limit:
:class:`~packhorse.errors.SshConnectionError`).

A link — a source data location and a destination data location that pulls from it over SSH — is
**cut** while a transfer over it waits on it: the transfer is ``PENDING`` or ``SCHEDULED`` (in
its retry backoff), or ``IN_PROGRESS`` without a byte moved yet (a retry connecting), its latest
failure is a lost SSH connection (:data:`LINK_CUT`), and it has not been handed back since for
another wait (a location away, space). ``since`` is the first lost connection of the cut still
going on: the earliest one after any other failure of that transfer and after its last
connection that carried bytes (:data:`LINK_WORKED`), so a link that flaps starts a new cut each
time it drops, and is news only if one drop lasts the grace. The link counts as back as soon as
a transfer over it reports a byte moved (its heartbeat) or has no such wait any more. A link
with a site at either end recorded cut off from the centre (``site_outages``,
:mod:`packhorse.recovery.site_reachability`) is not listed: that cut is the site's, told once
as such (a trial cutting a whole site off got one site notification and two link ones).

:func:`cut_links` computes it (read-only: ``status``, the dashboard, the monitor's passes);
:func:`track_links`, run by every recovery pass (``packhorse monitor``, ``packhorse run``), records
a cut in ``link_outages`` once it has lasted ``[recovery] service_dead_after_seconds`` (90 s: the
grace a site cut off from the centre gets too, so a blip that one retry bridges is not news), with
one WARNING notification ``link_unreachable``, and its end with one INFO ``link_reachable``
naming how long it lasted. Insert and delete are compare-and-set, so several monitors notify
once. Times UTC (the database's clock), durations seconds.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import structlog
from sqlalchemy import Select, delete, func, or_, select
from sqlalchemy.orm import Session, aliased

from packhorse.config import Settings
from packhorse.db.models import DataLocation, FailureEvent, LinkOutage, Operation, Site, SiteOutage, utcnow
from packhorse.db.session import Database, insert_if_absent
from packhorse.domain import NotificationLevel, Status
from packhorse.errors import SshConnectionError
from packhorse.notify.outbox import enqueue

log = structlog.get_logger(__name__)

#: The ``error_type`` of a failure event for a lost SSH connection to another site's data location.
LINK_CUT = SshConnectionError.__name__
#: The ``step`` of such a failure when payload bytes had arrived over the connection before it
#: failed (:class:`packhorse.storage.sftp.SftpSource`): the link worked, the failure begins a new
#: cut; otherwise it has carried nothing since the last failure, and the same cut goes on.
LINK_WORKED = SshConnectionError.AFTER_DATA


def cut_links(session: Session) -> list[dict[str, Any]]:
    """The links cut now (module docstring), one per source and destination data location, in
    the order of their first transfer's id. Two aggregate reads, however many retries the cut
    has cost.

    Returns:
        ``[{"source", "destination" (data location names, or ``None`` for an operation without
        one), "host" (the SSH server as the latest error named it, or ``None``), "since" (the
        first lost connection of the cut, a UTC datetime), "operations": [ids], "message" (the
        latest error's)}]``.
    """
    waiting = select(Operation.id).where(
        (Operation.status.in_([Status.PENDING.value, Status.SCHEDULED.value]))
        | ((Operation.status == Status.IN_PROGRESS.value) & (Operation.bytes_done == 0)),
        Operation.retry_count > 0,
        # handed back since for another wait (a location away, space): that wait is listed instead
        Operation.error_context["waiting"].as_string().is_(None))
    latest = (select(func.max(FailureEvent.id)).where(FailureEvent.operation_id.in_(waiting))
              .group_by(FailureEvent.operation_id))
    src, dst = aliased(DataLocation), aliased(DataLocation)
    # a site recorded cut off from the centre is its own line and notification: its links are not
    # listed again (the destination's transfers from a source site cut off fail on SSH too)
    cut_off = select(Site.id).join(SiteOutage, SiteOutage.site == Site.name)
    rows = session.execute(select(
        FailureEvent.operation_id, src.name, dst.name, FailureEvent.error_context["host"].as_string(),
        FailureEvent.message)
        .join(Operation, Operation.id == FailureEvent.operation_id)
        .outerjoin(src, src.id == Operation.source_location_id)
        .outerjoin(dst, dst.id == Operation.destination_location_id)
        .where(FailureEvent.id.in_(latest), FailureEvent.error_type == LINK_CUT,
               or_(src.site_id.is_(None), src.site_id.not_in(cut_off)),
               or_(dst.site_id.is_(None), dst.site_id.not_in(cut_off)))
        .order_by(FailureEvent.operation_id)).all()
    if not rows:
        return []
    # the cut began at the first lost connection after the operation's last other failure, or
    # at its last lost connection that came after bytes had moved (the link worked before it)
    other, moved = aliased(FailureEvent), aliased(FailureEvent)
    last_other = (select(func.coalesce(func.max(other.id), 0))
                  .where(other.operation_id == FailureEvent.operation_id, other.error_type != LINK_CUT)
                  .correlate(FailureEvent).scalar_subquery())
    last_moved = (select(func.coalesce(func.max(moved.id), 0))
                  .where(moved.operation_id == FailureEvent.operation_id, moved.error_type == LINK_CUT,
                         moved.error_context["step"].as_string() == LINK_WORKED)
                  .correlate(FailureEvent).scalar_subquery())
    began: dict[int, dt.datetime] = dict(session.execute(  # type: ignore[arg-type]
        select(FailureEvent.operation_id, func.min(FailureEvent.created_at))
        .where(FailureEvent.operation_id.in_([r[0] for r in rows]), FailureEvent.error_type == LINK_CUT,
               FailureEvent.id > last_other, FailureEvent.id >= last_moved)
        .group_by(FailureEvent.operation_id)).all())
    links: dict[tuple[str | None, str | None], list[Any]] = {}
    for r in rows:
        links.setdefault((r[1], r[2]), []).append(r)
    out = []
    for (source, destination), ops in links.items():
        since = [began[r[0]] for r in ops if r[0] in began]
        out.append({"source": source, "destination": destination, "host": ops[-1][3],
                    "since": min(since) if since else None, "operations": [r[0] for r in ops],
                    "message": ops[-1][4]})
    return out


def waiting_for_cut_link(now: dt.datetime) -> Select[tuple[int]]:
    """The ids of the transfers in their retry backoff at ``now`` (UTC: ``PENDING``, not due
    yet) over a link recorded cut (a ``link_outages`` row: cut for longer than the grace,
    notified): work that waits on the world outside, as work for an unavailable data location
    does. ``run --until-idle`` does not wait for it (it exits 4, ``status`` lists the link; the
    next run tries it again at once, as it is due by then), while a link cut more briefly is
    waited for like any retry backoff."""
    src, dst = aliased(DataLocation), aliased(DataLocation)
    return (select(Operation.id)
            .join(src, src.id == Operation.source_location_id)
            .join(dst, dst.id == Operation.destination_location_id)
            .join(LinkOutage, (LinkOutage.source == src.name) & (LinkOutage.destination == dst.name))
            .where(Operation.status == Status.PENDING.value, Operation.not_before > now))


def track_links(db: Database, settings: Settings) -> tuple[list[str], list[str]]:
    """Record links cut for longer than ``[recovery] service_dead_after_seconds`` and links back,
    once each, with their notification (see the module docstring), in one transaction.

    Returns:
        ``(cut, healed)``: ``"<source> → <destination>"`` of the links this call recorded as cut,
        and as back.
    """
    grace = dt.timedelta(seconds=settings.recovery.service_dead_after_seconds)

    def tx(s: Session) -> tuple[list[str], list[str]]:
        now = utcnow()
        links = {(c["source"], c["destination"]): c for c in cut_links(s)
                 if c["source"] is not None and c["destination"] is not None}
        recorded = {(o.source, o.destination): o for o in s.scalars(select(LinkOutage))}
        # locations at a site cut off from the centre: their links are not listed meanwhile, which
        # does not mean a link recorded cut before is back
        cut_off = set(s.scalars(select(DataLocation.name).join(Site, Site.id == DataLocation.site_id)
                                .join(SiteOutage, SiteOutage.site == Site.name))) if recorded else set()
        cut: list[str] = []
        healed: list[str] = []
        for (source, destination), c in links.items():
            if (source, destination) in recorded or c["since"] is None or now - c["since"] < grace:
                continue
            t = LinkOutage.__table__
            if not insert_if_absent(s, t, [t.c.source, t.c.destination],
                                    {"source": source, "destination": destination, "host": c["host"],
                                     "since": c["since"], "noticed_at": now}):
                continue  # another monitor recorded it first
            cut.append(f"{source} → {destination}")
            seconds = int((now - c["since"]).total_seconds())
            enqueue(s, level=NotificationLevel.WARNING, event="link_unreachable",
                    subject=f"Link {source} -> {destination} cut",
                    body=(f"{len(c['operations'])} transfer(s) from {source} to {destination} cannot reach "
                          f"{c['host'] or source} over SSH since {c['since'].isoformat()} UTC ({seconds} s): the "
                          f"link between the sites is cut, or the SSH server of {source}'s site is down "
                          f"({c['message']}). They try again for as long as it stays cut and resume from their "
                          f"partials by themselves once it is back. `packhorse status` lists the link."),
                    context={"source": source, "destination": destination, "host": c["host"],
                             "since": c["since"].isoformat(), "operations": c["operations"]},
                    cooldown_seconds=0, now=now, key=f"link_unreachable:{source}:{destination}:{c['since'].isoformat()}")
        for (source, destination), o in recorded.items():
            if (source, destination) in links or source in cut_off or destination in cut_off:
                continue
            if s.execute(delete(LinkOutage).where(LinkOutage.source == source, LinkOutage.destination == destination,
                                                  LinkOutage.since == o.since)).rowcount != 1:
                continue
            healed.append(f"{source} → {destination}")
            lasted = int((now - o.since).total_seconds())
            enqueue(s, level=NotificationLevel.INFO, event="link_reachable",
                    subject=f"Link {source} -> {destination} back",
                    body=(f"No transfer from {source} to {destination} waits for the link any more: they move "
                          f"bytes again (or ended otherwise). The link was cut for about {lasted} s (since "
                          f"{o.since.isoformat()} UTC)."),
                    context={"source": source, "destination": destination, "since": o.since.isoformat(),
                             "seconds": lasted},
                    cooldown_seconds=0, now=now, key=f"link_reachable:{source}:{destination}:{o.since.isoformat()}")
        return cut, healed

    cut, healed = db.transact(tx)
    for link in cut:
        log.warning("link_unreachable", link=link)
    for link in healed:
        log.info("link_reachable", link=link)
    return cut, healed
