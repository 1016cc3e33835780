"""Run one operation: claim → stage → verify → fenced completion (DESIGN.md "Architecture").

:func:`execute_operation` is the one entry point every executor calls (local thread pool,
Celery task, ``packhorse run-operation``). It never raises for an operation failure: the
failure goes through the single failure path (:func:`~packhorse.operations.record_failure`).
"""

from __future__ import annotations

import enum

import structlog
from sqlalchemy.orm import Session

from .db.models import FailureEvent, Operation, utcnow
from .errors import LeaseLostError, OperationDeferred, TransientDatabaseError
from .lease import LeaseKeeper
from .operations import Claim, build_error_context, claim, complete_in, defer, record_failure
from .stages import STAGES
from .stages.base import StageContext, Work

log = structlog.get_logger(__name__)


class Outcome(str, enum.Enum):
    """What :func:`execute_operation` did."""

    SKIPPED = "skipped"      # not runnable: done, running under another lease, or not yet due
    COMPLETED = "completed"
    RETRY = "retry"          # failed, reset to PENDING for a retry after backoff
    FAILED = "failed"        # failed permanently
    STALE = "stale"          # this attempt lost its lease; nothing it did was recorded
    DEFERRED = "deferred"    # waits (a cold-storage restore): PENDING again until not_before


def _record_stale(ctx: StageContext, c: Claim, exc: BaseException) -> None:
    ctx_dict = build_error_context(exc, kind=c.kind, operation_id=c.operation_id, task_id=f"{c.owner}#{c.attempt}",
                                   retry_count=0, will_retry=False)

    def tx(s: Session) -> None:
        s.add(FailureEvent(operation_id=c.operation_id, kind=c.kind.value, attempt=c.attempt, retry_count=0,
                           error_type=type(exc).__name__, message=str(exc)[:4000], will_retry=False,
                           error_context=ctx_dict, created_at=utcnow()))

    ctx.db.transact(tx)


def execute_operation(ctx: StageContext, operation_id: int, owner: str, *, min_attempt: int | None = None) -> Outcome:
    """Claim and run operation ``operation_id`` as ``owner`` (``host:pid:thread``).

    Args:
        min_attempt: run only as attempt ``min_attempt`` or later (a broker message's "at
            attempt ≥ A"; see :func:`~packhorse.operations.claim`). ``None``: any attempt.

    Returns:
        the :class:`Outcome`. A duplicate delivery (already done, leased by a live worker, at
        a newer attempt, or not yet due) returns ``SKIPPED`` without doing anything (I3).

    Raises:
        TransientDatabaseError: the database was unreachable while claiming (nothing was
            claimed; the caller may try again later).
    """
    c = claim(ctx.db, operation_id, owner, ctx.settings.recovery.lease_timeout_seconds, min_attempt=min_attempt)
    if c is None:
        return Outcome.SKIPPED
    # every log line of the task carries these (structlog contextvars; issue #3 "Structured logs")
    with structlog.contextvars.bound_contextvars(operation_kind=c.kind.value, operation_id=operation_id,
                                                 attempt=c.attempt, task_id=task_id(c)):
        return _run_claimed(ctx, c)


def task_id(c: Claim) -> str:
    """The task id of a claimed attempt, ``owner#attempt`` (logs, error context)."""
    return f"{c.owner}#{c.attempt}"


def _run_claimed(ctx: StageContext, c: Claim) -> Outcome:
    rec = ctx.settings.recovery
    operation_id = c.operation_id
    op = c.operation if c.operation is not None else ctx.db.read(lambda s: s.get(Operation, operation_id))
    assert op is not None
    bound = log
    bound.debug("operation_claimed")
    keeper = LeaseKeeper(ctx.db, c, lease_seconds=rec.lease_timeout_seconds,
                         interval_seconds=rec.heartbeat_interval_seconds,
                         deadline_seconds=rec.renewal_deadline_seconds)
    work = Work(ctx, c, op, keeper)
    with keeper:
        try:
            recorder = STAGES[c.kind](work)
            work.check()

            def finish(s: Session) -> None:
                if not complete_in(s, c, keeper.bytes_done):
                    raise LeaseLostError(f"operation {operation_id}: attempt {c.attempt} is stale; completion rejected")
                recorder(s)

            ctx.db.transact(finish)
        except LeaseLostError as exc:
            bound.warning("operation_attempt_stale", error=str(exc))
            _record_stale(ctx, c, exc)
            return Outcome.STALE
        except OperationDeferred as exc:
            if not defer(ctx.db, c, exc.seconds):
                return Outcome.STALE
            bound.info("operation_deferred", reason=str(exc), seconds=exc.seconds)
            return Outcome.DEFERRED
        except TransientDatabaseError as exc:
            # not the operation's failure (DESIGN.md "Architecture"): leave it IN_PROGRESS; its
            # lease expires and lease recovery hands it out again once the database is back
            bound.error("operation_abandoned_database_unavailable", error=str(exc))
            return Outcome.STALE
        except Exception as exc:  # the single failure path
            result = record_failure(ctx.db, c, exc, backoff_base=rec.retry_backoff_base_seconds,
                                    backoff_max=rec.retry_backoff_max_seconds, operation_info=work.info,
                                    notification_cooldown_seconds=rec.notification_cooldown_seconds,
                                    notify_retries=ctx.settings.notifications.development_mode)
            if result.status is None:
                bound.warning("operation_attempt_stale", error=str(exc))
                return Outcome.STALE
            level = bound.warning if result.will_retry else bound.error
            level("operation_failed", error_type=type(exc).__name__, error=str(exc), will_retry=result.will_retry)
            return Outcome.RETRY if result.will_retry else Outcome.FAILED
    bound.info("operation_completed", **{k: v for k, v in work.info.items() if isinstance(v, (str, int))})
    return Outcome.COMPLETED
