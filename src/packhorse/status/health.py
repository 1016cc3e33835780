"""The health report: what ``packhorse health`` and ``GET /api/health`` both show, read once.

Services and workers with their last heartbeat (alive or dead), scans overdue, whether a
distributed deployment runs without a monitor, leases no monitor reclaimed and sites cut off
from the centre (DESIGN.md I5: every state has an owner; these are where an owner is missing).
One reader, so the terminal and the browser cannot disagree (a trial found the API's report
without the cut-off sites the command listed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from packhorse.db.models import utcnow
from packhorse.recovery.breakers import jsonable
from packhorse.recovery.health import list_services, scan_health
from packhorse.status.blocked_work import BlockedItem, lease_not_reclaimed, site_unreachable

if TYPE_CHECKING:
    from packhorse.runtime.context import ProcessContext


@dataclass(frozen=True)
class HealthReport:
    """One reading of the deployment's health.

    ``services``: :func:`~packhorse.recovery.health.list_services` rows (``alive``, ``last_seen``
    UTC, ``age_seconds``, ``clock_offset_seconds`` database minus host, …); ``scans_overdue``:
    :func:`~packhorse.recovery.health.scan_health` rows; ``no_monitor``: services of distributed
    mode heartbeat but no monitor is alive; ``leases_not_reclaimed`` and ``sites_unreachable``:
    blocked work of those causes (:mod:`packhorse.status.blocked_work`)."""

    services: list[dict[str, Any]]
    scans_overdue: list[dict[str, Any]]
    no_monitor: bool
    leases_not_reclaimed: list[BlockedItem]
    sites_unreachable: list[BlockedItem]

    @property
    def dead(self) -> list[dict[str, Any]]:
        """The services whose heartbeat is older than ``service_dead_after_seconds``."""
        return [r for r in self.services if not r["alive"]]

    def as_json(self) -> dict[str, Any]:
        """The report as ``packhorse health --json`` prints it and ``GET /api/health`` returns it
        (times ISO 8601 UTC; ``dead``: how many services are dead)."""
        return {"services": [jsonable(r) for r in self.services], "dead": len(self.dead),
                "scans_overdue": self.scans_overdue, "no_monitor": self.no_monitor,
                "leases_not_reclaimed": [i.as_json() for i in self.leases_not_reclaimed],
                "sites_unreachable": [i.as_json() for i in self.sites_unreachable]}


def health_report(ctx: "ProcessContext") -> HealthReport:
    """Read the :class:`HealthReport` now (one read-only transaction; the database's clock)."""
    rec = ctx.settings.recovery

    def read(s: Any) -> HealthReport:
        now = utcnow()
        rows = list_services(s, now, dead_after_seconds=rec.service_dead_after_seconds,
                             forget_after_seconds=rec.service_forget_after_seconds)
        # distributed mode (workers or managers heartbeat) needs a monitor: it alone hands expired
        # leases back, lets breakers half-open and re-dispatches lost messages (DESIGN.md I5)
        distributed = any(r["kind"] in ("worker", "manager") for r in rows)
        return HealthReport(
            services=rows, scans_overdue=scan_health(s, overdue_seconds=rec.scan_overdue_seconds),
            no_monitor=distributed and not any(r["kind"] == "monitor" and r["alive"] for r in rows),
            leases_not_reclaimed=lease_not_reclaimed(s, ctx),
            sites_unreachable=site_unreachable(s, ctx, services=rows, now=now))  # the services read once

    return ctx.db.read(read)
