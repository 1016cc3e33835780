"""Rate limits on bytes: a token bucket and a reader that keeps to one.

Used by the fixity audit (``locations[].fixity_bytes_per_second``) and by transfers
(``routes[].bandwidth_limit_bytes_per_second``). The reader is the whole of a limit; the
storage stack's read-rate layer (:class:`packhorse.storage.layers.ReadRateLayer`) hands it out
from ``open_read``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO


class RateLimiter:
    """A token bucket: :meth:`take` blocks so that at most ``bytes_per_second`` pass on
    average, with bursts up to ``burst_seconds`` worth (the bucket starts full). ``None``
    means unlimited. Thread-safe.

    Args:
        bytes_per_second: the rate, bytes per second (``None``: no limit).
        burst_seconds: the bucket's size, in seconds of the rate.
        clock, sleep: monotonic seconds and a sleep function (injected by unit tests).
    """

    def __init__(self, bytes_per_second: float | None, *, burst_seconds: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = bytes_per_second
        self.burst_seconds = burst_seconds
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._allowance = float(bytes_per_second or 0) * burst_seconds
        self._last = clock()

    def set_rate(self, bytes_per_second: float | None) -> None:
        """Change the rate from now on (bytes per second; ``None``: no limit)."""
        with self._lock:
            self.rate = bytes_per_second
            if bytes_per_second:
                self._allowance = min(self._allowance, bytes_per_second * self.burst_seconds)

    def take(self, nbytes: int) -> None:
        """Account for ``nbytes``; sleeps as long as needed to keep the rate."""
        if not self.rate:
            return
        with self._lock:
            rate = self.rate
            now = self._clock()
            self._allowance = min(rate * self.burst_seconds, self._allowance + (now - self._last) * rate)
            self._last = now
            self._allowance -= nbytes
            wait = -self._allowance / rate if self._allowance < 0 else 0.0
        if wait > 0:
            self._sleep(wait)


class ThrottledReader:
    """A binary file object whose reads keep to ``limiter`` (``read`` and ``readinto``; the
    rest is the wrapped file's). Closing it closes the wrapped file.

    ``on_read`` (optional) is called before each read: the transfer refreshes its fair share
    of the route's limit there.
    """

    def __init__(self, raw: BinaryIO, limiter: RateLimiter, on_read: Callable[[], None] | None = None) -> None:
        self._raw = raw
        self._limiter = limiter
        self._on_read = on_read

    def read(self, size: int = -1) -> bytes:
        if self._on_read:
            self._on_read()
        data = self._raw.read(size)
        self._limiter.take(len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        if self._on_read:
            self._on_read()
        n = self._raw.readinto(buffer)  # type: ignore[attr-defined]
        self._limiter.take(n or 0)
        return n

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> "ThrottledReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self._raw.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)
