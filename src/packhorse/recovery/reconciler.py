"""The reconciler: the backstop for work that no lease covers (seed 000).

It re-dispatches

* ``SCHEDULED`` operations whose dispatch was lost — never claimed, scheduled longer ago than
  the *floor* (``Settings.reconcile_floor_seconds``: 0 embedded; at least the broker's
  ``visibility_timeout_seconds`` with Celery, so it never races the broker's own redelivery);
* ``IN_PROGRESS`` operations that no lease covers (no ``lease_expires_at``: a worker that died
  between the status write and its lease, or a row edited by hand). Expired leases are the
  stalled-task monitor's, not the reconciler's.

Each reset sets ``PENDING`` (dispatchable now), increments ``reconcile_count`` and logs a
WARNING. ``retry_count`` is never touched: a lost dispatch does not consume the operation's
retries — only attempts that ran do. After ``reconcile_max_resets`` resets of the same
operation it is left as it is and an ERROR notification is queued (once per cooldown), in the
same transaction.

:data:`RECONCILED_STATUSES` is the live registration the owners test (I5) reads.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection

import structlog
from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from ..config import Settings
from ..db.models import Operation, utcnow
from ..db.session import Database, bound_idle_in_transaction
from ..domain import NotificationLevel, Status
from ..notify.outbox import enqueue
from ..operations import fenced

log = structlog.get_logger(__name__)

#: The statuses the reconciler looks at (read by the owners test).
RECONCILED_STATUSES = (Status.SCHEDULED, Status.IN_PROGRESS)


def _orphans(floor: float, now: dt.datetime):  # type: ignore[no-untyped-def]
    older = now - dt.timedelta(seconds=floor)
    scheduled_since = Operation.scheduled_at.is_(None) | (Operation.scheduled_at <= older)
    return or_(
        and_(Operation.status == Status.SCHEDULED.value, scheduled_since, Operation.updated_at <= older),
        and_(Operation.status == Status.IN_PROGRESS.value, Operation.lease_expires_at.is_(None),
             Operation.updated_at <= older),
    )


def reconcile(db: Database, settings: Settings, *, exclude: Collection[int] = ()) -> list[int]:
    """Re-dispatch lost work (see the module docstring).

    Args:
        db: the ops database.
        settings: floor (``Settings.reconcile_floor_seconds``), cap
            (``recovery.reconcile_max_resets``) and notification cooldown.
        exclude: operation ids this process knows are queued in it right now (the local
            runner's in-flight set): not lost.

    Returns:
        the ids reset to ``PENDING`` (re-dispatched), in id order.
    """
    rec = settings.recovery
    floor = settings.reconcile_floor_seconds
    now = utcnow()
    found = db.read(lambda s: [(r.id, r.status, r.attempt) for r in s.execute(
        select(Operation.id, Operation.status, Operation.attempt).where(_orphans(floor, now)).order_by(Operation.id))])
    done: list[int] = []
    for op_id, status, attempt in found:
        if op_id in exclude:
            continue

        def tx(s: Session, op_id: int = op_id, status: str = status, attempt: int = attempt) -> tuple[str, int] | None:
            bound_idle_in_transaction(s, rec.lease_timeout_seconds)
            t = utcnow()
            op = s.scalars(select(Operation).where(Operation.id == op_id, Operation.status == status,
                                                   Operation.attempt == attempt, _orphans(floor, t))
                               .with_for_update(skip_locked=True)).first()  # another reconciler has it
            if op is None:
                return None  # claimed or moved on meanwhile
            if op.reconcile_count >= rec.reconcile_max_resets:
                enqueue(s, level=NotificationLevel.ERROR, event="reconcile_cap",
                        subject=f"Reconciler gave up on {op.kind} {op.id} after {op.reconcile_count} re-dispatches",
                        body=(f"Operation: {op.kind} {op.id}\nStatus: {op.status} (no live lease)\n"
                              f"Re-dispatched {op.reconcile_count} times without a worker claiming it; "
                              f"the cap is {rec.reconcile_max_resets}. Check that workers serve its queue, "
                              f"then: packhorse retry {op.kind} {op.id} --reason '...'"),
                        context={"operation_kind": op.kind, "operation_id": op.id, "status": op.status,
                                 "reconcile_count": op.reconcile_count},
                        operation_kind=op.kind, operation_id=op.id,
                        cooldown_seconds=rec.notification_cooldown_seconds, now=t)
                return None
            kind, count = op.kind, op.reconcile_count + 1
            s.execute(update(Operation).where(fenced(op_id, attempt, Status(status))).values(
                status=Status.PENDING.value, reconcile_count=Operation.reconcile_count + 1, lease_owner=None,
                lease_expires_at=None, not_before=None, updated_at=t))
            return kind, count

        reset = db.transact(tx)
        if reset is not None:  # logged once the reset is committed
            log.warning("reconciler_redispatched", operation_kind=reset[0], operation_id=op_id,
                        previous_status=status, reconcile_count=reset[1], floor_seconds=floor)
            done.append(op_id)
    return done
