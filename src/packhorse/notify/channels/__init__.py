"""Delivery channels of the notifier: e-mail (:mod:`.smtp`) and apprise URLs (:mod:`.apprise`).

Every channel has a stable ``name`` (the key of its delivery record, so a re-delivery after a
crash skips a channel that already took the message), says which levels it serves
(:meth:`Channel.wants`) and delivers one :class:`Message` or raises :class:`ChannelError`.
:func:`build_channels` composes the channels of a configuration in one place.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from packhorse.errors import ChannelError

if TYPE_CHECKING:
    from packhorse.config import NotificationsConfig
    from packhorse.runtime.hooks import Hooks

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


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


def build_channels(cfg: "NotificationsConfig", *, hooks: "Hooks | None" = None) -> list[Channel]:
    """The channels configured in ``[notifications]``: SMTP first, then one per apprise URL
    (``hooks``: the process's fault hooks, handed to the SMTP channel).

    Raises:
        ConfigError: an apprise URL apprise does not understand (named with its key).
    """
    from packhorse.notify.channels.apprise import apprise_channels
    from packhorse.notify.channels.smtp import SmtpChannel

    out: list[Channel] = []
    if cfg.smtp is not None:
        out.append(SmtpChannel(cfg.smtp) if hooks is None else SmtpChannel(cfg.smtp, hooks=hooks))
    out.extend(apprise_channels(cfg.apprise_urls, cfg.apprise_urls_by_level))
    return out


__all__ = ["Channel", "ChannelError", "Message", "build_channels"]
