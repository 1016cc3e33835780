"""A successor attempt waits for the partial its stale predecessor still holds
(``DiskBackend.open_resumable_write(..., wait_for_held_seconds=)``, docs/reliability.md
"Resumable transfers"): the stale attempt's lease is found lost, it suspends its partial (the
``flock`` is freed) and the successor takes those bytes over instead of sending them again
over the link. Without a wait (the default) a held partial is left alone and the successor
starts from byte 0, as before; still held at the bound, it starts from byte 0 too; the
successor's own lease check ends the wait. Two writers in threads: an integration test."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from packhorse.errors import LeaseLostError
from packhorse.storage.base import PARTIAL_SUFFIX
from packhorse.storage.disk import DiskBackend
from packhorse.storage.registry import compose

KEY = "bundles/b1.tar"
WRITTEN = 3 * (1 << 20) + 17  # what the stale attempt got across the link before it stalled


def backend(tmp_path: Path) -> DiskBackend:
    (tmp_path / "buf").mkdir()
    return DiskBackend("buf", tmp_path / "buf")


def partials(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "buf").rglob("*") if p.name.endswith(PARTIAL_SUFFIX))


def suspend_later(w: object, seconds: float) -> threading.Thread:
    """The stale attempt: its lease is found lost after ``seconds``; it suspends its partial."""
    def stale() -> None:
        time.sleep(seconds)
        w.suspend()  # type: ignore[attr-defined]
    t = threading.Thread(target=stale, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("layered", [False, True], ids=["disk", "composed"])
def test_the_successor_waits_for_the_held_partial_and_resumes_its_bytes(tmp_path: Path, layered: bool) -> None:
    disk = backend(tmp_path)
    b = compose(disk) if layered else disk
    data = os.urandom(WRITTEN)
    stale = b.open_resumable_write(KEY, 1)
    stale.write(data)  # written through to the partial, not published; its flock is held
    t = suspend_later(stale, 0.5)
    looks: list[float] = []
    started = time.monotonic()
    with b.open_resumable_write(KEY, 2, wait_for_held_seconds=5,
                                while_waiting=lambda: looks.append(time.monotonic())) as w:
        waited = time.monotonic() - started
        assert w.resumed_bytes == WRITTEN
        with w.open_resumed() as f:
            assert f.read() == data
        assert 0.4 < waited < 4
        assert len(looks) >= 2  # the successor's lease was checked while it waited
        assert [n for n in partials(tmp_path) if ".t2." in n] and not [n for n in partials(tmp_path) if ".t1." in n]
        w.abort()
    t.join(5)


def test_without_a_wait_a_held_partial_is_left_alone_and_the_successor_starts_fresh(tmp_path: Path) -> None:
    b = backend(tmp_path)
    stale = b.open_resumable_write(KEY, 1)
    stale.write(os.urandom(WRITTEN))
    with b.open_resumable_write(KEY, 2) as w:  # wait_for_held_seconds=0: today's behaviour
        assert w.resumed_bytes == 0
        assert len(partials(tmp_path)) == 2  # the stale attempt's partial is untouched
        w.abort()
    stale.suspend()


def test_a_partial_still_held_at_the_bound_is_left_alone_and_logged(tmp_path: Path) -> None:
    b = backend(tmp_path)
    stale = b.open_resumable_write(KEY, 1)
    stale.write(os.urandom(WRITTEN))
    started = time.monotonic()
    with capture_logs() as logs, b.open_resumable_write(KEY, 2, wait_for_held_seconds=0.5) as w:
        assert time.monotonic() - started >= 0.5
        assert w.resumed_bytes == 0
        w.abort()
    held = [e for e in logs if e["event"] == "partial_held_by_live_writer"]
    assert len(held) == 1 and held[0]["log_level"] == "info"
    assert held[0]["key"] == KEY and held[0]["attempt"] == 2 and held[0]["held_attempt"] == 1
    assert held[0]["held_bytes"] == WRITTEN
    stale.suspend()
    assert len(partials(tmp_path)) == 1


def test_the_successor_stops_waiting_when_it_loses_its_own_lease(tmp_path: Path) -> None:
    b = backend(tmp_path)
    stale = b.open_resumable_write(KEY, 1)
    stale.write(os.urandom(WRITTEN))
    looks: list[int] = []

    def check() -> None:
        looks.append(1)
        if len(looks) == 3:
            raise LeaseLostError("operation 7: attempt 2 is no longer the operation's current attempt")

    with pytest.raises(LeaseLostError):
        b.open_resumable_write(KEY, 2, wait_for_held_seconds=30, while_waiting=check)
    assert len(looks) == 3
    assert len(partials(tmp_path)) == 1  # the successor made none
    stale.suspend()


def test_a_free_partial_is_taken_over_without_waiting(tmp_path: Path) -> None:
    b = backend(tmp_path)
    first = b.open_resumable_write(KEY, 1)
    first.write(b"x" * 1000)
    first.suspend()
    looks: list[int] = []
    with b.open_resumable_write(KEY, 2, wait_for_held_seconds=30, while_waiting=lambda: looks.append(1)) as w:
        assert w.resumed_bytes == 1000 and looks == []
        w.abort()
