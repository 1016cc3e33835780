"""E-mail over SMTP with the standard library (``smtplib``), configured by ``[notifications.smtp]``.

Recipients are chosen per level (``recipients_by_level``, else ``recipients``). Every message
carries a stable ``Message-ID`` and ``X-Packhorse-Notification`` / ``X-Packhorse-Level``
headers, so a duplicate after a crash is recognisable by the receiver.
"""

from __future__ import annotations

import email.utils
import os
import smtplib
import ssl
from email.message import EmailMessage
from typing import TYPE_CHECKING

from ...hooks import NO_HOOKS, Hooks
from . import ChannelError, Message

if TYPE_CHECKING:
    from ...config import SmtpConfig


class SmtpChannel:
    """Deliver notifications as e-mail through one SMTP server.

    Args:
        cfg: the ``[notifications.smtp]`` table.
        environ: where ``password_env`` is looked up (default ``os.environ``).
        hooks: fault hooks (tests): point ``notify.smtp.session`` once connected.
    """

    name = "smtp"

    def __init__(self, cfg: "SmtpConfig", environ: dict[str, str] | None = None, *, hooks: Hooks = NO_HOOKS) -> None:
        self.cfg = cfg
        self.hooks = hooks
        self.environ = os.environ if environ is None else environ

    def wants(self, level: str) -> bool:
        """True when ``level`` has at least one recipient."""
        return bool(self.cfg.recipients_for(level))

    def build(self, message: Message) -> EmailMessage:
        """The e-mail for ``message`` (plain text, UTF-8 body, ASCII subject)."""
        em = EmailMessage()
        em["From"] = self.cfg.from_address
        em["To"] = ", ".join(self.cfg.recipients_for(message.level))
        em["Subject"] = message.subject
        em["Message-ID"] = message.message_id
        em["Date"] = email.utils.format_datetime(message.created_at)
        em["X-Packhorse-Notification"] = str(message.notification_id)
        em["X-Packhorse-Level"] = message.level
        em["X-Packhorse-Event"] = message.event
        em.set_content(message.body)
        return em

    def _password(self) -> str | None:
        if not self.cfg.username:
            return None
        var = self.cfg.password_env or ""
        if var not in self.environ:
            raise ChannelError(f"notifications.smtp.password_env: environment variable {var!r} is not set")
        return self.environ[var]

    def send(self, message: Message) -> None:
        """Send ``message`` to the recipients of its level.

        Raises:
            ChannelError: connection refused or lost, TLS or login failure, every recipient
                refused, or the server rejected the message (the reply is in the message).
        """
        rcpts = self.cfg.recipients_for(message.level)
        em = self.build(message)
        cfg = self.cfg
        where = f"smtp {cfg.host}:{cfg.port}"
        try:
            password = self._password()
            if cfg.ssl:
                conn: smtplib.SMTP = smtplib.SMTP_SSL(cfg.host, cfg.port, timeout=cfg.timeout_seconds,
                                                      context=ssl.create_default_context())
            else:
                conn = smtplib.SMTP(cfg.host, cfg.port, timeout=cfg.timeout_seconds)
            with conn:
                conn.ehlo()
                if cfg.starttls:
                    conn.starttls(context=ssl.create_default_context())
                    conn.ehlo()
                if cfg.username:
                    conn.login(cfg.username, password or "")
                self.hooks.hit("notify.smtp.session")  # connected, nothing sent yet (tests)
                refused = conn.send_message(em, from_addr=cfg.from_address, to_addrs=rcpts)
        except smtplib.SMTPRecipientsRefused as e:
            raise ChannelError(f"{where}: every recipient refused: {sorted(e.recipients)}") from None
        except smtplib.SMTPResponseException as e:
            text = e.smtp_error.decode("utf-8", "replace") if isinstance(e.smtp_error, bytes) else str(e.smtp_error)
            raise ChannelError(f"{where}: server replied {e.smtp_code} {text}") from None
        except (smtplib.SMTPException, OSError) as e:
            raise ChannelError(f"{where}: {type(e).__name__}: {e}") from None
        if refused:
            # accepted for the others; the refused addresses are a configuration problem that a
            # retry would not fix (and would duplicate the message for everyone else)
            import structlog

            structlog.get_logger(__name__).warning("smtp_recipients_refused", notification_id=message.notification_id,
                                                   refused=sorted(refused))
