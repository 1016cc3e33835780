"""The notification outbox: queue a notification in the caller's transaction.

A notification is a row of ``notification_outbox`` written in the **same transaction** as the
state change that causes it (an operation marked FAILED, a circuit breaker opening, …), so a
crash can never lose it and a rolled-back change never notifies (DESIGN.md "Architecture";
issues #3 and #7). Delivery (SMTP, apprise, retries, dead letters) reads the table later.

Cooldown (seed 002, DESIGN.md "Numbers": 3600 s): repeats of the same (kind, operation,
subject) within ``cooldown_seconds`` of the row already queued are counted on that row
(``repeat_count``, ``last_repeat_at``), not queued again.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..db.models import Notification, utcnow
from ..domain import NotificationLevel, NotificationStatus

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
    ("host", "Host"),
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
    (:func:`packhorse.operations.build_error_context`): one ``Label: value`` line per field
    that is set (diagnosis lines only when set), then the traceback."""
    lines = [f"{label}: {ctx[key]}" for key, label in _CONTEXT_LINES if ctx.get(key) not in (None, "")]
    if ctx.get("traceback"):
        lines += ["", "Traceback:", str(ctx["traceback"])]
    return "\n".join(lines)


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
) -> Notification | None:
    """Queue a notification inside the caller's transaction (commit it with the state change).

    Args:
        session: the open transaction of the state change that causes the notification.
        level: its severity (recipients are chosen per level at delivery).
        event: what happened, a short snake_case name (``permanent_failure``, ``breaker_open``).
        subject: names the event; made plain ASCII (:func:`ascii_subject`).
        body: the text; for failures use :func:`render_error_context` on the error context.
        context: the prebuilt dict the body was rendered from (kept for the API / channels).
        operation_kind, operation_id: the operation it is about, if any.
        cooldown_seconds: repeats of the same (kind, operation, subject) within this many
            seconds of the queued row are counted on it instead (0 disables the cooldown).
        now: the current UTC time (tests).

    Returns:
        the new row (flushed, so ``id`` is set), or ``None`` if it was folded into an earlier
        one by the cooldown.
    """
    now = now or utcnow()
    subject = ascii_subject(subject)
    key = cooldown_key(operation_kind, operation_id, subject)
    if cooldown_seconds > 0:
        earlier = session.scalars(
            select(Notification)
            .where(Notification.cooldown_key == key,
                   Notification.created_at > now - dt.timedelta(seconds=cooldown_seconds))
            .order_by(Notification.id.desc())
            .limit(1)
        ).first()
        if earlier is not None:
            earlier.repeat_count += 1
            earlier.last_repeat_at = now
            session.flush()
            return None
    row = Notification(
        created_at=now, level=level.value, event=event, subject=subject, body=body, context=context,
        operation_kind=operation_kind, operation_id=operation_id, cooldown_key=key, repeat_count=0,
        status=NotificationStatus.PENDING.value, attempts=0, next_attempt_at=now,
    )
    session.add(row)
    session.flush()
    return row
