"""The outcome of an attempt, decided by the engine: completion and the single failure path.

A stage only does the work; the worker (:mod:`packhorse.engine.worker`) turns what it did into
the operation's next state here, with everything that outcome implies written in the same
transaction:

* :func:`complete_in` / :func:`complete_many`: the fenced completion
  (:func:`packhorse.operations.lifecycle.mark_completed_in`), and the circuit breaker of an
  operation that stalled before closed (:func:`packhorse.recovery.breakers.after_success`);
* :func:`record_failure`: classify, diagnose (:mod:`packhorse.recovery.diagnosis`), build the
  one error context, append a failure event, reset for retry or mark ``FAILED`` (fenced), reopen
  or close the breaker, and queue the notification (:mod:`packhorse.notify.messages`).

Rules: DESIGN.md I1 (every FAILED operation has an error context, a failure event and a
notification), I3 (every status write is a compare-and-set on the fencing token).
"""

from __future__ import annotations

import datetime as dt
import socket
import traceback as tb
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from packhorse.db.models import CircuitBreaker, FailureEvent, Notification, NotificationDelivery, Operation, utcnow
from packhorse.db.session import Database
from packhorse.domain import BreakerState, OperationKind, Status
from packhorse.notify import messages
from packhorse.notify.outbox import FOLLOW_UP_OF, WITHDRAWN
from packhorse.operations.lifecycle import (
    Claim,
    backoff_seconds,
    fenced,
    mark_completed_in,
    mark_completed_many,
    record_salvage,
)
from packhorse.recovery import breakers, diagnosis
from packhorse.rules.convergence import superseded_failures
from packhorse.rules.space import waiting_for_space

if TYPE_CHECKING:
    from packhorse.config import RecoveryConfig

log = structlog.get_logger(__name__)


#: Exceptions that no retry can fix (layer 1).
PERMANENT_BUILTINS: tuple[type[BaseException], ...] = (
    FileNotFoundError,
    PermissionError,
    NotADirectoryError,
    IsADirectoryError,
)


TRACEBACK_MAX_CHARS = 8000


#: The notification that hands an operation to a human, per status: (event, subject template).
#: Read by :func:`record_failure` and by the I5 owner map (:mod:`packhorse.engine.owners`).
HUMAN_NOTIFICATIONS: dict[Status, tuple[str, str]] = {
    Status.FAILED: ("permanent_failure", "Permanent failure: {kind} {id}"),
}


def is_retryable(exc: BaseException, retry_count: int, max_retries: int) -> bool:
    """Classify a failure: permanent builtins and ``is_retryable = False``
    errors never retry; errors with ``retry_without_limit`` (a cut link between sites:
    :class:`~packhorse.errors.SshConnectionError`) always do; otherwise retry while
    ``retry_count`` is below the cap (the exception's own ``max_retries`` if it carries one, else
    the operation's)."""
    if isinstance(exc, PERMANENT_BUILTINS):
        return False
    if getattr(exc, "is_retryable", True) is False:
        return False
    if getattr(exc, "retry_without_limit", False) is True:
        return True
    cap = getattr(exc, "max_retries", None)
    return retry_count < (cap if isinstance(cap, int) else max_retries)


def build_error_context(
    exc: BaseException,
    *,
    kind: OperationKind,
    operation_id: int,
    task_id: str,
    retry_count: int,
    will_retry: bool,
    operation_info: dict[str, Any] | None = None,
    auto_diagnosis: str | None = None,
) -> dict[str, Any]:
    """The one error-context dict of a failure (DESIGN.md "Error context"); built once.

    ``host`` is where the failure happened as the error names it (a data location, or a
    remote endpoint); ``worker_host`` is the machine the attempt ran on (the host of
    ``task_id``'s lease owner, ``<host>:<pid>…#<attempt>``, else this machine's hostname).

    The traceback is always kept, capped at :data:`TRACEBACK_MAX_CHARS` with its tail. A
    diagnosis carried by the exception (set where it was raised) wins, with
    ``diagnosis_source = "boundary"``; otherwise ``auto_diagnosis`` (made from the database by
    :mod:`packhorse.recovery.diagnosis`) is used with ``diagnosis_source = "auto-db"``.
    """
    text = "".join(tb.format_exception(type(exc), exc, exc.__traceback__))
    if len(text) > TRACEBACK_MAX_CHARS:
        text = "[... traceback cut ...]\n" + text[-TRACEBACK_MAX_CHARS:]
    ctx: dict[str, Any] = {
        "error_type": type(exc).__name__,
        "message": str(exc),
        "operation_kind": kind.value,
        "operation_id": operation_id,
        "task_id": task_id,
        "task_name": f"packhorse.{kind.value}",
        "retry_count": retry_count,
        "will_retry": will_retry,
        "timestamp": utcnow().isoformat(),
        "operation_info": operation_info or {},
        "traceback": text,
    }
    for key in ("step", "side", "path", "host", "diagnosis"):
        value = getattr(exc, key, None)
        if value is not None:
            ctx[key] = value
    # the machine the attempt ran on (the error's ``host`` is where it happened: a data location)
    ctx["worker_host"] = task_id.split(":", 1)[0] if ":" in task_id else socket.gethostname()
    if ctx.get("diagnosis"):
        ctx["diagnosis_source"] = "boundary"
    elif auto_diagnosis:
        ctx["diagnosis"] = auto_diagnosis
        ctx["diagnosis_source"] = "auto-db"
    return ctx


