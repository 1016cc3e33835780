"""Rules the package holds itself to: no test switch in product code, one exception module,
a pinned public surface (``packhorse.__all__``)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import packhorse
import packhorse.errors as errors

SRC = Path(packhorse.__file__).resolve().parent


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages([str(SRC)], prefix="packhorse.")
                  # importing __main__ runs the CLI; alembic's migration scripts run only under alembic
                  if not m.name.endswith("__main__") and ".db.migrations" not in m.name)


def test_product_modules_read_no_test_variable() -> None:
    """Test-only behaviour comes in through hooks handed in by tests (packhorse.runtime.hooks), never
    through a PACKHORSE_TEST_* variable read by product code."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "PACKHORSE_TEST" in text:
            offenders.append(str(path.relative_to(SRC)))
            continue
        for node in ast.walk(ast.parse(text)):  # a name built at run time: "PACKHORSE_" + "TEST_..."
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("TEST_"):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert offenders == []


def test_no_module_of_the_old_test_switches_is_left() -> None:
    assert not (SRC / "faults.py").exists()
    for name in _modules():
        module = importlib.import_module(name)
        assert not hasattr(module, "fencing_disabled"), name


def test_every_exception_class_lives_in_errors_and_is_drawn_in_its_tree() -> None:
    defined_elsewhere = []
    for name in _modules():
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == name \
                    and name != "packhorse.errors":
                defined_elsewhere.append(f"{name}.{attr}")
    assert defined_elsewhere == []
    own = [n for n, o in vars(errors).items() if inspect.isclass(o) and issubclass(o, BaseException)
           and o.__module__ == "packhorse.errors"]
    assert len(own) >= 25
    tree = errors.__doc__ or ""
    drawn = set(re.findall(r"^[\s│├└─]*(\w+)", tree.split("::", 1)[1], re.M))
    assert sorted(set(own) - drawn) == []
    assert all(issubclass(getattr(errors, n), errors.PackhorseError) or n == "PackhorseError" for n in own)


def test_public_surface() -> None:
    assert packhorse.__all__ == sorted(packhorse.__all__)
    assert set(packhorse.__all__) == {
        "ConfigError", "CopyStatus", "DestinationConflictError", "LeaseLostError", "LocationRole",
        "OperationError", "OperationKind", "PackhorseError", "Settings", "Status", "StorageType",
        "UnsafePathError", "VerificationError", "__version__", "load_config",
    }
    for name in packhorse.__all__:
        obj = getattr(packhorse, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            assert obj.__module__ == "packhorse.errors", name
    namespace: dict[str, object] = {}
    exec("from packhorse import *", namespace)  # noqa: S102 - what a user's star import gets
    assert set(namespace) - {"__builtins__"} == set(packhorse.__all__)
