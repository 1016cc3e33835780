"""Wrapping layers of a storage backend: each adds one concern, none changes the contract.

A layer is a :class:`~packhorse.storage.base.StorageBackend` around another one (restic's
backend layers). :func:`packhorse.storage.registry.compose` stacks them in one place, in this
order from the caller inwards::

    LoggingLayer → RetryLayer → ReadRateLayer (fixity reads only) → hooks' fault layer → backend

* :class:`LoggingLayer` logs every publication, deletion, quarantine and partial cleanup once,
  after any retries (location, key, bytes, seconds).
* :class:`RetryLayer` is the only retry loop of the storage stack: it retries
  :class:`~packhorse.errors.StorageBusyError` ("try again now") of ``open_write`` and
  ``publish`` a few times with a short growing pause. Every other error goes up unchanged:
  an operation's failure is retried by the operation lifecycle, with backoff (DESIGN.md
  "Architecture"), not here.
* :class:`ReadRateLayer` holds reads to a :class:`~packhorse.ratelimit.RateLimiter` (bytes
  per second): the ``fixity_bytes_per_second`` of a location for the fixity audit, a route's
  ``bandwidth_limit_bytes_per_second`` share for a transfer's reads.
* the innermost layer is the one a test's :class:`~packhorse.runtime.hooks.Hooks` returns (faults
  as the medium would show them: a retry sees an injected "busy" like a real one).

Methods a layer does not override (backend-specific ones such as S3's ``retention``) are
forwarded to the backend inside.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import structlog

from packhorse.errors import LocationUnavailableError, StorageBusyError
from packhorse.ratelimit import RateLimiter, ThrottledReader
from packhorse.storage.base import (
    Entry,
    ObjectInfo,
    PendingWrite,
    PublishResult,
    ReuseListing,
    StorageBackend,
)

log = structlog.get_logger(__name__)


class PendingLayer(PendingWrite):
    """A :class:`PendingWrite` around another one, forwarding everything (hashing included:
    the inner write hashes, this one does not hash again)."""

    def __init__(self, inner: PendingWrite) -> None:  # no super().__init__: nothing of its own
        self.inner = inner
        self.key = inner.key

    @property  # type: ignore[override]
    def size(self) -> int:
        return self.inner.size

    @property  # type: ignore[override]
    def closed(self) -> bool:
        return self.inner.closed

    @property
    def sha256(self) -> str:
        return self.inner.sha256

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return self.inner.write(data)

    def defer_hash(self) -> bool:
        return self.inner.defer_hash()

    def _write(self, data: bytes | bytearray | memoryview) -> None:  # pragma: no cover - write() is forwarded
        self.inner.write(data)

    @property  # type: ignore[override]
    def resumed_bytes(self) -> int:
        return self.inner.resumed_bytes

    def open_resumed(self) -> BinaryIO:
        return self.inner.open_resumed()

    def keep_prefix(self, nbytes: int, hasher: Any) -> None:
        self.inner.keep_prefix(nbytes, hasher)

    @property
    def local_path(self) -> Path | None:
        return self.inner.local_path

    def adopt_local_file(self) -> None:
        self.inner.adopt_local_file()

    def publish(self, expected_sha256: str | None = None) -> PublishResult:
        return self.inner.publish(expected_sha256)

    def abort(self) -> None:
        self.inner.abort()

    def suspend(self) -> None:
        self.inner.suspend()


class Layer(StorageBackend):
    """A backend around ``inner`` that forwards every call (subclasses add their concern).

    ``holds``, ``check_same`` and ``sha256`` are not forwarded: the base class implements them
    with this layer's own ``stat`` and ``open_read``, so the layers below (rate, retry, faults)
    apply to the reads that decide "already there" too.
    """

    def __init__(self, inner: StorageBackend) -> None:
        self.inner = inner
        self.location = inner.location

    @property  # type: ignore[override]
    def cold(self) -> bool:
        return self.inner.cold

    def __getattr__(self, name: str) -> Any:  # backend-specific extras (probe, retention, root)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property  # type: ignore[override]
    def restore_poll_seconds(self) -> float:
        return self.inner.restore_poll_seconds

    def request_restore(self, key: str) -> None:
        self.inner.request_restore(key)

    def adopt_existing(self, key: str) -> None:
        self.inner.adopt_existing(key)

    def restore_ready(self, key: str) -> bool:
        return self.inner.restore_ready(key)

    def root_missing(self) -> str | None:
        return self.inner.root_missing()

    def create_root(self) -> bool:
        return self.inner.create_root()

    def write_fault(self) -> LocationUnavailableError | None:
        return self.inner.write_fault()

    def deferred_sync(self) -> contextlib.AbstractContextManager[None]:
        return self.inner.deferred_sync()

    def stat(self, key: str) -> ObjectInfo | None:
        return self.inner.stat(key)

    def open_read(self, key: str) -> BinaryIO:
        return self.inner.open_read(key)

    def open_write(self, key: str) -> PendingWrite:
        return self.inner.open_write(key)

    def open_resumable_write(self, key: str, token: int, *, wait_for_held_seconds: float = 0.0,
                             while_waiting: Callable[[], None] | None = None) -> PendingWrite:
        return self.inner.open_resumable_write(key, token, wait_for_held_seconds=wait_for_held_seconds,
                                               while_waiting=while_waiting)

    def delete(self, key: str, *, prune: bool = True) -> bool:
        return self.inner.delete(key, prune=prune)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self.inner.list(prefix)

    def walk(self, prefix: str = "", *, reuse: ReuseListing | None = None,
             everything: bool = False) -> Iterator[Entry]:
        return self.inner.walk(prefix, reuse=reuse, everything=everything)

    def cleanup_partials(self, older_than_seconds: float, *, resumable_older_than_seconds: float | None = None) -> int:
        return self.inner.cleanup_partials(older_than_seconds, resumable_older_than_seconds=resumable_older_than_seconds)

    def remove_partials_of(self, key: str) -> int:
        return self.inner.remove_partials_of(key)

    def quarantine(self, key: str) -> str | None:
        return self.inner.quarantine(key)

    def local_path(self, key: str) -> Path | None:
        return self.inner.local_path(key)

    def layers(self) -> list[str]:
        """Class names of this stack from the outside in, ending with the backend's."""
        inner = self.inner
        rest = inner.layers() if isinstance(inner, Layer) else [type(inner).__name__]
        return [type(self).__name__, *rest]


