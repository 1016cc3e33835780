"""The layer contract of ``src/packhorse`` (docs/design-notes.md "Layers"), read from the source.

Every import of a packhorse module counts, wherever it is written: at module top, under
``if TYPE_CHECKING:`` or inside a function. The contract:

* a module imports only modules of its own layer or of layers below it;
* ``stages/``, ``managers/`` and ``recovery/`` (one layer) never import one another;
* the module import graph has no cycle;
* imports sit at module top (``if TYPE_CHECKING:`` blocks included); only ``cli/`` defers
  imports into functions, for start-up time, each with a reason in a comment on it, and no more of
  them than :data:`MAX_CLI_DEFERRED`; elsewhere only the modules of :data:`OPTIONAL` (optional
  integrations most installations never use, whose client libraries every process would
  otherwise load) are imported in the function that needs them, with a reason likewise;
* error classes are imported from ``packhorse.errors`` only; no ``_private`` name is imported
  from another module; no module is named ``common``.

The checker is a plain function of a source tree, so the tests below also run it on a small
tree with a deliberate upward import, a sibling import and a cycle, and see each refused.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "packhorse"

#: Bottom to top. A top-level module (``packhorse.errors``) is in the ground layer; a package
#: (``packhorse.rules``) is in the layer that names it.
LAYERS: list[tuple[str, set[str]]] = [
    ("ground", {"", "errors", "domain", "config", "logs", "digest", "names", "ratelimit", "scanfilter",
                "time_text"}),
    ("db", {"db"}),
    ("storage", {"storage"}),
    ("bags", {"bags"}),
    ("runtime", {"runtime"}),
    ("operations", {"operations"}),
    ("notify", {"notify"}),
    ("rules", {"rules"}),
    ("work", {"stages", "managers", "recovery"}),
    ("engine", {"engine"}),
    ("status", {"status"}),
    ("actions", {"actions"}),
    ("executors", {"executors"}),
    ("front ends", {"api", "cli", "__main__"}),
]
#: Packages of one layer that must not import one another.
SIBLINGS = {"stages", "managers", "recovery"}
#: Imports deferred into functions in cli/ (start-up time), at most: a command's start-up imports what
#: it needs (packhorse.cli loads the module of the command that runs, six of these imports).
MAX_CLI_DEFERRED = 68
#: Modules a module outside cli/ may import in a function (with its reason on the line): the Azure
#: backend (the Azure SDK, ~90 M instructions of a 3.3 G ``packhorse status``) and the InfluxDB sink
#: (the Prometheus client, ~110 M), needed only where an Azure location or ``[metrics.influxdb]``
#: is configured.
OPTIONAL = {"packhorse.storage.azure", "packhorse.runtime.influx"}


@dataclass(frozen=True)
class Import:
    """One import of a packhorse module by ``importer`` (dotted names), at ``line``."""

    importer: str
    target: str
    names: tuple[str, ...]
    line: int
    deferred: bool
    reason: bool


def _module_names(root: Path) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root.parent).with_suffix("")
        if "migrations" in rel.parts:
            continue
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def read_imports(root: Path) -> tuple[dict[str, Path], list[Import]]:
    """Every import of a module of ``root``'s package, by every module of it."""
    pkg = root.name
    modules = _module_names(root)
    found: list[Import] = []
    for name, path in modules.items():
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        in_function: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)):
                        in_function.add(id(inner))
        for node in ast.walk(tree):
            targets: list[tuple[str, tuple[str, ...]]] = []
            if isinstance(node, ast.Import):
                targets = [(a.name, ()) for a in node.names if a.name.split(".")[0] == pkg]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                if mod.split(".")[0] != pkg:
                    continue
                plain = tuple(a.name for a in node.names if f"{mod}.{a.name}" not in modules)
                targets = [(f"{mod}.{a.name}", ()) for a in node.names if f"{mod}.{a.name}" in modules]
                if plain:
                    targets.append((mod, plain))
            line = "\n".join(lines[node.lineno - 1:node.end_lineno]) if targets else ""
            for target, names in targets:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                found.append(Import(name, target, names, node.lineno, id(node) in in_function,
                                    "#" in line))
    return modules, found


def layer_of(module: str) -> tuple[int, str]:
    """``(layer index, package)`` of a dotted module name."""
    parts = module.split(".")[1:]
    first = parts[0] if len(parts) > 1 else ""
    if len(parts) == 1 and parts[0] not in {p for _, ps in LAYERS for p in ps}:
        first = ""  # a top-level module: ground, unless it is a layer's package itself
    elif len(parts) == 1:
        first = parts[0]
    for i, (_, packages) in enumerate(LAYERS):
        if first in packages:
            return i, first
    raise AssertionError(f"{module}: in no layer; add its package to LAYERS")


