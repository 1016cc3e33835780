"""Circuit breakers: one per (operation kind, operation), kept in the ops database.

States (:class:`~packhorse.domain.BreakerState`; DESIGN.md "Circuit breaker"; seed 002 "Circuit
Breaker Pattern", with the half-open state of the usual pattern added):

* **closed** — the stalled-task monitor counts every stall (an ``IN_PROGRESS`` operation whose
  lease expired) on the operation's breaker (:func:`count_stall`) and resets the operation for
  re-dispatch;
* **open** — at ``max_stall_count`` stalls the breaker opens: the operation is held (left
  ``IN_PROGRESS``; after a failed trial ``PENDING`` and not due) for a cool-down
  (``circuit_breaker_cooldown_seconds``, 600 s), an ERROR notification is queued (at most one per
  ``notification_cooldown_seconds``) and the work shows in ``packhorse status`` as blocked
  (:func:`packhorse.status.blocked_work.circuit_breakers`, cause ``circuit_breaker``);
* **half-open** — when the cool-down passed, the monitor lets one attempt through
  (:func:`let_trials_through`: the operation is reset to ``PENDING``, dispatchable now). That
  attempt's success closes the breaker (:func:`after_success`, in the completion's transaction);
  its failure (:func:`after_failure`, in the failure's transaction) or its stall
  (:func:`count_stall`) opens it again for another cool-down, doubled with each failed trial up
  to ``circuit_breaker_timeout_seconds`` (3600 s). A permanent failure closes it: the ``FAILED``
  operation then waits for ``packhorse reset`` like any other.

An admin may close a breaker at any time (:func:`reset_breaker`, ``packhorse breaker reset``) or
force a retry (:func:`force_retry`, ``packhorse retry``). Every notification here is queued in
the same transaction as the breaker change. Times are UTC; durations are seconds.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from packhorse.config import RecoveryConfig
from packhorse.db.models import CircuitBreaker, Operation, utcnow
from packhorse.db.session import Database
from packhorse.domain import ACTIVE_STATUSES, BreakerState, NotificationLevel, OperationKind, Status
from packhorse.errors import ResetRefusedError
from packhorse.notify.outbox import enqueue
from packhorse.operations.lifecycle import fenced, get_operation

if TYPE_CHECKING:
    pass

log = structlog.get_logger(__name__)

#: Notification subjects of the breaker events (also the I5 owner of an open breaker: a human).
BREAKER_OPEN_SUBJECT = "Circuit breaker open: {kind} {id} held after {n} stalls"
BREAKER_REOPENED_SUBJECT = "Circuit breaker open again: {kind} {id}: the attempt after the cool-down {how}"
BREAKER_HALF_OPEN_SUBJECT = "Circuit breaker half-open: {kind} {id}: one attempt let through"
BREAKER_CLOSED_SUBJECT = "Circuit breaker closed: {kind} {id} will be recovered again"

_OPEN = BreakerState.OPEN.value
_HALF_OPEN = BreakerState.HALF_OPEN.value
_CLOSED = BreakerState.CLOSED.value
_ACTIVE = [s.value for s in ACTIVE_STATUSES]


def breaker_row(b: CircuitBreaker) -> dict[str, Any]:
    """One breaker as a plain dict (the shape of :func:`list_breakers`).

    ``{"kind", "operation_id", "state": "closed"|"open"|"half_open", "stall_count", "trips",
    "last_stall_at", "opened_at", "next_attempt_at", "half_open_at"}`` (UTC datetimes or
    ``None``; ``next_attempt_at`` only while open).
    """
    return {
        "kind": b.kind, "operation_id": b.operation_id, "state": b.state, "stall_count": b.stall_count,
        "trips": b.trips, "last_stall_at": b.last_stall_at, "opened_at": b.opened_at,
        "next_attempt_at": b.next_attempt_at if b.state == _OPEN else None,
        "half_open_at": b.half_open_at if b.state == _HALF_OPEN else None,
    }


def jsonable(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with datetimes as ISO 8601 strings (for notification contexts and ``--json``)."""
    return {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in row.items()}


def get_breaker(session: Session, kind: OperationKind | str, operation_id: int) -> CircuitBreaker | None:
    """The breaker row of (``kind``, ``operation_id``), or ``None`` (never stalled: closed)."""
    k = kind.value if isinstance(kind, OperationKind) else kind
    return session.scalars(select(CircuitBreaker).where(CircuitBreaker.kind == k,
                                                         CircuitBreaker.operation_id == operation_id)).first()


