"""How :class:`packhorse.storage.sftp.SftpSource` opens its streams: all at once, not one after
another, and not at all when a finished transfer left sound connections to the same server
(an SSH login is a dozen round trips: over a 100 ms link, four streams opened in turn cost every
transfer about four seconds; docs/benchmarks.md, "20,000 small files over a long thin link").
The SSH connections are fakes: what is checked is how many logins are under way at once, and
how many a transfer needed; the known-hosts file is real."""

from __future__ import annotations

import asyncio
import json
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

with warnings.catch_warnings():  # asyncssh names DSA keys, which cryptography deprecates
    warnings.simplefilter("ignore")
    import asyncssh

from packhorse.errors import HostKeyError, LocationUnavailableError, SshConnectionError
from packhorse.storage.sftp import SftpSource, SshEndpoint
from ssh_fakes import HOST_KEY, FakeConn


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


HOSTS = ["fyst.example.org", "at-once.example.org", "refused.example.org", "kept.example.org",
         "other.example.org", "half-dead.example.org", "partly.example.org", "counted.example.org",
         "rootless.example.org", "read-once.example.org", "removed.example.org"]  # removed last: a test takes it out of the file
KNOWN_HOSTS: list[Path] = []


@pytest.fixture(autouse=True)
def known_hosts(tmp_path: Path) -> Path:
    """A known-hosts file listing :data:`HOST_KEY` for every host of these tests."""
    path = tmp_path / "known_hosts"
    path.write_text(f"{','.join(HOSTS)} {HOST_KEY.export_public_key('openssh').decode().strip()}\n")
    KNOWN_HOSTS[:] = [path]
    return path


def source(streams: int, host: str = "fyst.example.org") -> SftpSource:
    return SftpSource(SshEndpoint(location="fyst-buffer", host=host, port=22, user="packhorse",
                                  key_file=Path("/k"), known_hosts_file=KNOWN_HOSTS[0], root="/buffer"),
                      streams=streams)


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


def test_only_the_kept_connections_that_do_not_answer_are_replaced() -> None:
    state = {"now": 0, "peak": 0}
    sessions = iter([FakeSftp, DeadSftp, FakeSftp, DeadSftp])
    with source(4, "partly.example.org") as s:
        async def connect_one() -> tuple[FakeConn, FakeSftp]:
            state["logins"] = state.get("logins", 0) + 1
            return FakeConn(), next(sessions)()
        s._connect_one = connect_one  # type: ignore[method-assign]
        s._ensure(4)
    with source(4, "partly.example.org") as s:
        s._connect_one = counting(state)  # type: ignore[method-assign]
        s.connect()
        assert state["logins"] == 4 + 2 and len(s._conns) == 4
        assert sum(isinstance(f, DeadSftp) for _, f in s._conns) == 0


def test_a_kept_connection_whose_host_key_left_the_known_hosts_file_is_not_used(known_hosts: Path) -> None:
    state = {"now": 0, "peak": 0}
    with source(2, "removed.example.org") as s:
        s._connect_one = counting(state)  # type: ignore[method-assign]
        s.connect()
        kept = [c for c, _ in s._conns]
    assert state["logins"] == 2
    # the operators remove the host's key (compromised, or the host retired)
    known_hosts.write_text(known_hosts.read_text().replace(",removed.example.org ", " "))
    with source(2, "removed.example.org") as s:
        s._connect_one = counting(state)  # type: ignore[method-assign]
        s.connect()  # a real login would now be refused (the fake one is not: it counts)
        assert state["logins"] == 4
    assert all(c.closed for c in kept)


def test_a_refused_login_closes_the_kept_connections_too() -> None:
    state = {"now": 0, "peak": 0}
    with source(2, "refused.example.org") as s:
        s._connect_one = counting(state)  # type: ignore[method-assign]
        s._ensure(1)  # one kept from an earlier transfer
    trust = HostKeyError("changed host key", step="connect", side="source", host="h", path="/kh")
    with source(2, "refused.example.org") as s:
        s._connect_one = counting(state, [trust])  # type: ignore[method-assign]
        kept = [c for _, c, _ in s._pool._idle[s._pool_key]]
        with pytest.raises(HostKeyError):
            s.connect()
    assert kept and all(c.closed for c in kept)
    assert not s._pool._idle.get(s._pool_key)


