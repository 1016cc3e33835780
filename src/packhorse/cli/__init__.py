"""The ``packhorse`` command line (typer), one module per concept:

- ``pipeline``: init, run, run-operation, demo, status, verify, stage
- ``distributed``: worker, manager, monitor, notifier, disk-monitor, api
- ``operator``: reset, retry, breaker, diagnose, skipped, locate, reconcile, notifications
- ``admin``: health, token, config, audit, usage
- ``quarantine``: quarantine list, quarantine purge
- ``bags``: validate (a BagIt bag folder or tar; no configuration needed)

``common`` holds the application object, exit codes and the helpers they share; ``progress``
the per-stage progress of a run (bars on a terminal, summary lines off one). Exit codes:
0 ok, 1 a check found a problem, 2 configuration error, 3 an operation FAILED, 4 work is
blocked waiting for a human. ``main`` is the console-script entry point (``packhorse``).
"""

from __future__ import annotations

import os
import sys

# each registers its commands on ``app``; the order is the order of `packhorse --help`
from packhorse.cli import admin, bags, distributed, operator, pipeline, quarantine  # noqa: F401, I001
from packhorse.cli.app import (
    EXIT_BLOCKED,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_OUTPUT_CLOSED,
    EXIT_PROBLEM,
    app,
)
from packhorse.cli.distributed import serve_api
from packhorse.cli.pipeline import exit_code_after_run
from packhorse.errors import PackhorseError

__all__ = ["EXIT_BLOCKED", "EXIT_CONFIG", "EXIT_FAILED", "EXIT_OK", "EXIT_OUTPUT_CLOSED", "EXIT_PROBLEM", "app", "exit_code_after_run",
           "main", "serve_api"]


def main() -> None:
    """Console-script entry point: run the command (logging at WARNING until the command sets
    its own level); a ``PackhorseError`` that escapes a command prints ``error: ...`` and exits 1;
    output whose reader went away (``| head``) exits :data:`EXIT_OUTPUT_CLOSED` (141), not 1."""
    from packhorse import logs  # deferred: start-up time

    # until a command sets its own level: warnings and errors only (structlog's default would
    # print every debug line)
    logs.configure("WARNING")
    stdout_before = _stdout_identity()
    try:
        try:
            app()
        finally:  # what is still buffered goes to the reader now, or fails here, not at exit
            sys.stdout.flush()
    except BrokenPipeError:
        # the rest goes nowhere: the interpreter's last flush must not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        sys.exit(EXIT_OUTPUT_CLOSED)
    except PackhorseError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_PROBLEM)
    except SystemExit as e:
        # click (and rich, for what it prints) end a command whose output pipe was closed
        # (EPIPE) with exit 1, after wrapping stdout (click) or pointing it at /dev/null (rich)
        # so that nothing more is written to it: the code of "a check found a problem" and of
        # "nothing matches"; a closed pipe is no such finding
        # (click's wrapper is matched by name: typer carries its own copy of click)
        if e.code == EXIT_PROBLEM and (type(sys.stdout).__name__ == "PacifyFlushWrapper"
                                       or _stdout_identity() != stdout_before):
            sys.exit(EXIT_OUTPUT_CLOSED)
        raise


def _stdout_identity() -> tuple[int, int] | None:
    """``(device, inode)`` of file descriptor 1, or ``None`` if it is not open."""
    try:
        st = os.fstat(1)
    except OSError:
        return None
    return st.st_dev, st.st_ino