def _trip(b: CircuitBreaker, rec: RecoveryConfig, now: dt.datetime) -> None:
    """Open ``b`` (again): hold its operation for the cool-down of this trip."""
    b.trips = (b.trips or 0) + 1
    b.state = _OPEN
    b.opened_at = now
    b.half_open_at = None
    b.next_attempt_at = now + dt.timedelta(seconds=rec.breaker_cooldown_seconds(b.trips))
    log.error("circuit_breaker_opened", operation_kind=b.kind, operation_id=b.operation_id,
              stall_count=b.stall_count, trips=b.trips, next_attempt_at=b.next_attempt_at.isoformat())


def let_trials_through(session: Session, rec: RecoveryConfig, now: dt.datetime | None = None) -> list[int]:
    """Move every open breaker whose cool-down passed to half-open and let one attempt of its
    operation through: a stalled operation (left ``IN_PROGRESS`` by the breaker) is reset to
    ``PENDING`` (fenced on its attempt), a held ``PENDING`` one made due now. An INFO
    notification per breaker. A breaker whose operation finished meanwhile is closed.

    Locked (``FOR UPDATE SKIP LOCKED``): two monitors let one attempt through, not two.

    Returns:
        the operation ids let through.
    """
    now = now or utcnow()
    through: list[int] = []
    due = select(CircuitBreaker).where(CircuitBreaker.state == _OPEN, CircuitBreaker.next_attempt_at <= now)
    for b in session.scalars(due.with_for_update(skip_locked=True)):
        op = session.get(Operation, b.operation_id)
        if op is None or op.status not in _ACTIVE:
            _close(session, b, reason=f"the operation is {op.status if op else 'gone'}", actor="monitor", now=now)
            continue
        if op.status == Status.IN_PROGRESS.value and (op.lease_expires_at is None or op.lease_expires_at < now):
            session.execute(update(Operation).where(fenced(op.id, op.attempt)).values(
                status=Status.PENDING.value, lease_owner=None, lease_expires_at=None, not_before=None, updated_at=now))
        elif op.status == Status.PENDING.value:
            session.execute(update(Operation).where(fenced(op.id, op.attempt, Status.PENDING)).values(
                not_before=None, updated_at=now))
        b.state = _HALF_OPEN
        b.half_open_at = now
        log.warning("circuit_breaker_half_open", operation_kind=b.kind, operation_id=b.operation_id,
                    trips=b.trips)
        enqueue(session, level=NotificationLevel.INFO, event="breaker_half_open",
                subject=BREAKER_HALF_OPEN_SUBJECT.format(kind=b.kind, id=b.operation_id),
                body=(f"Operation: {b.kind} {b.operation_id}\nStall count: {b.stall_count}\n"
                      f"Cool-down {b.trips} ended (UTC): {now.isoformat()}\n"
                      "One attempt is let through now. If it succeeds the breaker closes; if it fails or "
                      "stalls the breaker opens again for another cool-down."),
                context=jsonable(breaker_row(b)), operation_kind=b.kind, operation_id=b.operation_id,
                cooldown_seconds=rec.notification_cooldown_seconds, now=now)
        through.append(b.operation_id)
    session.flush()
    return through


def _close(session: Session, b: CircuitBreaker, *, reason: str, actor: str, now: dt.datetime) -> None:
    was = b.state
    previous = b.stall_count
    b.stall_count = 0
    b.state = _CLOSED
    b.trips = 0
    b.opened_at = None
    b.next_attempt_at = None
    b.half_open_at = None
    log.info("circuit_breaker_closed", operation_kind=b.kind, operation_id=b.operation_id,
             previous_stall_count=previous, previous_state=was, reason=reason, actor=actor)
    if was != _CLOSED or actor != "monitor":
        enqueue(session, level=NotificationLevel.INFO, event="breaker_closed",
                subject=BREAKER_CLOSED_SUBJECT.format(kind=b.kind, id=b.operation_id),
                body=(f"Operation: {b.kind} {b.operation_id}\nPrevious state: {was}\n"
                      f"Previous stall count: {previous}\nClosed by: {actor}\nReason: {reason}\n"
                      f"Time (UTC): {now.isoformat()}\nA new stall counts towards a new breaker cycle."),
                context={"operation_kind": b.kind, "operation_id": b.operation_id, "previous_state": was,
                         "previous_stall_count": previous, "reason": reason, "actor": actor},
                operation_kind=b.kind, operation_id=b.operation_id, cooldown_seconds=0, now=now)