def innermost(backend: StorageBackend) -> StorageBackend:
    """The backend at the bottom of a layer stack (``backend`` itself if it is not a layer)."""
    while isinstance(backend, Layer):
        backend = backend.inner
    return backend


# ------------------------------------------------------------------------------ retry


class _RetryingPending(PendingLayer):
    def __init__(self, inner: PendingWrite, layer: "RetryLayer") -> None:
        super().__init__(inner)
        self._layer = layer

    def publish(self, expected_sha256: str | None = None) -> PublishResult:
        return self._layer._retry("publish", self.key, lambda: self.inner.publish(expected_sha256))


class RetryLayer(Layer):
    """Retries :class:`~packhorse.errors.StorageBusyError` of ``open_write`` and ``publish``.

    Args:
        inner: the backend below.
        attempts: tries in all (the first included); the last error goes up.
        base_delay_seconds: pause after the first busy answer; the n-th pause is n times it.
        sleep: how to pause (injected by unit tests).
    """

    def __init__(self, inner: StorageBackend, *, attempts: int = 10, base_delay_seconds: float = 0.05,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(inner)
        self.attempts = max(1, attempts)
        self.base_delay = base_delay_seconds
        self.sleep = sleep

    def _retry(self, what: str, key: str, call: Callable[[], Any]) -> Any:
        for attempt in range(1, self.attempts + 1):
            try:
                return call()
            except StorageBusyError as e:
                if attempt == self.attempts:
                    raise
                log.debug("storage_busy_retry", location=self.location, key=key, action=what, attempt=attempt,
                          error=str(e))
                self.sleep(self.base_delay * attempt)
        raise AssertionError("unreachable")

    def open_write(self, key: str) -> PendingWrite:
        return _RetryingPending(self._retry("open_write", key, lambda: self.inner.open_write(key)), self)

    def open_resumable_write(self, key: str, token: int, *, wait_for_held_seconds: float = 0.0,
                             while_waiting: Callable[[], None] | None = None) -> PendingWrite:
        return _RetryingPending(self._retry("open_write", key, lambda: self.inner.open_resumable_write(
            key, token, wait_for_held_seconds=wait_for_held_seconds, while_waiting=while_waiting)), self)


# ------------------------------------------------------------------------------ logging


class _LoggedPending(PendingLayer):
    def __init__(self, inner: PendingWrite, location: str) -> None:
        super().__init__(inner)
        self._location = location
        self._started = time.monotonic()

    def publish(self, expected_sha256: str | None = None) -> PublishResult:
        try:
            result = self.inner.publish(expected_sha256)
        except Exception as e:
            log.warning("storage_publish_failed", location=self._location, key=self.key, bytes=self.size,
                        error_type=type(e).__name__, error=str(e))
            raise
        log.debug("storage_published", location=self._location, key=self.key, bytes=result.size,
                  seconds=round(time.monotonic() - self._started, 3), already_there=result.already_there)
        return result


class LoggingLayer(Layer):
    """Logs what changes the medium: publications (DEBUG; WARNING when one fails), deletions
    (DEBUG), quarantines (WARNING), partial cleanups that removed something (INFO)."""

    def open_write(self, key: str) -> PendingWrite:
        return _LoggedPending(self.inner.open_write(key), self.location)

    def open_resumable_write(self, key: str, token: int, *, wait_for_held_seconds: float = 0.0,
                             while_waiting: Callable[[], None] | None = None) -> PendingWrite:
        pending = self.inner.open_resumable_write(key, token, wait_for_held_seconds=wait_for_held_seconds,
                                                  while_waiting=while_waiting)
        if pending.resumed_bytes:
            log.info("storage_partial_taken_over", location=self.location, key=key, attempt=token,
                     unverified_bytes=pending.resumed_bytes)
        return _LoggedPending(pending, self.location)

    def delete(self, key: str, *, prune: bool = True) -> bool:
        removed = self.inner.delete(key, prune=prune)
        log.debug("storage_deleted", location=self.location, key=key, existed=removed)
        return removed

    def quarantine(self, key: str) -> str | None:
        moved = self.inner.quarantine(key)
        if moved is not None:
            log.warning("storage_quarantined", location=self.location, key=key, moved_to=moved)
        return moved

    def cleanup_partials(self, older_than_seconds: float, *, resumable_older_than_seconds: float | None = None) -> int:
        n = self.inner.cleanup_partials(older_than_seconds, resumable_older_than_seconds=resumable_older_than_seconds)
        if n:
            log.info("storage_partials_removed", location=self.location, count=n,
                     older_than_seconds=older_than_seconds, resumable_older_than_seconds=resumable_older_than_seconds)
        return n


# ------------------------------------------------------------------------------ read rate


_limiters: dict[str, RateLimiter] = {}
_limiters_lock = threading.Lock()


def limiter_for(location: str, bytes_per_second: float | None) -> RateLimiter:
    """The process-wide :class:`RateLimiter` of ``location`` (one bucket shared by every
    reader of the location in this process; a changed rate starts a new bucket)."""
    with _limiters_lock:
        lim = _limiters.get(location)
        if lim is None or lim.rate != bytes_per_second:
            lim = _limiters[location] = RateLimiter(bytes_per_second)
        return lim


class ReadRateLayer(Layer):
    """Holds every byte read through ``open_read`` (and so ``sha256``) to ``limiter``
    (:class:`~packhorse.ratelimit.ThrottledReader`; ``on_read`` is called before each read)."""

    def __init__(self, inner: StorageBackend, limiter: RateLimiter,
                 on_read: Callable[[], None] | None = None) -> None:
        super().__init__(inner)
        self.limiter = limiter
        self.on_read = on_read

    def open_read(self, key: str) -> BinaryIO:
        return ThrottledReader(self.inner.open_read(key), self.limiter, self.on_read)  # type: ignore[return-value]
