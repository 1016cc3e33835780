"""Bag commands: ``validate`` a BagIt bag folder or bag tar to RFC 8493 (or 0.97), with no
configuration or database (the logic is :mod:`packhorse.bags.validation`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from packhorse.cli.app import EXIT_OK, EXIT_PROBLEM, JsonOpt, app, print_json


@app.command()
def validate(
    paths: Annotated[list[Path], typer.Argument(help="bag folders, or bag tars holding one top folder each")],
    as_json: JsonOpt = False,
) -> None:
    """Validate BagIt bags (RFC 8493, or 0.97) and list every problem of each. Exit 0 when every
    one is valid, 1 when one is not. ``--json``: one path gives its report, several a list of
    reports in the order given."""
    from packhorse.bags.validation import validate_path  # deferred: start-up time

    reports = [validate_path(p) for p in paths]
    if as_json:
        print_json(reports[0].as_dict() if len(reports) == 1 else [r.as_dict() for r in reports])
    else:
        for r in reports:
            print(r.summary())
    raise typer.Exit(EXIT_OK if all(r.valid for r in reports) else EXIT_PROBLEM)