def count_stall(session: Session, op: Operation, rec: RecoveryConfig, now: dt.datetime | None = None) -> CircuitBreaker:
    """Count the stall of ``op``'s current attempt on its breaker (once per attempt).

    A closed breaker opens when ``stall_count`` reaches ``rec.max_stall_count``; a half-open
    one (its one attempt stalled) — or an open one whose operation was claimed anyway — opens
    again for the next cool-down. Returns the breaker.
    """
    now = now or utcnow()
    b = get_breaker(session, op.kind, op.id)
    if b is None:
        b = CircuitBreaker(kind=op.kind, operation_id=op.id, stall_count=0, last_stall_attempt=0,
                           state=_CLOSED, trips=0)
        session.add(b)
    if b.last_stall_attempt != op.attempt:
        op.stall_count = (op.stall_count or 0) + 1  # every stall of the operation, ever
        b.stall_count += 1
        b.last_stall_attempt = op.attempt
        b.last_stall_at = now
        if b.state in (_OPEN, _HALF_OPEN) or b.stall_count >= rec.max_stall_count:
            _trip(b, rec, now)
    session.flush()
    return b


def notify_open(session: Session, b: CircuitBreaker, op: Operation, rec: RecoveryConfig,
                now: dt.datetime | None = None) -> None:
    """Queue the ERROR notification of an open breaker (one per cooldown window)."""
    now = now or utcnow()
    nxt = b.next_attempt_at
    subject = (BREAKER_OPEN_SUBJECT.format(kind=b.kind, id=b.operation_id, n=b.stall_count) if b.trips <= 1
               else BREAKER_REOPENED_SUBJECT.format(kind=b.kind, id=b.operation_id, how="stalled"))
    enqueue(session, level=NotificationLevel.ERROR, event="breaker_open", subject=subject,
            body=(f"Operation: {b.kind} {b.operation_id}\nStall count: {b.stall_count}\n"
                  f"Times opened: {b.trips}\nLast claim: {op.attempt} ({op.retry_count} retries counted; a claim "
                  "that waited or stalled is no failure)\n"
                  f"Last lease owner: {op.lease_owner or '-'}\n"
                  f"Last stall (UTC): {b.last_stall_at.isoformat() if b.last_stall_at else '-'}\n"
                  f"Next automatic attempt (UTC): {nxt.isoformat() if nxt else '-'}\n\n"
                  "The operation is held and shown as blocked by `packhorse status`. After the cool-down one "
                  "attempt is let through by itself; to try now, once you know why its workers die or hang: "
                  f"packhorse retry {b.kind} {b.operation_id} --reason '...'"),
            context=jsonable(breaker_row(b)), operation_kind=b.kind, operation_id=b.operation_id,
            cooldown_seconds=rec.notification_cooldown_seconds, now=now)


def after_success(session: Session, kind: str, operation_id: int, now: dt.datetime | None = None) -> bool:
    """In the transaction that completed ``operation_id``: close its breaker if it was open or
    half-open (the attempt let through succeeded; INFO notification). Returns whether it did.
    Called only for operations that ever stalled (:func:`packhorse.engine.outcome.complete_in`)."""
    now = now or utcnow()
    b = session.scalars(select(CircuitBreaker).where(CircuitBreaker.kind == kind,
                                                      CircuitBreaker.operation_id == operation_id,
                                                      CircuitBreaker.state != _CLOSED)).first()
    if b is None:
        return False
    _close(session, b, reason="the attempt after the cool-down succeeded", actor="worker", now=now)
    return True


