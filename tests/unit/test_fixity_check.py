"""Fixity helpers: the per-location read rate (a storage layer) and the check of one copy."""

from __future__ import annotations

import hashlib
import time
from types import SimpleNamespace

from packhorse.ratelimit import RateLimiter
from packhorse.rules.fixity import CORRUPT, MISSING, OK, check_copy
from packhorse.storage.disk import DiskBackend
from packhorse.storage.registry import compose


class FakeClock:
    """A monotonic clock that only moves when the limiter sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_rate_limiter_keeps_the_rate():
    clock = FakeClock()
    lim = RateLimiter(4 * 1024**2, clock=clock, sleep=clock.sleep)  # 4 MiB/s, bursts up to one second's worth
    for _ in range(12):
        lim.take(1024**2)  # 12 MiB: 4 MiB burst + 8 MiB at 4 MiB/s = 2 s
    assert abs(clock.now - 2.0) < 1e-9, clock.now


def test_unlimited_rate_limiter_never_waits():
    clock = FakeClock()
    lim = RateLimiter(None, clock=clock, sleep=clock.sleep)
    for _ in range(1000):
        lim.take(1 << 30)
    assert clock.now == 0.0


def test_check_copy_ok_corrupt_missing(tmp_path):
    (tmp_path / "lta").mkdir()
    b = DiskBackend("lta", tmp_path / "lta")
    data = b"archived bytes" * 1000
    with b.open_write("raw/a.tar") as w:
        w.write(data)
        w.publish()
    copy = SimpleNamespace(id=1, path="raw/a.tar", size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                           raw_data_package_id=7, data_transfer_package_id=None)
    seen: list[int] = []
    f = check_copy(b, copy, "lta", on_bytes=seen.append)
    assert (f.status, f.actual, sum(seen)) == (OK, copy.sha256, len(data))
    p = tmp_path / "lta/raw/a.tar"
    p.chmod(0o644)
    p.write_bytes(b"X" + data[1:])
    f = check_copy(b, copy, "lta")
    assert f.status == CORRUPT and f.actual == hashlib.sha256(b"X" + data[1:]).hexdigest()
    p.unlink()
    assert check_copy(b, copy, "lta").status == MISSING
    bad = SimpleNamespace(**{**vars(copy), "path": "../escape"})
    f = check_copy(b, bad, "lta")
    assert f.status == MISSING and "'../escape'" in (f.error or "")


def test_check_copy_is_throttled_by_the_location_rate(tmp_path):
    (tmp_path / "lta").mkdir()
    b = DiskBackend("lta", tmp_path / "lta")
    data = bytes(3 * 1024**2)
    with b.open_write("raw/big.tar") as w:
        w.write(data)
        w.publish()
    copy = SimpleNamespace(id=1, path="raw/big.tar", size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                           raw_data_package_id=7, data_transfer_package_id=None)
    t0 = time.monotonic()
    limited = compose(b, read_bytes_per_second=1024**2)  # the fixity stack: 1 MiB/s
    assert check_copy(limited, copy, "lta").status == OK
    assert time.monotonic() - t0 >= 1.8  # 1 MiB burst, then 2 MiB at 1 MiB/s
