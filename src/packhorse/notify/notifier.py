"""The notifier: deliver the notification outbox at least once, never twice per channel.

``packhorse notifier`` runs it as a service; ``packhorse run`` runs it in a thread and
``run --until-idle`` delivers what it can within a bounded time before exiting
(:meth:`Notifier.flush`). :meth:`Notifier.stop` aborts a send in progress, so a service stops
within seconds however slow the mail server is.

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
3. Every channel done → ``sent``. A permanent refusal (SMTP 5xx) → ``dead`` at once.
   Otherwise ``attempts + 1`` and, while ``attempts ≤ max_retries`` (5), ``next_attempt_at = now + backoff`` (exponential from
   ``retry_backoff_base_seconds``, full jitter in [½, 1], capped at
   ``retry_backoff_max_seconds``); after that the row is a **dead letter** (``dead``), listed
   by ``packhorse notifications --dead``. Every status write is fenced on the claim token.

Nothing is deliverable without a channel: with none configured rows stay ``pending``.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy import case, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from packhorse.config import NotificationsConfig
from packhorse.db.models import Notification, NotificationDelivery, utcnow
from packhorse.db.session import Database
from packhorse.domain import NotificationStatus
from packhorse.errors import ChannelError
from packhorse.notify.channels import build_channels
from packhorse.notify.channels.base import Channel, Message
from packhorse.notify.outbox import WITHDRAWN, ascii_subject, pending_count
from packhorse.operations.identity import worker_identity
from packhorse.operations.lifecycle import backoff_seconds
from packhorse.runtime.hooks import NO_HOOKS, Hooks

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


def rendered(n: Notification, cfg: NotificationsConfig) -> tuple[str, str]:
    """``(subject, body)`` of outbox row ``n`` as every channel gets them: the subject with
    ``cfg``'s prefix and ``[DEV]`` (ASCII), the body with the repeats counted on the row
    (a digest of permanent failures lists its repeats itself). Used by the notifier and by
    ``packhorse notifications --show``, so what an operator reads there is what was sent."""
    prefix = cfg.subject_prefix.strip()
    dev = "[DEV] " if cfg.development_mode else ""
    body = n.body
    if n.repeat_count and n.event not in ("permanent_failure", "failure_repaired"):  # a digest lists its repeats
        body += f"\n\nRepeated {n.repeat_count} more time(s) within the cooldown"
        if n.last_repeat_at is not None:
            body += f" (last at {n.last_repeat_at.isoformat(timespec='seconds')})"
        body += "."
    return ascii_subject(f"{prefix} {dev}{n.subject}".strip()), body


class Notifier:
    """Delivers the outbox of ``db`` through ``channels`` (default: those of ``cfg``).

    Args:
        cfg: the ``[notifications]`` settings.
        db: the ops database.
        channels: override the configured channels (tests).
        owner: the lease owner name (default ``host:pid:notifier``).
        hooks: the process's fault hooks (:mod:`packhorse.runtime.hooks`; tests): points
            ``notify.delivered`` and ``notify.smtp.session``.
        review: ``review(session, row)``, called in a transaction of its own on every claimed
            row just before it is rendered and sent; it may rewrite the row's level, event,
            subject, body and context (the engine's
            :func:`packhorse.engine.outcome.review_notification`: a failure repaired within
            the gather window does not page). A review that raises is logged and the row is
            sent as it was; one that returns :data:`~packhorse.notify.outbox.WITHDRAWN` deleted
            the row (a follow-up whose condition ended): nothing is sent.
    """
    def __init__(self, cfg: NotificationsConfig, db: Database, *, channels: list[Channel] | None = None,
                 owner: str | None = None, hooks: Hooks = NO_HOOKS,
                 review: Callable[[Session, Notification], Any] | None = None) -> None:
        self.cfg = cfg
        self.db = db
        self.review = review
        self.hooks = hooks
        self.channels = build_channels(cfg, hooks=hooks) if channels is None else channels
        self.owner = owner or worker_identity("notifier")
        smtp = cfg.smtp
        self.domain = smtp.from_address.rsplit("@", 1)[-1] if smtp else "packhorse.localhost"
        #: set by :meth:`stop`
        self.stopping = threading.Event()
        #: channel name -> ``time.monotonic()`` until which it counts as unreachable
        self._down: dict[str, float] = {}

    # -- claim / renew / release ---------------------------------------------------------
    def claim_next(self, now: dt.datetime | None = None, *, flush: bool = False,
                   exclude: set[int] | frozenset[int] = frozenset()) -> NotificationClaim | None:
        """Lease the next deliverable row (retries first, then oldest); ``None`` if none is due.

        Args:
            flush: also take rows never tried that are due within ``digest_gather_seconds``
                (a digest still gathering: the run that could add to it is ending).
            exclude: ids not to take (rows this flush already handled).
        """

        def tx(s: Session) -> NotificationClaim | None:
            t = now or utcnow()
            free = (Notification.lease_expires_at.is_(None)) | (Notification.lease_expires_at < t)
            due = Notification.next_attempt_at <= t
            if flush:
                due = due | ((Notification.attempts == 0) & (Notification.next_attempt_at <= t + dt.timedelta(
                    seconds=self.cfg.digest_gather_seconds)))
            for _ in range(5):
                row = s.execute(
                    select(Notification.id, Notification.claim_token)
                    .where(Notification.status == PENDING, due, free,
                           *([Notification.id.not_in(sorted(exclude))] if exclude else []))
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
    def _channel_down(self, name: str) -> float:
        """Seconds the channel ``name`` still counts as unreachable (0: try it)."""
        return max(0.0, self._down.get(name, 0.0) - time.monotonic())

    def deliver(self, c: NotificationClaim, *, deadline: float | None = None) -> str:
        """Send claimed notification ``c`` to every channel that still needs it.

        A channel that failed with a retryable error counts as down for
        ``retry_backoff_base_seconds / 4`` (for the rest of a :meth:`flush`): rows needing it
        meanwhile are handed back untried (no attempt counted) instead of each waiting for
        the same timeout.

        Args:
            deadline: ``time.monotonic()`` value no network step may pass (a flush's budget).

        Returns:
            ``"sent"``, ``"retry"``, ``"dead"``, ``"deferred"`` (a channel is down; handed
            back untried), ``"lost"`` (the lease went to another notifier) or
            :data:`~packhorse.notify.outbox.WITHDRAWN` (the review deleted the row unsent: a
            follow-up whose condition has ended).
        """
        def load(s: Session) -> tuple[Notification, set[str]]:
            n = s.get(Notification, c.notification_id)
            assert n is not None
            done = set(s.scalars(select(NotificationDelivery.channel)
                                 .where(NotificationDelivery.notification_id == n.id)))
            return n, done

        if self.review is not None and self._review(c) == WITHDRAWN:
            log.info("notification_withdrawn", notification_id=c.notification_id)
            return WITHDRAWN
        n, done = self.db.read(load)
        msg = self.message(n)
        errors: list[str] = []
        permanent = False
        deferred_for = 0.0
        for ch in self.channels:
            if ch.name in done or not ch.wants(n.level):
                continue
            down = self._channel_down(ch.name)
            if down > 0:
                deferred_for = max(deferred_for, down)
                continue
            if self.stopping.is_set():
                return self._release(c, 0.0, n.id)
            if not self.renew(c):
                log.warning("notification_lease_lost", notification_id=n.id)
                return "lost"
            timeout = None if deadline is None else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                return self._release(c, 0.0, n.id)
            try:
                ch.send(msg, timeout=timeout)
            except ChannelError as e:
                errors.append(f"{ch.name}: {e}")
                permanent = permanent or e.permanent
                if not e.permanent:
                    self._down[ch.name] = time.monotonic() + (
                        float("inf") if deadline is not None else self.cfg.retry_backoff_base_seconds / 4)
                log.warning("notification_channel_failed", notification_id=n.id, channel=ch.name, error=str(e),
                            permanent=e.permanent)
                continue
            except Exception as e:  # a bug in a channel must not stop the notifier
                errors.append(f"{ch.name}: {type(e).__name__}: {e}")
                log.error("notification_channel_crashed", notification_id=n.id, channel=ch.name, error=repr(e))
                continue
            self.hooks.hit("notify.delivered")  # accepted, not yet recorded (tests)
            self._record_delivery(c, ch.name, msg.message_id, n.attempts + 1)
        if not errors and deferred_for > 0:
            return self._release(c, deferred_for if deadline is None else 0.0, n.id)
        return self._finish(c, n.attempts, errors, permanent=permanent)

    def _review(self, c: NotificationClaim) -> Any:
        """Run :attr:`review` on claimed row ``c`` (fenced on the claim; never raises); returns
        what it returned (``None`` when it failed or the row was no longer ours)."""
        review = self.review
        assert review is not None

        def tx(s: Session) -> Any:
            n = s.get(Notification, c.notification_id)
            if n is not None and n.claim_token == c.token and n.status == PENDING:
                return review(s, n)
            return None

        try:
            return self.db.transact(tx)
        except Exception as e:  # noqa: BLE001 - a review that fails must not keep a message back
            log.warning("notification_review_failed", notification_id=c.notification_id, error=repr(e))
            return None

    def message(self, n: Notification) -> Message:
        """The :class:`Message` channels send for outbox row ``n`` (:func:`rendered`)."""
        subject, body = rendered(n, self.cfg)
        return Message(notification_id=n.id, level=n.level, event=n.event, subject=subject, body=body,
                       message_id=message_id(n, self.domain), created_at=n.created_at)

    def _release(self, c: NotificationClaim, wait_seconds: float, notification_id: int) -> str:
        """Hand claimed row ``c`` back untried (no attempt counted), due in ``wait_seconds``."""
        def tx(s: Session) -> bool:
            values: dict[str, Any] = dict(lease_owner=None, lease_expires_at=None)
            if wait_seconds > 0:
                values["next_attempt_at"] = utcnow() + dt.timedelta(seconds=wait_seconds)
            return s.execute(update(Notification).where(*self._fenced(c)).values(**values)).rowcount == 1

        return "deferred" if self.db.transact(tx) else "lost"

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

    def _finish(self, c: NotificationClaim, attempts_before: int, errors: list[str], *,
                permanent: bool = False) -> str:
        def tx(s: Session) -> str:
            now = utcnow()
            if not errors:
                values: dict[str, Any] = dict(status=SENT, sent_at=now, attempts=attempts_before + 1, last_error=None)
                outcome = "sent"
            else:
                attempts = attempts_before + 1
                values = dict(attempts=attempts, last_error="; ".join(errors)[:4000])
                if permanent or attempts > self.cfg.max_retries:  # a 5xx reply: a retry cannot help
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
    def stop(self) -> None:
        """Stop delivering (from a signal handler or another thread): loops end after the row
        in hand, and a channel send in progress is aborted (SMTP: its socket is shut)."""
        self.stopping.set()
        for ch in self.channels:
            try:
                ch.abort()
            except Exception as e:  # best effort: the process is stopping anyway
                log.warning("notification_channel_abort_failed", channel=ch.name, error=repr(e))

    def run_once(self, limit: int = 1000, *, deadline: float | None = None, flush: bool = False,
                 exclude: set[int] | None = None) -> dict[str, int]:
        """Deliver every row that is due now (at most ``limit``); returns counts per outcome.

        Ends early when :meth:`stop` was called, when ``deadline`` (a ``time.monotonic()``
        value) passed, or when every channel is down. ``flush`` and ``exclude``: see
        :meth:`claim_next` (``exclude`` gains the ids handled)."""
        counts: dict[str, int] = {}
        if not self.channels or (not flush and self.seconds_until_due() != 0.0):
            return counts  # nothing due: no write transaction (the SQLite write lock is shared)
        handled = exclude if exclude is not None else set()
        for _ in range(limit):
            if self.stopping.is_set() or (deadline is not None and time.monotonic() >= deadline):
                break
            if all(self._channel_down(ch.name) > 0 for ch in self.channels):
                break
            c = self.claim_next(flush=flush, exclude=handled)
            if c is None:
                break
            handled.add(c.notification_id)
            outcome = self.deliver(c, deadline=deadline)
            counts[outcome] = counts.get(outcome, 0) + 1
        return counts

    def flush(self, budget_seconds: float, stop: threading.Event | None = None) -> dict[str, int]:
        """Deliver what can be delivered within ``budget_seconds`` and return: the end of
        ``run --until-idle`` and of a stopping service (DESIGN.md "Architecture": the outbox
        is durable, so nothing is lost by leaving the rest to ``packhorse notifier``).

        Each row is tried at most once; digests still gathering are sent now; a channel that
        fails (down, timeout, 4xx) is not tried again in this flush; no network step may pass
        the budget. Returns counts per outcome and ``"queued"``: rows still pending after it.
        """
        deadline = time.monotonic() + budget_seconds
        stop = stop or threading.Event()
        self.stopping.clear()
        saved_down, self._down = self._down, {}
        handled: set[int] = set()
        total: dict[str, int] = {}
        try:
            while self.channels and not stop.is_set() and time.monotonic() < deadline:
                got = self.run_once(deadline=deadline, flush=True, exclude=handled)
                for k, v in got.items():
                    total[k] = total.get(k, 0) + v
                if got:
                    continue
                if all(self._channel_down(ch.name) > 0 for ch in self.channels):
                    break
                # a row not handled yet may fall due within the budget (e.g. one whose delivery
                # the stopping notifier thread just aborted): wait for it, else we are done
                wait = self.seconds_until_due(exclude=handled)
                if wait is None or wait >= deadline - time.monotonic():
                    break
                stop.wait(max(wait, 0.01))
        finally:
            self._down = saved_down
        total["queued"] = self.pending_count()
        return total

    def pending_count(self) -> int:
        """Rows of the outbox still to deliver (``pending``)."""
        return pending_count(self.db)

    def seconds_until_due(self, exclude: set[int] | frozenset[int] = frozenset()) -> float | None:
        """Seconds until the next pending row (not in ``exclude``) may be claimed (0 if one is
        due now); ``None`` when nothing is pending."""
        def q(s: Session) -> float | None:
            now = utcnow()
            due = s.scalar(select(func.min(case(
                (Notification.lease_expires_at > Notification.next_attempt_at, Notification.lease_expires_at),
                else_=Notification.next_attempt_at))).where(
                    Notification.status == PENDING, *([Notification.id.not_in(sorted(exclude))] if exclude else [])))
            return None if due is None else max(0.0, (due - now).total_seconds())

        return self.db.read(q)

    def drain(self, stop: threading.Event | None = None) -> dict[str, int]:
        """Deliver until no pending row is left: each ends ``sent`` or ``dead`` (bounded by the
        retries and their backoff), or ``stop`` is set. With no channel, returns at once. For
        tests and tools: ``run --until-idle`` uses the bounded :meth:`flush` instead."""
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
        while not stop.is_set() and not self.stopping.is_set():
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
