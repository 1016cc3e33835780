"""Bag commands: ``validate`` a BagIt bag folder or bag tar to RFC 8493 (or 0.97), with no
configuration or database (the logic is :mod:`packhorse.bagvalidation`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import EXIT_OK, EXIT_PROBLEM, JsonOpt, app, print_json


@app.command()
def validate(
    path: Annotated[Path, typer.Argument(help="a bag folder, or a bag tar holding one top folder")],
    as_json: JsonOpt = False,
) -> None:
    """Validate a BagIt bag (RFC 8493, or 0.97) and list every problem. Exit 0 valid, 1 invalid."""
    from ..bagvalidation import validate_path

    report = validate_path(path)
    if as_json:
        print_json(report.as_dict())
    else:
        print(report.summary())
    raise typer.Exit(EXIT_OK if report.valid else EXIT_PROBLEM)
