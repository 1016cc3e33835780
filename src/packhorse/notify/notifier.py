"""The notifier: deliver the notification outbox at least once, never twice per channel.

``packhorse notifier`` runs it as a service; ``packhorse run`` runs it in a thread and
``run --until-idle`` drains it before exiting (issue #7).

Delivery of one notification:

1. **Claim** it like an operation (DESIGN.md "Lease"): a conditional ``UPDATE`` takes rows
   that are ``pending``, due (``next_attempt_at`` passed) and not leased by a live notifier,
   increments ``claim_token`` (the fencing token) and sets a lease of ``lease_seconds``. Rows
   already retried go first (the retry queue), then the oldest.
2. For each channel that serves the level and has **no delivery record** for it yet, renew
   the lease (fenced; a lost lease stops the attempt), send, and at once insert the delivery
   record ``(notification, channel)`` (unique). A notifier killed mid-delivery leaves the row
   leased; once the lease expires another notifier (or the restarted one) claims it and sends
   only to the channels without a record. The window between a server accepting a message and
   the record being written cannot be closed from this side: a crash exactly there re-sends
   the message with the **same Message-ID** (at-least-once; receivers can drop the duplicate).
3. Every channel done → ``sent``. Otherwise ``attempts + 1`` and, while ``attempts ≤
   max_retries`` (5), ``next_attempt_at = now + backoff`` (exponential from
   ``retry_backoff_base_seconds``, full jitter in [½, 1], capped at
   ``retry_backoff_max_seconds``); after that the row is a **dead letter** (``dead``), listed
   by ``packhorse notifications --dead``. Every status write is fenced on the claim token.

Nothing is deliverable without a channel: with none configured rows stay ``pending``.
"""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy import case, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ..config import NotificationsConfig
from ..db.models import Notification, NotificationDelivery, utcnow
from ..db.session import Database
from ..domain import NotificationStatus
from ..hooks import NO_HOOKS, Hooks
from ..operations import backoff_seconds, worker_identity
from .channels import Channel, ChannelError, Message, build_channels
from .outbox import ascii_subject

log = structlog.get_logger(__name__)

PENDING, SENT, DEAD = (s.value for s in (NotificationStatus.PENDING, NotificationStatus.SENT, NotificationStatus.DEAD))


@dataclass(frozen=True)
class NotificationClaim:
    """A notifier's lease on one outbox row: ``token`` is the fencing token."""

    notification_id: int
    token: int
    owner: str


def message_id(n: Notification, domain: str) -> str:
    """The stable Message-ID of notification ``n`` (the same on every delivery attempt)."""
    return f"<packhorse.notification.{n.id}.{int(n.created_at.timestamp())}@{domain}>"


