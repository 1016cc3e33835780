"""Circuit breakers: one per (operation kind, operation), kept in the ops database.

The stalled-task monitor counts every stall (an ``IN_PROGRESS`` operation whose lease expired)
on the operation's breaker (:func:`count_stall`). While fewer than ``max_stall_count`` stalls
were counted the breaker is *closed* and the monitor resets the operation for re-dispatch; at
``max_stall_count`` it *opens*: the operation is left alone and an ERROR notification is queued
(at most one per ``notification_cooldown_seconds``). The breaker closes by itself
``circuit_breaker_timeout_seconds`` after the last stall (with an INFO notification), or when an
admin resets it (:func:`reset_breaker`, ``packhorse breaker reset``) or forces a retry
(:func:`force_retry`, ``packhorse retry``). (DESIGN.md "Circuit breaker"; seed 002 "Circuit
Breaker Pattern".)

Every notification here is queued in the same transaction as the breaker change.
Times are UTC; durations are seconds.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import structlog
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ..config import RecoveryConfig
from ..db.models import CircuitBreaker, Operation, utcnow
from ..db.session import Database
from ..domain import NotificationLevel, OperationKind, Status
from ..errors import UnknownOperationError
from ..notify.outbox import enqueue
from ..operations import fenced

log = structlog.get_logger(__name__)

#: Notification subjects of the breaker events (also the I5 owner of an open breaker: a human).
BREAKER_OPEN_SUBJECT = "Circuit breaker open: {kind} {id} blocked from recovery after {n} stalls"
BREAKER_CLOSED_SUBJECT = "Circuit breaker closed: {kind} {id} will be recovered again"


def breaker_row(b: CircuitBreaker) -> dict[str, Any]:
    """One breaker as a plain dict (the shape of :func:`list_breakers`)."""
    return {
        "kind": b.kind, "operation_id": b.operation_id, "stall_count": b.stall_count,
        "last_stall_at": b.last_stall_at, "opened_at": b.opened_at,
        "closes_at": b.closes_at if b.opened_at is not None else None,
        "state": "open" if b.opened_at is not None else "closed",
    }


def jsonable(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with datetimes as ISO 8601 strings (for notification contexts and ``--json``)."""
    return {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in row.items()}


def get_breaker(session: Session, kind: OperationKind | str, operation_id: int) -> CircuitBreaker | None:
    """The breaker row of (``kind``, ``operation_id``), or ``None`` (never stalled: closed)."""
    k = kind.value if isinstance(kind, OperationKind) else kind
    return session.scalars(select(CircuitBreaker).where(CircuitBreaker.kind == k,
                                                         CircuitBreaker.operation_id == operation_id)).first()


def close_expired(session: Session, now: dt.datetime | None = None) -> list[int]:
    """Close every open breaker whose ``closes_at`` passed (INFO notification each).

    Returns:
        the operation ids whose breaker closed (the monitor resets those operations next).
    """
    now = now or utcnow()
    closed: list[int] = []
    # locked: two monitors closing the same breaker notify once (the second skips it)
    due = select(CircuitBreaker).where(CircuitBreaker.opened_at.is_not(None), CircuitBreaker.closes_at <= now)
    for b in session.scalars(due.with_for_update(skip_locked=True)):
        _close(session, b, reason="timeout", actor="monitor", now=now)
        closed.append(b.operation_id)
    return closed


def _close(session: Session, b: CircuitBreaker, *, reason: str, actor: str, now: dt.datetime) -> None:
    was_open = b.opened_at is not None
    previous = b.stall_count
    b.stall_count = 0
    b.opened_at = None
    b.closes_at = None
    log.info("circuit_breaker_closed", operation_kind=b.kind, operation_id=b.operation_id,
             previous_stall_count=previous, reason=reason, actor=actor)
    if was_open or actor != "monitor":
        enqueue(session, level=NotificationLevel.INFO, event="breaker_closed",
                subject=BREAKER_CLOSED_SUBJECT.format(kind=b.kind, id=b.operation_id),
                body=(f"Operation: {b.kind} {b.operation_id}\nPrevious stall count: {previous}\n"
                      f"Closed by: {actor}\nReason: {reason}\nTime (UTC): {now.isoformat()}\n"
                      "A new stall counts towards a new breaker cycle."),
                context={"operation_kind": b.kind, "operation_id": b.operation_id,
                         "previous_stall_count": previous, "reason": reason, "actor": actor},
                operation_kind=b.kind, operation_id=b.operation_id, cooldown_seconds=0, now=now)


