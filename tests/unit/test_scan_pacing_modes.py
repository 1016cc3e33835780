"""Scan pacing is one rule in both modes (:func:`packhorse.operations.scan_lease.scan_rest_seconds`):
a completed scan rests at least the poll interval and three times as long as it took, whether a
distributed site's scan lease decides it (:func:`~packhorse.operations.scan_lease.rest_until`,
database clock) or the embedded runner (:class:`packhorse.executors.local.ScanPacing`, monotonic
clock). Pure functions: no database, no runner loop."""

from __future__ import annotations

import datetime as dt

import pytest

from packhorse.executors.local import ScanPacing
from packhorse.operations.scan_lease import ScanClaim, ScanLeaseKeeper, rest_until, scan_rest_seconds

T0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
CLAIM = ScanClaim("fyst-source", "worker-a", 1)

#: (how long the scan took, poll interval, the rest both modes must give), seconds
CASES = [
    (0.1, 0.5, 0.5),  # a quick scan rests the poll interval
    (2.0, 0.5, 6.0),  # a slow one three times as long as it took
    (20.0, 10.0, 60.0),
    (3.0, 10.0, 10.0),
    (0.0, 10.0, 10.0),
]


@pytest.mark.parametrize(("took", "poll", "rest"), CASES)
def test_both_modes_rest_a_completed_scan_alike(took: float, poll: float, rest: float) -> None:
    assert scan_rest_seconds(took, min_rest_seconds=poll) == pytest.approx(rest)
    completed = T0 + dt.timedelta(seconds=took)
    distributed = rest_until(T0, completed, min_rest_seconds=poll)
    assert distributed is not None
    assert (distributed - completed).total_seconds() == pytest.approx(rest)
    embedded = ScanPacing()
    embedded.scanned(1000.0, 1000.0 + took, completed=True)
    assert embedded.due_at(poll) - (1000.0 + took) == pytest.approx(rest)


def test_the_embedded_runner_scans_at_once_first_and_a_failed_scan_waits_the_poll_interval() -> None:
    pacing = ScanPacing()
    assert pacing.due_at(10.0) == float("-inf")
    pacing.scanned(1000.0, 1030.0, completed=False)  # failed after 30 s: no rest for its length
    assert pacing.due_at(10.0) == pytest.approx(1040.0)
    pacing.scanned(1040.0, 1070.0, completed=True)
    assert pacing.due_at(10.0) == pytest.approx(1160.0)
    assert pacing.due_at(100.0) == pytest.approx(1170.0)  # a poll interval changed at run time applies


def test_a_scan_never_completed_or_under_way_does_not_rest_on_the_lease() -> None:
    assert rest_until(None, None, min_rest_seconds=10) is None
    assert rest_until(T0 + dt.timedelta(seconds=5), T0, min_rest_seconds=10) is None


def test_a_scan_held_up_by_an_unreachable_database_rests_by_its_work_not_by_the_outage() -> None:
    """A site cut off from the centre: the scan under way waits on the database as long as the
    cut lasts, and its lease renewals fail or hang as long. The keeper leaves that time out of
    the scan's work, so after a 132 s cut a scan that worked 2 s rests 6 s, not 3 × 134 s (a
    trial waited minutes for files written during the cut to be registered); a scan that ends
    before a renewal came through again leaves the open gap out too."""
    keeper = ScanLeaseKeeper(None, CLAIM, lease_seconds=600, heartbeat_seconds=5)  # type: ignore[arg-type]
    keeper.started = keeper.last_ok = 1000.0
    for t in (1005.0, 1010.2, 1015.3):  # renewals on time: nothing left out
        keeper.renewed(t)
    assert keeper.unreachable_seconds == 0.0
    keeper.renewed(1015.3 + 132.0)  # the next one came through once the link was back
    assert keeper.unreachable_seconds == pytest.approx(127.0)
    assert keeper.worked_seconds(now=1149.3) == pytest.approx(22.3)
    completed = T0 + dt.timedelta(seconds=149.3)
    rest = rest_until(T0, completed, min_rest_seconds=0.5, worked_seconds=keeper.worked_seconds(now=1149.3))
    assert rest is not None and (rest - completed).total_seconds() == pytest.approx(3 * 22.3)
    assert rest_until(T0, completed, min_rest_seconds=0.5) == completed + dt.timedelta(seconds=3 * 149.3)  # before

    ending = ScanLeaseKeeper(None, CLAIM, lease_seconds=600, heartbeat_seconds=5)  # type: ignore[arg-type]
    ending.started = ending.last_ok = 2000.0
    ending.renewed(2004.0)
    assert ending.worked_seconds(now=2009.0) == pytest.approx(9.0)  # one heartbeat late: still work
    assert ending.worked_seconds(now=2100.0) == pytest.approx(9.0)  # the database away since 2004 + 5
