"""Any apprise URL (Slack, Matrix, ntfy, Teams, JSON webhooks, …) as a notification channel.

``[notifications] apprise_urls`` receive every level that ``apprise_urls_by_level`` does not
name. Each distinct URL is its own channel (named ``apprise:<12 hex digits of its sha256>``,
never the URL itself, which may hold a token), so a URL that accepted a message is not sent
it again when another URL fails and the notification is retried.
"""

from __future__ import annotations

import hashlib
from typing import Any

from packhorse.errors import ChannelError, ConfigError
from packhorse.notify.channels.base import Message

#: packhorse's levels → apprise's notify types (the values of ``apprise.NotifyType``)
_TYPES = {"DEBUG": "info", "INFO": "info", "WARNING": "warning", "ERROR": "failure", "CRITICAL": "failure"}


def _apprise() -> Any:
    """The apprise module, imported with the first apprise channel: a process whose
    configuration names no apprise URL never pays its import (start-up time)."""
    import apprise  # noqa: PLC0415 - start-up time (see the docstring)

    return apprise


class AppriseChannel:
    """One apprise URL serving ``levels`` (``None``: every level).

    Raises:
        ConfigError: apprise does not understand ``url`` (named by ``key``).
    """

    def __init__(self, url: str, levels: set[str] | None, key: str) -> None:
        self.url = url
        self.levels = levels
        self.name = "apprise:" + hashlib.sha256(url.encode()).hexdigest()[:12]
        self._apprise = _apprise().Apprise()
        if not self._apprise.add(url):
            raise ConfigError(f"{key}: {_redact(url)!r} is not a URL apprise can deliver to")

    def wants(self, level: str) -> bool:
        """True when this URL is listed for ``level``."""
        return self.levels is None or level in self.levels

    def abort(self) -> None:
        """Nothing to abort: apprise bounds each post by its own timeouts (4 s connect and
        read by default; ``cto`` / ``rto`` URL arguments)."""

    def send(self, message: Message, *, timeout: float | None = None) -> None:
        """Post ``message`` (title = subject, body = text); ``timeout`` is not used (see
        :meth:`abort`).

        Raises:
            ChannelError: apprise reported a failed delivery.
        """
        ok = self._apprise.notify(title=message.subject, body=message.body,
                                  notify_type=_apprise().NotifyType(_TYPES.get(message.level, "info")))
        if not ok:
            raise ChannelError(f"{self.name} ({_redact(self.url)}): delivery failed")


def _redact(url: str) -> str:
    """The URL's scheme and host only (tokens and passwords stay out of logs and errors)."""
    scheme, sep, rest = url.partition("://")
    host = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    return f"{scheme}{sep}{host}/…" if sep else "<url>"


def apprise_channels(urls: list[str], by_level: dict[str, list[str]]) -> list[AppriseChannel]:
    """One channel per distinct URL: default URLs serve every level not in ``by_level``,
    a per-level URL serves the levels that list it."""
    levels_of: dict[str, set[str] | None] = {}
    all_levels = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}
    default_levels = all_levels - set(by_level)
    keys: dict[str, str] = {}
    for i, url in enumerate(urls):
        levels_of[url] = set(default_levels)
        keys.setdefault(url, f"notifications.apprise_urls[{i}]")
    for level, lst in by_level.items():
        for i, url in enumerate(lst):
            levels = levels_of.setdefault(url, set())
            assert levels is not None
            levels.add(level)
            keys.setdefault(url, f"notifications.apprise_urls_by_level.{level}[{i}]")
    return [AppriseChannel(url, levels, keys[url]) for url, levels in levels_of.items()]
