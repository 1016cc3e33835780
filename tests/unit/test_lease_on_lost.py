""":meth:`packhorse.operations.lease.LeaseKeeper.on_lost`: the renewal that finds the fencing
token stale runs the registered callbacks once, with the error :meth:`check` raises; one
registered after the loss runs at once; a failing callback is logged and the others still
run; an unregistered one never runs. The renewal is driven directly (no scheduler thread), its
database call replaced."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from packhorse.domain import OperationKind
from packhorse.errors import LeaseLostError
from packhorse.operations import lease as lease_module
from packhorse.operations.lease import LeaseKeeper
from packhorse.operations.lifecycle import Claim


def keeper(monkeypatch: pytest.MonkeyPatch, *, current: bool) -> LeaseKeeper:
    """A keeper whose renewals find the token current (``True``) or stale (``False``)."""
    monkeypatch.setattr(lease_module, "heartbeat", lambda *a, **kw: current)
    claim = Claim(operation_id=7, kind=OperationKind.TRANSFER, attempt=3, owner="w:1",
                  expires_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    k = LeaseKeeper(db=None, claim=claim, lease_seconds=60, interval_seconds=30,  # type: ignore[arg-type]
                    deadline_seconds=60)
    k.stopped = True  # a renewal that succeeds schedules no next one (no thread in a unit test)
    return k


def test_a_renewal_that_finds_the_token_stale_runs_each_callback_once(monkeypatch: pytest.MonkeyPatch) -> None:
    k = keeper(monkeypatch, current=False)
    got: list[Any] = []
    k.on_lost(got.append)
    k.on_lost(lambda e: got.append("second"))
    assert got == []
    k._renew()
    assert len(got) == 2 and isinstance(got[0], LeaseLostError) and got[1] == "second"
    assert "attempt 3" in str(got[0])
    with pytest.raises(LeaseLostError):
        k.check()
    k._renew()  # a later renewal (there is none in practice) runs nothing again
    assert len(got) == 2


def test_a_callback_registered_after_the_loss_runs_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    k = keeper(monkeypatch, current=False)
    k._renew()
    got: list[BaseException] = []
    k.on_lost(got.append)
    assert len(got) == 1 and isinstance(got[0], LeaseLostError)


def test_a_current_token_runs_nothing_and_a_forgotten_callback_never_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    k = keeper(monkeypatch, current=True)
    got: list[BaseException] = []
    forget = k.on_lost(got.append)
    k._renew()
    assert got == []
    forget()
    monkeypatch.setattr(lease_module, "heartbeat", lambda *a, **kw: False)
    k._renew()
    assert got == []
    forget()  # idempotent


def test_a_failing_callback_is_logged_not_raised_and_the_others_run(monkeypatch: pytest.MonkeyPatch) -> None:
    k = keeper(monkeypatch, current=False)
    got: list[BaseException] = []

    def broken(e: LeaseLostError) -> None:
        raise RuntimeError("the reader is gone")

    k.on_lost(broken)
    k.on_lost(got.append)
    k._renew()  # raises nothing
    assert len(got) == 1
