"""How :class:`packhorse.storage.sftp.SftpSource` opens its streams: all at once, not one after
another (an SSH login is a dozen round trips: over a 100 ms link, four streams opened in turn
cost every transfer about four seconds; docs/benchmarks.md, "20,000 small files over a long thin
link"). The SSH connections are fakes: what is checked is how many logins are under way at once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from packhorse.errors import HostKeyError, SshConnectionError
from packhorse.storage.sftp import SftpSource, SshEndpoint


class FakeFile:
    async def read(self, length: int, offset: int) -> bytes:
        return json.dumps({"location": "fyst-buffer"}).encode()[offset:offset + length]

    async def close(self) -> None:
        pass


class FakeSftp:
    limits = SimpleNamespace(max_read_len=261120)  # what OpenSSH announces (limits@openssh.com)

    async def stat(self, path: str, follow_symlinks: bool = True) -> object:
        return object()

    async def open(self, path: str, mode: str, **kw: Any) -> FakeFile:
        return FakeFile()

    def exit(self) -> None:
        pass


class FakeConn:
    def close(self) -> None:
        pass

    async def wait_closed(self) -> None:
        pass


def source(streams: int) -> SftpSource:
    return SftpSource(SshEndpoint(location="fyst-buffer", host="fyst.example.org", port=22, user="packhorse",
                                  key_file=Path("/k"), known_hosts_file=Path("/kh"), root="/buffer"), streams=streams)


def counting(state: dict[str, int], fail: list[BaseException] | None = None) -> Any:
    async def connect_one() -> tuple[FakeConn, FakeSftp]:
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        for _ in range(3):  # the login's round trips: the other openings get their turns
            await asyncio.sleep(0)
        state["now"] -= 1
        if fail:
            raise fail.pop(0)
        return FakeConn(), FakeSftp()
    return connect_one


def test_connect_opens_every_stream_at_once() -> None:
    state = {"now": 0, "peak": 0}
    with source(4) as s:
        s._connect_one = counting(state)  # type: ignore[method-assign]
        s.connect()
        assert len(s._conns) == 4
        assert state["peak"] == 4
        s.open_read("bundles/b.tar", size=0)  # nothing more to open
        assert len(s._conns) == 4


def test_a_permanent_failure_among_the_openings_is_the_one_raised_and_the_open_streams_are_kept() -> None:
    state = {"now": 0, "peak": 0}
    cut = SshConnectionError("cut", step="connect", side="source", host="h")
    trust = HostKeyError("unknown host key", step="connect", side="source", host="h", path="/kh")
    with source(4) as s:
        s._connect_one = counting(state, [cut, trust])  # type: ignore[method-assign]
        with pytest.raises(HostKeyError):
            s.connect()
        assert len(s._conns) == 2
