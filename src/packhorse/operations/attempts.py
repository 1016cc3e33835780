"""How an operation's claims and failures are worded for an operator.

An operation's ``attempt`` is its fencing token (DESIGN.md "Lease"): it grows by one with
every claim, whether the claim then failed, stalled, or was handed back to wait for a data
location that was unavailable, for space, or for a deletion rule (no retry counted). It must
keep growing for fencing, so it is never reset; but "attempt 7" after six waits reads as seven
tries that failed. ``retry_count`` counts the failures that were retried. These functions
word the two honestly for ``packhorse diagnose`` and ``packhorse locate``.
"""

from __future__ import annotations


def _retries(n: int) -> str:
    return f"{n} retr{'y' if n == 1 else 'ies'}"


def claim_words(attempt: int, retry_count: int, *, explain: bool = True) -> str:
    """The claim ``attempt`` (fencing token, 1-based) of an operation with ``retry_count``
    failures retried so far, as an operator reads it: ``"attempt N"`` when every claim before
    it failed (``attempt <= retry_count + 1``), else ``"claim N, after M retries (the other
    claims waited for a location or for space, or stalled: no failure)"`` — a claim after a
    wait is not a new failed attempt. Without ``explain`` (a line that shows the retries
    itself) only ``"claim N"``."""
    if attempt <= retry_count + 1:
        return f"attempt {attempt}"
    if not explain:
        return f"claim {attempt}"
    return (f"claim {attempt}, after {_retries(retry_count)} (the other claims waited for a location or "
            "for space, or stalled: no failure)")


def failure_words(attempt: int, retry_count: int) -> str:
    """A failure recorded at claim ``attempt`` (fencing token) when ``retry_count`` retries
    had been counted before it: ``"failure K"`` (K = ``retry_count + 1``: the how-manieth
    failure of the operation), with ``" (claim N)"`` when claims that waited or stalled came
    between."""
    nth = retry_count + 1
    return f"failure {nth}" + (f" (claim {attempt})" if attempt != nth else "")
