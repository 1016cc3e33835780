"""The one format a time is shown in (:func:`packhorse.time_text.utc_text`): UTC, whole
seconds, no offset, from an ISO 8601 string or a datetime; ``missing`` for no time."""

from __future__ import annotations

import datetime as dt

import pytest

from packhorse.time_text import utc_text


def test_a_naive_datetime_is_read_as_utc() -> None:
    assert utc_text(dt.datetime(2026, 12, 5, 10, 1, 2, 999_999)) == "2026-12-05 10:01:02"


def test_an_aware_datetime_elsewhere_is_converted_to_utc() -> None:
    cet = dt.timezone(dt.timedelta(hours=1))
    assert utc_text(dt.datetime(2026, 12, 5, 0, 30, 0, tzinfo=cet)) == "2026-12-04 23:30:00"
    assert utc_text(dt.datetime(2026, 12, 5, 10, 1, 2, tzinfo=dt.UTC)) == "2026-12-05 10:01:02"


@pytest.mark.parametrize(("iso", "shown"), [
    ("2026-12-05T10:01:02.123456+00:00", "2026-12-05 10:01:02"),  # microseconds cut, not rounded
    ("2026-12-05T10:01:02Z", "2026-12-05 10:01:02"),
    ("2026-12-05T10:01:02", "2026-12-05 10:01:02"),  # no offset: UTC
    ("2026-12-05T01:01:02.5-05:30", "2026-12-05 06:31:02"),  # another offset: converted
    ("2026-12-31T23:30:00-01:00", "2027-01-01 00:30:00"),  # into the next day and year
])
def test_an_iso_time_is_shown_in_utc_to_the_second(iso: str, shown: str) -> None:
    assert utc_text(iso) == shown


def test_no_time_is_shown_as_missing() -> None:
    assert utc_text(None) == "-"
    assert utc_text("") == "-"
    assert utc_text(None, "never") == "never"
    assert utc_text(None, missing="?") == "?"


def test_text_that_is_not_a_time_is_refused() -> None:
    with pytest.raises(ValueError):
        utc_text("yesterday")
