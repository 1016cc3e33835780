"""Resumable writes on a disk location (storage/base.py "Resumption", docs/reliability.md
"Resumable transfers"): which partial a later attempt takes over, what it keeps of it, and
what the partial sweep leaves for a retry."""

from __future__ import annotations

import hashlib
import io
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from memory_backend import MemoryBackend
from packhorse.config import load_config
from packhorse.engine.pipeline import S3_PARTIAL_AGE_SECONDS, resumable_partial_age
from packhorse.ratelimit import MIN_PIECE_BYTES, RateLimiter
from packhorse.runtime.hooks import NO_HOOKS
from packhorse.stages.base import copy_object, resume_partial
from packhorse.storage.base import CHUNK_BYTES, PARTIAL_SUFFIX
from packhorse.storage.disk import DiskBackend, partial_name
from packhorse.storage.registry import read_limited
from support import write_site_config

KEY = "bundles/b1.tar"


def _work() -> SimpleNamespace:
    done: list[int] = []
    return SimpleNamespace(progress=done.append, info={}, done=done)


def _leave_partial(backend: DiskBackend, key: str, data: bytes, token: int | None, age: float = 0.0) -> Path:
    """What a writer killed under fencing token ``token`` leaves: its partial file."""
    final = backend.local_path(key)
    final.parent.mkdir(parents=True, exist_ok=True)
    p = final.with_name(partial_name(final.name, token))
    p.write_bytes(data)
    if age:
        t = time.time() - age
        os.utime(p, (t, t))
    return p


def _copy_resuming(backend: DiskBackend, key: str, source: bytes, token: int) -> tuple[int, int]:
    """Copy ``source`` to ``key`` as attempt ``token`` would; returns (bytes kept, bytes written)."""
    written = 0
    with backend.open_resumable_write(key, token) as w:
        f = io.BytesIO(source)
        work = _work()
        kept = 0
        if w.resumed_bytes:
            leftover = resume_partial(work, f, w, len(source))  # type: ignore[arg-type]
            kept = w.size
            if leftover:
                written += w.write(leftover)
        while chunk := f.read(CHUNK_BYTES):
            written += w.write(chunk)
        w.publish(hashlib.sha256(source).hexdigest())
    return kept, written


def test_a_later_attempt_keeps_the_verified_prefix_and_drops_a_garbage_tail(tmp_path):
    backend = DiskBackend("buf", tmp_path / "buf")
    source = os.urandom(3 * CHUNK_BYTES + 12345)
    _leave_partial(backend, KEY, source[:2 * CHUNK_BYTES] + b"\x00garbage a crash left" * 5000, token=1)
    kept, written = _copy_resuming(backend, KEY, source, token=2)
    assert kept == 2 * CHUNK_BYTES
    assert written == len(source) - kept
    assert (tmp_path / "buf" / KEY).read_bytes() == source
    assert not list((tmp_path / "buf").rglob(f"*{PARTIAL_SUFFIX}"))


def test_a_partial_of_another_object_is_never_trusted(tmp_path):
    backend = DiskBackend("buf", tmp_path / "buf")
    source = os.urandom(2 * CHUNK_BYTES)
    _leave_partial(backend, KEY, os.urandom(CHUNK_BYTES + 7), token=1)
    kept, written = _copy_resuming(backend, KEY, source, token=2)
    assert (kept, written) == (0, len(source))
    assert (tmp_path / "buf" / KEY).read_bytes() == source


def test_a_partial_longer_than_the_source_is_cut(tmp_path):
    backend = DiskBackend("buf", tmp_path / "buf")
    source = os.urandom(CHUNK_BYTES + 99)
    _leave_partial(backend, KEY, source + b"tail", token=3)
    assert _copy_resuming(backend, KEY, source, token=4) == (len(source), 0)
    assert (tmp_path / "buf" / KEY).read_bytes() == source


def test_only_partials_of_lower_tokens_that_no_live_writer_holds_are_taken_over(tmp_path):
    backend = DiskBackend("buf", tmp_path / "buf")
    newer = _leave_partial(backend, KEY, b"n" * 1000, token=7)
    with backend.open_resumable_write(KEY, 5) as stale:  # attempt 5 after attempt 7 started: stale
        assert stale.resumed_bytes == 0
    assert newer.read_bytes() == b"n" * 1000  # the newer attempt's partial is left alone

    live = backend.open_resumable_write(KEY, 8)  # a live writer holding the token-7 partial now
    assert live.resumed_bytes == 1000 and not newer.exists()
    with backend.open_resumable_write(KEY, 9) as other:
        assert other.resumed_bytes == 0  # held by a live writer: never taken over
    assert live.local_path.exists()
    live.abort()


