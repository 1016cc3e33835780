"""Delivery channels of the notifier: e-mail (:mod:`.smtp`) and apprise URLs (:mod:`.apprise`).

Every channel has a stable ``name`` (the key of its delivery record, so a re-delivery after a
crash skips a channel that already took the message), says which levels it serves
(:meth:`Channel.wants`) and delivers one :class:`Message` or raises :class:`ChannelError`.
:func:`build_channels` composes the channels of a configuration in one place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from packhorse.errors import ChannelError
from packhorse.notify.channels.apprise import apprise_channels
from packhorse.notify.channels.base import Channel, Message
from packhorse.notify.channels.smtp import SmtpChannel

if TYPE_CHECKING:
    from packhorse.config import NotificationsConfig
    from packhorse.runtime.hooks import Hooks


def build_channels(cfg: "NotificationsConfig", *, hooks: "Hooks | None" = None) -> list[Channel]:
    """The channels configured in ``[notifications]``: SMTP first, then one per apprise URL
    (``hooks``: the process's fault hooks, handed to the SMTP channel).

    Raises:
        ConfigError: an apprise URL apprise does not understand (named with its key).
    """
    out: list[Channel] = []
    if cfg.smtp is not None:
        out.append(SmtpChannel(cfg.smtp) if hooks is None else SmtpChannel(cfg.smtp, hooks=hooks))
    out.extend(apprise_channels(cfg.apprise_urls, cfg.apprise_urls_by_level))
    return out


__all__ = ["Channel", "ChannelError", "Message", "build_channels"]