def append_failure_event(db: Database, claim: Claim, retry_count: int, ctx: dict[str, Any]) -> None:
    """Append a failure event in its own transaction (survives the operation's rollback)."""

    def tx(s: Session) -> None:
        s.add(FailureEvent(
            operation_id=claim.operation_id, kind=claim.kind.value, attempt=claim.attempt,
            retry_count=retry_count, error_type=ctx["error_type"], message=ctx["message"][:4000],
            will_retry=bool(ctx["will_retry"]), error_context=ctx, created_at=utcnow(),
        ))

    db.transact(tx)


@dataclass(frozen=True)
class FailureOutcome:
    """What :func:`record_failure` did: ``status`` written (or ``None`` if the attempt was
    stale), whether it will retry, and the error context."""

    status: Status | None
    will_retry: bool
    error_context: dict[str, Any]


def record_failure(
    db: Database,
    claim: Claim,
    exc: BaseException,
    *,
    backoff_base: float,
    backoff_max: float,
    operation_info: dict[str, Any] | None = None,
    notification_cooldown_seconds: float = 3600.0,
    notification_gather_seconds: float = 0.0,
    notify_retries: bool = False,
    salvage: Callable[[Session], None] | None = None,
    recovery: RecoveryConfig | None = None,
) -> FailureOutcome:
    """The single failure path of every kind: classify, diagnose a permanent failure that has no
    diagnosis from the database (``diagnosis_source = "auto-db"``), build the error context
    once, append a failure event, then (fenced) reset for retry or mark ``FAILED``.

    A retry sets ``PENDING``, ``retry_count + 1``, clears the cached error context and sets
    ``not_before`` to now + jittered exponential backoff. ``FAILED`` keeps the error context
    and queues an ERROR notification ("Permanent failure: <kind> <id>") in the same
    transaction (I1: every FAILED operation has an error context, a failure event and a
    notification); failures of one root cause within ``notification_cooldown_seconds`` share
    one message, which waits ``notification_gather_seconds`` for them
    (:func:`packhorse.notify.messages.operation_failed`). With ``notify_retries`` (``[notifications] development_mode``) a retry
    queues a DEBUG "Retry: <kind> <id>" notification too. ``salvage`` (the attempt's
    :attr:`~packhorse.stages.base.Work.salvage`) runs in the same transaction, only when the
    fenced status write succeeded. ``recovery`` (the ``[recovery]`` settings): a failure of an
    operation that stalled before may be the attempt a half-open circuit breaker let through:
    a retry then opens the breaker again and the operation is not due before its next
    cool-down ends; a permanent failure closes it
    (:func:`packhorse.recovery.breakers.after_failure`, same transaction).
    """
    op = db.read(lambda s: s.get(Operation, claim.operation_id))
    assert op is not None
    stale = op.attempt != claim.attempt or op.status != Status.IN_PROGRESS.value
    will_retry = not stale and is_retryable(exc, op.retry_count, op.max_retries)
    auto = None
    if not will_retry and not getattr(exc, "diagnosis", None):
        auto = diagnosis.safe_diagnose(db, claim.operation_id, exc)  # never raises: a failing diagnoser blocks nothing
    ctx = build_error_context(exc, kind=claim.kind, operation_id=claim.operation_id, task_id=
                              f"{claim.owner}#{claim.attempt}", retry_count=op.retry_count,
                              will_retry=will_retry, operation_info=operation_info, auto_diagnosis=auto)
    append_failure_event(db, claim, op.retry_count, ctx)

    def tx(s: Session) -> Status | None:
        now = utcnow()
        where = (fenced(claim.operation_id, claim.attempt),)
        if will_retry:
            values: dict[str, Any] = dict(
                status=Status.PENDING.value, retry_count=Operation.retry_count + 1, error_context=None,
                not_before=now + dt.timedelta(seconds=backoff_seconds(op.retry_count, backoff_base, backoff_max)),
                lease_owner=None, lease_expires_at=None, updated_at=now,
            )
            new = Status.PENDING
        else:
            values = dict(status=Status.FAILED.value, error_context=ctx, finished_at=now, updated_at=now,
                          lease_owner=None, lease_expires_at=None)
            new = Status.FAILED
        res = s.execute(update(Operation).where(*where).values(**values))
        if res.rowcount != 1:
            return None
        if recovery is not None and op.stall_count:
            held_until = breakers.after_failure(s, claim.kind.value, claim.operation_id, will_retry=new is Status.PENDING,
                                       rec=recovery, now=now)
            if held_until is not None:  # one attempt per cool-down: not due before the next one
                s.execute(update(Operation).where(fenced(claim.operation_id, claim.attempt, Status.PENDING))
                          .values(not_before=held_until))
        record_salvage(s, salvage, claim.operation_id)
        if new is Status.FAILED:
            messages.operation_failed(s, ctx, cooldown_seconds=notification_cooldown_seconds,
                             gather_seconds=notification_gather_seconds)
        elif notify_retries:
            messages.operation_retry(s, ctx, cooldown_seconds=notification_cooldown_seconds)
        return new

    return FailureOutcome(db.transact(tx), will_retry, ctx)


