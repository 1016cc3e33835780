"""The ``packhorse`` command line (typer), one module per concept:

- ``pipeline``: init, run, run-operation, demo, status, verify, stage
- ``distributed``: worker, manager, monitor, notifier, disk-monitor, api
- ``operator``: reset, retry, breaker, diagnose, locate, reconcile, notifications
- ``admin``: health, token, config, audit, usage
- ``bags``: validate (a BagIt bag folder or tar; no configuration needed)

``common`` holds the application object, exit codes and the helpers they share; ``progress``
the per-stage progress of a run (bars on a terminal, summary lines off one). Exit codes:
0 ok, 1 a check found a problem, 2 configuration error, 3 an operation FAILED, 4 work is
blocked waiting for a human. ``main`` is the console-script entry point (``packhorse``).
"""

from __future__ import annotations

import sys

from ..errors import PackhorseError
# each registers its commands on ``app``; the order is the order of `packhorse --help`
from . import pipeline, operator, distributed, admin, bags  # noqa: F401, I001
from .common import EXIT_BLOCKED, EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_PROBLEM, app
from .distributed import serve_api
from .pipeline import exit_code_after_run

__all__ = ["EXIT_BLOCKED", "EXIT_CONFIG", "EXIT_FAILED", "EXIT_OK", "EXIT_PROBLEM", "app", "exit_code_after_run",
           "main", "serve_api"]


def main() -> None:
    """Console-script entry point: run the command (logging at WARNING until the command sets
    its own level); a ``PackhorseError`` that escapes a command prints ``error: ...`` and exits 1."""
    from .. import logs

    # until a command sets its own level: warnings and errors only (structlog's default would
    # print every debug line)
    logs.configure("WARNING")
    try:
        app()
    except PackhorseError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_PROBLEM)
