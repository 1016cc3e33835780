"""Reading the notification outbox for operators: ``packhorse notifications`` and the API."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from packhorse.config import NotificationsConfig
from packhorse.db.models import Notification, NotificationDelivery, utcnow
from packhorse.db.session import Database
from packhorse.domain import NotificationStatus
from packhorse.notify.notifier import rendered


def notification_dict(n: Notification, delivered_to: list[str]) -> dict[str, Any]:
    """One outbox row as plain data (times ISO 8601 UTC; ``delivered_to``: channel names)."""
    iso = lambda t: t.isoformat() if t is not None else None  # noqa: E731
    return {"id": n.id, "created_at": iso(n.created_at), "level": n.level, "event": n.event, "subject": n.subject,
            "status": n.status, "attempts": n.attempts, "next_attempt_at": iso(n.next_attempt_at),
            "sent_at": iso(n.sent_at), "last_error": n.last_error, "repeat_count": n.repeat_count,
            "operation_kind": n.operation_kind, "operation_id": n.operation_id, "delivered_to": delivered_to}


def not_sent_because(cfg: NotificationsConfig) -> str | None:
    """Why nothing in the outbox is sent with configuration ``cfg`` (notifications disabled, or
    no channel configured: no notifier delivers, so a pending notification is kept, never
    attempted), or ``None`` when a notifier can deliver."""
    if not cfg.enabled:
        return "notifications are disabled ([notifications] enabled = false)"
    if not cfg.channels_configured:
        return "no notification channel is configured ([notifications.smtp] or apprise_urls)"
    return None


def list_notifications(db: Database, *, dead: bool = False, sent_limit: int = 20,
                       cfg: NotificationsConfig | None = None) -> list[dict[str, Any]]:
    """Dead letters (``dead=True``), else the pending rows — those already retried first, as
    the notifier takes them — then the ``sent_limit`` most recent sent ones.

    With ``cfg`` under which nothing is sent (:func:`not_sent_because`), each pending row says
    so: ``"kept_because"`` names why, and its ``"next_attempt_at"`` is ``None`` (no attempt is
    made until a channel is configured); otherwise ``"kept_because"`` is ``None``."""
    why = not_sent_because(cfg) if cfg is not None else None
    def q(s: Session) -> list[dict[str, Any]]:
        if dead:
            rows = list(s.scalars(select(Notification).where(Notification.status == NotificationStatus.DEAD.value)
                                  .order_by(Notification.id)))
        else:
            pending = list(s.scalars(select(Notification)
                                     .where(Notification.status == NotificationStatus.PENDING.value)
                                     .order_by((Notification.attempts == 0), Notification.next_attempt_at,
                                               Notification.id)))
            sent = list(s.scalars(select(Notification).where(Notification.status == NotificationStatus.SENT.value)
                                  .order_by(Notification.id.desc()).limit(sent_limit)))
            rows = pending + sent
        ids = [r.id for r in rows]
        channels: dict[int, list[str]] = {}
        for nid, ch in s.execute(select(NotificationDelivery.notification_id, NotificationDelivery.channel)
                                 .where(NotificationDelivery.notification_id.in_(ids))
                                 .order_by(NotificationDelivery.id)):
            channels.setdefault(nid, []).append(ch)
        out = [notification_dict(r, channels.get(r.id, [])) for r in rows]
        for d in out:
            kept = why if d["status"] == NotificationStatus.PENDING.value else None
            d["kept_because"] = kept
            if kept:
                d["next_attempt_at"] = None
        return out

    return db.read(q)


def show_notification(db: Database, notification_id: int, cfg: NotificationsConfig) -> dict[str, Any] | None:
    """One outbox row with the message as the channels of ``cfg`` get it
    (:func:`~packhorse.notify.notifier.rendered`): :func:`notification_dict` with ``"subject"``
    as sent, plus ``"body"`` and ``"context"`` (the details it was rendered from); ``None`` if
    there is no notification with that id."""
    def q(s: Session) -> dict[str, Any] | None:
        n = s.get(Notification, notification_id)
        if n is None:
            return None
        channels = list(s.scalars(select(NotificationDelivery.channel)
                                  .where(NotificationDelivery.notification_id == n.id)
                                  .order_by(NotificationDelivery.id)))
        subject, body = rendered(n, cfg)
        return {**notification_dict(n, channels), "subject": subject, "body": body, "context": n.context}

    return db.read(q)


def requeue_dead_letters(db: Database) -> list[int]:
    """Queue every dead letter again (attempts from 0, due now); returns their ids. Channels
    that already took a message are still skipped (their delivery records stay)."""
    def tx(s: Session) -> list[int]:
        ids = list(s.scalars(select(Notification.id).where(Notification.status == NotificationStatus.DEAD.value)))
        if ids:
            s.execute(update(Notification).where(Notification.id.in_(ids)).values(
                status=NotificationStatus.PENDING.value, attempts=0, next_attempt_at=utcnow(),
                lease_owner=None, lease_expires_at=None))
        return ids

    return db.transact(tx)


