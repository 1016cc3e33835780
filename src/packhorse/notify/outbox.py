"""The notification outbox: queue a notification in the caller's transaction.

A notification is a row of ``notification_outbox`` written in the **same transaction** as the
state change that causes it (an operation marked FAILED, a circuit breaker opening, …), so a
crash can never lose it and a rolled-back change never notifies (DESIGN.md "Architecture";
issues #3 and #7). Delivery (SMTP, apprise, retries, dead letters) reads the table later.

Cooldown (seed 002, DESIGN.md "Numbers": 3600 s): one message per cooldown key and window;
repeats are folded into the waiting row or reported by a follow-up when the window ends
(:func:`enqueue`). Permanent failures use their root cause as the key, so one cause hitting
many operations sends one digest listing them (:mod:`packhorse.notify.messages`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from packhorse.db.models import Notification, utcnow
from packhorse.db.session import Database
from packhorse.domain import NotificationLevel, NotificationStatus

#: Subjects are plain ASCII and at most this long (mail headers, chat titles).
SUBJECT_MAX_CHARS = 200

#: Error-context fields rendered in a notification body, in this order; absent ones are skipped.
_CONTEXT_LINES = (
    ("operation_kind", "Task"),
    ("operation_id", "Operation"),
    ("retry_count", "Retry count"),
    ("error_type", "Error type"),
    ("message", "Error"),
    ("step", "Step"),
    ("side", "Side"),
    ("path", "Path"),
    ("host", "Location"),
    ("worker_host", "Host"),
    ("diagnosis", "Diagnosis"),
    ("diagnosis_source", "Diagnosis source"),
    ("timestamp", "Time (UTC)"),
)


def ascii_subject(text: str) -> str:
    """``text`` as a one-line plain-ASCII subject (non-ASCII → ``?``), cut at
    :data:`SUBJECT_MAX_CHARS`."""
    one_line = " ".join(text.split())
    return one_line.encode("ascii", "replace").decode("ascii")[:SUBJECT_MAX_CHARS]


def cooldown_key(kind: str | None, operation_id: int | None, subject: str) -> str:
    """The cooldown identity ``kind:operation:subject`` (``-`` for a missing part)."""
    return f"{kind or '-'}:{operation_id if operation_id is not None else '-'}:{subject}"[:400]


def render_error_context(ctx: dict[str, Any]) -> str:
    """The body of a failure notification, rendered from the one prebuilt error context
    (:func:`packhorse.engine.outcome.build_error_context`): one ``Label: value`` line per field
    that is set (diagnosis lines only when set), then the traceback. ``Location`` is where the
    failure happened (the error's ``host``: a data location, or a remote endpoint); ``Host`` is
    the machine the failing attempt ran on (``worker_host``, else the host of the ``task_id``'s
    lease owner)."""
    if ctx.get("worker_host") in (None, "") and ":" in str(ctx.get("task_id") or ""):
        ctx = {**ctx, "worker_host": str(ctx["task_id"]).split(":", 1)[0]}
    lines = [f"{label}: {ctx[key]}" for key, label in _CONTEXT_LINES if ctx.get(key) not in (None, "")]
    if ctx.get("traceback"):
        lines += ["", "Traceback:", str(ctx["traceback"])]
    return "\n".join(lines)


#: Where :func:`enqueue` keeps, in a row's ``context``, when the row's cooldown window began
#: (ISO 8601 UTC) and which earlier row a follow-up reports the repeats of.
WINDOW_START, FOLLOW_UP_OF = "cooldown_window_start", "follow_up_of"

#: A follow-up (``"Repeated: …"``, :data:`FOLLOW_UP_OF`) about a standing condition that has
#: ended by the time it is due is *withdrawn*: deleted unsent. The engine's review at send time
#: decides and deletes it and returns this
#: (:func:`packhorse.engine.outcome.review_notification`); the notifier then sends nothing and
#: returns it too (:meth:`packhorse.notify.notifier.Notifier.deliver`).
WITHDRAWN = "withdrawn"

#: ``merge(row) -> (subject, body, context)``: the content of ``row`` with one more repeat in it.
Merge = Callable[[Notification], tuple[str, str, dict[str, Any]]]


def _aware(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def window_start(row: Notification) -> dt.datetime:
    """When the cooldown window of ``row`` began (UTC): when it was first due to be sent."""
    text = (row.context or {}).get(WINDOW_START)
    return _aware(dt.datetime.fromisoformat(text)) if text else _aware(row.created_at)


def enqueue(
    session: Session,
    *,
    level: NotificationLevel,
    event: str,
    subject: str,
    body: str,
    context: dict[str, Any] | None = None,
    operation_kind: str | None = None,
    operation_id: int | None = None,
    cooldown_seconds: float = 3600.0,
    now: dt.datetime | None = None,
    key: str | None = None,
    gather_seconds: float = 0.0,
    merge: Merge | None = None,
) -> Notification | None:
    """Queue a notification inside the caller's transaction (commit it with the state change).

    One message per cooldown window (seed 002, DESIGN.md "Numbers": 3600 s) per cooldown key:

    * the first of a key is queued, due ``gather_seconds`` from now (a digest gathers the
      other failures of its cause meanwhile); its window starts when it is due;
    * a repeat while that row is still waiting (pending, never tried, not leased) is folded
      into it: ``merge(row)`` gives its new subject, body and context (a digest lists one
      more failure), or without ``merge`` it is counted (``repeat_count``, ``last_repeat_at``,
      "repeated N more time(s)" in the message);
    * a repeat after the row was sent or tried, still inside its window, goes to a
      **follow-up** row due when the window ends, so repeats counted during a cooldown are
      reported when it ends; further repeats fold into that follow-up, which opens the next
      window;
    * a repeat after the window (``cooldown_seconds`` after it began) is a new first message.

    The fold is a compare-and-set (on ``repeat_count`` and ``claim_token``), so two failures
    folding at once, or a notifier claiming the row meanwhile, never lose a repeat; on
    PostgreSQL a transaction-scoped advisory lock on the key keeps two first failures from
    queuing two rows.

    Args:
        session: the open transaction of the state change that causes the notification.
        level: its severity (recipients are chosen per level at delivery).
        event: what happened, a short snake_case name (``permanent_failure``, ``breaker_open``).
        subject: names the event; made plain ASCII (:func:`ascii_subject`).
        body: the text; for failures use :func:`render_error_context` on the error context.
        context: the prebuilt dict the body was rendered from (kept for the API / channels).
        operation_kind, operation_id: the operation it is about, if any.
        cooldown_seconds: the window, seconds (0 disables the cooldown: every call queues).
        now: the current UTC time (tests).
        key: the cooldown key (default :func:`cooldown_key` of kind, operation and subject;
            a digest passes its root-cause key).
        gather_seconds: delay of a first message (seconds) during which repeats fold into it.
        merge: how a repeat is folded into a waiting row (default: counted).

    Returns:
        the new row (flushed, so ``id`` is set), or ``None`` if it was folded into an earlier
        one.
    """
    now = now or utcnow()
    subject = ascii_subject(subject)
    key = (key or cooldown_key(operation_kind, operation_id, subject))[:400]
    due = now + dt.timedelta(seconds=max(gather_seconds, 0.0))
    follow_up_of: Notification | None = None
    if cooldown_seconds > 0:
        if session.get_bind().dialect.name == "postgresql":
            # two first failures of one cause at once must not both find "no row yet" and
            # queue two (SQLite writers are serialized already); held until the commit
            session.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 7))"), {"k": key})
        for _ in range(10):
            earlier = session.scalars(
                select(Notification).where(Notification.cooldown_key == key)
                .order_by(Notification.id.desc()).limit(1)
                .execution_options(populate_existing=True)
            ).first()
            if earlier is None:
                break
            start = window_start(earlier)
            if now >= start + dt.timedelta(seconds=cooldown_seconds):
                break  # the window is over: a new first message
            waiting = (earlier.status == NotificationStatus.PENDING.value and earlier.attempts == 0
                       and (earlier.lease_expires_at is None or _aware(earlier.lease_expires_at) < now))
            if waiting:
                values: dict[str, Any] = dict(repeat_count=earlier.repeat_count + 1, last_repeat_at=now)
                if merge is not None:
                    new_subject, new_body, new_context = merge(earlier)
                    values.update(subject=ascii_subject(new_subject), body=new_body,
                                  context={**new_context, WINDOW_START: start.isoformat()})
                res = session.execute(
                    update(Notification)
                    .where(Notification.id == earlier.id, Notification.repeat_count == earlier.repeat_count,
                           Notification.claim_token == earlier.claim_token,
                           Notification.status == NotificationStatus.PENDING.value, Notification.attempts == 0)
                    .values(**values).execution_options(synchronize_session=False))
                if res.rowcount == 1:
                    session.expire(earlier)
                    return None
                continue  # another failure folded, or a notifier took the row: look again
            follow_up_of = earlier
            due = start + dt.timedelta(seconds=cooldown_seconds)
            break
    ctx = dict(context or {})
    ctx[WINDOW_START] = due.isoformat()
    if follow_up_of is not None:
        ctx[FOLLOW_UP_OF] = follow_up_of.id
        if merge is None:
            subject = ascii_subject(f"Repeated: {subject}")
    row = Notification(
        created_at=now, level=level.value, event=event, subject=subject, body=body, context=ctx,
        operation_kind=operation_kind, operation_id=operation_id, cooldown_key=key, repeat_count=0,
        status=NotificationStatus.PENDING.value, attempts=0, next_attempt_at=due,
    )
    session.add(row)
    session.flush()
    return row


def pending_count(db: Database) -> int:
    """Notifications of the outbox still to deliver (status ``pending``)."""
    return int(db.read(lambda s: s.scalar(select(func.count()).select_from(Notification)
                                          .where(Notification.status == NotificationStatus.PENDING.value))) or 0)
