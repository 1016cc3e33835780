""":meth:`packhorse.operations.lease.LeaseKeeper.on_lost` at the renewal deadline: when no renewal
succeeded for ``deadline_seconds`` (the database unreachable), the callbacks run once, with the
:class:`~packhorse.errors.LeaseNotRenewedError` that :meth:`check` raises from then on, without
waiting for the work's next check: from the scheduler's deadline check (armed when a renewal
falls due, before it calls the database, or at the start when the deadline comes first) and from
a renewal that gave up because the deadline passed. No thread and no sleep: the scheduler is
replaced by a recorder, the renewal and the deadline check are driven directly, and the last
renewal is moved into the past instead of waiting."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from packhorse.domain import OperationKind
from packhorse.errors import LeaseLostError, LeaseNotRenewedError, TransientDatabaseError
from packhorse.operations import lease as lease_module
from packhorse.operations.lease import LeaseKeeper
from packhorse.operations.lifecycle import Claim


class RecordingScheduler:
    """Stands in for the process's heartbeat scheduler: records what is scheduled, runs nothing."""

    def __init__(self) -> None:
        self.added: list[tuple[float, float | None]] = []

    def add(self, keeper: LeaseKeeper, due: float, *, deadline_of: float | None = None) -> None:
        self.added.append((due, deadline_of))

    def deadline_checks(self) -> list[tuple[float, float]]:
        return [(due, of) for due, of in self.added if of is not None]


@pytest.fixture
def scheduler(monkeypatch: pytest.MonkeyPatch) -> RecordingScheduler:
    s = RecordingScheduler()
    monkeypatch.setattr(lease_module, "_scheduler", s)
    return s


def keeper(*, interval: float = 30, deadline: float = 60) -> LeaseKeeper:
    claim = Claim(operation_id=7, kind=OperationKind.TRANSFER, attempt=3, owner="w:1",
                  expires_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    return LeaseKeeper(db=None, claim=claim, lease_seconds=interval + deadline,  # type: ignore[arg-type]
                       interval_seconds=interval, deadline_seconds=deadline)


def unreachable(*a: Any, **kw: Any) -> bool:
    raise TransientDatabaseError("database unavailable after 8 attempts: connection refused")


def test_the_deadline_check_runs_each_callback_once_with_the_not_renewed_error(
        monkeypatch: pytest.MonkeyPatch, scheduler: RecordingScheduler) -> None:
    seen: list[list[tuple[float, float]]] = []

    def hangs(*a: Any, **kw: Any) -> bool:  # what the scheduler holds while the renewal is stuck
        seen.append(scheduler.deadline_checks())
        raise TransientDatabaseError("connection timed out")

    monkeypatch.setattr(lease_module, "heartbeat", hangs)
    k = keeper()
    got: list[Any] = []
    k.on_lost(got.append)
    k.on_lost(lambda e: got.append("second"))
    with k:
        k._renew()  # falls due; its database call fails before the deadline
    assert got == []
    # the deadline check was armed before the renewal called the database
    assert seen == [[(k._last_renewal + 60, k._last_renewal)]]
    (_, of), = scheduler.deadline_checks()
    k.stopped = False
    k._deadline_due(of)  # not due yet in real time, but no renewal succeeded since: declared
    assert len(got) == 2 and isinstance(got[0], LeaseNotRenewedError) and got[1] == "second"
    assert "lease not renewed" in str(got[0]) and "operation 7" in str(got[0])
    with pytest.raises(LeaseNotRenewedError):
        k.check()
    assert not k.may_hold()
    k._deadline_due(of)  # a second check (or a renewal that gives up) runs nothing again
    k._renew()
    assert len(got) == 2


def test_a_renewal_that_gives_up_at_the_deadline_runs_the_callbacks(
        monkeypatch: pytest.MonkeyPatch, scheduler: RecordingScheduler) -> None:
    monkeypatch.setattr(lease_module, "heartbeat", unreachable)
    k = keeper()
    got: list[BaseException] = []
    k.on_lost(got.append)
    k._last_renewal -= 61  # the database has been away for longer than the deadline
    k._renew()
    assert len(got) == 1 and isinstance(got[0], LeaseNotRenewedError)
    assert [due for due, of in scheduler.added if of is None] == []  # no further renewal is made
    late: list[BaseException] = []
    k.on_lost(late.append)  # registered after the loss: runs at once
    assert len(late) == 1 and isinstance(late[0], LeaseNotRenewedError)


def test_a_failed_renewal_before_the_deadline_runs_nothing_and_renews_again(
        monkeypatch: pytest.MonkeyPatch, scheduler: RecordingScheduler) -> None:
    monkeypatch.setattr(lease_module, "heartbeat", unreachable)
    k = keeper()
    got: list[BaseException] = []
    k.on_lost(got.append)
    k._renew()
    assert got == []
    assert k.may_hold()
    assert len([due for due, of in scheduler.added if of is None]) == 1  # the next renewal


def test_a_renewal_that_succeeds_in_time_disarms_the_deadline_check(
        monkeypatch: pytest.MonkeyPatch, scheduler: RecordingScheduler) -> None:
    monkeypatch.setattr(lease_module, "heartbeat", lambda *a, **kw: True)
    k = keeper()
    got: list[BaseException] = []
    k.on_lost(got.append)
    armed_for = k._last_renewal
    k._renew()
    assert k._last_renewal != armed_for
    k._deadline_due(armed_for)
    assert got == []
    k.check()


def test_a_deadline_before_the_first_renewal_is_checked_from_the_start(scheduler: RecordingScheduler) -> None:
    k = keeper(interval=30, deadline=10)
    with k:
        pass
    start = k._last_renewal
    assert sorted(scheduler.added, key=lambda a: a[0]) == [(start + 10, start), (start + 30, None)]


def test_a_stopped_keeper_declares_nothing(monkeypatch: pytest.MonkeyPatch, scheduler: RecordingScheduler) -> None:
    k = keeper()
    got: list[BaseException] = []
    k.on_lost(got.append)
    k.stopped = True
    k._deadline_due(k._last_renewal)
    assert got == []


def test_the_first_loss_stays(monkeypatch: pytest.MonkeyPatch, scheduler: RecordingScheduler) -> None:
    k = keeper()
    k._deadline_due(k._last_renewal)
    monkeypatch.setattr(lease_module, "heartbeat", lambda *a, **kw: False)  # a late renewal finds it stale
    k._renew()
    with pytest.raises(LeaseNotRenewedError):
        k.check()
    assert isinstance(k.lost_error(), LeaseLostError)
