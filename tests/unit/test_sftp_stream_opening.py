"""How :class:`packhorse.storage.sftp.SftpSource` opens its streams: all at once, not one after
another, and not at all when a finished transfer left sound connections to the same server
(an SSH login is a dozen round trips: over a 100 ms link, four streams opened in turn cost every
transfer about four seconds; docs/benchmarks.md, "20,000 small files over a long thin link").
The SSH connections are fakes: what is checked is how many logins are under way at once, and
how many a transfer needed."""

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
    def __init__(self) -> None:
        self.closed = False

    def is_closed(self) -> bool:
        return self.closed

    def abort(self) -> None:
        self.closed = True

    def close(self) -> None:
        self.closed = True

    async def wait_closed(self) -> None:
        pass


def source(streams: int, host: str = "fyst.example.org") -> SftpSource:
    return SftpSource(SshEndpoint(location="fyst-buffer", host=host, port=22, user="packhorse",
                                  key_file=Path("/k"), known_hosts_file=Path("/kh"), root="/buffer"), streams=streams)


def counting(state: dict[str, int], fail: list[BaseException] | None = None, sftp: Any = FakeSftp) -> Any:
    async def connect_one() -> tuple[FakeConn, FakeSftp]:
        state["logins"] = state.get("logins", 0) + 1
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        for _ in range(3):  # the login's round trips: the other openings get their turns
            await asyncio.sleep(0)
        state["now"] -= 1
        if fail:
            raise fail.pop(0)
        return FakeConn(), sftp()
    return connect_one


def test_connect_opens_every_stream_at_once() -> None:
    state = {"now": 0, "peak": 0}
    with source(4, "at-once.example.org") as s:
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
    with source(4, "refused.example.org") as s:
        s._connect_one = counting(state, [cut, trust])  # type: ignore[method-assign]
        with pytest.raises(HostKeyError):
            s.connect()
        assert len(s._conns) == 2


def test_a_finished_transfer_leaves_its_connections_to_the_next_and_a_cut_one_does_not() -> None:
    state = {"now": 0, "peak": 0}
    with source(4, "kept.example.org") as s:
        s._connect_one = counting(state)  # type: ignore[method-assign]
        s.connect()
    assert state["logins"] == 4
    with source(4, "kept.example.org") as s:  # the next transfer from that server: no login
        s._connect_one = counting(state)  # type: ignore[method-assign]
        s.connect()
        assert len(s._conns) == 4
        kept = [c for c, _ in s._conns]
        s._cut("the link dropped")  # this transfer's link fails under it
    assert state["logins"] == 4
    assert all(c.closed for c in kept)  # closed, not kept
    with source(2, "kept.example.org") as s:
        s._connect_one = counting(state)  # type: ignore[method-assign]
        s.connect()
    assert state["logins"] == 6
    with source(4, "other.example.org") as s:  # another server: its own logins
        s._connect_one = counting(state)  # type: ignore[method-assign]
        s.connect()
    assert state["logins"] == 10


class DeadSftp(FakeSftp):
    async def stat(self, path: str, follow_symlinks: bool = True) -> object:
        raise ConnectionResetError("the link dropped while the connection sat idle")


def test_a_kept_connection_that_does_not_answer_is_replaced_by_a_new_login() -> None:
    state = {"now": 0, "peak": 0}
    with source(2, "half-dead.example.org") as s:
        s._connect_one = counting(state, sftp=DeadSftp)  # type: ignore[method-assign]
        s._ensure(2)
    assert state["logins"] == 2
    with source(2, "half-dead.example.org") as s:
        s._connect_one = counting(state)  # type: ignore[method-assign]
        dead = [c for _, c, _ in s._pool._idle[s._pool_key]]
        s.connect()  # the kept ones fail their first question: two new logins, no error
        assert state["logins"] == 4 and not s._broken
        assert all(isinstance(f, FakeSftp) and not isinstance(f, DeadSftp) for _, f in s._conns)
    assert all(c.closed for c in dead)