def test_a_stale_attempt_never_appends_to_the_partial_a_newer_attempt_resumed(tmp_path):
    backend = DiskBackend("buf", tmp_path / "buf")
    source = os.urandom(2 * CHUNK_BYTES)
    _leave_partial(backend, KEY, source[:CHUNK_BYTES], token=1)
    newer = backend.open_resumable_write(KEY, 2)
    assert newer.resumed_bytes == CHUNK_BYTES
    # the stale attempt 1 comes back and starts again: it gets a partial of its own
    with backend.open_resumable_write(KEY, 1) as stale:
        assert stale.resumed_bytes == 0 and stale.local_path != newer.local_path
        stale.write(b"stale bytes")
    h = hashlib.sha256(source[:CHUNK_BYTES])
    newer.keep_prefix(CHUNK_BYTES, h)
    newer.write(source[CHUNK_BYTES:])
    newer.publish(hashlib.sha256(source).hexdigest())
    assert (tmp_path / "buf" / KEY).read_bytes() == source


def test_other_free_partials_of_the_key_are_removed_when_one_is_taken_over(tmp_path):
    backend = DiskBackend("buf", tmp_path / "buf")
    _leave_partial(backend, KEY, b"a" * 10, token=1)
    _leave_partial(backend, KEY, b"b" * 20, token=2)
    plain = _leave_partial(backend, KEY, b"c" * 5, token=None)
    other_key = _leave_partial(backend, KEY + ".t1", b"d", token=1)  # another object's partial
    with backend.open_resumable_write(KEY, 3) as w:
        assert w.resumed_bytes == 20
        left = sorted(p.name for p in (tmp_path / "buf/bundles").iterdir())
        assert left == sorted([w.local_path.name, other_key.name])
    assert not plain.exists()


def test_the_sweep_keeps_resumable_partials_for_the_retry(tmp_path):
    backend = DiskBackend("buf", tmp_path / "buf")
    plain = _leave_partial(backend, "a.tar", b"x", token=None, age=600)
    resumable = _leave_partial(backend, "b.tar", b"y", token=2, age=600)
    ancient = _leave_partial(backend, "c.tar", b"z", token=2, age=3 * 86400)
    assert backend.cleanup_partials(300, resumable_older_than_seconds=86400) == 2
    assert resumable.exists() and not plain.exists() and not ancient.exists()


def test_the_sweep_never_removes_a_partial_a_live_writer_holds(tmp_path):
    (tmp_path / "buf").mkdir()
    backend = DiskBackend("buf", tmp_path / "buf")
    with backend.open_write("a.tar") as w:
        w.write(b"still writing")
        w._file.flush()  # type: ignore[attr-defined]
        old = time.time() - 3600
        os.utime(w.local_path, (old, old))  # a slow writer whose partial looks old
        assert backend.cleanup_partials(300) == 0
        assert w.local_path.exists()
        w.publish()
    assert (tmp_path / "buf/a.tar").read_bytes() == b"still writing"


def test_resumable_partials_outlive_the_retry_schedule(tmp_path):
    settings = load_config(write_site_config(tmp_path / "site"))
    assert resumable_partial_age(settings) >= S3_PARTIAL_AGE_SECONDS
    r = settings.recovery.model_copy(update={"circuit_breaker_timeout_seconds": 10 * 86400.0})
    slow = settings.model_copy(update={"recovery": r})
    assert resumable_partial_age(slow) > 10 * 86400.0


def _partial_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob(f"*{PARTIAL_SUFFIX}"))


@pytest.mark.parametrize("rate", [20_000, 300_000])
def test_a_rate_limited_transfer_keeps_its_partial_within_a_piece_of_what_it_read(tmp_path, rate):
    """A transfer killed while it waits for the bandwidth limiter leaves in its partial every
    byte it was let through but the piece it is paying for: about a second of the rate, at
    least 64 KiB (the partial once stayed empty for 20 s at 100 kB/s: 1 MiB read and paid for
    before it was written, then held in the partial's 1 MiB write buffer)."""
    (tmp_path / "buf").mkdir()
    dst = DiskBackend("buf", tmp_path / "buf")
    source = MemoryBackend("src")
    data = os.urandom(CHUNK_BYTES + 300_000)
    with source.open_write(KEY) as w:
        w.write(data)
        w.publish()
    now = [0.0]
    lag: list[int] = []  # at each wait: bytes let through so far that are not in the partial

    def sleep(seconds: float) -> None:
        # a kill during the wait, at its end at the latest, leaves the partial as it is; by then
        # the limiter has let through its burst plus the time so far at the rate
        now[0] += seconds
        lag.append(int(rate * (now[0] + limiter.burst_seconds)) - _partial_bytes(tmp_path / "buf"))

    limiter = RateLimiter(rate, burst_seconds=0.25, clock=lambda: now[0], sleep=sleep)
    work = SimpleNamespace(ctx=SimpleNamespace(hooks=NO_HOOKS), claim=SimpleNamespace(attempt=1), info={},
                           check=lambda: None, progress=lambda n: None)
    copy_object(work, read_limited(source, limiter, lambda: None), KEY, dst, KEY, size=len(data),  # type: ignore[arg-type]
                sha256=hashlib.sha256(data).hexdigest(), point="transfer", resume=True, to_buffer=True)
    assert (tmp_path / "buf" / KEY).read_bytes() == data
    piece = max(MIN_PIECE_BYTES, rate)
    assert lag and max(lag) <= piece + rate * 0.25  # one piece (plus the burst it started with)
    assert now[0] == pytest.approx(len(data) / rate - limiter.burst_seconds, rel=0.02)  # the rate held



