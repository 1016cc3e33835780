"""Bag commands: ``validate`` a BagIt bag folder or bag tar to RFC 8493 (or 0.97), with no
configuration or database (the logic is :mod:`packhorse.bags.validation`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from packhorse.cli.app import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    EXIT_PROBLEM,
    ConfigOpt,
    JsonOpt,
    command_set,
    print_json,
    settings,
)

#: this module's commands (loaded by packhorse.cli when one of them runs)
commands = command_set()


@commands.command()
def validate(
    paths: Annotated[list[Path], typer.Argument(help="bag folders, or bag tars holding one top folder each")],
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Validate BagIt bags (RFC 8493, or 0.97) and list every problem of each. Exit 0 when every
    one is valid and complete, 1 when one is not valid, 5 when all are valid but one is
    incomplete (payload files listed in its fetch.txt are not there; packhorse does not fetch).
    Warnings (departures the reference library accepts) are listed and change nothing. --json:
    one path gives its report, several a list of reports in the order given. Needs no
    configuration; with --config its [extraction] limits apply (member caps, manifest entries)."""
    from packhorse.bags.validation import ExtractionLimits, validate_path  # deferred: start-up time

    limits = ExtractionLimits.from_settings(settings(config)) if config is not None else None
    reports = [validate_path(p, limits=limits) for p in paths]
    if as_json:
        print_json(reports[0].as_dict() if len(reports) == 1 else [r.as_dict() for r in reports])
    else:
        for r in reports:
            print(r.summary())
    if not all(r.valid for r in reports):
        raise typer.Exit(EXIT_PROBLEM)
    raise typer.Exit(EXIT_OK if all(r.complete for r in reports) else EXIT_INCOMPLETE)
