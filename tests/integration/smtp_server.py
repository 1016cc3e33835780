"""A real SMTP server on loopback for tests (aiosmtpd), recording every message it accepts."""

from __future__ import annotations

import email
import json
import os
import socket
import threading
import time
from email.message import Message
from typing import Any

import pytest

from free_ports import free_port

try:
    from aiosmtpd.controller import Controller
except ImportError:  # pragma: no cover - the test extra installs it
    Controller = None  # type: ignore[assignment,misc]


def require_aiosmtpd() -> None:
    """Skip without aiosmtpd locally; fail under CI (the brief's rule for service tests)."""
    if Controller is None:
        if os.environ.get("CI") == "true":
            pytest.fail("aiosmtpd is required in CI")
        pytest.skip("aiosmtpd is not installed")


class Inbox:
    """aiosmtpd handler: keeps (envelope recipients, parsed message) of every accepted mail.
    ``reject_with`` makes it refuse every message with that SMTP reply (e.g. ``"554 no"``)."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], Message]] = []
        self.reject_with: str | None = None
        self.lock = threading.Lock()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.reject_with:
            return self.reject_with
        msg = email.message_from_bytes(envelope.content)
        with self.lock:
            self.messages.append((list(envelope.rcpt_tos), msg))
        return "250 OK"

    def subjects(self) -> list[str]:
        with self.lock:
            return [m["Subject"] for _, m in self.messages]

    def wait_for(self, pred: Any, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out; inbox holds {self.subjects()}")


class SmtpServer:
    """Start/stop an aiosmtpd server on ``port`` (restartable on the same port)."""

    def __init__(self, port: int | None = None) -> None:
        require_aiosmtpd()
        self.port = port or free_port()
        self.inbox = Inbox()
        self.controller: Any = None

    def start(self) -> "SmtpServer":
        self.controller = Controller(self.inbox, hostname="127.0.0.1", port=self.port)
        self.controller.start()
        return self

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None


@pytest.fixture
def smtp_server():
    """A real SMTP server on a free loopback port (import this fixture into a test module)."""
    server = SmtpServer().start()
    yield server
    server.stop()


def toml_table(name: str, table: dict[str, Any]) -> str:
    """``table`` as TOML under ``[name]`` (sub-dicts become ``[name.key]`` tables)."""
    lines = [f"[{name}]"] + [f"{k} = {json.dumps(v)}" for k, v in table.items() if not isinstance(v, dict)]
    subs = [toml_table(f"{name}.{k}", v) for k, v in table.items() if isinstance(v, dict)]
    return "\n".join(lines) + "\n" + "".join(subs)


def smtp_settings(port: int, **notifications: Any) -> dict[str, Any]:
    """A ``[notifications]`` table delivering to the test server on ``port`` (ops@ for every
    level), with test-sized backoff; ``notifications`` overrides keys."""
    smtp = {"host": "127.0.0.1", "port": port, "from_address": "packhorse@example.org",
            "recipients": ["ops@example.org"], "timeout_seconds": 5, **notifications.pop("smtp", {})}
    return {"retry_backoff_base_seconds": 0.05, "retry_backoff_max_seconds": 0.1, "poll_interval_seconds": 0.1,
            **notifications, "smtp": smtp}


class SilentServer:
    """A mail server that is "down" the slow way: it accepts TCP connections on loopback and
    never says a word (no greeting), so a client waits for its full timeout. ``accepted``
    counts the connections."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.conns: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            self.accepted += 1

    def close(self) -> None:
        self._stop = True
        for c in self.conns:
            c.close()
        self.sock.close()
