"""Imported by multiprocessing's fork server alone (its preload list, see
:func:`packhorse.executors.local._start_forkserver`): the fork server ends with ``os._exit`` as
soon as ``packhorse run`` is gone, instead of tearing down every module it imported first.

Why: the fork server inherits ``packhorse run``'s stdout and stderr, so a caller that reads
them to the end (a cron job, ``subprocess.run(capture_output=True)``) waits for the fork server
to exit too; a normal interpreter shutdown with SQLAlchemy, pydantic and the CLI loaded took
about 0.2 s on a 2-core machine. The fork server holds no buffered output and no resources
of its own. Worker processes forked from it leave through ``os._exit`` in any case.
"""

from __future__ import annotations

import atexit
import os

atexit.register(os._exit, 0)
