"""The ``sftp`` pull when its link stalls and a successor attempt is claimed
(:func:`packhorse.stages.pull.pull_over_ssh`, docs/reliability.md "Resumable transfers"): the
stale attempt's renewal finds its fencing token stale, which aborts its read at once
(:meth:`~packhorse.operations.lease.LeaseKeeper.on_lost`) instead of after the link's patience;
it suspends its partial, and the successor, which waited for that partial's lock, takes its
bytes over and reads only the rest over the link. A stale attempt cut off from the database
too (its renewals hang) does the same at its renewal deadline.

The SSH source is a fake (its reader stalls after the first bytes until aborted); the lease
keepers are real, their renewal driven by hand with the database call replaced (the deadline
test runs the real scheduler); the destination is a real disk buffer. Threads and short
waits: an integration test."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from packhorse.domain import OperationKind
from packhorse.errors import LeaseLostError, LeaseNotRenewedError, SshConnectionError
from packhorse.operations import lease as lease_module
from packhorse.operations.lease import LeaseKeeper
from packhorse.operations.lifecycle import Claim
from packhorse.runtime.hooks import NO_HOOKS
from packhorse.stages import pull
from packhorse.storage.base import CHUNK_BYTES, ObjectInfo
from packhorse.storage.disk import DiskBackend

KEY = "bundles/b1.tar"
DATA = os.urandom(6 * CHUNK_BYTES + 123)
ACROSS = 3 * CHUNK_BYTES  # what the stale attempt got across before the link stalled
PATIENCE = 20.0  # the fake link's patience: a read waits this long before the link counts as cut


class StallingReader:
    """Returns the source's bytes from ``offset``; with ``stall_at``, waits there until aborted
    (then raises what :meth:`abort` got) or until :data:`PATIENCE` passed (a cut link)."""

    def __init__(self, offset: int, stall_at: int | None) -> None:
        self.pos = offset
        self.stall_at = stall_at
        self.stalled = threading.Event()
        self._woken = threading.Event()
        self._error: BaseException | None = None

    def readinto(self, buf: Any) -> int:
        if self._error is not None:
            raise self._error
        if self.stall_at is not None and self.pos >= self.stall_at:
            self.stalled.set()
            if not self._woken.wait(PATIENCE):
                raise SshConnectionError("a ranged read stalled", step="transfer", side="source", host="fyst")
            assert self._error is not None
            raise self._error
        end = min(len(DATA), self.pos + len(buf), self.stall_at or len(DATA))
        n = end - self.pos
        buf[:n] = DATA[self.pos:end]
        self.pos = end
        return n

    def abort(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self._woken.set()

    def __enter__(self) -> "StallingReader":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class FakeSource:
    """Stands for :class:`packhorse.storage.sftp.SftpSource`; records the offsets read from."""

    stall_at: int | None = None
    readers: list[StallingReader] = []

    def __init__(self, endpoint: Any, *, streams: int, limiter: Any, compression: bool = False) -> None:
        self.endpoint = SimpleNamespace(host="fyst", where="packhorse@fyst:22")

    def __enter__(self) -> "FakeSource":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def connect(self) -> None:
        pass

    def stat(self, key: str) -> ObjectInfo:
        return ObjectInfo(key, len(DATA), 0.0)

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        return DATA[offset:offset + length]

    def abort_range_reads(self, exc: BaseException) -> None:
        pass  # the fake's ranged reads never stall

    def open_read(self, key: str, *, offset: int, size: int, on_read: Any = None) -> StallingReader:
        r = StallingReader(offset, type(self).stall_at)
        type(self).readers.append(r)
        return r


def work_of(attempt: int) -> SimpleNamespace:
    claim = Claim(operation_id=7, kind=OperationKind.TRANSFER, attempt=attempt, owner=f"w:{attempt}",
                  expires_at=dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc))
    keeper = LeaseKeeper(db=None, claim=claim, lease_seconds=60, interval_seconds=0.5,  # type: ignore[arg-type]
                         deadline_seconds=60)
    keeper.stopped = True  # renewals are made by hand here (no scheduler)
    return SimpleNamespace(ctx=SimpleNamespace(settings=None, hooks=NO_HOOKS), claim=claim, lease=keeper,
                           check=keeper.check, progress=lambda n: keeper.check(), info={})


def run(work: SimpleNamespace, dst: DiskBackend) -> None:
    pull.pull_over_ssh(work, "fyst-buffer", dst, KEY, size=len(DATA), sha256=hashlib.sha256(DATA).hexdigest(),  # type: ignore[arg-type]
                       location_id=1, data_transfer_package_id=1, streams=2, share=None)



def start_stalled(attempt: Callable[[], None]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``attempt`` (a pull) in a thread until its read stalls mid-bundle
    (:attr:`FakeSource.stall_at`): ``(the thread, its outcome)``; the outcome gets ``error``
    (what the attempt raised) and ``at`` (when, monotonic seconds) once it ends."""
    outcome: dict[str, Any] = {}

    def body() -> None:
        try:
            attempt()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome["error"] = e
            outcome["at"] = time.monotonic()

    t = threading.Thread(target=body, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not FakeSource.readers and "error" not in outcome and time.monotonic() < deadline:
        time.sleep(0.01)
    if "error" in outcome:
        raise outcome["error"]
    assert FakeSource.readers and FakeSource.readers[0].stalled.wait(10)  # the link stalls mid-bundle
    return t, outcome

def test_a_stale_attempt_stops_at_once_and_its_successor_resumes_its_partial(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pull, "SftpSource", FakeSource)
    monkeypatch.setattr(pull, "endpoint_for", lambda settings, name: None)
    monkeypatch.setattr(lease_module, "heartbeat", lambda *a, **kw: False)  # every renewal finds its token stale
    monkeypatch.setattr(FakeSource, "readers", [])
    (tmp_path / "buf").mkdir()
    dst = DiskBackend("buf", tmp_path / "buf")

    stale = work_of(1)
    FakeSource.stall_at = ACROSS
    t, outcome = start_stalled(lambda: run(stale, dst))

    # the monitor declares it stalled and the successor is claimed (token 2); the stale
    # attempt's next renewal, half a second later, finds its token stale
    renewal = threading.Timer(0.5, stale.lease._renew)
    renewal.start()
    successor = work_of(2)
    FakeSource.stall_at = None
    started = time.monotonic()
    run(successor, dst)
    took = time.monotonic() - started
    t.join(10)
    renewal.join()

    assert isinstance(outcome.get("error"), LeaseLostError)
    assert outcome["at"] - started < 5 < PATIENCE  # stopped at once, not after the link's patience
    assert took < 5
    assert (tmp_path / "buf" / KEY).read_bytes() == DATA
    assert successor.info["resumed_bytes"] == ACROSS  # the bytes across the link were not sent again
    assert FakeSource.readers[-1].pos == len(DATA) and len(FakeSource.readers) == 2
    assert not [p for p in (tmp_path / "buf").rglob("*") if p.name.endswith(".packhorse-partial")]


def test_a_stale_attempt_cut_off_from_the_database_stops_at_its_deadline_and_its_successor_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pull, "SftpSource", FakeSource)
    monkeypatch.setattr(pull, "endpoint_for", lambda settings, name: None)
    unreachable = threading.Event()  # set at the end: the database answers again
    monkeypatch.setattr(lease_module, "heartbeat", lambda *a, **kw: unreachable.wait(30))  # every renewal hangs
    monkeypatch.setattr(FakeSource, "readers", [])
    (tmp_path / "buf").mkdir()
    dst = DiskBackend("buf", tmp_path / "buf")

    stale = work_of(1)
    stale.lease.interval, stale.lease.deadline = 0.2, 1.5
    stale.lease.stopped = False  # the real scheduler renews it (and checks its deadline)
    FakeSource.stall_at = ACROSS
    def stale_attempt() -> None:
        with stale.lease:
            run(stale, dst)

    try:
        started = time.monotonic()
        t, outcome = start_stalled(stale_attempt)

        successor = work_of(2)  # claimed once the stale lease expired; waits for the partial's lock
        FakeSource.stall_at = None
        run(successor, dst)
        t.join(10)

        assert isinstance(outcome.get("error"), LeaseNotRenewedError)
        assert outcome["at"] - started < 5 < PATIENCE  # stopped at its deadline, not after the link's patience
        assert (tmp_path / "buf" / KEY).read_bytes() == DATA
        assert successor.info["resumed_bytes"] == ACROSS
        assert FakeSource.readers[-1].pos == len(DATA) and len(FakeSource.readers) == 2
    finally:
        unreachable.set()
