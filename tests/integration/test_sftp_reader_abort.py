""":meth:`packhorse.storage.sftp.ParallelReader.abort` (and
:meth:`~packhorse.storage.sftp.SftpSource.abort_range_reads`): a read waiting on a stalled link (the
caller's ``readinto`` may otherwise wait ``2 × STALL_SECONDS`` and more) raises the given error
at once when another thread aborts the reader — what the ``sftp`` pull does when its lease is
found lost, so the stale attempt frees its partial for the successor (docs/reliability.md
"Resumable transfers"). The SSH connections are fakes whose reads never answer; the known-hosts
file is real. A thread and short waits: hence an integration test."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from packhorse.errors import LeaseLostError
from packhorse.storage.sftp import STALL_SECONDS, SftpSource, SshEndpoint
from ssh_fakes import HOST_KEY, FakeConn

HOSTS = ["stalled.example.org", "early.example.org", "ranged.example.org"]
SIZE = 8 << 20


class SilentFile:
    """A remote file whose first ``answered`` reads are answered, the rest never (a stalled link)."""

    def __init__(self, answered: int) -> None:
        self.answered = answered

    async def read(self, length: int, offset: int) -> bytes:
        if self.answered <= 0:
            await asyncio.Event().wait()  # never set
        self.answered -= 1
        return bytes(length)

    async def close(self) -> None:
        pass


class SilentSftp:
    limits = SimpleNamespace(max_read_len=261120)

    def __init__(self, answered: int) -> None:
        self.answered = answered

    async def stat(self, path: str, follow_symlinks: bool = True) -> object:
        return object()

    async def open(self, path: str, mode: str, **kw: Any) -> SilentFile:
        return SilentFile(self.answered)

    def exit(self) -> None:
        pass


def source(tmp_path: Path, host: str, conns: list[FakeConn], answered: int) -> SftpSource:
    known = tmp_path / "known_hosts"
    known.write_text(f"{','.join(HOSTS)} {HOST_KEY.export_public_key('openssh').decode().strip()}\n")
    s = SftpSource(SshEndpoint(location="fyst-buffer", host=host, port=22, user="packhorse", key_file=Path("/k"),
                               known_hosts_file=known, root="/buffer"), streams=2, block_bytes=1 << 20)

    async def connect_one() -> tuple[FakeConn, SilentSftp]:
        conn = FakeConn()
        conns.append(conn)
        return conn, SilentSftp(answered)
    s._connect_one = connect_one  # type: ignore[method-assign]
    return s


def test_abort_makes_a_read_waiting_on_a_stalled_link_raise_at_once(tmp_path: Path) -> None:
    conns: list[FakeConn] = []
    with source(tmp_path, "stalled.example.org", conns, answered=1) as s:
        s._ensure(2)  # the connections (connect() would also read the root's marker)
        with s.open_read("bundles/b.tar", size=SIZE) as f:
            buf = bytearray(1 << 20)
            assert f.readinto(buf) == 1 << 20  # the first block arrives; the link then stalls
            outcome: dict[str, Any] = {}

            def reader() -> None:
                started = time.monotonic()
                try:
                    while f.readinto(buf):
                        pass
                except BaseException as e:  # noqa: BLE001 - handed to the test
                    outcome["error"] = e
                outcome["seconds"] = time.monotonic() - started

            t = threading.Thread(target=reader, daemon=True)
            t.start()
            t.join(0.5)
            assert t.is_alive(), "the read should be waiting on the stalled link"
            lost = LeaseLostError("operation 7: attempt 3 is no longer the operation's current attempt")
            aborted = time.monotonic()
            f.abort(lost)
            t.join(10)
            assert not t.is_alive(), "the aborted read still waits"
            assert outcome["error"] is lost
            assert time.monotonic() - aborted < 5 < STALL_SECONDS
            with pytest.raises(LeaseLostError):  # and every later read
                f.readinto(buf)
            f.abort(RuntimeError("a second abort changes nothing"))
            with pytest.raises(LeaseLostError):
                f.readinto(buf)
    assert conns and all(c.closed for c in conns)  # reads were cancelled on them: not kept


def test_abort_before_the_first_read_requests_nothing_and_raises(tmp_path: Path) -> None:
    conns: list[FakeConn] = []
    with source(tmp_path, "early.example.org", conns, answered=0) as s:
        s._ensure(2)  # the connections (connect() would also read the root's marker)
        with s.open_read("bundles/b.tar", size=SIZE) as f:
            f.abort(LeaseLostError("lost"))
            with pytest.raises(LeaseLostError):
                f.readinto(bytearray(1024))


def test_abort_range_reads_makes_a_ranged_read_waiting_on_a_stalled_link_raise_at_once(tmp_path: Path) -> None:
    conns: list[FakeConn] = []
    with source(tmp_path, "ranged.example.org", conns, answered=0) as s:
        s._ensure(1)
        outcome: dict[str, Any] = {}

        def compare() -> None:  # what resume_sampled does with a taken-over partial
            try:
                s.read_range("bundles/b.tar", 0, 1 << 20)
            except BaseException as e:  # noqa: BLE001 - handed to the test
                outcome["error"] = e

        t = threading.Thread(target=compare, daemon=True)
        t.start()
        t.join(0.5)
        assert t.is_alive(), "the ranged read should be waiting on the stalled link"
        lost = LeaseLostError("operation 7: attempt 3 is no longer the operation's current attempt")
        s.abort_range_reads(lost)
        t.join(5)
        assert not t.is_alive(), "the aborted ranged read still waits"
        assert outcome["error"] is lost
        with pytest.raises(LeaseLostError):  # and every later one
            s.read_range("bundles/b.tar", 0, 10)
    assert conns and all(c.closed for c in conns)
