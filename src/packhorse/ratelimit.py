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

#: The longest single sleep of :meth:`RateLimiter.take` when it is given ``on_wait``, seconds.
WAIT_SLICE_SECONDS = 0.1

#: A rate-limited ``readinto`` returns at most this many seconds of the rate ...
PIECE_SECONDS = 1.0
#: ... but never caps a read below this many bytes.
MIN_PIECE_BYTES = 64 * 1024


def piece_bytes(bytes_per_second: float | None) -> int | None:
    """The most bytes one rate-limited read hands out at ``bytes_per_second``: about
    :data:`PIECE_SECONDS` of the rate, at least :data:`MIN_PIECE_BYTES`; ``None`` (no cap) when
    there is no limit. A copy writes each piece before it pays for the next, so a writer killed
    while it waits for the limiter loses at most one piece (a transfer resumes from the rest)."""
    if not bytes_per_second:
        return None
    return max(MIN_PIECE_BYTES, int(bytes_per_second * PIECE_SECONDS))


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
            if self.rate:
                self._refill()  # the time so far earns at the old rate
            else:
                self._last = self._clock()
            self.rate = bytes_per_second
            if bytes_per_second:
                self._allowance = min(self._allowance, bytes_per_second * self.burst_seconds)

    def take(self, nbytes: int, on_wait: Callable[[], None] | None = None) -> None:
        """Account for ``nbytes``; sleeps as long as needed to keep the rate.

        With ``on_wait``, a long wait is slept in slices of at most :data:`WAIT_SLICE_SECONDS`
        and ``on_wait`` is called between them, so a rate it changes (:meth:`set_rate`: a
        transfer's share of its route's limit when another transfer starts) applies to the rest
        of this wait, not only from the next read: a transfer that started alone and is given
        half the limit keeps to it within a slice, not a whole chunk later."""
        if not self.rate:
            return
        with self._lock:
            self._refill()
            self._allowance -= nbytes
        while True:
            with self._lock:
                if not self.rate:
                    return
                self._refill()
                if self._allowance >= 0:
                    return
                wait = -self._allowance / self.rate
            if on_wait is None or wait <= WAIT_SLICE_SECONDS:
                self._sleep(wait)
                with self._lock:  # the sleep refills exactly the debt: nothing more is owed
                    self._refill()
                return
            self._sleep(min(wait, WAIT_SLICE_SECONDS))
            on_wait()

    def _refill(self) -> None:
        """Add the allowance earned since the last look (caller holds the lock; rate set)."""
        rate = float(self.rate or 0)
        now = self._clock()
        self._allowance = min(rate * self.burst_seconds, self._allowance + (now - self._last) * rate)
        self._last = now


class ThrottledReader:
    """A binary file object whose reads keep to ``limiter`` (``read`` and ``readinto``; the
    rest is the wrapped file's). Closing it closes the wrapped file.

    ``readinto`` fills at most :func:`piece_bytes` of the limiter's rate at the time (about a
    second's worth, at least 64 KiB; the whole buffer when there is no rate), so a copy loop
    over it writes each piece as soon as it is paid for instead of holding a 1 MiB block for
    seconds (callers loop over short reads, as ``readinto`` allows). ``read(n)`` returns what
    the wrapped file returns.

    ``on_read`` (optional) is called before each read and between the slices of a long wait
    (:meth:`RateLimiter.take`): the transfer refreshes its fair share of the route's limit there.
    """

    def __init__(self, raw: BinaryIO, limiter: RateLimiter, on_read: Callable[[], None] | None = None) -> None:
        self._raw = raw
        self._limiter = limiter
        self._on_read = on_read

    def read(self, size: int = -1) -> bytes:
        if self._on_read:
            self._on_read()
        data = self._raw.read(size)
        self._limiter.take(len(data), self._on_read)
        return data

    def readinto(self, buffer: Any) -> int:
        if self._on_read:
            self._on_read()
        cap = piece_bytes(self._limiter.rate)
        if cap is None:
            n = self._raw.readinto(buffer)  # type: ignore[attr-defined]
        else:
            with memoryview(buffer) as view:
                n = self._raw.readinto(view[:cap])  # type: ignore[attr-defined]
        self._limiter.take(n or 0, self._on_read)
        return n

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> "ThrottledReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self._raw.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)
