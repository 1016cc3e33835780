"""An in-memory storage backend with the contract of :mod:`packhorse.storage.base`, for fast
unit tests (test-only: packhorse never builds it). The conformance suite
(``tests/conformance/test_storage_contract.py``) holds it to the same contract as the disk and
S3 backends.

Objects live in a dict under a lock; a pending write spools its bytes in memory and nothing is
visible before ``publish`` (like S3, a killed writer leaves nothing on the "medium").
``publish`` is a conditional create under the lock; an existing key is decided by
:meth:`~packhorse.storage.base.StorageBackend.holds`. :class:`ColdLayer` makes any backend a
cold store whose restores take ``restore_seconds`` of an injected clock.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from packhorse.errors import (
    DestinationConflictError,
    LocationUnavailableError,
    RestoreRequiredError,
    SourceMissingError,
)
from packhorse.storage.base import (
    RESERVED_PREFIX,
    Entry,
    EntryKind,
    ObjectInfo,
    PendingWrite,
    PublishResult,
    ReuseListing,
    StorageBackend,
    check_key,
)
from packhorse.storage.layers import Layer, PendingLayer

#: where :class:`ColdLayer` keeps its restore requests (never listed)
RESTORE_PREFIX = RESERVED_PREFIX + "restore/"


class _MemoryPending(PendingWrite):
    def __init__(self, backend: "MemoryBackend", key: str) -> None:
        super().__init__(key)
        self._b = backend
        self._buf: io.BytesIO | None = io.BytesIO()

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        assert self._buf is not None, "write after publish or abort"
        self._buf.write(data)

    def publish(self, expected_sha256: str | None = None) -> PublishResult:
        try:
            sha = self.check_expected(expected_sha256, self._b.location)
            assert self._buf is not None
            created = self._b._create(self.key, self._buf.getvalue())
            if not created:
                self._b.check_same(self.key, self.size, sha)
            return PublishResult(self.key, self.size, sha, already_there=not created)
        finally:
            self.abort()

    def abort(self) -> None:
        self._buf = None
        self.closed = True


class MemoryBackend(StorageBackend):
    """A data location held in memory (see the module docstring).

    Args:
        location: the data location's name, for messages.
        clock: UTC seconds for ``mtime`` (injected by tests).
    """

    def __init__(self, location: str, *, clock: Callable[[], float] = time.time) -> None:
        self.location = location
        self._clock = clock
        self._lock = threading.Lock()
        self._objects: dict[str, tuple[bytes, float]] = {}
        #: false: the location is "unmounted" (:meth:`walk` raises LocationUnavailableError)
        self.available = True

    def _create(self, key: str, data: bytes) -> bool:
        with self._lock:
            if key in self._objects:
                return False
            self._objects[key] = (data, self._clock())
            return True

    def stat(self, key: str) -> ObjectInfo | None:
        check_key(key)
        with self._lock:
            found = self._objects.get(key)
        if found is None:
            return None
        return ObjectInfo(key, len(found[0]), found[1], int(found[1] * 1e9))

    def open_read(self, key: str) -> BinaryIO:
        check_key(key)
        with self._lock:
            found = self._objects.get(key)
        if found is None:
            raise SourceMissingError(f"{self.location}: {key!r} does not exist", side="source", path=key,
                                     host=self.location)
        return io.BytesIO(found[0])

    def open_write(self, key: str) -> PendingWrite:
        check_key(key)
        return _MemoryPending(self, key)

    def delete(self, key: str, *, prune: bool = True) -> bool:
        check_key(key)
        with self._lock:
            return self._objects.pop(key, None) is not None

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        with self._lock:
            items = sorted(self._objects.items())
        return iter([ObjectInfo(k, len(d), t) for k, (d, t) in items
                     if k.startswith(prefix) and not k.startswith(RESERVED_PREFIX)])

    def walk(self, prefix: str = "", *, reuse: ReuseListing | None = None,
             everything: bool = False) -> Iterator[Entry]:
        """Like an object store's (no folders of its own, ``reuse`` never called): the start
        ``FOLDER`` entry, then every object under ``prefix`` as a ``FILE``, sorted by key.
        Raises :class:`LocationUnavailableError` while :attr:`available` is false (a test's
        unmounted volume)."""
        if not self.available:
            raise LocationUnavailableError(f"data location {self.location}: location unavailable (memory backend "
                                           "switched off)", location=self.location, reason="switched off")
        if prefix:
            check_key(prefix)
        start = f"{prefix}/" if prefix else ""
        with self._lock:
            items = sorted(self._objects.items())
        yield Entry(prefix, EntryKind.FOLDER, 0, 0)
        for k, (d, t) in items:
            if k.startswith(start) and (everything or not k.startswith(RESERVED_PREFIX)):
                yield Entry(k, EntryKind.FILE, len(d), int(t * 1e9))

    def cleanup_partials(self, older_than_seconds: float, *, resumable_older_than_seconds: float | None = None) -> int:
        return 0  # unpublished bytes never reach the dict

    def quarantine(self, key: str) -> str | None:
        check_key(key)
        target = self.quarantine_key(key)
        with self._lock:
            found = self._objects.get(key)
            if found is None:
                return None
            if target in self._objects:
                raise DestinationConflictError(f"{self.location}: quarantine name {target!r} is taken", path=target)
            self._objects[target] = found
            del self._objects[key]
        return target

    def corrupt(self, key: str) -> None:
        """Flip the first byte of ``key`` behind the backend's back (a test's fault)."""
        with self._lock:
            data, t = self._objects[key]
            self._objects[key] = (bytes([(data[0] if data else 0) ^ 0xFF]) + data[1:], t)


class _HotPending(PendingLayer):
    def __init__(self, inner: PendingWrite, layer: "ColdLayer") -> None:
        super().__init__(inner)
        self._layer = layer

    def publish(self, expected_sha256: str | None = None) -> PublishResult:
        result = self.inner.publish(expected_sha256)
        self._layer._hot.add(self.key)
        return result


class ColdLayer(Layer):
    """Makes the backend below a cold store, as tape or Glacier: an object must be restored
    before it can be read, and a restore is ready ``restore_seconds`` after
    :meth:`request_restore`. The request time is kept in a marker object under
    ``_packhorse/restore/`` of the backend itself (written once), so every process of a run
    sees the same restores. Objects published through this layer stay readable in the process
    that published them (the hot tier before the transition), as with S3, so the read-back
    verification after publishing works.

    Args:
        clock: UTC seconds (injected by unit tests).
    """

    def __init__(self, inner: StorageBackend, *, restore_seconds: float,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(inner)
        self.restore_seconds = restore_seconds
        self._clock = clock
        self._hot: set[str] = set()

    @property
    def cold(self) -> bool:  # type: ignore[override]
        return True

    @staticmethod
    def _marker(key: str) -> str:
        return f"{RESTORE_PREFIX}{check_key(key)}.json"

    def open_write(self, key: str) -> PendingWrite:
        return _HotPending(self.inner.open_write(key), self)

    def open_resumable_write(self, key: str, token: int, **wait: Any) -> PendingWrite:
        return _HotPending(self.inner.open_resumable_write(key, token, **wait), self)

    def request_restore(self, key: str) -> None:
        if self.inner.stat(key) is None:
            raise SourceMissingError(f"{self.location}: {key!r} does not exist", side="source", path=key,
                                     host=self.location)
        marker = self._marker(key)
        if self.inner.stat(marker) is None:
            body = json.dumps({"requested_at": self._clock()}).encode()
            try:
                with self.inner.open_write(marker) as w:
                    w.write(body)
                    w.publish()
            except DestinationConflictError:
                pass  # another process asked first: its time counts (idempotent)
        self.inner.request_restore(key)

    def restore_ready(self, key: str) -> bool:
        if key in self._hot:
            return True
        marker = self._marker(key)
        if self.inner.stat(marker) is None:  # never requested (a cold S3 store answers a read
            return False                     # of a missing key with "restore first")
        with self.inner.open_read(marker) as f:
            requested = float(json.loads(f.read())["requested_at"])
        return self._clock() >= requested + self.restore_seconds and self.inner.restore_ready(key)

    def open_read(self, key: str) -> BinaryIO:
        if not self.restore_ready(key):
            raise RestoreRequiredError(f"{self.location}: {key!r} is in cold storage and not restored; "
                                       "request a restore first", side="source", path=key, host=self.location)
        return self.inner.open_read(key)
