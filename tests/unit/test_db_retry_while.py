"""A unit of work gives up after its attempts, unless a lease holder asked it to ride out the
outage while its lease may hold (:func:`packhorse.db.session.retry_while`, docs/recovery.md
"Layer 2")."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import exc

from packhorse.db import session as db_session
from packhorse.db.session import _retrying, retry_while
from packhorse.errors import TransientDatabaseError


class _Outage:
    """``once()`` of a unit of work that fails with a dropped connection ``failures`` times."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise exc.OperationalError("SELECT 1", {}, Exception("server closed the connection unexpectedly"))
        return "done"


@pytest.fixture(autouse=True)
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The pauses between tries (s), not slept."""
    out: list[float] = []
    monkeypatch.setattr(db_session.time, "sleep", out.append)
    return out


def test_a_unit_gives_up_after_its_attempts() -> None:
    once = _Outage(failures=100)
    with pytest.raises(TransientDatabaseError, match="after 8 attempts"):
        _retrying(once, 8)
    assert once.calls == 8


def test_inside_retry_while_it_goes_on_while_asked_and_then_succeeds(slept: list[float]) -> None:
    once = _Outage(failures=30)
    with retry_while(lambda: True):
        assert _retrying(once, 8) == "done"
    assert once.calls == 31
    # a lease holder sees the database back within about a second: no long backoff
    assert len(slept) == 30 and max(slept) <= db_session.PATIENT_RETRY_MAX_DELAY


def test_outside_the_backoff_grows(slept: list[float]) -> None:
    with pytest.raises(TransientDatabaseError):
        _retrying(_Outage(failures=100), 8)
    assert len(slept) == 7 and max(slept) > db_session.PATIENT_RETRY_MAX_DELAY


def test_it_gives_up_once_the_lease_could_have_expired() -> None:
    once = _Outage(failures=100)
    asked = []

    def may_hold() -> bool:
        asked.append(time.monotonic())
        return len(asked) < 5

    with retry_while(may_hold):
        with pytest.raises(TransientDatabaseError):
            _retrying(once, 8)
    assert once.calls == 8 + 4 and len(asked) == 5
    # outside the block the default (8 attempts) applies again
    again = _Outage(failures=100)
    with pytest.raises(TransientDatabaseError):
        _retrying(again, 8)
    assert again.calls == 8


def test_any_other_error_is_raised_at_once() -> None:
    calls = []

    def once() -> None:
        calls.append(1)
        raise exc.IntegrityError("INSERT", {}, Exception("duplicate key"))

    with retry_while(lambda: True), pytest.raises(exc.IntegrityError):
        _retrying(once, 8)
    assert calls == [1]
