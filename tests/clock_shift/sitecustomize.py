"""Test hook: play a host whose clock is off, in a ``packhorse`` subprocess.

Put this folder first on the subprocess's ``PYTHONPATH`` and set
``PACKHORSE_TEST_CLOCK_SHIFT_SECONDS`` (seconds, may be negative): Python imports this
``sitecustomize`` at start-up, which replaces :func:`packhorse.db.clock.host_now` — the one read
of the host's clock that packhorse derives database timestamps from — by one running that many
seconds ahead. Processes forked from it (Celery pool children, local workers) inherit it.
Celery's worker reads the wall clock once more, to drop a message whose ``expires`` has
passed: that read (``celery.worker.request``'s ``datetime.now``) is shifted the same way.
Without the variable nothing is imported or changed.

``PACKHORSE_TEST_HOSTNAME`` (optional) makes the process name another host
(``socket.gethostname``): its leases and heartbeats then name that host, so the monitor and
``health`` cannot see that its processes are gone and must judge it by time alone, as they do a
worker on another machine.

Why not libfaketime: it shifts ``sleep`` and ``select`` timeouts along with the clock on this
machine's Python (a shifted process then sleeps for hours or spins), where a host whose clock
is off sleeps normally. Only packhorse's host-clock read is shifted here; file times, logs and
``time.monotonic`` keep the real clock, as they do on a real host (their own clock, which this
test bed shares).

Being first on ``PYTHONPATH``, this file hides any other ``sitecustomize`` of the interpreter
in that subprocess (this machine's Python has none).

Only test code reads the variable (``tests/unit/test_package_rules.py``: product modules read
no ``PACKHORSE_TEST_*``).
"""

from __future__ import annotations

import os

_SHIFT = os.environ.get("PACKHORSE_TEST_CLOCK_SHIFT_SECONDS")

if _SHIFT:
    import datetime as _dt

    from packhorse.db import clock as _clock

    _real_host_now = _clock.host_now
    _delta = _dt.timedelta(seconds=float(_SHIFT))

    def _shifted_host_now() -> _dt.datetime:
        return _real_host_now() + _delta

    _clock.host_now = _shifted_host_now

    # Celery's worker reads the host's wall clock too: it drops a message whose ``expires``
    # (an absolute time the sender stamped with its own clock) is behind its clock. A worker
    # on a host whose clock is ahead sees that clock there.
    try:
        from celery.worker import request as _celery_request
    except ImportError:  # no Celery in this interpreter: nothing of it to shift
        _celery_request = None
    if _celery_request is not None:
        class _ShiftedDatetime(_dt.datetime):
            @classmethod
            def now(cls, tz: _dt.tzinfo | None = None) -> _dt.datetime:  # type: ignore[override]
                return _dt.datetime.now(tz) + _delta

        _celery_request.datetime = _ShiftedDatetime  # type: ignore[misc]

_HOSTNAME = os.environ.get("PACKHORSE_TEST_HOSTNAME")

if _HOSTNAME:
    import socket as _socket

    _socket.gethostname = lambda: _HOSTNAME
