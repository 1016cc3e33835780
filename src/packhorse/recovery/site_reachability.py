"""Sites the centre cannot reach: a site cut off is one line and one notification, not one per
operation (DESIGN.md I5; a site's workers are the owners of its work, so when none of them can
reach the ops database, everything there waits, and an operator must be told once).

A site is **unreachable** when it has workers (services of kind ``worker`` with the site in their
health heartbeat, :mod:`packhorse.recovery.health`) and none of them is alive: no heartbeat for
``[recovery] service_dead_after_seconds`` (90 s). That is what the centre sees of a site cut off
from the database and broker by its link, and of a site whose every worker stopped; it cannot
tell the two apart and says so. ``since`` is the last heartbeat of any of its workers.

:func:`unreachable_sites` computes it (read-only: ``status``, ``health``, the dashboard);
:func:`track_sites`, run by every recovery pass (``packhorse monitor``, ``packhorse run``),
records each cut once in ``site_outages`` with one WARNING notification ``site_unreachable``,
and its end with one INFO ``site_reachable`` naming how long it lasted. Insert and delete are
compare-and-set, so several monitors notify once. A site that has never had a worker heartbeat
(embedded mode, a site only configured) is never unreachable. Times UTC, durations seconds.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import structlog
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from packhorse.config import Settings
from packhorse.db.models import SiteOutage, utcnow
from packhorse.db.session import Database, insert_if_absent
from packhorse.domain import LocationRole, NotificationLevel
from packhorse.notify.outbox import enqueue
from packhorse.recovery.health import list_services

log = structlog.get_logger(__name__)


def unreachable_sites(session: Session, *, dead_after_seconds: float, forget_after_seconds: float,
                      now: dt.datetime | None = None,
                      services: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Sites with workers none of which is alive, by name. ``services``: the rows of
    :func:`~packhorse.recovery.health.list_services` read at ``now`` by the caller with the same
    ``dead_after_seconds`` and ``forget_after_seconds`` (one read for a whole report); ``None``
    reads them.

    Returns:
        ``[{"site", "since" (the last heartbeat of its workers, ISO 8601 UTC), "seconds" (since
        then), "workers": [service identities]}]``.
    """
    now = now or utcnow()
    by_site: dict[str, list[dict[str, Any]]] = {}
    if services is None:
        services = list_services(session, now, dead_after_seconds=dead_after_seconds,
                                 forget_after_seconds=forget_after_seconds)
    for r in services:
        if r["kind"] == "worker" and r["site"]:
            by_site.setdefault(r["site"], []).append(r)
    out = []
    for site, rows in sorted(by_site.items()):
        if any(r["alive"] for r in rows):
            continue
        last = max(r["last_seen"] for r in rows)
        out.append({"site": site, "since": last.isoformat(), "seconds": int((now - last).total_seconds()),
                    "workers": sorted(r["service"] for r in rows)})
    return out


def source_sites(settings: Settings) -> set[str]:
    """The names of the sites that hold a source location (whose instruments' files wait there
    while the site is cut off)."""
    return {loc.site for loc in settings.locations if loc.role is LocationRole.SOURCE}


def track_sites(db: Database, settings: Settings) -> tuple[list[str], list[str]]:
    """Record sites that became unreachable and sites that came back, once each, with their
    notification (see the module docstring), in one transaction.

    Returns:
        ``(cut, healed)``: site names this call recorded as cut off, and as reachable again.
    """
    rec = settings.recovery

    def tx(s: Session) -> tuple[list[str], list[str]]:
        now = utcnow()
        down = {u["site"]: u for u in unreachable_sites(s, dead_after_seconds=rec.service_dead_after_seconds,
                                                        forget_after_seconds=rec.service_forget_after_seconds,
                                                        now=now)}
        recorded = {o.site: o for o in s.scalars(select(SiteOutage))}
        sources = source_sites(settings)
        cut: list[str] = []
        healed: list[str] = []
        for site, u in down.items():
            if site in recorded:
                continue
            t = SiteOutage.__table__
            if not insert_if_absent(s, t, [t.c.site],
                                    {"site": site, "since": dt.datetime.fromisoformat(u["since"]), "noticed_at": now}):
                continue  # another monitor recorded it first
            cut.append(site)
            enqueue(s, level=NotificationLevel.WARNING, event="site_unreachable",
                    subject=f"Site {site} unreachable",
                    body=(f"No worker of site {site} has sent a heartbeat since {u['since']} UTC ({u['seconds']} s): "
                          f"the site is cut off from the centre (its link, or the database and broker are out of "
                          f"its reach) or its workers are down ({', '.join(u['workers'])}). Its work waits and "
                          "resumes by itself once they are back"
                          + ("; its instruments' files stay in its source location meanwhile"
                             if site in sources else "") + ". `packhorse health` lists its workers."),
                    context={"site": site, "since": u["since"], "workers": u["workers"]},
                    cooldown_seconds=0, now=now, key=f"site_unreachable:{site}:{u['since']}")
        for site, o in recorded.items():
            if site in down:
                continue
            if s.execute(delete(SiteOutage).where(SiteOutage.site == site, SiteOutage.since == o.since)).rowcount != 1:
                continue
            healed.append(site)
            lasted = int((now - o.since).total_seconds())
            enqueue(s, level=NotificationLevel.INFO, event="site_reachable",
                    subject=f"Site {site} reachable again",
                    body=(f"A worker of site {site} sends heartbeats again; the site was unreachable for about "
                          f"{lasted} s (since {o.since.isoformat()} UTC). Its waiting work goes on by itself."),
                    context={"site": site, "since": o.since.isoformat(), "seconds": lasted},
                    cooldown_seconds=0, now=now, key=f"site_reachable:{site}:{o.since.isoformat()}")
        return cut, healed

    cut, healed = db.transact(tx)
    for site in cut:
        log.warning("site_unreachable", site=site)
    for site in healed:
        log.info("site_reachable", site=site)
    return cut, healed
