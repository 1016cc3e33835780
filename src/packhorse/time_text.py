"""How a time is written for a person: the one format of the text surfaces (the CLI's tables
and lines, ``status`` and its problem summaries, ``locate``'s sentences).

The format is ``YYYY-MM-DD HH:MM:SS``: UTC, whole seconds (cut, not rounded), no offset; the
column title or the sentence around it says UTC. Data (``--json``, the API's fields, the
database, audit details) keeps ISO 8601.
"""

from __future__ import annotations

import datetime as dt

#: The ``strftime`` pattern of :func:`utc_text`.
UTC_TEXT_FORMAT = "%Y-%m-%d %H:%M:%S"


def utc_text(when: str | dt.datetime | None, missing: str = "-") -> str:
    """``when`` as every text surface shows a time: ``2026-12-05 10:01:02`` (UTC, seconds).

    Args:
        when: an ISO 8601 time (``2026-12-05T10:01:02.123456+00:00``, ``…Z``, any offset, or
            none: then it is read as UTC), a ``datetime`` (naive: read as UTC; aware: converted
            to UTC), or ``None`` / ``""`` for no time.
        missing: the text for no time (``"-"`` in a table cell; ``"?"``, ``"never"`` in a sentence).

    Returns:
        ``YYYY-MM-DD HH:MM:SS`` in UTC, or ``missing``.

    Raises:
        ValueError: ``when`` is a string that is not ISO 8601.
    """
    if when is None or when == "":
        return missing
    t = dt.datetime.fromisoformat(when) if isinstance(when, str) else when
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.astimezone(dt.UTC).strftime(UTC_TEXT_FORMAT)