class Notifier:
    """Delivers the outbox of ``db`` through ``channels`` (default: those of ``cfg``).

    Args:
        cfg: the ``[notifications]`` settings.
        db: the ops database.
        channels: override the configured channels (tests).
        owner: the lease owner name (default ``host:pid:notifier``).
        hooks: the process's fault hooks (:mod:`packhorse.hooks`; tests): points
            ``notify.delivered`` and ``notify.smtp.session``.
    """

    def __init__(self, cfg: NotificationsConfig, db: Database, *, channels: list[Channel] | None = None,
                 owner: str | None = None, hooks: Hooks = NO_HOOKS) -> None:
        self.cfg = cfg
        self.db = db
        self.hooks = hooks
        self.channels = build_channels(cfg, hooks=hooks) if channels is None else channels
        self.owner = owner or worker_identity("notifier")
        smtp = cfg.smtp
        self.domain = smtp.from_address.rsplit("@", 1)[-1] if smtp else "packhorse.localhost"

    # -- claim / renew / release ---------------------------------------------------------
    def claim_next(self, now: dt.datetime | None = None) -> NotificationClaim | None:
        """Lease the next deliverable row (retries first, then oldest); ``None`` if none is due."""

        def tx(s: Session) -> NotificationClaim | None:
            t = now or utcnow()
            free = (Notification.lease_expires_at.is_(None)) | (Notification.lease_expires_at < t)
            for _ in range(5):
                row = s.execute(
                    select(Notification.id, Notification.claim_token)
                    .where(Notification.status == PENDING, Notification.next_attempt_at <= t, free)
                    .order_by(case((Notification.attempts > 0, 0), else_=1), Notification.next_attempt_at,
                              Notification.id)
                    .limit(1)
                ).first()
                if row is None:
                    return None
                got = s.execute(
                    update(Notification)
                    .where(Notification.id == row.id, Notification.claim_token == row.claim_token,
                           Notification.status == PENDING, free)
                    .values(claim_token=Notification.claim_token + 1, lease_owner=self.owner,
                            lease_expires_at=t + dt.timedelta(seconds=self.cfg.lease_seconds))
                    .returning(Notification.claim_token)
                ).first()
                if got is not None:
                    return NotificationClaim(row.id, got.claim_token, self.owner)
            return None

        return self.db.transact(tx)

    def _fenced(self, c: NotificationClaim) -> tuple[Any, ...]:
        return (Notification.id == c.notification_id, Notification.claim_token == c.token,
                Notification.status == PENDING)

    def renew(self, c: NotificationClaim) -> bool:
        """Extend the lease of ``c``; ``False`` if another notifier holds the row now."""

        def tx(s: Session) -> bool:
            res = s.execute(update(Notification).where(*self._fenced(c)).values(
                lease_expires_at=utcnow() + dt.timedelta(seconds=self.cfg.lease_seconds)))
            return res.rowcount == 1

        return self.db.transact(tx)

    # -- one delivery --------------------------------------------------------------------
    def deliver(self, c: NotificationClaim) -> str:
        """Send claimed notification ``c`` to every channel that still needs it.

        Returns:
            ``"sent"``, ``"retry"``, ``"dead"`` or ``"lost"`` (the lease went to another
            notifier; nothing more was written).
        """

        def load(s: Session) -> tuple[Notification, set[str]]:
            n = s.get(Notification, c.notification_id)
            assert n is not None
            done = set(s.scalars(select(NotificationDelivery.channel)
                                 .where(NotificationDelivery.notification_id == n.id)))
            return n, done

        n, done = self.db.read(load)
        prefix = self.cfg.subject_prefix.strip()
        dev = "[DEV] " if self.cfg.development_mode else ""
        repeats = f" (repeated {n.repeat_count} more time(s) within the cooldown)" if n.repeat_count else ""
        msg = Message(notification_id=n.id, level=n.level, event=n.event,
                      subject=ascii_subject(f"{prefix} {dev}{n.subject}".strip()), body=n.body + ("\n\n" + repeats.strip()
                                                                                  if repeats else ""),
                      message_id=message_id(n, self.domain), created_at=n.created_at)
        errors: list[str] = []
        for ch in self.channels:
            if ch.name in done or not ch.wants(n.level):
                continue
            if not self.renew(c):
                log.warning("notification_lease_lost", notification_id=n.id)
                return "lost"
            try:
                ch.send(msg)
            except ChannelError as e:
                errors.append(f"{ch.name}: {e}")
                log.warning("notification_channel_failed", notification_id=n.id, channel=ch.name, error=str(e))
                continue
            except Exception as e:  # a bug in a channel must not stop the notifier
                errors.append(f"{ch.name}: {type(e).__name__}: {e}")
                log.error("notification_channel_crashed", notification_id=n.id, channel=ch.name, error=repr(e))
                continue
            self.hooks.hit("notify.delivered")  # accepted, not yet recorded (tests)
            self._record_delivery(c, ch.name, msg.message_id, n.attempts + 1)
        return self._finish(c, n.attempts, errors)

    def _record_delivery(self, c: NotificationClaim, channel: str, mid: str, attempt: int) -> None:
        # not fenced on purpose: even a stale attempt's record stops a successor from re-sending
        def tx(s: Session) -> None:
            try:
                with s.begin_nested():
                    s.add(NotificationDelivery(notification_id=c.notification_id, channel=channel, message_id=mid,
                                               attempt=attempt, delivered_at=utcnow()))
            except IntegrityError:
                pass

        self.db.transact(tx)

    def _finish(self, c: NotificationClaim, attempts_before: int, errors: list[str]) -> str:
        def tx(s: Session) -> str:
            now = utcnow()
            if not errors:
                values: dict[str, Any] = dict(status=SENT, sent_at=now, attempts=attempts_before + 1, last_error=None)
                outcome = "sent"
            else:
                attempts = attempts_before + 1
                values = dict(attempts=attempts, last_error="; ".join(errors)[:4000])
                if attempts > self.cfg.max_retries:
                    values["status"] = DEAD
                    outcome = "dead"
                else:
                    wait = backoff_seconds(attempts - 1, self.cfg.retry_backoff_base_seconds,
                                           self.cfg.retry_backoff_max_seconds)
                    values["next_attempt_at"] = now + dt.timedelta(seconds=wait)
                    outcome = "retry"
            res = s.execute(update(Notification).where(*self._fenced(c)).values(
                lease_owner=None, lease_expires_at=None, **values))
            return outcome if res.rowcount == 1 else "lost"

        outcome = self.db.transact(tx)
        if outcome == "dead":
            log.error("notification_dead_letter", notification_id=c.notification_id, errors=errors)
        elif outcome == "retry":
            log.warning("notification_retry", notification_id=c.notification_id, errors=errors)
        else:
            log.info("notification_" + outcome, notification_id=c.notification_id)
        return outcome

    # -- loops ---------------------------------------------------------------------------
    def run_once(self, limit: int = 1000) -> dict[str, int]:
        """Deliver every row that is due now (at most ``limit``); returns counts per outcome."""
        counts: dict[str, int] = {}
        if not self.channels or self.seconds_until_due() != 0.0:
            return counts  # nothing due: no write transaction (the SQLite write lock is shared)
        for _ in range(limit):
            c = self.claim_next()
            if c is None:
                break
            outcome = self.deliver(c)
            counts[outcome] = counts.get(outcome, 0) + 1
        return counts

    def seconds_until_due(self) -> float | None:
        """Seconds until the next pending row may be claimed (0 if one is due now); ``None``
        when nothing is pending."""

        def q(s: Session) -> float | None:
            now = utcnow()
            due = s.scalar(select(func.min(case(
                (Notification.lease_expires_at > Notification.next_attempt_at, Notification.lease_expires_at),
                else_=Notification.next_attempt_at))).where(Notification.status == PENDING))
            return None if due is None else max(0.0, (due - now).total_seconds())

        return self.db.read(q)

    def drain(self, stop: threading.Event | None = None) -> dict[str, int]:
        """Deliver until no pending row is left: each ends ``sent`` or ``dead`` (bounded by the
        retries and their backoff), or ``stop`` is set. With no channel, returns at once."""
        total: dict[str, int] = {}
        stop = stop or threading.Event()
        while self.channels and not stop.is_set():
            for k, v in self.run_once().items():
                total[k] = total.get(k, 0) + v
            wait = self.seconds_until_due()
            if wait is None:
                break
            stop.wait(min(max(wait, 0.01), self.cfg.poll_interval_seconds))
        return total

    def serve(self, stop: threading.Event, *, on_cycle: Any = None) -> None:
        """Deliver until ``stop`` is set, waking every ``poll_interval_seconds`` or sooner when a
        retry falls due; ``on_cycle()`` runs after every cycle (the service's still-alive)."""
        while not stop.is_set():
            try:
                self.run_once()
                if on_cycle:
                    on_cycle()
                wait = self.seconds_until_due()
            except Exception as e:  # a database blip: log, keep serving
                log.error("notifier_cycle_failed", error=repr(e))
                wait = None
            timeout = self.cfg.poll_interval_seconds if wait is None else min(self.cfg.poll_interval_seconds,
                                                                              max(wait, 0.01))
            stop.wait(timeout)