def count_stall(session: Session, op: Operation, rec: RecoveryConfig, now: dt.datetime | None = None) -> CircuitBreaker:
    """Count the stall of ``op``'s current attempt on its breaker (once per attempt).

    Opens the breaker when ``stall_count`` reaches ``rec.max_stall_count``. Returns the breaker.
    """
    now = now or utcnow()
    b = get_breaker(session, op.kind, op.id)
    if b is None:
        b = CircuitBreaker(kind=op.kind, operation_id=op.id, stall_count=0, last_stall_attempt=0)
        session.add(b)
    if b.last_stall_attempt != op.attempt:
        op.stall_count = (op.stall_count or 0) + 1  # every stall of the operation, ever
        b.stall_count += 1
        b.last_stall_attempt = op.attempt
        b.last_stall_at = now
        if b.stall_count >= rec.max_stall_count and b.opened_at is None:
            b.opened_at = now
            b.closes_at = now + dt.timedelta(seconds=rec.circuit_breaker_timeout_seconds)
            log.error("circuit_breaker_opened", operation_kind=op.kind, operation_id=op.id, stall_count=b.stall_count)
    session.flush()
    return b


def notify_open(session: Session, b: CircuitBreaker, op: Operation, rec: RecoveryConfig,
                now: dt.datetime | None = None) -> None:
    """Queue the ERROR notification of an open breaker (one per cooldown window)."""
    now = now or utcnow()
    closes = b.closes_at
    enqueue(session, level=NotificationLevel.ERROR, event="breaker_open",
            subject=BREAKER_OPEN_SUBJECT.format(kind=b.kind, id=b.operation_id, n=b.stall_count),
            body=(f"Operation: {b.kind} {b.operation_id}\nStall count: {b.stall_count}\n"
                  f"Last attempt: {op.attempt}\nLast lease owner: {op.lease_owner or '-'}\n"
                  f"Last stall (UTC): {b.last_stall_at.isoformat() if b.last_stall_at else '-'}\n"
                  f"Closes by itself at (UTC): {closes.isoformat() if closes else '-'}\n\n"
                  "The operation is left IN_PROGRESS and is not recovered automatically. Find why its "
                  "workers die or hang, then: packhorse retry "
                  f"{b.kind} {b.operation_id} --reason '...'"),
            context=jsonable(breaker_row(b)), operation_kind=b.kind, operation_id=b.operation_id,
            cooldown_seconds=rec.notification_cooldown_seconds, now=now)


def is_open(session: Session, kind: OperationKind | str, operation_id: int) -> bool:
    """True if the breaker of (``kind``, ``operation_id``) is open."""
    b = get_breaker(session, kind, operation_id)
    return b is not None and b.opened_at is not None


def open_breaker_count(session: Session) -> int:
    """How many breakers are open whose operation is still active (work blocked on a human)."""
    return len(session.scalars(
        select(CircuitBreaker.id).join(Operation, Operation.id == CircuitBreaker.operation_id)
        .where(CircuitBreaker.opened_at.is_not(None),
               Operation.status.in_([Status.PENDING.value, Status.SCHEDULED.value, Status.IN_PROGRESS.value]))
    ).all())


def list_breakers(session: Session) -> list[dict[str, Any]]:
    """Every breaker that counted a stall, open ones first.

    Returns:
        dicts with ``kind``, ``operation_id``, ``stall_count``, ``last_stall_at``,
        ``opened_at`` and ``closes_at`` (UTC datetimes, ``None`` while closed), ``state``
        (``"open"`` / ``"closed"``).
    """
    rows = session.scalars(select(CircuitBreaker).where(CircuitBreaker.stall_count > 0)
                           .order_by(CircuitBreaker.opened_at.is_(None), CircuitBreaker.id)).all()
    return [breaker_row(b) for b in rows]


def _operation(session: Session, kind: OperationKind, operation_id: int) -> Operation:
    op = session.get(Operation, operation_id)
    if op is None or op.kind != kind.value:
        raise UnknownOperationError(f"no {kind.value} operation with id {operation_id}")
    return op


