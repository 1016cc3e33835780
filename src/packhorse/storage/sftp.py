"""Reading a data location of another site over SSH (SFTP): the ``sftp`` transfer method.

Sites share no file system (DESIGN.md "Across sites"): a destination site's worker pulls a
bundle from the source site's buffer through the source host's SSH server. This module is the
client side of that: an :class:`SftpSource` opens ``streams`` SSH connections (each one TCP
connection with its own SFTP session, as FTS and Globus open parallel streams, so a long link is
not held to one TCP window) and reads one object as ranged reads spread over them, handed to
the caller in order (:class:`ParallelReader`), so the destination's partial file always holds a
prefix of the object and resumes as any other (docs/reliability.md "Resumable transfers").

Trust (never trust-on-first-use): the server's host key must be listed for the host in the
configured known-hosts file (OpenSSH format, ``[host]:port`` entries for other ports, hashed
entries accepted). An unknown or changed host key is refused with
:class:`~packhorse.errors.HostKeyError` naming the host, port, the key's SHA256 fingerprint and
the known-hosts file; a key the server does not accept with
:class:`~packhorse.errors.SshAuthenticationError` naming user, host and key file. Both are
permanent (a configuration to fix). A connection that cannot be made, is cut or stalls for
:data:`STALL_SECONDS` raises :class:`~packhorse.errors.SshConnectionError` (retryable: the
transfer resumes from its partial at the next attempt).

The client runs on one asyncio event loop per process, in a thread of its own (asyncssh);
the methods here are blocking and may be called from any one thread at a time. A transfer
that ends with its connections sound hands them back to the process
(:class:`_ConnectionPool`): the next transfer from the same server with the same credentials
takes them instead of logging in again (a login is a dozen round trips, about 1.3 s over a
100 ms link) when they sat idle for at most :data:`IDLE_KEEP_SECONDS`. A kept connection is
taken only while the host key it logged in with is still listed for the host in the
known-hosts file, read again for every transfer (a key removed from the file is trusted by no
later transfer), and every kept connection taken must answer a first question within
:data:`PROBE_SECONDS`, or it is closed and replaced by a new login. Connections of a transfer
whose link failed, or that met a host key or a login it may not trust, are closed, never kept.
Nothing here writes to the remote location: deletion of a bundle at the source buffer stays
with the source site's own workers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import getpass
import json
import os
import threading
import time
import warnings
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import structlog

from packhorse.config import Settings
from packhorse.errors import (
    ConfigError,
    HostKeyError,
    LocationUnavailableError,
    SourceMissingError,
    SshAuthenticationError,
    SshConnectionError,
)
from packhorse.ratelimit import RateLimiter
from packhorse.storage.base import ObjectInfo, check_key
from packhorse.storage.identity import MARKER_KEY, MAX_MARKER_BYTES

#: Default number of parallel streams (SSH connections) of one transfer.
DEFAULT_STREAMS = 4
#: Bytes one stream reads in one ranged read (the unit handed out in order), bytes.
BLOCK_BYTES = 4 * 1024 * 1024
#: Blocks each stream has in flight at once (its ranged reads overlap, so no round trip is lost
#: between one block and the next); the caller may fall behind by ``streams × (this + 1)`` blocks
#: (the reorder window): memory ≈ streams × (this + 1) × block.
AHEAD_PER_STREAM = 2
#: A ranged read (or a connection attempt) with no answer for this long counts as a cut link, seconds.
STALL_SECONDS = 60.0
#: SSH keepalives: sent after this many idle seconds; the link is dead after KEEPALIVE_COUNT unanswered.
KEEPALIVE_SECONDS = 15.0
KEEPALIVE_COUNT = 4
#: Size of one SFTP read request within a ranged read at most, bytes (asyncssh pipelines them); a
#: server that announces a smaller maximum read length (``limits@openssh.com``: OpenSSH's
#: sftp-server answers at most 255 KiB) gets requests of that size, as a shorter answer costs one
#: more round trip for the rest of the request.
REQUEST_BYTES = 256 * 1024
#: SFTP read requests in flight per ranged read (asyncssh's ``max_requests``): a whole block is requested at once.
REQUESTS_IN_FLIGHT = 32
#: The SSH channel's receive window, bytes: how much the server may send unasked for (asyncssh's
#: default, 2 MiB, refilled at half, holds one stream to about 1.5 MiB per round trip, 125 Mbit/s at 100 ms:
#: below a link's rate once the round trip is longer). It must cover what a stream has requested
#: (``AHEAD_PER_STREAM × BLOCK_BYTES``), so the server never waits for a window adjustment.
WINDOW_BYTES = 16 * 1024 * 1024
#: The SSH compression a connection asks for with a route's ``compression = true``, in order of
#: preference: OpenSSH's zlib after login (its default ``Compression yes``; never zlib before
#: login), else none. Without it: none (stated, not left to asyncssh's defaults).
COMPRESSED = ["zlib@openssh.com", "none"]
UNCOMPRESSED = ["none"]
#: An SSH connection a finished transfer left sound is kept this long for the next transfer
#: from the same server (seconds), then closed.
IDLE_KEEP_SECONDS = 30.0
#: A kept connection taken back must answer its first request within this many seconds, or
#: every kept one of the transfer is dropped and new ones are opened (a link that dropped
#: while they sat idle can leave them half-dead until their keepalives fail).
PROBE_SECONDS = 10.0
#: asyncssh's read length when the server announces none (it then assumes 16 KiB)
_UNANNOUNCED_READ_LEN = 16 * 1024

T = TypeVar("T")

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class SshEndpoint:
    """How this site reaches data location ``location`` of another site over SSH.

    Attributes:
        location: the data location's name (for messages).
        host, port: the SSH server of the site that owns the location.
        user: the account to log in as.
        key_file: the private key this site authenticates with (absolute path).
        known_hosts_file: the OpenSSH known-hosts file the server's host key must be in (absolute).
        root: the location's root as that account sees it (a POSIX path on the remote host).
        connect_timeout_seconds: how long one connection attempt may take, seconds.
    """

    location: str
    host: str
    port: int
    user: str
    key_file: Path
    known_hosts_file: Path
    root: str
    connect_timeout_seconds: float = 30.0

    @property
    def where(self) -> str:
        """``user@host:port`` as operators write it."""
        return f"{self.user}@{self.host}:{self.port}"


def endpoint_for(settings: Settings, location: str) -> SshEndpoint:
    """The :class:`SshEndpoint` of data location ``location`` from its ``[locations.ssh]`` table:
    ``key_file`` and ``known_hosts_file`` resolved like every path of the configuration (``~``,
    relative to the configuration file's folder); ``path`` defaults to the location's ``path``;
    ``user`` to the name of the user this worker runs as (as ``ssh`` does).

    Raises:
        ConfigError: the location is unknown or has no ``ssh`` table.
    """
    try:
        loc = settings.location(location)
    except KeyError:
        raise ConfigError(f"unknown data location {location!r}") from None
    if loc.ssh is None:
        raise ConfigError(f"locations: {location!r} has no [locations.ssh] table; the 'sftp' transfer method reads "
                          "the source site's buffer through it")
    s = loc.ssh
    return SshEndpoint(location=location, host=s.host, port=s.port, user=s.user or getpass.getuser(),
                       key_file=settings.config_path(s.key_file),
                       known_hosts_file=settings.config_path(s.known_hosts_file),
                       root=s.path or str(settings.location_path(location)),
                       connect_timeout_seconds=s.connect_timeout_seconds)


@functools.cache
def _asyncssh() -> tuple[Any, type]:
    """``(the asyncssh module, the SSH client class)``, imported and built on first use (with the
    first :class:`SftpSource`) and kept for the process: asyncssh and cryptography are an eighth
    of ``packhorse run``'s start-up (and of its fork server's), and a site with no SSH route
    never needs them. Two first calls at once may each build the class; either one serves."""
    with warnings.catch_warnings():  # asyncssh names DSA keys, which cryptography deprecates, at import
        warnings.simplefilter("ignore")
        import asyncssh  # noqa: PLC0415 - start-up time (see the docstring)

    class Client(asyncssh.SSHClient):  # type: ignore[misc]
        """Keeps the host key the server offered when it is not in the known-hosts file
        (asyncssh asks this only then), so the refusal can name its fingerprint; never
        trusts it."""

        def __init__(self) -> None:
            self.refused_key: Any = None

        def validate_host_public_key(self, host: str, addr: str, port: int, key: Any) -> bool:
            self.refused_key = key
            return False

    return asyncssh, Client


#: One SSH server and the credentials used there: what a kept connection may be reused for.
_PoolKey = tuple[str, int, str, str, str, bool]


class _ConnectionPool:
    """This process's SSH event loop (one daemon thread) and the connections finished transfers
    left sound, by :data:`_PoolKey`, each kept :data:`IDLE_KEEP_SECONDS` at most (see the
    module). One per process (:func:`_pool`): a forked child makes its own."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sftp", daemon=True)
        self._thread.start()
        self._lock = threading.Lock()
        self._idle: dict[_PoolKey, list[tuple[float, Any, Any]]] = {}  # (since, connection, SFTP client)

    def take(self, key: _PoolKey, n: int) -> list[tuple[Any, Any]]:
        """Up to ``n`` kept connections for ``key`` (the most recently kept first), each
        ``(connection, SFTP client)``; expired or closed ones met on the way are closed."""
        now = time.monotonic()
        out: list[tuple[Any, Any]] = []
        stale: list[Any] = []
        with self._lock:
            kept = self._idle.get(key, [])
            while kept and len(out) < n:
                since, conn, sftp = kept.pop()
                if now - since > IDLE_KEEP_SECONDS or conn.is_closed():
                    stale.append(conn)
                else:
                    out.append((conn, sftp))
        self.discard(stale)
        return out

    def give(self, key: _PoolKey, conns: list[tuple[Any, Any]]) -> None:
        """Keep ``conns`` (sound, their transfer finished) for the next transfer to ``key``."""
        now = time.monotonic()
        with self._lock:
            self._idle.setdefault(key, []).extend((now, c, f) for c, f in conns if not c.is_closed())
        self.loop.call_soon_threadsafe(self.loop.call_later, IDLE_KEEP_SECONDS + 1, self._expire)

    def discard(self, conns: list[Any]) -> None:
        """Close ``conns`` (SSH connections) at once, without the SSH goodbye (called from
        another thread than the loop's)."""
        if not conns:
            return

        async def abort() -> None:
            for conn in conns:
                conn.abort()

        try:
            asyncio.run_coroutine_threadsafe(abort(), self.loop).result(5)
        except Exception:  # noqa: BLE001 - a connection that cannot even be aborted is gone
            pass

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            stale = [c for kept in self._idle.values() for since, c, _ in kept if now - since > IDLE_KEEP_SECONDS]
            for key, kept in list(self._idle.items()):
                self._idle[key] = [k for k in kept if now - k[0] <= IDLE_KEEP_SECONDS]
        for conn in stale:
            conn.abort()


