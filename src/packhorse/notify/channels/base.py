"""What every delivery channel of the notifier is: the :class:`Message` it sends and the
:class:`Channel` protocol (:mod:`packhorse.notify.channels` composes the channels).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class Message:
    """One notification as a channel sends it.

    ``subject`` is plain ASCII and already carries the configured prefix; ``message_id`` is
    stable for the notification (every attempt carries the same one), e.g.
    ``<packhorse.notification.17.1764460800@example.org>``; ``created_at`` is UTC.
    """

    notification_id: int
    level: str
    event: str
    subject: str
    body: str
    message_id: str
    created_at: dt.datetime


class Channel(Protocol):
    """What the notifier needs of a channel."""

    name: str

    def wants(self, level: str) -> bool:
        """Whether this channel has recipients for notifications of ``level``."""

    def send(self, message: Message, *, timeout: float | None = None) -> None:
        """Deliver ``message``; raises :class:`ChannelError` if it was not accepted.
        ``timeout`` (seconds) caps each network step below the channel's own timeout."""

    def abort(self) -> None:
        """From another thread: make a :meth:`send` in progress fail now (the notifier stops)."""
