"""Test-only fault hooks, switched on by the ``PACKHORSE_TEST_FAULTS`` environment variable.

Never set it in production. The value is JSON: a list of hooks, each
``{"point": NAME, "action": ACTION, ...}``. Points are hit by the stages, e.g.
``long_term_archive.writing`` (after the first chunk is written), ``long_term_archive.write``
(every byte written, before the last lease check), ``long_term_archive.publishing`` (after
that check, just before publishing) and
``long_term_archive.published`` (after publishing, before verification). Actions:

* ``"pause"``: create the file ``marker`` (if given), then sleep ``seconds``.
* ``"corrupt"``: flip one byte of the object just published (disk backends), so the
  verification by re-reading must catch it.
* ``"fail"``: raise ``RuntimeError`` (a retryable failure) ``times`` times (default 1).
* ``"db_error"``: raise :class:`~packhorse.errors.TransientDatabaseError`, as a unit of work
  does when the database stayed unavailable (point ``manager.cycle``: in the middle of a
  manager cycle of ``packhorse run``).
* ``"duplicate"`` (point ``dispatch``): the local runner delivers every dispatch twice
  (:func:`active`).

A hook fires at most ``times`` times per process (default: always for pause/corrupt). A hook
with ``"unless_exists": PATH`` does not fire once that file exists (e.g. its own ``marker``:
only the first process that reaches the point pauses, not the pool child that replaces it).

``PACKHORSE_TEST_NO_FENCING=1`` switches fencing off (:func:`fencing_disabled`) so the chaos
harness can show that it detects what fencing prevents: workers never stop on a lost lease,
heartbeats and completions ignore the fencing token, neither a successor nor the start-up
sweep removes the partial file of a stale attempt, and disk publication replaces an existing object
instead of refusing to. Never set it outside that test.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

ENV = "PACKHORSE_TEST_FAULTS"
NO_FENCING_ENV = "PACKHORSE_TEST_NO_FENCING"
_lock = threading.Lock()
_fired: dict[int, int] = {}


def _hooks() -> list[dict[str, Any]]:
    raw = os.environ.get(ENV)
    if not raw:
        return []
    data = json.loads(raw)
    return data if isinstance(data, list) else [data]


def fencing_disabled() -> bool:
    """True only under the test-only ``PACKHORSE_TEST_NO_FENCING=1`` (see module docstring)."""
    return os.environ.get(NO_FENCING_ENV) == "1"


def active(point: str, action: str) -> bool:
    """True if a hook ``{"point": point, "action": action}`` is registered (mode switches)."""
    return any(h.get("point") == point and h.get("action") == action for h in _hooks())


def hit(point: str, *, path: Path | None = None) -> None:
    """Run every hook registered for ``point``; ``path`` is the local file concerned, if any."""
    for i, hook in enumerate(_hooks()):
        if hook.get("point") != point:
            continue
        if hook.get("unless_exists") and Path(hook["unless_exists"]).exists():
            continue
        with _lock:
            times = hook.get("times")
            if times is not None and _fired.get(i, 0) >= int(times):
                continue
            _fired[i] = _fired.get(i, 0) + 1
        action = hook.get("action")
        if action == "pause":
            if hook.get("marker"):
                Path(hook["marker"]).write_text(str(os.getpid()))
            time.sleep(float(hook.get("seconds", 1)))
        elif action == "corrupt" and path is not None:
            os.chmod(path, 0o644)
            with open(path, "r+b") as f:
                b = f.read(1)
                f.seek(0)
                f.write(bytes([(b[0] if b else 0) ^ 0xFF]))
            os.chmod(path, 0o444)
        elif action == "fail":
            raise RuntimeError(f"test fault at {point}")
        elif action == "db_error":
            from .errors import TransientDatabaseError

            raise TransientDatabaseError(f"test fault at {point}: database unavailable")
