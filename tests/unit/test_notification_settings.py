"""``[notifications]``, ``[notifications.smtp]`` and ``[disk_usage]`` settings: the
contract keys, defaults, per-level recipients, nested environment overrides, clear refusals."""

from __future__ import annotations

import pytest

from packhorse.config import settings_from_dict
from packhorse.errors import ConfigError
from packhorse.notify.channels import build_channels

SMTP = {"host": "mail.example.org", "port": 587, "starttls": True, "username": "packhorse",
        "password_env": "PACKHORSE_SMTP_PASSWORD", "from_address": "packhorse@example.org",
        "recipients": ["ops@example.org"], "recipients_by_level": {"CRITICAL": ["director@example.org"]}}


def test_contract_keys_and_defaults() -> None:
    s = settings_from_dict({"notifications": {"apprise_urls": ["json://127.0.0.1:9/hook"], "smtp": SMTP}}, environ={})
    n = s.notifications
    assert (n.max_retries, n.development_mode, n.enabled) == (5, False, True)
    assert n.smtp is not None and n.smtp.recipients_for("CRITICAL") == ["director@example.org"]
    assert n.smtp.recipients_for("INFO") == ["ops@example.org"]
    assert (s.disk_usage.interval_seconds, s.disk_usage.warning_percent, s.disk_usage.critical_percent,
            s.disk_usage.emergency_percent, s.disk_usage.recovery_percent) == (60, 70, 85, 95, 60)
    assert [c.name for c in build_channels(n)][0] == "smtp"
    assert build_channels(n)[1].name.startswith("apprise:")


def test_retention_defaults_to_seven_days() -> None:
    s = settings_from_dict({"sites": [{"name": "a"}], "locations": [
        {"name": "b", "site": "a", "role": "buffer", "path": "b"}]}, environ={})
    assert s.location("b").retention_seconds == 604800


def test_nested_environment_override_reaches_the_smtp_table() -> None:
    s = settings_from_dict({"notifications": {"smtp": SMTP}}, environ={
        "PACKHORSE_NOTIFICATIONS__SMTP__HOST": "relay.internal", "PACKHORSE_NOTIFICATIONS__DEVELOPMENT_MODE": "true"})
    assert s.notifications.smtp is not None and s.notifications.smtp.host == "relay.internal"
    assert s.notifications.smtp.port == 587 and s.notifications.development_mode is True


@pytest.mark.parametrize("data, words", [
    ({"notifications": {"smtp": {**SMTP, "hots": "x"}}}, ["notifications.smtp.hots", "unknown key"]),
    ({"notifications": {"smtp": {**SMTP, "ssl": True}}}, ["notifications.smtp", "ssl", "starttls"]),
    ({"notifications": {"smtp": {**SMTP, "password_env": None}}}, ["password_env"]),
    ({"notifications": {"smtp": {**SMTP, "recipients_by_level": {"LOUD": ["a@b"]}}}},
     ["notifications.smtp.recipients_by_level.LOUD"]),
    ({"disk_usage": {"warning_percent": 90}}, ["disk_usage", "critical_percent"]),
])
def test_wrong_settings_are_refused_naming_the_key(data: dict, words: list[str]) -> None:
    with pytest.raises(ConfigError) as e:
        settings_from_dict(data, environ={})
    for w in words:
        assert w in str(e.value)


def test_an_apprise_url_apprise_cannot_use_is_refused_naming_it() -> None:
    s = settings_from_dict({"notifications": {"apprise_urls_by_level": {"ERROR": ["nosuchscheme://x"]}}}, environ={})
    with pytest.raises(ConfigError, match=r"notifications.apprise_urls_by_level.ERROR\[0\]"):
        build_channels(s.notifications)
