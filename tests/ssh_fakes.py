"""Stand-ins for asyncssh's connection objects, for the ``sftp`` tests that run no SSH server:
a test replaces :meth:`packhorse.storage.sftp.SftpSource._connect_one` with a coroutine that
returns ``(FakeConn(), <its own fake SFTP client>)``."""

from __future__ import annotations

import warnings
from typing import Any

with warnings.catch_warnings():  # asyncssh names DSA keys, which cryptography deprecates
    warnings.simplefilter("ignore")
    import asyncssh

#: The host key every fake connection presents (the tests list it in their known-hosts file).
HOST_KEY = asyncssh.generate_private_key("ssh-ed25519").convert_to_public()


class FakeConn:
    """An SSH connection that is open until aborted or closed, presenting :data:`HOST_KEY`."""

    def __init__(self) -> None:
        self.closed = False

    def get_server_host_key(self) -> Any:
        return HOST_KEY

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return "none" if name in ("send_compression", "recv_compression") else default

    def is_closed(self) -> bool:
        return self.closed

    def abort(self) -> None:
        self.closed = True

    def close(self) -> None:
        self.closed = True

    async def wait_closed(self) -> None:
        pass