_pool_instance: _ConnectionPool | None = None
_pool_lock = threading.Lock()


def _pool() -> _ConnectionPool:
    """This process's :class:`_ConnectionPool`, made on first use (and anew in a forked child:
    an event loop and its connections never cross a fork)."""
    global _pool_instance
    with _pool_lock:
        if _pool_instance is None or _pool_instance.pid != os.getpid():
            _pool_instance = _ConnectionPool()
        return _pool_instance


class SftpSource:
    """Blocking read access to one data location of another site over SFTP (see the module).

    Args:
        endpoint: where and as whom (:func:`endpoint_for`).
        streams: SSH connections to read one object over at once (>= 1).
        limiter: the transfer's bandwidth share (bytes/s, :class:`~packhorse.ratelimit.RateLimiter`;
            ``None``: unlimited). Every byte read over the link is paid for before it is
            requested, across all streams (the route's ``bandwidth_limit_bytes_per_second``).
        block_bytes: bytes of one ranged read; with a limiter at most about a second of its rate
            (at least 64 KiB), so a cut loses little of what was paid for.
        compression: ask the server for zlib compression of the connections
            (:data:`COMPRESSED`; the route's ``compression``); kept connections are reused only
            by a transfer that asks the same.

    Use as a context manager, or call :meth:`close`: the connections go back to the process for
    the next transfer unless the link failed under them (see the module).
    """

    def __init__(self, endpoint: SshEndpoint, *, streams: int = DEFAULT_STREAMS, limiter: RateLimiter | None = None,
                 block_bytes: int = BLOCK_BYTES, compression: bool = False) -> None:
        if streams < 1:
            raise ValueError(f"streams must be at least 1, not {streams}")
        self._ssh, self._client_class = _asyncssh()
        self.endpoint = endpoint
        self.location = endpoint.location
        self.streams = streams
        self.limiter = limiter
        self.block_bytes = block_bytes
        self.compression = compression
        self._pool = _pool()
        self._loop = self._pool.loop
        self._pool_key: _PoolKey = (endpoint.host, endpoint.port, endpoint.user, str(endpoint.key_file),
                                    str(endpoint.known_hosts_file), compression)
        self._conns: list[tuple[Any, Any]] = []  # (SSHClientConnection, SFTPClient)
        self._reused = 0  # how many of them were kept ones, taken back
        self._broken = False  # the link failed under them: never kept
        self._closed = False
        #: the known-hosts file as read for this connect (:meth:`_read_known_hosts`); ``None``: not yet
        self._known_hosts: tuple[Any, str | None] | None = None
        self._aborted: BaseException | None = None  # abort_range_reads(), from any thread
        self._range_read: Any = None  # the concurrent future of the read_range under way
        #: a payload byte arrived since the last :meth:`connect`: the link carried data, so a cut
        #: now is a new cut (its failure's ``step`` is ``"transfer"``, before that ``"connect"``;
        #: :mod:`packhorse.recovery.link_reachability` dates a cut link by it)
        self._moved = False

    # -- the event loop ------------------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise self._cut(f"no answer for {timeout or 0:.0f} s") from None
        except BaseException:
            fut.cancel()
            raise

    def _cut(self, why: str) -> SshConnectionError:
        """The error of a link that failed: ``step`` ``"transfer"`` once a payload byte had
        arrived since :meth:`connect` (the link worked, this is a new cut), else ``"connect"``
        (it has not carried data since the last failure: the same cut goes on)."""
        self._broken = True  # the connections are closed at the end, never kept
        e = self.endpoint
        return SshConnectionError(
            f"data location {e.location}: the SSH connection to {e.where} failed or was cut: {why}",
            step=SshConnectionError.AFTER_DATA if self._moved else SshConnectionError.BEFORE_DATA,
            side="source", host=e.host,
            diagnosis=f"the link to {e.host} port {e.port} is down or the SSH server there stopped; the transfer "
                      "resumes from its partial by itself once it answers again")

    # -- connections ---------------------------------------------------------------------
    def _read_known_hosts(self) -> tuple[Any, str | None]:
        """The known-hosts file (asyncssh's ``SSHKnownHosts``, ``None`` if unreadable) and why it
        could not be read (``None`` if it could): read at most once per :meth:`connect` (which
        forgets the last reading), for the kept connections' trust (:meth:`_still_trusted`) and
        every new login (:meth:`_connect_one`) alike."""
        if self._known_hosts is None:
            try:
                self._known_hosts = (self._ssh.read_known_hosts(str(self.endpoint.known_hosts_file)), None)
            except (OSError, ValueError) as exc:
                self._known_hosts = (None, str(exc))
        return self._known_hosts

    def _known(self) -> Any:
        """The known-hosts file for a login (:meth:`_read_known_hosts`).

        Raises:
            HostKeyError: the file cannot be read (permanent: a configuration to fix).
        """
        known, unreadable = self._read_known_hosts()
        if known is None:
            e = self.endpoint
            raise HostKeyError(f"data location {e.location}: cannot read the known-hosts file {e.known_hosts_file}: "
                               f"{unreadable}", step="connect", side="source", host=e.host,
                               path=str(e.known_hosts_file),
                               diagnosis="set [locations.ssh] known_hosts_file to a readable file listing the "
                                         "host key of " + e.host)
        return known

    async def _connect_one(self) -> tuple[Any, Any]:
        e = self.endpoint
        client = self._client_class()
        known = self._known()
        try:
            key = self._ssh.read_private_key(str(e.key_file))
        except (OSError, ValueError, self._ssh.KeyImportError) as exc:
            raise SshAuthenticationError(
                f"data location {e.location}: cannot read the SSH key file {e.key_file} (user {e.user} at "
                f"{e.host}:{e.port}): {exc}", step="connect", side="source", host=e.host, path=str(e.key_file),
                diagnosis="set [locations.ssh] key_file to a readable private key without a passphrase") from None
        try:
            conn, _ = await asyncio.wait_for(self._ssh.create_connection(
                lambda: client, e.host, e.port, username=e.user, client_keys=[key], known_hosts=known,
                agent_path=None, config=None, preferred_auth="publickey", password=None,
                keepalive_interval=KEEPALIVE_SECONDS, keepalive_count_max=KEEPALIVE_COUNT, window=WINDOW_BYTES,
                login_timeout=e.connect_timeout_seconds,
                compression_algs=COMPRESSED if self.compression else UNCOMPRESSED), e.connect_timeout_seconds)
        except self._ssh.HostKeyNotVerifiable as exc:
            raise self._host_key_error(client.refused_key, known, str(exc)) from None
        except self._ssh.PermissionDenied as exc:
            raise SshAuthenticationError(
                f"data location {e.location}: {e.where} refused user {e.user} with the key {e.key_file}: "
                f"{exc.reason or exc}", step="connect", side="source", host=e.host, path=str(e.key_file),
                diagnosis=f"add the public key of {e.key_file} to ~{e.user}/.ssh/authorized_keys on {e.host}, or "
                          "fix [locations.ssh] user / key_file") from None
        except (OSError, self._ssh.Error, TimeoutError) as exc:
            raise self._cut(f"{type(exc).__name__}: {exc}") from None
        try:
            sftp = await asyncio.wait_for(conn.start_sftp_client(), e.connect_timeout_seconds)
        except (OSError, self._ssh.Error, TimeoutError) as exc:
            conn.abort()
            raise self._cut(f"the SFTP session could not start: {type(exc).__name__}: {exc}") from None
        return conn, sftp

    def _still_trusted(self, kept: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        """The kept connections whose server host key is still listed for the host in the
        known-hosts file (read now, once for this connect: :meth:`_read_known_hosts`); the others
        are closed. A connection was trusted at its login; a key the operators have removed from
        the file since is trusted no longer."""
        if not kept:
            return kept
        e = self.endpoint
        known, _ = self._read_known_hosts()
        if known is not None:
            trusted, _, revoked, *_ = known.match(e.host, "", e.port)
        else:
            trusted, revoked = [], []  # unreadable now: the next login says why
        listed = {k.public_data for k in trusted} - {k.public_data for k in revoked}
        good, gone = [], []
        for conn, sftp in kept:
            key = conn.get_server_host_key()
            (good if key is not None and key.public_data in listed else gone).append((conn, sftp))
        self._pool.discard([c for c, _ in gone])
        return good

    def _probe(self) -> tuple[bool, Any]:
        """Ask every kept connection of :attr:`_conns` one short question (a ``stat`` of the
        remote root, :data:`PROBE_SECONDS` at most, all at once); close those that do not
        answer (a link that dropped while they sat idle can leave them half-dead until their
        keepalives fail), so :meth:`_ensure` replaces them with new logins.

        Returns:
            ``(True, attrs)``: the answer of the connection now first in :attr:`_conns` (the
            root's SFTP attributes, ``None`` when it is not there), which :meth:`connect` takes
            for its root check instead of asking again; ``(False, None)`` when none answered.
        """
        root = self.endpoint.root
        ssh = self._ssh

        async def ask(sftp: Any) -> tuple[bool, Any]:
            try:
                return True, await asyncio.wait_for(sftp.stat(root, follow_symlinks=False), PROBE_SECONDS)
            except ssh.SFTPNoSuchFile:
                return True, None  # it answered (the root's absence is judged after)
            except (OSError, ssh.Error, TimeoutError):
                return False, None

        async def ask_all() -> list[tuple[bool, Any]]:
            return list(await asyncio.gather(*(ask(f) for _, f in self._conns)))

        answers = self._run(ask_all(), PROBE_SECONDS + 5)
        dead = [c for (c, _), (ok, _) in zip(self._conns, answers) if not ok]
        if dead:
            self._pool.discard(dead)
            self._conns = [(c, f) for (c, f), (ok, _) in zip(self._conns, answers) if ok]
            self._reused = len(self._conns)
        return next(((True, attrs) for ok, attrs in answers if ok), (False, None))

    def _host_key_error(self, key: Any, known: Any, detail: str) -> HostKeyError:
        e = self.endpoint
        fingerprint = key.get_fingerprint("sha256") if key is not None else "(not offered)"
        listed = known.match(e.host, "", e.port)[0] if key is not None else []
        what = "changed: it is not the one listed" if listed else "unknown: no key is listed"
        return HostKeyError(
            f"data location {e.location}: the host key of {e.host} port {e.port} is {what} for it in "
            f"{e.known_hosts_file} (offered {key.get_algorithm() if key is not None else '?'} key {fingerprint}); "
            f"refusing to connect ({detail})", step="connect", side="source", host=e.host,
            path=str(e.known_hosts_file),
            diagnosis=(f"check the fingerprint {fingerprint} with the operators of {e.host}, then add the key to "
                       f"{e.known_hosts_file} (`ssh-keyscan -p {e.port} {e.host}`); it is never trusted on first use"))

    def _ensure(self, n: int) -> None:
        """Have at least ``n`` open connections; the missing ones are opened at once, not one
        after another: an SSH login is a dozen round trips (about 1.3 s over a 100 ms round
        trip), so opening four streams in turn cost a transfer four of them
        (docs/benchmarks.md, "20,000 small files over a long thin link").

        Raises:
            HostKeyError / SshAuthenticationError: as :meth:`connect` (preferred over a cut
                link when both happen: they are permanent); the connections that did open are kept.
            SshConnectionError: a connection could not be opened.
        """
        missing = n - len(self._conns)
        if missing <= 0:
            return

        async def open_all() -> list[Any]:
            return await asyncio.gather(*(self._connect_one() for _ in range(missing)), return_exceptions=True)

        opened = self._run(open_all(), self.endpoint.connect_timeout_seconds + 5)
        self._conns.extend(c for c in opened if not isinstance(c, BaseException))
        failed = [c for c in opened if isinstance(c, BaseException)]
        if failed:
            raise next((c for c in failed if not isinstance(c, SshConnectionError)), failed[0])

    @property
    def compression_in_use(self) -> set[str]:
        """The compression the open connections receive with, as negotiated with the server
        (``{"none"}``, or ``{"zlib@openssh.com"}`` with :attr:`compression` where the server
        allows it; the empty set before :meth:`connect`)."""
        return {str(conn.get_extra_info("recv_compression")) for conn, _ in self._conns}

    def connect(self) -> None:
        """Open the connections (all :attr:`streams` at once) and check the remote root over
        the first: there and carrying the location's identity marker, naming this location
        (storage that is absent is not empty; the marker's uuid is left to the owning site's
        own checks). When kept connections were taken, the first's answer to :meth:`_probe` (a
        ``stat`` of the root) is that check's answer: the root is asked about once per connect.

        Raises:
            HostKeyError / SshAuthenticationError: permanent, a configuration to fix.
            SshConnectionError: the server cannot be reached now.
            LocationUnavailableError: the remote root or its identity marker is missing.
        """
        fresh = not self._conns
        self._moved = False
        probed, root_attrs = False, None
        self._known_hosts = None  # read again, once, for the kept connections' trust and the new logins alike
        if fresh:
            taken = self._pool.take(self._pool_key, self.streams)
            self._conns = self._still_trusted(taken)
            untrusted = len(taken) - len(self._conns)
            if self._conns:  # the first kept one that answered stays first: its answer is the root check's
                probed, root_attrs = self._probe()
            self._reused = len(self._conns)
        try:
            self._ensure(self.streams)
        except (HostKeyError, SshAuthenticationError):
            self._broken = True  # nothing of this server is kept while it is not trusted
            raise
        if fresh:  # INFO: which of the transfer's connections were kept ones (else only sshd's log says)
            log.info("ssh_connections", location=self.location, server=self.endpoint.where, kept=self._reused,
                     opened=len(self._conns) - self._reused,
                     dropped=len(taken) - self._reused, dropped_untrusted=untrusted,
                     compression=",".join(sorted(self.compression_in_use)))
        root = self.endpoint.root
        there = root_attrs if probed else self._stat_path(root)
        if there is None:
            why = f"its root {root} is not there on {self.endpoint.host}"
            raise LocationUnavailableError(f"data location {self.location}: {why}", location=self.location,
                                           reason=why)
        if self._stat_path(self._path(MARKER_KEY)) is None:
            why = f"its root {root} on {self.endpoint.host} has no identity marker {MARKER_KEY}"
            raise LocationUnavailableError(f"data location {self.location}: {why}", location=self.location,
                                           reason=why, marker_only=True)
        raw = self.read_range(MARKER_KEY, 0, MAX_MARKER_BYTES + 1)
        try:
            named = json.loads(raw.decode("utf-8")).get("location")
        except (UnicodeDecodeError, ValueError, AttributeError):
            named = None
        if named != self.location:  # another location's storage (or no marker at all) at that root
            why = (f"the identity marker {MARKER_KEY} under {root} on {self.endpoint.host} names "
                   f"{named!r}, not this location" if named else
                   f"{MARKER_KEY} under {root} on {self.endpoint.host} is not a packhorse location marker")
            raise LocationUnavailableError(f"data location {self.location}: {why}", location=self.location,
                                           reason=why)

    def close(self) -> None:
        """Hand the connections back to the process for the next transfer to the same server
        (:data:`IDLE_KEEP_SECONDS`), or close them if the link failed under them; idempotent."""
        if self._closed:
            return
        self._closed = True
        conns, self._conns = self._conns, []
        if self._broken:
            self._pool.discard([c for c, _ in conns])
        else:
            self._pool.give(self._pool_key, conns)

    def __enter__(self) -> "SftpSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------------
    def _path(self, key: str) -> str:
        return str(PurePosixPath(self.endpoint.root) / check_key(key))

    def _stat_path(self, path: str) -> Any:
        async def go() -> Any:
            try:
                return await self._conns[0][1].stat(path, follow_symlinks=False)
            except self._ssh.SFTPNoSuchFile:
                return None
        try:
            return self._run(go(), STALL_SECONDS)
        except (OSError, self._ssh.Error) as exc:
            raise self._cut(f"stat {path}: {type(exc).__name__}: {exc}") from None

    def stat(self, key: str) -> ObjectInfo | None:
        """The object ``key``'s size (bytes) and mtime, or ``None`` if there is none (a link or
        anything but a regular file counts as none: never followed, I6).

        Raises:
            SshConnectionError, HostKeyError, SshAuthenticationError: as :meth:`connect`.
        """
        self._ensure(1)
        attrs = self._stat_path(self._path(key))
        if attrs is None or attrs.type != self._ssh.FILEXFER_TYPE_REGULAR:
            return None
        return ObjectInfo(key, int(attrs.size or 0), float(attrs.mtime or 0))

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes of ``key`` from byte ``offset`` (fewer at its end), over the first
        connection, paid for at the limiter.

        Raises:
            SourceMissingError: no object under ``key``.
            SshConnectionError: the link was cut or stalled.
        """
        self._ensure(1)
        if self.limiter is not None:
            self.limiter.take(length)
        fut = asyncio.run_coroutine_threadsafe(self._read(self._conns[0][1], key, offset, length), self._loop)
        self._range_read = fut
        try:
            if self._aborted is not None:  # set before abort_range_reads() could see this read
                raise self._aborted
            return fut.result(STALL_SECONDS)
        except TimeoutError:
            raise self._cut(f"no answer for {STALL_SECONDS:.0f} s") from None
        except concurrent.futures.CancelledError:
            if self._aborted is not None:
                raise self._aborted from None
            raise
        finally:
            self._range_read = None
            fut.cancel()  # no-op once it is done

    def abort_range_reads(self, exc: BaseException) -> None:
        """Make the :meth:`read_range` waiting in another thread, and every later one, raise
        ``exc`` at once instead of waiting up to ``STALL_SECONDS`` on a stalled link (the read is
        cancelled; the connections are then not kept). Thread-safe, never blocks, idempotent
        (the first ``exc`` stays). The ``sftp`` pull calls it when its lease is lost while it
        compares a taken-over partial with the source
        (:meth:`packhorse.operations.lease.LeaseKeeper.on_lost`; docs/reliability.md
        "Resumable transfers")."""
        if self._aborted is not None:
            return
        self._aborted = exc
        self._broken = True
        fut = self._range_read
        if fut is not None:
            fut.cancel()

    async def _open(self, sftp: Any, key: str) -> Any:
        """Open ``key`` for reading on one SFTP session (an asyncssh file: pipelined requests)."""
        path = self._path(key)
        announced = sftp.limits.max_read_len
        request = min(REQUEST_BYTES, announced) if announced > _UNANNOUNCED_READ_LEN else REQUEST_BYTES
        try:
            return await sftp.open(path, "rb", block_size=request, max_requests=REQUESTS_IN_FLIGHT)
        except self._ssh.SFTPNoSuchFile:
            raise SourceMissingError(f"{self.location}: {key!r} does not exist on {self.endpoint.host} ({path})",
                                     step="transfer", side="source", path=key, host=self.endpoint.host) from None
        except (OSError, self._ssh.Error) as exc:
            raise self._cut(f"opening {path}: {type(exc).__name__}: {exc}") from None

    async def _read_at(self, f: Any, key: str, offset: int, length: int) -> bytes:
        try:
            data = bytes(await f.read(length, offset))
        except (OSError, self._ssh.Error) as exc:
            raise self._cut(f"reading {self._path(key)}: {type(exc).__name__}: {exc}") from None
        self._moved = self._moved or bool(data)
        return data

    async def _read(self, sftp: Any, key: str, offset: int, length: int) -> bytes:
        f = await self._open(sftp, key)
        try:
            return await self._read_at(f, key, offset, length)
        finally:
            try:
                await f.close()
            except (OSError, self._ssh.Error):
                pass  # the session is gone: so is the handle

    def open_read(self, key: str, *, offset: int = 0, size: int,
                  on_read: Callable[[], None] | None = None) -> "ParallelReader":
        """Read ``key`` from byte ``offset`` to ``size`` (its length, bytes, as recorded) over
        :attr:`streams` connections at once, in blocks of :attr:`block_bytes`, returned in order.

        ``on_read`` is called before each ``readinto`` of the caller (the transfer refreshes its
        share of the route's limit there).

        Raises (from the reader's reads):
            SourceMissingError / SshConnectionError: as :meth:`read_range`.
        """
        self._ensure(self.streams)
        return ParallelReader(self, key, offset, size, on_read)


class ParallelReader:
    """A binary file object over ranged reads of one remote object by several streams: each
    stream keeps ``AHEAD_PER_STREAM`` blocks requested at once, at most
    ``streams × (AHEAD_PER_STREAM + 1)`` blocks ahead of the caller, and they are returned by
    :meth:`readinto` / :meth:`read` strictly in order. Closing it cancels what is still in
    flight (the connections stay open). :meth:`abort` (from any thread) makes a waiting or
    later read raise at once."""

    def __init__(self, source: SftpSource, key: str, offset: int, size: int,
                 on_read: Callable[[], None] | None) -> None:
        self._src = source
        self._key = key
        self._on_read = on_read
        block = source.block_bytes
        if source.limiter is not None and source.limiter.rate:
            block = min(block, max(64 * 1024, int(source.limiter.rate)))
        self._blocks = [(o, min(block, size - o)) for o in range(offset, size, block)]
        rate = source.limiter.rate if source.limiter is not None else None
        #: seconds the caller waits for its next block at most (then the link counts as cut)
        self._patience = STALL_SECONDS * 2 + (source.streams * (AHEAD_PER_STREAM + 1) * block / rate
                                               if rate else 0)
        self._next = 0  # the next block the caller gets
        self._buf = memoryview(b"")
        self._done: dict[int, bytes] = {}
        self._error: BaseException | None = None
        self._cond: asyncio.Condition | None = None
        self._tasks: list[Any] = []
        self._started = False
        self._aborted: BaseException | None = None  # set by abort(), from any thread

    async def _start(self) -> None:
        self._cond = asyncio.Condition()
        if self._aborted is not None:  # aborted before the first read: nothing is requested
            self._error = self._aborted
        taken = iter(range(len(self._blocks)))
        window = self._src.streams * (AHEAD_PER_STREAM + 1)
        limiter = self._src.limiter

        async def stream(sftp: Any) -> None:
            try:
                f = await asyncio.wait_for(self._src._open(sftp, self._key), STALL_SECONDS)
            except TimeoutError:
                await fail(self._src._cut(f"opening {self._key} stalled for {STALL_SECONDS:.0f} s"))
                return
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                await fail(exc)
                return
            try:  # AHEAD_PER_STREAM ranged reads at once on this stream's file handle
                await asyncio.gather(*(blocks(f) for _ in range(AHEAD_PER_STREAM)))
            finally:
                try:
                    await f.close()
                except (OSError, self._src._ssh.Error):
                    pass  # the session is gone: so is the handle

        async def fail(err: BaseException) -> None:
            assert self._cond is not None
            async with self._cond:
                if self._error is None:
                    self._error = err
                self._cond.notify_all()

        async def blocks(f: Any) -> None:
            assert self._cond is not None
            for i in taken:
                async with self._cond:
                    await self._cond.wait_for(lambda: i < self._next + window or self._error is not None)
                if self._error is not None:
                    return
                offset, length = self._blocks[i]
                if limiter is not None and limiter.rate:
                    await asyncio.to_thread(limiter.take, length)
                try:
                    data = await asyncio.wait_for(self._src._read_at(f, self._key, offset, length), STALL_SECONDS)
                    if len(data) != length:
                        raise SourceMissingError(
                            f"{self._src.location}: {self._key!r} ended at {offset + len(data):,} bytes on "
                            f"{self._src.endpoint.host}, shorter than the {self._blocks[-1][0] + self._blocks[-1][1]:,} "
                            "recorded", step="transfer", side="source", path=self._key, host=self._src.endpoint.host)
                except TimeoutError:
                    err: BaseException = self._src._cut(f"a ranged read stalled for {STALL_SECONDS:.0f} s")
                except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                    err = exc
                else:
                    async with self._cond:
                        self._done[i] = data
                        self._cond.notify_all()
                    continue
                await fail(err)
                return

        self._tasks = [asyncio.ensure_future(stream(sftp)) for _, sftp in self._src._conns[:self._src.streams]]

    async def _take(self, i: int) -> bytes:
        assert self._cond is not None
        async with self._cond:
            await self._cond.wait_for(lambda: i in self._done or self._error is not None)
            if i in self._done:
                data = self._done.pop(i)
                self._next = i + 1
                self._cond.notify_all()
                return data
            assert self._error is not None
            raise self._error

    def readinto(self, buffer: Any) -> int:
        """Fill ``buffer`` with the next bytes (fewer at a block's end); 0 at the end.

        Raises:
            SourceMissingError / SshConnectionError: as :meth:`SftpSource.read_range`.
            the error given to :meth:`abort`, once it was called.
        """
        if self._aborted is not None:
            raise self._aborted
        if self._on_read is not None:
            self._on_read()
        if not self._buf:
            if self._next >= len(self._blocks):
                return 0
            if not self._started:
                self._src._run(self._start())
                self._started = True
            # a stream that stalls is cut by its own timeout; this one only guards against a lost
            # wake-up, beyond the time the limiter may make the blocks ahead of this one wait
            self._buf = memoryview(self._src._run(self._take(self._next), self._patience))
            if self._aborted is not None:
                raise self._aborted
        with memoryview(buffer) as view:
            n = min(len(view), len(self._buf))
            view[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (``-1``: up to the end)."""
        out = bytearray()
        chunk = bytearray(BLOCK_BYTES if size < 0 else min(size, BLOCK_BYTES))
        while size < 0 or len(out) < size:
            want = len(chunk) if size < 0 else min(len(chunk), size - len(out))
            n = self.readinto(memoryview(chunk)[:want])
            if not n:
                break
            out += chunk[:n]
        return bytes(out)

    def abort(self, exc: BaseException) -> None:
        """Make the read waiting in :meth:`readinto` (in another thread) and every later one
        raise ``exc`` at once, instead of waiting up to its patience (``2 × STALL_SECONDS``
        and more) for a stalled link; the block reads in flight are cancelled and the source's
        connections are not kept (:meth:`SftpSource.close`: a cancelled request may still be
        answered on them). Thread-safe, never blocks, idempotent (the first ``exc`` stays).
        The ``sftp`` pull calls it when its lease is lost
        (:meth:`packhorse.operations.lease.LeaseKeeper.on_lost`): the stale attempt then
        suspends its partial and frees its lock for the successor without delay
        (docs/reliability.md "Resumable transfers")."""
        if self._aborted is not None:
            return
        self._aborted = exc
        self._src._broken = True

        async def wake() -> None:
            if self._cond is None:  # not started: _start() sees _aborted
                return
            async with self._cond:
                self._error = exc
                self._cond.notify_all()
            for t in self._tasks:
                t.cancel()

        loop = self._src._loop
        if loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(wake(), loop)
            except RuntimeError:  # the loop closed meanwhile: no read can be waiting on it
                pass

    def close(self) -> None:
        """Cancel the reads still in flight; idempotent."""
        tasks, self._tasks = self._tasks, []
        if tasks and self._src._loop.is_running():
            async def cancel() -> None:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            try:
                self._src._run(cancel(), 10)
            except Exception:  # noqa: BLE001 - the connection may be gone already
                pass

    def __enter__(self) -> "ParallelReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