def complete_in(session: Session, claim: Claim, bytes_done: int | None = None) -> bool:
    """Mark the claimed attempt ``COMPLETED`` inside the caller's transaction (fenced, I3):
    :func:`packhorse.operations.lifecycle.mark_completed_in`.

    Returns ``False`` if the attempt is stale; the caller must then roll back whatever else it
    wrote in the transaction (raise :class:`~packhorse.errors.LeaseLostError`). The completion
    of an operation that stalled before closes its open or half-open circuit breaker in the
    same transaction (:func:`packhorse.recovery.breakers.after_success`).
    """
    now = utcnow()
    if not mark_completed_in(session, claim, bytes_done):
        return False
    if claim.operation is None or claim.operation.stall_count:
        # it stalled before: this may be the attempt a half-open circuit breaker let through,
        # whose success closes the breaker (an operation that never stalled has none to close)
        breakers.after_success(session, claim.kind.value, claim.operation_id, now)
    return True


def complete_many(session: Session, claims: Iterable[Claim],
                  bytes_done: Mapping[int, int | None] | None = None) -> set[int]:
    """:func:`complete_in` for several claimed attempts in one statement (per
    :data:`~packhorse.operations.lifecycle.BATCH_ROWS`), inside the caller's transaction:
    :func:`packhorse.operations.lifecycle.mark_completed_many`, each row a compare-and-set on
    its own claim's fencing token (I3).

    Returns:
        the ids of the operations completed; a stale attempt is left out, and the caller must
        then roll back (or not write) whatever else it meant for it. An operation that stalled
        before has its circuit breaker closed in the same transaction, as :func:`complete_in` does.
    """
    todo = list(claims)
    now = utcnow()
    completed = mark_completed_many(session, todo, bytes_done)
    for c in sorted(todo, key=lambda c: c.operation_id):
        if c.operation_id in completed and (c.operation is None or c.operation.stall_count):
            breakers.after_success(session, c.kind.value, c.operation_id, now)
    return completed


#: The events :func:`review_notification` re-decides at send time.
REVIEWED_EVENTS = ("permanent_failure", "failure_repaired")

#: Events about a standing condition: a follow-up of one ("Repeated: …", the repeats counted
#: during the cooldown) is withdrawn at send time once the condition has ended
#: (:func:`condition_stands`; :data:`packhorse.notify.outbox.WITHDRAWN`).
STANDING_CONDITIONS = ("location_full", "breaker_open")


