"""The order the chaos, long and multi-site tests start in (``tests/conftest.py``).

The slowest tests are meant to start first, the multi-site ones before all others. In the test
processes of pytest-xdist, where the order that counts is collected, ``dist`` reads ``"no"``:
the sort never ran there, and the multi-site tests ran last in every CI run.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

_spec = importlib.util.spec_from_file_location("tests_root_conftest", Path(__file__).parents[1] / "conftest.py")
assert _spec is not None and _spec.loader is not None
root_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(root_conftest)

ACROSS = "tests/multisite/test_across_sites.py::"
QUICK = "tests/e2e/test_convergence.py::test_not_in_the_list"


class _Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid
        self.fspath = Path(nodeid.split("::")[0]).resolve()

    def add_marker(self, marker: Any) -> None:
        pass


def _order(config: Any) -> list[str]:
    slow = sorted(root_conftest._SLOWEST, key=root_conftest._SLOWEST.get)
    items = [_Item(QUICK), *(_Item(n) for n in slow)]  # collected quickest first
    root_conftest.pytest_collection_modifyitems(config, items)
    return [i.nodeid for i in items]


@pytest.mark.parametrize("where", ["xdist test process", "controller with --dist load"])
def test_the_multi_site_tests_start_first_wherever_the_order_is_made(where: str) -> None:
    if where == "xdist test process":  # what pytest-xdist gives its test processes
        config = SimpleNamespace(workerinput={"workerid": "gw0"}, getoption=lambda name, default=None: "no")
    else:
        config = SimpleNamespace(getoption=lambda name, default=None: "load")
    order = _order(config)
    assert [n.split("::")[0] for n in order[:4]] == ["tests/multisite/test_across_sites.py"] * 2 + [
        "tests/multisite/test_clock_and_outages.py"] * 2  # each module's pair together: one bed each
    assert order[-1] == QUICK


def test_one_process_keeps_the_collected_order() -> None:
    config = SimpleNamespace(getoption=lambda name, default=None: "no")  # -n0: a developer's run
    assert _order(config)[0] == QUICK
