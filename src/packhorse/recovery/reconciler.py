"""The reconciler: the backstop for work that no lease covers (seed 000).

It re-dispatches

* ``SCHEDULED`` operations whose dispatch was lost — never claimed, scheduled longer ago than
  the *floor* (``Settings.reconcile_floor_seconds``: 0 embedded; at least the broker's
  ``visibility_timeout_seconds`` with Celery, so it never races the broker's own redelivery;
  with a broker that counts the messages its workers hold too, Redis, only the watch's
  confirmation: :attr:`BrokerView.counts_delivered`) **and not still waiting in the broker**. Old is not lost: a message queued behind a busy
  worker may wait far longer than any floor. With a broker (:class:`BrokerView`, given by
  ``packhorse monitor`` in distributed mode) the reconciler asks it how many messages each
  queue holds right now. Queues are first in, first out, so a queue holding *n* messages can
  hold the messages of at most its *n* most recently scheduled ``SCHEDULED`` operations;
  those are still queued, not lost, and are left alone (INFO ``reconciler_still_queued``).
  Only older ones, whose messages the queue can no longer hold, were lost (a broker restart
  without persistence, a flush) — once the broker said so in two passes some time apart
  (:class:`BrokerWatch`), so a message a worker has just taken but not yet claimed is not
  mistaken for a loss. A queue the broker cannot be asked about (unreachable) is
  left alone for this pass: unknown is not lost. Messages that are not operations' (a
  duplicate publish, a stale redelivery) only make the reconciler wait longer, never reset
  work that is queued. The embedded runner knows its own queue (``exclude``);
* ``IN_PROGRESS`` operations that no lease covers (no ``lease_expires_at``: a worker that died
  between the status write and its lease, or a row edited by hand). Expired leases are the
  stalled-task monitor's, not the reconciler's.

Each reset sets ``PENDING`` (dispatchable now), increments ``reconcile_count`` and logs a
WARNING. ``retry_count`` is never touched: a lost dispatch does not consume the operation's
retries — only attempts that ran do. No give-up is for ever (I5): the cap applies per window,
like a circuit breaker (:func:`window_step`). After ``reconcile_max_resets`` re-dispatches in
one window (a window starts over when a worker claimed the operation, or on ``packhorse
retry``) the reconciler gives up: the operation stays where it is, one ERROR notification is
queued in the same transaction (``reconcile_given_up_at`` set), and until it moves it is listed
as blocked (``dispatch_lost``, :func:`dispatch_given_up`: ``status``, the dashboard, the gauge
``packhorse_dispatch_lost``). ``[recovery] reconcile_cooldown_seconds`` later it is
re-dispatched once more (half-open); lost again without a claim, it is given up on again at
once.

:data:`RECONCILED_STATUSES` is the live registration the owners test (I5) reads.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

import structlog
from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from packhorse.config import Settings
from packhorse.db.models import Operation, utcnow
from packhorse.db.session import Database, bound_idle_in_transaction
from packhorse.domain import NotificationLevel, Status
from packhorse.notify.outbox import enqueue
from packhorse.operations.batching import operations_per_task
from packhorse.operations.lifecycle import fenced

log = structlog.get_logger(__name__)

#: The statuses the reconciler looks at (read by the owners test).
RECONCILED_STATUSES = (Status.SCHEDULED, Status.IN_PROGRESS)

#: One broker queue, as the operations name it: ``(site id, id of the data location the
#: operation writes to — its destination, else its source —, operation kind)``.
QueueKey = tuple[int, int, str]


class BrokerView(Protocol):
    """The broker's own view of its queues (DESIGN.md "Architecture": a broker only carries
    "please run operation N" messages; this says how many it still holds)."""

    def depths(self, keys: Collection[QueueKey]) -> Mapping[QueueKey, int | None]:
        """Messages the broker holds for the queue of each key right now: waiting ones, and
        where :attr:`counts_delivered`, those a worker has taken and not acknowledged too;
        ``None`` for a queue the broker could not be asked about. May raise any error when
        the broker is unreachable (the reconciler then treats every queue as unknown)."""
        ...

    #: ``True``: :meth:`depths` counts every message the broker could still deliver or
    #: deliver again (Redis: the queue's lists and kombu's unacknowledged hash), so a message in
    #: neither can never come back from the broker, and the reconciler need not wait the
    #: broker's visibility timeout before sending its operation again (a message a worker's
    #: connection took from Redis in the second a site's link went down is gone with it: a
    #: trial's bundle waited an hour). ``False``: a worker may hold messages the count
    #: misses (RabbitMQ's delivered ones, requeued by the broker itself if the worker goes).
    counts_delivered: bool


def _queue_key(site_id: int, source_location_id: int | None, destination_location_id: int | None,
               kind: str) -> QueueKey:
    loc = destination_location_id if destination_location_id is not None else source_location_id
    return (site_id, loc if loc is not None else -1, kind)


class BrokerWatch:
    """The reconciler's view of a broker across its passes: which ``SCHEDULED`` operations'
    messages are lost, not merely queued (see the module docstring).

    An operation counts as lost only when the broker showed, in two passes at least
    ``confirm_seconds`` apart, that its queue no longer holds its message: a worker that has
    just taken the message from the queue but not yet claimed the operation (a short window)
    is never mistaken for a loss.

    Args:
        view: the broker (:class:`BrokerView`).
        confirm_seconds: how long (s) an operation must stay absent from its queue before it
            is lost (:meth:`for_settings`: twice the monitor interval, at least the floor up to
            30 s).
        clock: monotonic seconds (tests inject one).
    """

    def __init__(self, view: BrokerView, *, confirm_seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.view = view
        self.confirm = confirm_seconds
        self.clock = clock
        self._absent: dict[int, float] = {}  # operation id -> when first seen not queued

    @classmethod
    def for_settings(cls, view: BrokerView, settings: Settings) -> BrokerWatch:
        """A watch with the confirmation time of ``settings`` (see the class docstring)."""
        confirm = max(2 * settings.recovery.monitor_interval_seconds, min(30.0, settings.reconcile_floor_seconds))
        return cls(view, confirm_seconds=confirm)

    def lost(self, db: Database, candidates: list[tuple[int, QueueKey]]) -> set[int]:
        """The ``SCHEDULED`` ``candidates`` (id, queue key) whose message is lost.

        Per queue holding *n* messages, its *n × k* most recently scheduled ``SCHEDULED``
        operations may still be in it (FIFO; a message holds up to *k* operations of its kind,
        :func:`packhorse.operations.batching.operations_per_task`) and are not lost; nor is any operation of a
        queue of unknown depth (broker unreachable); the rest are lost once they stayed so
        for ``confirm_seconds``."""
        keys = {k for _, k in candidates}
        try:
            depths: Mapping[QueueKey, int | None] = self.view.depths(keys)
        except Exception as e:  # noqa: BLE001 - a broker that cannot be asked loses nothing
            log.warning("reconciler_broker_unavailable", error=repr(e), queues=len(keys))
            depths = {}
        now = self.clock()
        absent: set[int] = set()
        for key in sorted(keys):
            mine = {op_id for op_id, k in candidates if k == key}
            n = depths.get(key)
            if n is None:
                continue  # unknown: not lost
            queued = self._newest_scheduled(db, key, n * operations_per_task(key[2])) & mine if n > 0 else set()
            if queued:
                site_id, loc, kind = key
                log.info("reconciler_still_queued", operation_kind=kind, site_id=site_id, location_id=loc,
                         queued_messages=n, waiting=len(queued), operation_ids=sorted(queued)[:20])
            absent |= mine - queued
        self._absent = {op_id: self._absent.get(op_id, now) for op_id in absent}
        return {op_id for op_id, since in self._absent.items() if now - since >= self.confirm}

    @staticmethod
    def _newest_scheduled(db: Database, key: QueueKey, n: int) -> set[int]:
        site_id, loc, kind = key
        written = func.coalesce(Operation.destination_location_id, Operation.source_location_id)

        def newest(s: Session) -> list[int]:
            return list(s.scalars(
                select(Operation.id).where(Operation.status == Status.SCHEDULED.value, Operation.kind == kind,
                                           Operation.site_id == site_id,
                                           written == loc if loc != -1 else written.is_(None))
                .order_by(Operation.scheduled_at.desc().nulls_last(), Operation.id.desc()).limit(n)))

        return set(db.read(newest))


def _orphans(floor: float, now: dt.datetime, scheduled_floor: float | None = None):  # type: ignore[no-untyped-def]
    older = now - dt.timedelta(seconds=floor)
    older_scheduled = now - dt.timedelta(seconds=floor if scheduled_floor is None else scheduled_floor)
    scheduled_since = Operation.scheduled_at.is_(None) | (Operation.scheduled_at <= older_scheduled)
    return or_(
        and_(Operation.status == Status.SCHEDULED.value, scheduled_since, Operation.updated_at <= older_scheduled),
        and_(Operation.status == Status.IN_PROGRESS.value, Operation.lease_expires_at.is_(None),
             Operation.updated_at <= older),
    )


def reconcile(db: Database, settings: Settings, *, exclude: Collection[int] = (),
              broker: BrokerWatch | None = None) -> list[int]:
    """Re-dispatch lost work (see the module docstring; seed 000 "heartbeat-gated reconciler").

    Args:
        db: the ops database.
        settings: floor (``Settings.reconcile_floor_seconds``), cap
            (``recovery.reconcile_max_resets``) and notification cooldown.
        exclude: operation ids this process knows are queued in it right now (the local
            runner's in-flight set): not lost.
        broker: the broker's view of its queues (distributed mode, :class:`BrokerWatch`):
            ``SCHEDULED`` work whose message may still be in its queue is not lost. ``None``:
            no broker (embedded).

    Returns:
        the ids reset to ``PENDING`` (re-dispatched), in id order. Work still queued is never
        reset, never counted in ``reconcile_count`` and never notified.
    """
    rec = settings.recovery
    floor = settings.reconcile_floor_seconds
    # a broker that counts every message it could still deliver (BrokerView.counts_delivered):
    # an operation whose message it holds nowhere waits only the watch's confirmation
    scheduled_floor = (min(floor, broker.confirm)
                       if broker is not None and getattr(broker.view, "counts_delivered", False) else floor)
    now = utcnow()
    found = db.read(lambda s: [tuple(r) for r in s.execute(
        select(Operation.id, Operation.status, Operation.attempt, Operation.site_id, Operation.source_location_id,
               Operation.destination_location_id, Operation.kind)
        .where(_orphans(floor, now, scheduled_floor)).order_by(Operation.id))])
    found = [r for r in found if r[0] not in exclude]
    scheduled = [(r[0], _queue_key(r[3], r[4], r[5], r[6])) for r in found if r[1] == Status.SCHEDULED.value]
    lost = broker.lost(db, scheduled) if broker is not None else set()
    done: list[int] = []
    for op_id, status, attempt, *_where in found:
        if broker is not None and status == Status.SCHEDULED.value and op_id not in lost:
            continue  # still queued in the broker, or not yet confirmed lost

        def tx(s: Session, op_id: int = op_id, status: str = status,
               attempt: int = attempt) -> tuple[str, str, int] | None:
            bound_idle_in_transaction(s, rec.lease_timeout_seconds)
            t = utcnow()
            op = s.scalars(select(Operation).where(Operation.id == op_id, Operation.status == status,
                                                   Operation.attempt == attempt, _orphans(floor, t, scheduled_floor))
                               .with_for_update(skip_locked=True)).first()  # another reconciler has it
            if op is None:
                return None  # claimed or moved on meanwhile
            step = window_step(op, t, cap=rec.reconcile_max_resets, cooldown_seconds=rec.reconcile_cooldown_seconds)
            if step == WAIT:
                return None  # given up: waits for its cool-down (listed as blocked, dispatch_lost)
            window = {"reconcile_window_at": t, "reconcile_count": 0} if _new_window(op) else {}
            count = window.get("reconcile_count", op.reconcile_count)
            if step == GIVE_UP:
                s.execute(update(Operation).where(fenced(op_id, attempt, Status(status)))
                          .values(reconcile_given_up_at=t, **window))
                retry_at = t + dt.timedelta(seconds=rec.reconcile_cooldown_seconds)
                enqueue(s, level=NotificationLevel.ERROR, event="reconcile_cap",
                        subject=f"Reconciler gave up on {op.kind} {op.id} after {count} re-dispatches",
                        body=(f"Operation: {op.kind} {op.id}\nStatus: {op.status} (no live lease)\n"
                              f"Re-dispatched {count} times without a worker claiming it; "
                              f"the cap is {rec.reconcile_max_resets}. It is listed as blocked (dispatch_lost) "
                              f"and re-dispatched once more at {retry_at.isoformat(timespec='seconds')} UTC. "
                              f"Check that workers serve its queue, "
                              f"then: packhorse retry {op.kind} {op.id} --reason '...'"),
                        context={"operation_kind": op.kind, "operation_id": op.id, "status": op.status,
                                 "reconcile_count": count, "retry_at": retry_at.isoformat()},
                        operation_kind=op.kind, operation_id=op.id,
                        cooldown_seconds=rec.notification_cooldown_seconds, now=t)
                return GIVE_UP, op.kind, count
            s.execute(update(Operation).where(fenced(op_id, attempt, Status(status))).values(
                status=Status.PENDING.value, reconcile_count=count + 1, lease_owner=None,
                lease_expires_at=None, not_before=None, updated_at=t, reconcile_given_up_at=None,
                **{k: v for k, v in window.items() if k != "reconcile_count"}))
            return step, op.kind, count + 1

        got = db.transact(tx)
        if got is None:
            continue
        step, kind, count = got  # logged once the change is committed
        if step == GIVE_UP:
            log.error("reconciler_gave_up", operation_kind=kind, operation_id=op_id, previous_status=status,
                      reconcile_count=count, cooldown_seconds=rec.reconcile_cooldown_seconds)
            continue
        log.warning("reconciler_redispatched", operation_kind=kind, operation_id=op_id,
                    previous_status=status, reconcile_count=count, floor_seconds=floor,
                    half_open=step == HALF_OPEN)
        done.append(op_id)
    return done


#: What the reconciler does with a lost operation (:func:`window_step`).
REDISPATCH, GIVE_UP, WAIT, HALF_OPEN = "redispatch", "give_up", "wait", "half_open"


def _new_window(op: Operation) -> bool:
    """True if ``op``'s re-dispatch count starts over: no window yet, or a worker claimed it
    since the window began (its ``started_at`` is later: the queue is served)."""
    w = op.reconcile_window_at
    return w is None or (op.started_at is not None and op.started_at > w)


def window_step(op: Operation, now: dt.datetime, *, cap: int, cooldown_seconds: float) -> str:
    """What the reconciler does with lost operation ``op`` at ``now`` (UTC), like a circuit
    breaker per operation (DESIGN.md I5: no give-up is for ever):

    * :data:`REDISPATCH` while its window holds fewer than ``cap`` re-dispatches (a new window
      starts when a worker claimed it since the last one began: :func:`_new_window`);
    * :data:`GIVE_UP` when the window's ``cap`` is reached and it has not given up yet: the
      operation stays where it is (listed as blocked, ``dispatch_lost``) and an ERROR
      notification is queued;
    * :data:`WAIT` while given up, for ``cooldown_seconds`` (s) after the give-up;
    * :data:`HALF_OPEN` after that: one more re-dispatch; lost again without a claim, it gives
      up again at once (one attempt per cool-down), claimed, its window starts over.
    """
    if op.reconcile_given_up_at is not None and not _new_window(op):
        if now < op.reconcile_given_up_at + dt.timedelta(seconds=cooldown_seconds):
            return WAIT
        return HALF_OPEN
    count = 0 if _new_window(op) else op.reconcile_count
    return REDISPATCH if count < cap else GIVE_UP


def dispatch_given_up():  # type: ignore[no-untyped-def]
    """SQL predicate on :class:`~packhorse.db.models.Operation`: the reconciler gave up on its
    lost dispatch and it has not moved since (still ``SCHEDULED``, or ``IN_PROGRESS`` with no
    lease): the blocked list's ``dispatch_lost`` and the gauge ``packhorse_dispatch_lost``."""
    return and_(Operation.reconcile_given_up_at.is_not(None),
                or_(Operation.status == Status.SCHEDULED.value,
                    and_(Operation.status == Status.IN_PROGRESS.value, Operation.lease_expires_at.is_(None))),
                or_(Operation.started_at.is_(None), Operation.reconcile_window_at.is_(None),
                    Operation.started_at <= Operation.reconcile_window_at))