def condition_stands(session: Session, row: Notification) -> bool:
    """Whether the standing condition outbox ``row`` is about still holds now: for
    ``location_full``, an operation still waits for space at the data location of its context
    (:func:`packhorse.rules.space.waiting_for_space`); for ``breaker_open``, the circuit
    breaker of its operation is not closed. Any other event (or a row naming no location or
    operation) counts as standing."""
    ctx = row.context or {}
    if row.event == "location_full" and ctx.get("location"):
        return session.scalar(select(Operation.id).where(
            waiting_for_space(in_backoff=False),
            Operation.error_context["location"].as_string() == str(ctx["location"])).limit(1)) is not None
    if row.event == "breaker_open" and row.operation_kind and row.operation_id is not None:
        return session.scalar(select(CircuitBreaker.id).where(
            CircuitBreaker.kind == row.operation_kind, CircuitBreaker.operation_id == row.operation_id,
            CircuitBreaker.state != BreakerState.CLOSED.value)) is not None
    return True


def _withdraw_ended_follow_up(session: Session, row: Notification) -> bool:
    """Delete ``row`` unsent when it is a follow-up ("Repeated: …") of a standing condition
    that has ended meanwhile (its end was told already, or needs no message: a location full
    has none); never once any channel got it. Returns whether it was deleted."""
    if row.event not in STANDING_CONDITIONS or not (row.context or {}).get(FOLLOW_UP_OF):
        return False
    if condition_stands(session, row):
        return False
    if session.scalar(select(NotificationDelivery.id).where(NotificationDelivery.notification_id == row.id)
                      .limit(1)) is not None:
        return False
    log.info("follow_up_withdrawn", notification_id=row.id, notification_event=row.event, subject=row.subject,
             follow_up_of=(row.context or {}).get(FOLLOW_UP_OF))
    session.delete(row)
    session.flush()
    return True


def review_notification(session: Session, row: Notification) -> str | None:
    """The notifier's review of outbox ``row`` just before it is sent (the gather window is
    over): a permanent-failure digest pages (ERROR) only for what still needs a human, and a
    follow-up of a standing condition (a data location full, a circuit breaker open) that has
    ended meanwhile is not sent at all (:data:`~packhorse.notify.outbox.WITHDRAWN`: the row is
    deleted).

    A listed operation no longer needs one when the convergence made its work by other means
    meanwhile (:func:`packhorse.rules.convergence.superseded_failures`: a later operation of the
    same kind, artifact and destination COMPLETED, or its package archived — e.g. a transfer
    that met its bundle deleted, then the rebuilt bundle shipped), or when it is no longer
    ``FAILED`` (reset and moving again). The decision is made here, at send time, never guessed
    at failure time: a failure is ERROR unless its repair is already a fact in the database.
    The row is rewritten in ``session`` (:func:`packhorse.notify.messages.review_failures`);
    other events are left alone.

    Returns:
        ``"unchanged"``, ``"partly_repaired"``, ``"repaired"``,
        :data:`~packhorse.notify.outbox.WITHDRAWN`, or ``None``
        for an event that is not reviewed.
    """
    if _withdraw_ended_follow_up(session, row):
        return WITHDRAWN
    if row.event not in REVIEWED_EVENTS:
        return None
    ctx = row.context or {}
    ids = sorted({int(i["operation_id"]) for i in [*ctx.get(messages.REPAIRED, []), *ctx.get("failures", [])]})
    if not ids:
        return None
    ops = session.execute(select(Operation.id, Operation.kind, Operation.status, Operation.raw_data_package_id,
                                 Operation.data_transfer_package_id, Operation.destination_location_id)
                          .where(Operation.id.in_(ids))).all()
    failed = [o for o in ops if o.status == Status.FAILED.value]
    superseded = superseded_failures(session, failed)
    still = {(o.kind, o.id) for o in failed if o.id not in superseded}
    how = {(o.kind, o.id): "repaired by a later operation of the same work (or its package is archived)"
           for o in failed if o.id in superseded}
    how.update({(o.kind, o.id): f"{o.status} (moving again)" for o in ops if o.status != Status.FAILED.value})
    decided = messages.review_failures(row, still, how)
    if decided != "unchanged":
        log.info("failure_notification_reviewed", notification_id=row.id, decided=decided,
                 still_failed=len(still), repaired=len(ids) - len(still))
    return decided
