"""FAILED operations grouped by cause, and the bulk reset of a group (admins).

A *cause* is one (operation kind, data location, error type): a hundred transfers that failed
because one destination's mount is gone are one row with a count, not a hundred rows. The
location is where the work happens (the destination, else the source, else — a deletion — the
copy's location, as in :mod:`packhorse.status.overview`); the error type is the one the operation's
error context recorded when it failed (else its newest failure event's; ``unknown`` if none).

:func:`failure_groups` lists the groups; :func:`reset_group` resets every operation of one
group that is still FAILED, one compare-and-set each (:func:`packhorse.operations.lifecycle.reset_failed`:
PENDING, retry count + 1, failure history kept), and writes one audit entry with the reason and
the ids. Error messages are in the groups (``sample_message``): admin routes only.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from packhorse.db.models import FailureEvent, Operation
from packhorse.domain import OperationKind, Status
from packhorse.errors import EmptyReasonError, ResetRefusedError
from packhorse.operations.lifecycle import reset_failed
from packhorse.runtime import audit
from packhorse.runtime.context import ProcessContext
from packhorse.status.operation_names import package_and_location

#: At most this many FAILED operations are grouped (newest first); more is reported as truncated.
MAX_FAILED = 10000
#: At most this many operations are listed per group (the count is always complete).
MAX_LISTED = 200
UNKNOWN = "unknown"


def _failed(session: Session, kind: OperationKind | None = None) -> tuple[list[dict[str, Any]], bool]:
    package, location, join = package_and_location()
    q = join(select(Operation.id, Operation.kind, package, location, Operation.error_context, Operation.updated_at,
                    Operation.retry_count, Operation.max_retries).select_from(Operation)).where(
        Operation.status == Status.FAILED.value)
    if kind is not None:
        q = q.where(Operation.kind == kind.value)
    rows = session.execute(q.order_by(Operation.updated_at.desc(), Operation.id.desc()).limit(MAX_FAILED + 1)).all()
    truncated = len(rows) > MAX_FAILED
    rows = rows[:MAX_FAILED]
    no_context = [r[0] for r in rows if not (r[4] or {}).get("error_type")]
    latest: dict[int, tuple[str, str]] = {}
    if no_context:
        for op_id, etype, msg in session.execute(
                select(FailureEvent.operation_id, FailureEvent.error_type, FailureEvent.message)
                .where(FailureEvent.operation_id.in_(no_context)).order_by(FailureEvent.id)):
            latest[op_id] = (etype, msg)
    out = []
    for op_id, k, pkg, loc, ctx, updated, retries, max_retries in rows:
        ctx = ctx or {}
        etype, msg = (ctx.get("error_type"), ctx.get("message")) if ctx.get("error_type") else latest.get(op_id, (None, None))
        out.append({"operation_id": op_id, "kind": k, "package": pkg, "location": loc, "error_type": etype or UNKNOWN,
                    "message": msg, "updated_at": updated.isoformat() if updated else None,
                    "retry_count": retries, "max_retries": max_retries})
    return out, truncated


def failure_groups(session: Session) -> dict[str, Any]:
    """Every FAILED operation grouped by (kind, location, error type), largest group first.

    Returns:
        ``{"groups": [{"kind", "location" (None if none), "error_type", "count", "first_at",
        "last_at" (ISO UTC of the operations' last update), "sample_message", "operations":
        [{"operation_id", "package", "updated_at", "retry_count", "max_retries"}] (newest
        first, at most :data:`MAX_LISTED`)}], "failed": total, "truncated": bool}``.
    """
    failed, truncated = _failed(session)
    groups: dict[tuple[str, str | None, str], dict[str, Any]] = {}
    for f in failed:
        g = groups.setdefault((f["kind"], f["location"], f["error_type"]), {
            "kind": f["kind"], "location": f["location"], "error_type": f["error_type"], "count": 0,
            "first_at": f["updated_at"], "last_at": f["updated_at"], "sample_message": f["message"], "operations": []})
        g["count"] += 1
        g["first_at"] = min(x for x in (g["first_at"], f["updated_at"]) if x) if f["updated_at"] else g["first_at"]
        if len(g["operations"]) < MAX_LISTED:
            g["operations"].append({k: f[k] for k in ("operation_id", "package", "updated_at", "retry_count",
                                                      "max_retries")})
    ordered = sorted(groups.values(), key=lambda g: (-g["count"], g["kind"], g["location"] or "", g["error_type"]))
    return {"groups": ordered, "failed": len(failed), "truncated": truncated}


def reset_group(ctx: ProcessContext, kind: OperationKind, location: str | None, error_type: str, *, actor: str,
                reason: str) -> list[int]:
    """Reset every operation of one failure group that is still FAILED; audited.

    An operation that left FAILED meanwhile (someone reset it) is skipped, not an error.

    Args:
        location: the group's data location (``None``: operations without one).
        error_type: the group's error type (``unknown`` for those without).
        reason: why (required: kept in the audit log).

    Returns:
        the ids reset (possibly empty: the group is gone).

    Raises:
        EmptyReasonError: ``reason`` is empty.
    """
    if not reason or not reason.strip():
        raise EmptyReasonError("reason: say why these operations may be retried (kept in the audit log)")
    members = ctx.db.read(lambda s: [f["operation_id"] for f in _failed(s, kind)[0]
                                     if f["location"] == location and f["error_type"] == error_type])
    done: list[int] = []
    for op_id in members:
        try:
            done += reset_failed(ctx.db, kind, op_id)
        except ResetRefusedError:
            continue
    audit.record(ctx.db, actor=actor, action="operation.reset_group",
                 target=f"{kind.value}@{location or '-'}:{error_type}",
                 details={"reason": reason, "reset": done, "count": len(done), "location": location,
                          "error_type": error_type})
    return done