def after_failure(session: Session, kind: str, operation_id: int, *, will_retry: bool, rec: RecoveryConfig,
                  now: dt.datetime | None = None) -> dt.datetime | None:
    """In the transaction that recorded a failure of ``operation_id``: a half-open breaker (the
    attempt let through failed) opens again for the next cool-down when the operation will
    retry (ERROR notification) and the time of the next automatic attempt is returned — the
    caller makes the operation not due before it. An open breaker is not the attempt let
    through failing but the stalled one reporting late (its holder was cut off): it stays open
    until its cool-down ends, as it was (that time is returned; no notification). A permanent
    failure closes the breaker (the ``FAILED`` operation waits for ``packhorse reset``) and
    ``None`` is returned.
    Called only for operations that ever stalled (:func:`packhorse.engine.outcome.record_failure`)."""
    now = now or utcnow()
    b = session.scalars(select(CircuitBreaker).where(CircuitBreaker.kind == kind,
                                                      CircuitBreaker.operation_id == operation_id,
                                                      CircuitBreaker.state != _CLOSED)).first()
    if b is None:
        return None
    if not will_retry:
        _close(session, b, reason="the attempt after the cool-down failed permanently: the operation is FAILED",
               actor="worker", now=now)
        return None
    if b.state == _OPEN:
        # not the attempt let through: the one that stalled (its holder was cut off, not dead)
        # reporting its failure late. The cool-down runs on as it was; no second page.
        return b.next_attempt_at
    _trip(b, rec, now)
    nxt = b.next_attempt_at
    enqueue(session, level=NotificationLevel.ERROR, event="breaker_open",
            subject=BREAKER_REOPENED_SUBJECT.format(kind=b.kind, id=b.operation_id, how="failed"),
            body=(f"Operation: {b.kind} {b.operation_id}\nTimes opened: {b.trips}\n"
                  f"Next automatic attempt (UTC): {nxt.isoformat() if nxt else '-'}\n\n"
                  "The attempt let through after the cool-down failed; the operation is held until the next "
                  f"one. To try now: packhorse retry {b.kind} {b.operation_id} --reason '...'"),
            context=jsonable(breaker_row(b)), operation_kind=b.kind, operation_id=b.operation_id,
            cooldown_seconds=rec.notification_cooldown_seconds, now=now)
    return nxt


def is_open(session: Session, kind: OperationKind | str, operation_id: int) -> bool:
    """True if the breaker of (``kind``, ``operation_id``) is open (holding its operation)."""
    b = get_breaker(session, kind, operation_id)
    return b is not None and b.state == _OPEN


def open_breaker_count(session: Session) -> int:
    """How many breakers are open or half-open whose operation is still active."""
    return len(session.scalars(
        select(CircuitBreaker.id).join(Operation, Operation.id == CircuitBreaker.operation_id)
        .where(CircuitBreaker.state.in_([_OPEN, _HALF_OPEN]), Operation.status.in_(_ACTIVE))
    ).all())


def list_breakers(session: Session) -> list[dict[str, Any]]:
    """Every breaker that counted a stall or is not closed: open ones first, then half-open.

    Returns:
        dicts as :func:`breaker_row`.
    """
    rank = {_OPEN: 0, _HALF_OPEN: 1, _CLOSED: 2}
    rows = session.scalars(select(CircuitBreaker).where((CircuitBreaker.stall_count > 0)
                                                        | (CircuitBreaker.state != _CLOSED))
                           .order_by(CircuitBreaker.id)).all()
    return [breaker_row(b) for b in sorted(rows, key=lambda b: rank.get(b.state, 3))]


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
        get_operation(s, kind, operation_id)
        b = get_breaker(s, kind, operation_id)
        if b is None:
            b = CircuitBreaker(kind=kind.value, operation_id=operation_id, stall_count=0, last_stall_attempt=0,
                               state=_CLOSED, trips=0)
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
    The reconciler's count of lost dispatches starts over and a give-up of it is released
    (``dispatch_lost``, :func:`packhorse.recovery.reconciler.window_step`).

    A ``COMPLETED`` operation is refused (nothing to retry). A ``FAILED`` one gets
    ``retry_count + 1``, its cached error context cleared; the failure history stays.

    Returns:
        ``{"kind", "operation_id", "previous_status", "status": "PENDING", "breaker": {...}}``.

    Raises:
        UnknownOperationError: no operation ``operation_id`` of ``kind``.
        ResetRefusedError: the operation is ``COMPLETED``, or it changed (claimed, finished)
            between reading it and resetting it: the reset is a compare-and-set on
            :func:`~packhorse.operations.lifecycle.fenced` with the status and attempt read.
    """
    def tx(s: Session) -> dict[str, Any]:
        op = get_operation(s, kind, operation_id)
        if op.status == Status.COMPLETED.value:
            raise ResetRefusedError(f"{kind.value} {operation_id} is COMPLETED; nothing to retry")
        previous = op.status
        b = get_breaker(s, kind, operation_id)
        if b is not None:
            _close(s, b, reason=reason, actor=actor, now=utcnow())
        now = utcnow()
        # the reconciler's window starts over too: a human looked (a give-up is released here)
        values: dict[str, Any] = dict(status=Status.PENDING.value, not_before=None, lease_owner=None,
                                      lease_expires_at=None, finished_at=None, updated_at=now,
                                      reconcile_count=0, reconcile_window_at=None, reconcile_given_up_at=None)
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
