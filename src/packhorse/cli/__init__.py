"""The ``packhorse`` command line (typer), one module per concept:

- ``pipeline``: init, run, run-operation, demo, status, verify, stage
- ``distributed``: worker, manager, monitor, notifier, disk-monitor, api
- ``operator``: reset, retry, breaker, diagnose, skipped, locate, reconcile, notifications
- ``admin``: health, token, config, audit, usage
- ``quarantine``: quarantine list, quarantine purge
- ``bags``: validate (a BagIt bag folder or tar; no configuration needed)

The module ``cli.app`` holds what every command shares (global options, exit codes, helpers);
``progress`` the per-stage progress of a run (bars on a terminal, summary lines off one). The
typer application is :data:`app` of this package. Exit codes: 0 ok, 1 a
check found a problem, 2 configuration error, 3 an operation FAILED, 4 work is blocked waiting
for a human. ``main`` is the console-script entry point (``packhorse``).

Commands are loaded on demand: :data:`COMMANDS` names every command and the module that defines
it, and a module is imported (and its commands built) only when one of its commands runs, or
when ``packhorse --help`` lists them all. A command's start-up so costs its own module and what
it needs, not every command's dependencies (the pattern of click's "Lazily loading
subcommands", on typer's group class). A command added to a module is added to
:data:`COMMANDS` too (tests/unit/test_cli_commands.py checks that the two agree).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import typer
from typer.core import TyperGroup

from packhorse import logs
from packhorse.cli.app import (
    EXIT_BLOCKED,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_OUTPUT_CLOSED,
    EXIT_PROBLEM,
    HELP,
    global_options,
)
from packhorse.errors import PackhorseError

__all__ = ["COMMANDS", "EXIT_BLOCKED", "EXIT_CONFIG", "EXIT_FAILED", "EXIT_OK", "EXIT_OUTPUT_CLOSED", "EXIT_PROBLEM",
           "app", "main"]

#: Every command and command group of ``packhorse``, in the order of ``packhorse --help``, with
#: the cli module that defines it.
COMMANDS: dict[str, str] = {
    "health": "admin", "audit": "admin", "usage": "admin",
    "validate": "bags",
    "worker": "distributed", "manager": "distributed", "notifier": "distributed", "disk-monitor": "distributed",
    "monitor": "distributed", "api": "distributed",
    "reset": "operator", "notifications": "operator", "retry": "operator", "diagnose": "operator",
    "locate": "operator", "reconcile": "operator",
    "version": "pipeline", "init": "pipeline", "run": "pipeline", "run-operation": "pipeline", "status": "pipeline",
    "verify": "pipeline", "demo": "pipeline", "stage": "pipeline",
    "token": "admin", "config": "admin",
    "breaker": "operator", "skipped": "operator",
    "quarantine": "quarantine",
}


def command_set_of(module: str) -> typer.Typer:
    """The commands of cli module ``module`` (one of :data:`COMMANDS`' values), importing it."""
    if module == "admin":
        from packhorse.cli.admin import commands  # deferred: loaded when one of its commands runs
    elif module == "bags":
        from packhorse.cli.bags import commands  # deferred: loaded when one of its commands runs
    elif module == "distributed":
        from packhorse.cli.distributed import commands  # deferred: loaded when one of its commands runs
    elif module == "operator":
        from packhorse.cli.operator import commands  # deferred: loaded when one of its commands runs
    elif module == "pipeline":
        from packhorse.cli.pipeline import commands  # deferred: loaded when one of its commands runs
    elif module == "quarantine":
        from packhorse.cli.quarantine import commands  # deferred: loaded when one of its commands runs
    else:
        raise ValueError(f"no cli module {module!r}")
    return commands


class _OnDemand(Mapping[str, Any]):
    """The click commands of :data:`COMMANDS` by name, each module's built when one of its
    commands is first looked up; the names (``list_commands``, "Did you mean ...?") need no
    module."""

    def __init__(self) -> None:
        self._built: dict[str, dict[str, Any]] = {}

    def __getitem__(self, name: str) -> Any:
        module = COMMANDS[name]
        if module not in self._built:
            self._built[module] = typer.main.get_group(command_set_of(module)).commands
        return self._built[module][name]

    def __iter__(self) -> Iterator[str]:
        return iter(COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS)


class _CommandsOnDemand(TyperGroup):
    """typer's group, with the commands of :data:`COMMANDS` loaded on demand."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = _OnDemand()  # type: ignore[assignment]


app = typer.Typer(cls=_CommandsOnDemand, callback=global_options, add_completion=False, no_args_is_help=True,
                  rich_markup_mode=None, help=HELP)


def main() -> None:
    """Console-script entry point: run the command (logging at WARNING until the command sets
    its own level); a ``PackhorseError`` that escapes a command prints ``error: ...`` and exits 1;
    output whose reader went away (``| head``) exits :data:`EXIT_OUTPUT_CLOSED` (141), not 1."""
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
