"""The ``packhorse`` application loads a command's module only when that command runs
(:mod:`packhorse.cli`): :data:`~packhorse.cli.COMMANDS` names every command of every cli module,
in the order of ``packhorse --help``, and neither the application nor a command that needs no
database (``--version``, ``validate``) imports SQLAlchemy, the database or runtime layers, the
storage registry (every storage type's SDK), or the other commands' modules.

The import checks run in this process on a fresh import of packhorse: the test takes packhorse's
modules out of ``sys.modules``, imports, looks at which packhorse modules came in and at what
they hold (a class or module of SQLAlchemy, say), and puts every module back as it was. Only
packhorse's own modules are imported afresh (a second copy of SQLAlchemy, or of the ORM models,
would change that library's global state for the tests after this one).
"""

from __future__ import annotations

import gc
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

#: Libraries a start-up that needs no database must not use.
HEAVY_LIBRARIES = ("sqlalchemy", "alembic", "azure", "boto3", "botocore", "prometheus_client", "celery", "fastapi")
#: packhorse modules (and their submodules) such a start-up must not import.
HEAVY_MODULES = ("packhorse.db", "packhorse.runtime", "packhorse.storage.registry", "packhorse.engine",
                 "packhorse.executors", "packhorse.status", "packhorse.cli.pipeline", "packhorse.cli.operator",
                 "packhorse.cli.distributed", "packhorse.cli.admin", "packhorse.cli.quarantine")


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.fixture
def fresh_import() -> Iterator[None]:
    """``sys.modules`` without packhorse's modules for the test; restored after it."""
    saved = dict(sys.modules)
    for name in [n for n in sys.modules if _under(n, ("packhorse",))]:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.clear()
        sys.modules.update(saved)
        gc.collect()  # the fresh copies are garbage now: collected here, not in a later test


def _heavy_loaded() -> list[str]:
    """The heavy packhorse modules imported, and every name a packhorse module imported holds
    that comes from a heavy library (a module, class or function)."""
    found = [n for n in sys.modules if _under(n, HEAVY_MODULES)]
    for name, module in list(sys.modules.items()):
        if not _under(name, ("packhorse",)) or module is None:
            continue
        for attr, value in vars(module).items():
            origin = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
            if isinstance(origin, str) and _under(origin, HEAVY_LIBRARIES):
                found.append(f"{name}.{attr} ({origin})")
    return sorted(found)


def test_every_command_of_every_module_is_listed_in_order_of_the_help() -> None:
    from packhorse.cli import COMMANDS, app, command_set_of

    defined: dict[str, str] = {}
    for module in dict.fromkeys(COMMANDS.values()):
        for name in typer.main.get_group(command_set_of(module)).commands:
            assert name not in defined, f"{name} is defined by {defined[name]} and {module}"
            defined[name] = module
    assert defined == COMMANDS
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    assert group.list_commands(None) == list(COMMANDS)  # type: ignore[arg-type]


def test_the_help_lists_every_command_and_a_typo_is_answered_with_a_suggestion() -> None:
    from packhorse.cli import COMMANDS, app

    r = CliRunner().invoke(app, ["--help"])
    assert r.exit_code == 0
    listed = [line.split()[0] for line in r.output.split("Commands:")[1].splitlines() if line.strip()]
    assert listed == list(COMMANDS)
    r = CliRunner().invoke(app, ["helth"])
    assert r.exit_code == 2
    assert "No such command 'helth'. Did you mean 'health'?" in r.output


@pytest.mark.usefixtures("fresh_import")
def test_the_application_imports_no_database_and_no_command_module() -> None:
    import packhorse.cli  # noqa: F401

    assert _heavy_loaded() == []
    assert not [n for n in sys.modules if n.startswith("packhorse.cli.") and n != "packhorse.cli.app"]


@pytest.mark.usefixtures("fresh_import")
def test_version_and_validate_start_without_the_database_layers(tmp_path: Path) -> None:
    from packhorse.cli import app

    r = CliRunner().invoke(app, ["--version"])
    assert (r.exit_code, r.output.startswith("packhorse ")) == (0, True)
    r = CliRunner().invoke(app, ["validate", "--help"])
    assert r.exit_code == 0 and "Validate BagIt bags" in r.output
    r = CliRunner().invoke(app, ["validate", str(tmp_path / "no-such-bag")])
    assert r.exit_code == 1
    assert _heavy_loaded() == []
    # the command's own module, and no other command's
    assert {n for n in sys.modules if n.startswith("packhorse.cli.")} == {"packhorse.cli.app", "packhorse.cli.bags"}


def test_the_check_sees_a_heavy_library_held_by_a_packhorse_module(monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlalchemy.exc import SQLAlchemyError

    import packhorse.cli  # noqa: F401  (packhorse.cli.app the attribute is the application)

    monkeypatch.setattr(sys.modules["packhorse.cli.app"], "SQLAlchemyError", SQLAlchemyError, raising=False)
    assert "packhorse.cli.app.SQLAlchemyError (sqlalchemy.exc)" in _heavy_loaded()


