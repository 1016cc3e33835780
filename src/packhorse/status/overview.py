"""The pipeline overview: what is stuck, for everybody (observers included).

The overview says *what* (operation kind, package, location, status, retry count) and never
*why*: it carries no error context, traceback, error message or diagnosis, for any caller —
the same payload for observers and admins. The "why" is only in the diagnostic report
(:mod:`packhorse.status.diagnose`, admin). The API serves it through a response model that forbids
any other field, so an error field cannot slip in.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from packhorse.db.models import (
    DataLocation,
    Operation,
    PhysicalCopy,
    Site,
    utcnow,
)
from packhorse.domain import CopyStatus, Status
from packhorse.rules.disk_usage import latest_usage
from packhorse.status.blocked_work import blocked_items
from packhorse.status.operation_names import package_and_location
from packhorse.status.problems import problem_lines
from packhorse.status.reporting import failed_operations

if TYPE_CHECKING:
    from packhorse.runtime.context import ProcessContext


def pipeline_overview(session: Session, *, limit: int = 500, now: dt.datetime | None = None,
                      ctx: "ProcessContext | None" = None) -> dict[str, Any]:
    """Operations grouped by kind, location and status, and the operations not yet completed.

    Args:
        limit: at most this many unfinished operations are listed (stuck ones first).

    Returns:
        ``{"generated_at": ISO, "counts": [{"kind", "location", "status", "count"}],
        "totals": {STATUS: n}, "stalled": n, "operations": [{"kind", "operation_id", "package",
        "location", "status", "stalled", "retry_count", "max_retries", "updated_at"}],
        "truncated": bool, "blocked": [BlockedItem.as_json()]}`` — ``stalled`` is ``IN_PROGRESS``
        with an expired lease; the list holds FAILED and stalled operations first, then the other
        unfinished ones by id; ``blocked`` is :func:`packhorse.status.blocked_work.blocked_items` (with
        ``ctx``; empty without it), the list ``packhorse status`` shows; ``problems`` is
        :func:`packhorse.status.problems.problem_lines` of the FAILED operations and ``blocked``
        (what the dashboard's banner shows first).
    """
    now = now or utcnow()
    package, location, join = package_and_location()
    counts = [{"kind": k, "location": l, "status": s, "count": int(n)} for k, l, s, n in session.execute(
        join(select(Operation.kind, location, Operation.status, func.count()).select_from(Operation))
        .group_by(Operation.kind, location, Operation.status).order_by(Operation.kind, location, Operation.status))]
    totals: dict[str, int] = {s.value: 0 for s in Status}
    for c in counts:
        totals[c["status"]] += c["count"]
    stalled_expr = (Operation.status == Status.IN_PROGRESS.value) & (Operation.lease_expires_at < now)
    stalled = session.scalar(select(func.count()).select_from(Operation).where(stalled_expr)) or 0
    rank = case((Operation.status == Status.FAILED.value, 0), (stalled_expr, 1), else_=2)
    rows = session.execute(
        join(select(Operation.kind, Operation.id, package, location, Operation.status, Operation.lease_expires_at,
                    Operation.retry_count, Operation.max_retries, Operation.updated_at).select_from(Operation))
        .where(Operation.status != Status.COMPLETED.value).order_by(rank, Operation.id).limit(limit + 1)).all()
    ops = [{"kind": r[0], "operation_id": r[1], "package": r[2], "location": r[3], "status": r[4],
            "stalled": r[4] == Status.IN_PROGRESS.value and r[5] is not None and r[5] < now,
            "retry_count": r[6], "max_retries": r[7], "updated_at": r[8].isoformat() if r[8] else None}
           for r in rows[:limit]]
    blocked: list[dict[str, Any]] = []
    if ctx is not None:
        blocked = [b.as_json() for b in blocked_items(session, ctx)]
    return {"generated_at": now.isoformat(), "counts": counts, "totals": totals, "stalled": int(stalled),
            "operations": ops, "truncated": len(rows) > limit, "blocked": blocked,
            "problems": problem_lines(failed_operations(session), blocked)}


def location_usage(session: Session) -> list[dict[str, Any]]:
    """Per data location: ``[{"name", "site", "role", "storage", "active", "copies", "bytes",
    "disk"}]`` counting present physical copies (what packhorse stored there); ``disk`` is the
    latest disk usage sample of the location's file system (bytes, percent, level),
    ``None`` before the disk monitor measured it (or for object storage)."""
    agg = (select(PhysicalCopy.location_id, func.count().label("n"), func.coalesce(func.sum(PhysicalCopy.size), 0).label("b"))
           .where(PhysicalCopy.status == CopyStatus.PRESENT.value).group_by(PhysicalCopy.location_id).subquery())
    rows = session.execute(
        select(DataLocation.name, Site.name, DataLocation.role, DataLocation.storage_type, DataLocation.active,
               agg.c.n, agg.c.b).join(Site, Site.id == DataLocation.site_id)
        .outerjoin(agg, agg.c.location_id == DataLocation.id).order_by(DataLocation.id)).all()

    disk = latest_usage(session)

    def usage(name: str) -> dict[str, Any] | None:
        u = disk.get(name)
        if u is None:
            return None
        return {"total_bytes": int(u.total_bytes), "used_bytes": int(u.used_bytes), "free_bytes": int(u.free_bytes),
                "percent": round(float(u.percent), 2), "level": u.level, "measured_at": u.measured_at}

    return [{"name": n, "site": s, "role": r, "storage": st, "active": bool(a), "copies": int(c or 0),
             "bytes": int(b or 0), "disk": usage(n)} for n, s, r, st, a, c, b in rows]