def _errors_module_classes(root: Path) -> set[str]:
    path = root / "errors.py"
    if not path.exists():
        return set()
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)}


def violations(root: Path, max_cli_deferred: int = MAX_CLI_DEFERRED) -> list[str]:
    """Every breach of the layer contract in the package at ``root``, one line each."""
    pkg = root.name
    modules, imports = read_imports(root)
    errors = _errors_module_classes(root)
    out: list[str] = []
    graph: dict[str, set[str]] = {m: set() for m in modules}
    cli_deferred = 0
    for imp in imports:
        if imp.target == imp.importer:
            continue
        graph[imp.importer].add(imp.target)
        (li, pi), (lt, pt) = layer_of(imp.importer), layer_of(imp.target)
        where = f"{imp.importer}:{imp.line} imports {imp.target}"
        if lt > li:
            out.append(f"{where}: layer {LAYERS[lt][0]} is above {LAYERS[li][0]}")
        if pi in SIBLINGS and pt in SIBLINGS and pi != pt:
            out.append(f"{where}: {pi}/ and {pt}/ must not import each other")
        if imp.deferred:
            if pi == "cli":
                cli_deferred += 1
                if not imp.reason:
                    out.append(f"{where}: a deferred import in cli/ needs its reason on its line")
            elif imp.target in OPTIONAL:
                if not imp.reason:
                    out.append(f"{where}: a deferred import of an optional integration needs its reason on its line")
            else:
                out.append(f"{where}: inside a function (imports sit at module top)")
        for n in imp.names:
            if n in errors and imp.target != f"{pkg}.errors":
                out.append(f"{where}: error {n} must come from {pkg}.errors")
            if n.startswith("_") and not n.startswith("__"):
                out.append(f"{where}: private name {n} imported across modules")
    if cli_deferred > max_cli_deferred:
        out.append(f"cli/ defers {cli_deferred} imports, more than {max_cli_deferred}")
    for m in modules:
        if m.rsplit(".", 1)[-1] == "common":
            out.append(f"{m}: no module is named common (name it after what it holds)")
    out.extend(f"import cycle: {' -> '.join(c)}" for c in _cycles(graph))
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_packhorse_keeps_its_layers() -> None:
    assert violations(SRC) == []


def test_every_module_is_in_a_layer() -> None:
    for module in _module_names(SRC):
        layer_of(module)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "packhorse"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        (folder / "__init__.py").touch()
    return root


def test_the_checker_refuses_an_upward_import_a_sibling_import_and_a_cycle(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "errors.py": "class BoomError(Exception):\n    pass\n",
        "db/models.py": "from packhorse.engine.worker import run\n",                  # upward
        "engine/worker.py": "def run():\n    from packhorse.db import models\n",        # deferred, and a cycle
        "stages/archive.py": "from packhorse.managers.scan import x\n",                 # sibling
        "managers/scan.py": "x = 1\n",
        "rules/policy.py": "from packhorse.stages.archive import BoomError\n",          # upward, error elsewhere
        "status/common.py": "from packhorse.rules.policy import _hidden\n",             # private, and the name
    })
    found = "\n".join(violations(root))
    assert "packhorse.db.models:1 imports packhorse.engine.worker: layer engine is above db" in found
    assert "packhorse.stages.archive:1 imports packhorse.managers.scan: stages/ and managers/" in found
    assert "packhorse.engine.worker:2 imports packhorse.db.models: inside a function" in found
    assert "import cycle: packhorse.db.models -> packhorse.engine.worker" in found
    assert "error BoomError must come from packhorse.errors" in found
    assert "private name _hidden" in found
    assert "packhorse.status.common: no module is named common" in found


def test_the_checker_counts_deferred_imports_in_cli(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "errors.py": "",
        "cli/app.py": ("def a():\n    from packhorse import errors  # start-up time\n"
                       "def b():\n    from packhorse import errors\n"),
    })
    found = violations(root, max_cli_deferred=1)
    assert any("cli/ defers 2 imports, more than 1" in v for v in found)
    assert any("packhorse.cli.app:4" in v and "needs its reason" in v for v in found)
    assert not any("packhorse.cli.app:2" in v for v in found)


def test_outside_cli_only_an_optional_integration_is_imported_in_a_function_with_its_reason(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "errors.py": "",
        "storage/azure.py": "",
        "storage/disk.py": "",
        "storage/registry.py": ("def a():\n    from packhorse.storage.azure import x  # optional: its SDK\n"
                                "def b():\n    from packhorse.storage.azure import x\n"
                                "def c():\n    from packhorse.storage.disk import y  # start-up time\n"),
    })
    found = violations(root)
    assert not any("packhorse.storage.registry:2" in v for v in found), found
    assert any("packhorse.storage.registry:4" in v and "needs its reason" in v for v in found), found
    assert any("packhorse.storage.registry:6" in v and "inside a function" in v for v in found), found