ROOT_STATS: list[str] = []


class CountingSftp(FakeSftp):
    async def stat(self, path: str, follow_symlinks: bool = True) -> object:
        ROOT_STATS.extend([path] if path == "/buffer" else [])
        return object()


def test_the_root_is_asked_about_once_per_connect_the_probe_of_kept_connections_included() -> None:
    state = {"now": 0, "peak": 0}
    ROOT_STATS.clear()
    with source(2, "counted.example.org") as s:
        s._connect_one = counting(state, sftp=CountingSftp)  # type: ignore[method-assign]
        s.connect()  # new logins: the root check asks
    assert ROOT_STATS == ["/buffer"]
    ROOT_STATS.clear()
    with source(2, "counted.example.org") as s:
        s._connect_one = counting(state, sftp=CountingSftp)  # type: ignore[method-assign]
        s.connect()  # two kept connections: each probed, and the first one's answer is the root check's
    assert state["logins"] == 2
    assert ROOT_STATS == ["/buffer", "/buffer"]


class RootlessSftp(FakeSftp):
    async def stat(self, path: str, follow_symlinks: bool = True) -> object:
        if path == "/buffer":
            raise asyncssh.SFTPNoSuchFile("no such file")
        return object()


def test_a_root_gone_while_the_connections_were_kept_is_unavailable_storage() -> None:
    state = {"now": 0, "peak": 0}
    with source(2, "rootless.example.org") as s:
        s._connect_one = counting(state, sftp=RootlessSftp)  # type: ignore[method-assign]
        s._ensure(2)
    with source(2, "rootless.example.org") as s:
        s._connect_one = counting(state)  # type: ignore[method-assign]
        with pytest.raises(LocationUnavailableError, match="its root /buffer is not there on rootless.example.org"):
            s.connect()
        assert state["logins"] == 2 and not s._broken  # the kept ones answered: no new login


class LoginConn(FakeConn):
    async def start_sftp_client(self) -> FakeSftp:
        return FakeSftp()


class CountingSsh:
    """asyncssh, but reading the known-hosts file is counted, and a login is a fake one that
    records the known hosts it was handed."""

    def __init__(self) -> None:
        self.reads = 0
        self.handed: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncssh, name)

    def read_known_hosts(self, path: str) -> Any:
        self.reads += 1
        return asyncssh.read_known_hosts(path)

    def read_private_key(self, path: str) -> object:
        return object()

    async def create_connection(self, factory: Any, host: str, port: int, **kw: Any) -> tuple[LoginConn, None]:
        self.handed.append(kw["known_hosts"])
        return LoginConn(), None


def test_the_known_hosts_file_is_read_once_per_connect_for_the_kept_connections_and_every_login() -> None:
    ssh = CountingSsh()
    with source(3, "read-once.example.org") as s:
        s._ssh = ssh
        s.connect()  # three logins
        assert len(s._conns) == 3
    assert ssh.reads == 1 and len(ssh.handed) == 3 and all(k is ssh.handed[0] for k in ssh.handed)
    with source(4, "read-once.example.org") as s:
        s._ssh = ssh
        s.connect()  # three kept connections, trusted by the file as read now, and one login with it
        assert len(s._conns) == 4 and s._reused == 3
    assert ssh.reads == 2 and len(ssh.handed) == 4 and ssh.handed[3] is not ssh.handed[0]


def test_an_unreadable_known_hosts_file_refuses_the_logins_and_trusts_no_kept_connection(known_hosts: Path) -> None:
    ssh = CountingSsh()
    with source(2, "read-once.example.org") as s:
        s._ssh = ssh
        s._ensure(2)  # kept from an earlier transfer
        kept = [c for c, _ in s._conns]
    known_hosts.unlink()
    with source(2, "read-once.example.org") as s:
        s._ssh = ssh
        with pytest.raises(HostKeyError, match="cannot read the known-hosts file"):
            s.connect()
    assert all(c.closed for c in kept)