def test_a_suspended_write_leaves_its_partial_for_the_next_attempt(tmp_path):
    # the sftp method suspends its write when the link is cut: the bytes stay, unpublished
    (tmp_path / "buf").mkdir()
    backend = DiskBackend("buf", tmp_path / "buf")
    source = os.urandom(3 * CHUNK_BYTES)
    with backend.open_resumable_write(KEY, 1) as first:
        first.write(source[:CHUNK_BYTES + 5])
        first.suspend()
    assert backend.stat(KEY) is None  # nothing published
    with backend.open_resumable_write(KEY, 2) as second:  # its lock is free: taken over
        assert second.resumed_bytes == CHUNK_BYTES + 5
        second.keep_prefix(CHUNK_BYTES + 5, hashlib.sha256(source[:CHUNK_BYTES + 5]))
        second.write(source[CHUNK_BYTES + 5:])
        second.publish(hashlib.sha256(source).hexdigest())
    assert (tmp_path / "buf" / KEY).read_bytes() == source
    assert not [p for p in (tmp_path / "buf").rglob("*") if p.name.endswith(PARTIAL_SUFFIX)]


def test_a_write_that_is_not_resumable_is_aborted_by_suspend(tmp_path):
    (tmp_path / "buf").mkdir()
    backend = DiskBackend("buf", tmp_path / "buf")
    with backend.open_write(KEY) as w:
        w.write(b"x" * 100)
        w.suspend()
    assert not [p for p in (tmp_path / "buf").rglob("*") if p.name.endswith(PARTIAL_SUFFIX)]


def test_a_deferred_read_back_follows_the_write_and_still_refuses_a_damaged_tail(tmp_path, monkeypatch):
    # a resumable write whose hash is deferred (a transfer's) reads its partial back in segments
    # while it is written (each after an fdatasync), and the rest after the final fsync: the
    # sha256 compared before publishing is that of the bytes read back, all of them (I4)
    from packhorse.errors import VerificationError
    from packhorse.storage import disk

    monkeypatch.setattr(disk, "READ_BACK_SEGMENT_BYTES", 64 * 1024)
    backend = DiskBackend("buf", tmp_path)
    data = os.urandom(300 * 1024)
    sha = hashlib.sha256(data).hexdigest()
    with backend.open_resumable_write(KEY, 1) as w:
        assert w.defer_hash()
        for i in range(0, len(data), 10_000):
            w.write(data[i:i + 10_000])
        result = w.publish(sha)
    assert result.read_back and result.sha256 == sha and result.size == len(data)
    assert backend.local_path(KEY).read_bytes() == data

    other = "bundles/b2.tar"
    with backend.open_resumable_write(other, 1) as w:
        w.defer_hash()
        for i in range(0, len(data), 10_000):
            w.write(data[i:i + 10_000])
        with open(w.local_path, "r+b") as f:  # the last byte, written after the last segment handed over
            f.seek(len(data) - 1)
            f.write(bytes([data[-1] ^ 0xFF]))
        with pytest.raises(VerificationError, match="before publishing"):
            w.publish(sha)
    assert not backend.local_path(other).exists()
    assert not [p for p in backend.local_path(other).parent.iterdir() if p.name.startswith(".b2.tar")]


def test_a_suspended_write_stops_its_read_back_and_leaves_the_partial(tmp_path, monkeypatch):
    from packhorse.storage import disk

    monkeypatch.setattr(disk, "READ_BACK_SEGMENT_BYTES", 64 * 1024)
    backend = DiskBackend("buf", tmp_path)
    data = os.urandom(200 * 1024)
    with backend.open_resumable_write(KEY, 1) as w:
        w.defer_hash()
        w.write(data)
        w.suspend()
    partials = [p for p in backend.local_path(KEY).parent.iterdir() if p.name.endswith(PARTIAL_SUFFIX)]
    assert len(partials) == 1 and partials[0].read_bytes() == data