def reset_breaker(db: Database, kind: OperationKind, operation_id: int, *, reason: str, actor: str) -> dict[str, Any]:
    """Close the breaker of (``kind``, ``operation_id``) by hand (INFO notification, WARNING log).

    The operation itself is not touched: if it is stalled, the next monitor cycle recovers it.

    Returns:
        the breaker as in :func:`list_breakers` (state ``"closed"``, ``stall_count`` 0),
        plus ``previous_stall_count``.

    Raises:
        UnknownOperationError: no operation ``operation_id`` of ``kind``.
    """

    def tx(s: Session) -> dict[str, Any]:
        _operation(s, kind, operation_id)
        b = get_breaker(s, kind, operation_id)
        if b is None:
            b = CircuitBreaker(kind=kind.value, operation_id=operation_id, stall_count=0, last_stall_attempt=0)
            s.add(b)
            s.flush()
        previous = b.stall_count
        _close(s, b, reason=reason, actor=actor, now=utcnow())
        return {**breaker_row(b), "previous_stall_count": previous}

    out = db.transact(tx)
    log.warning("circuit_breaker_reset", operation_kind=kind.value, operation_id=operation_id, reason=reason,
                actor=actor)
    return out


def force_retry(db: Database, kind: OperationKind, operation_id: int, *, reason: str, actor: str) -> dict[str, Any]:
    """Force a retry: close the breaker, reset the operation to ``PENDING`` and make it
    dispatchable now (backoff cleared; ``attempt`` is kept, so a stale worker stays fenced out).

    A ``COMPLETED`` operation is refused (nothing to retry). A ``FAILED`` one gets
    ``retry_count + 1``, its cached error context cleared; the failure history stays.

    Returns:
        ``{"kind", "operation_id", "previous_status", "status": "PENDING", "breaker": {...}}``.

    Raises:
        UnknownOperationError: no operation ``operation_id`` of ``kind``.
        ResetRefusedError: the operation is ``COMPLETED``, or it changed (claimed, finished)
            between reading it and resetting it: the reset is a compare-and-set on
            :func:`~packhorse.operations.fenced` with the status and attempt read.
    """
    from ..operations import ResetRefusedError

    def tx(s: Session) -> dict[str, Any]:
        op = _operation(s, kind, operation_id)
        if op.status == Status.COMPLETED.value:
            raise ResetRefusedError(f"{kind.value} {operation_id} is COMPLETED; nothing to retry")
        previous = op.status
        b = get_breaker(s, kind, operation_id)
        if b is not None:
            _close(s, b, reason=reason, actor=actor, now=utcnow())
        now = utcnow()
        values: dict[str, Any] = dict(status=Status.PENDING.value, not_before=None, lease_owner=None,
                                      lease_expires_at=None, finished_at=None, updated_at=now)
        if previous == Status.FAILED.value:
            values.update(retry_count=Operation.retry_count + 1, error_context=None)
        if s.execute(update(Operation).where(fenced(operation_id, op.attempt, Status(previous)))
                     .values(**values)).rowcount != 1:  # claimed or finished since it was read
            raise ResetRefusedError(f"{kind.value} {operation_id} changed while it was being retried; try again")
        enqueue(s, level=NotificationLevel.INFO, event="forced_retry",
                subject=f"Forced retry: {kind.value} {operation_id}",
                body=(f"Operation: {kind.value} {operation_id}\nPrevious status: {previous}\nBy: {actor}\n"
                      f"Reason: {reason}\nThe circuit breaker was reset and the operation set to PENDING."),
                context={"operation_kind": kind.value, "operation_id": operation_id, "previous_status": previous,
                         "reason": reason, "actor": actor},
                operation_kind=kind.value, operation_id=operation_id, cooldown_seconds=0, now=now)
        return {"kind": kind.value, "operation_id": operation_id, "previous_status": previous,
                "status": Status.PENDING.value, "breaker": jsonable(breaker_row(b)) if b is not None else None}

    out = db.transact(tx)
    log.warning("operation_force_retried", operation_kind=kind.value, operation_id=operation_id,
                previous_status=out["previous_status"], reason=reason, actor=actor)
    return out
