"""E-mail over SMTP with the standard library (``smtplib``), configured by ``[notifications.smtp]``.

Recipients are chosen per level (``recipients_by_level``, else ``recipients``). Every message
carries a stable ``Message-ID`` and ``X-Packhorse-Notification`` / ``X-Packhorse-Level``
headers, so a duplicate after a crash is recognisable by the receiver. A 5xx reply is a
permanent :class:`ChannelError` (the notification is dead-lettered at once), a 4xx reply or a
network error a retryable one.
"""

from __future__ import annotations

import email.utils
import os
import smtplib
import socket
import ssl
from email.message import EmailMessage
from typing import TYPE_CHECKING

from packhorse.errors import ChannelError
from packhorse.notify.channels.base import Message
from packhorse.runtime.hooks import NO_HOOKS, Hooks

if TYPE_CHECKING:
    from packhorse.config import SmtpConfig


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
        self._conn: smtplib.SMTP | None = None
        self._aborted = False

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
            raise ChannelError(f"notifications.smtp.password_env: environment variable {var!r} is not set",
                               permanent=True)
        return self.environ[var]

    def _tls(self) -> ssl.SSLContext:
        ca = self.cfg.ca_file
        return ssl.create_default_context(cafile=str(ca) if ca is not None else None)

    def abort(self) -> None:
        """Shut the socket of a :meth:`send` in progress (from another thread or a signal
        handler): its next read or write fails at once. A connect in progress still waits for
        at most its timeout."""
        self._aborted = True
        conn = getattr(self, "_conn", None)
        sock = getattr(conn, "sock", None) if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def send(self, message: Message, *, timeout: float | None = None) -> None:
        """Send ``message`` to the recipients of its level.

        Args:
            timeout: cap (seconds) on every network step, below ``timeout_seconds``.

        Raises:
            ChannelError: ``permanent`` for a 5xx reply (relaying denied, login refused, every
                recipient unknown), a certificate that does not verify, or a missing password
                variable; retryable for a 4xx reply, a refused or lost connection or a timeout
                (the server's reply is in the message).
        """
        rcpts = self.cfg.recipients_for(message.level)
        em = self.build(message)
        cfg = self.cfg
        where = f"smtp {cfg.host}:{cfg.port}"
        wait = cfg.timeout_seconds if timeout is None else max(0.1, min(cfg.timeout_seconds, timeout))
        self._aborted = False
        try:
            password = self._password()
            conn: smtplib.SMTP = (smtplib.SMTP_SSL(timeout=wait, context=self._tls()) if cfg.ssl
                                  else smtplib.SMTP(timeout=wait))
            # connected by hand (not by the constructor) so that abort() can reach the socket
            # while the greeting is awaited; TLS checks the certificate against _host, which
            # only the constructor would have set
            conn._host = cfg.host  # type: ignore[attr-defined]
            self._conn = conn
            with conn:
                conn.connect(cfg.host, cfg.port)
                if self._aborted:
                    raise smtplib.SMTPServerDisconnected("notifier stopping")
                conn.ehlo()
                if cfg.starttls:
                    conn.starttls(context=self._tls())
                    conn.ehlo()
                if cfg.username:
                    conn.login(cfg.username, password or "")
                self.hooks.hit("notify.smtp.session")  # connected, nothing sent yet (tests)
                refused = conn.send_message(em, from_addr=cfg.from_address, to_addrs=rcpts)
        except smtplib.SMTPRecipientsRefused as e:
            codes = [code for code, _ in e.recipients.values()]
            raise ChannelError(f"{where}: every recipient refused: "
                               + "; ".join(f"{a}: {c} {_text(m)}" for a, (c, m) in sorted(e.recipients.items())),
                               permanent=all(500 <= c < 600 for c in codes)) from None
        except smtplib.SMTPResponseException as e:
            raise ChannelError(f"{where}: server replied {e.smtp_code} {_text(e.smtp_error)}",
                               permanent=500 <= e.smtp_code < 600) from None
        except ssl.SSLCertVerificationError as e:
            raise ChannelError(f"{where}: the server's certificate does not verify ({e.verify_message}); "
                               "for a private certificate authority set notifications.smtp.ca_file",
                               permanent=True) from None
        except (smtplib.SMTPException, OSError) as e:
            raise ChannelError(f"{where}: {type(e).__name__}: {e}") from None
        finally:
            self._conn = None
        if refused:
            # accepted for the others; the refused addresses are a configuration problem that a
            # retry would not fix (and would duplicate the message for everyone else)
            import structlog

            structlog.get_logger(__name__).warning("smtp_recipients_refused", notification_id=message.notification_id,
                                                   refused=sorted(refused))


def _text(reply: bytes | str) -> str:
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
