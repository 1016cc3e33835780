"""Scan pacing is one rule in both modes (:func:`packhorse.operations.scan_lease.scan_rest_seconds`):
a completed scan rests at least the poll interval and three times as long as it took, whether a
distributed site's scan lease decides it (:func:`~packhorse.operations.scan_lease.rest_until`,
database clock) or the embedded runner (:class:`packhorse.executors.local.ScanPacing`, monotonic
clock). Pure functions: no database, no runner loop."""

from __future__ import annotations

import datetime as dt

import pytest

from packhorse.executors.local import ScanPacing
from packhorse.operations.scan_lease import rest_until, scan_rest_seconds

T0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.timezone.utc)

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
