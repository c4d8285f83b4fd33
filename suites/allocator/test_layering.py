"""Imports point one way (DESIGN 1): the allocator imports neither the harness nor pytest, and
the project's conftest hands the allocator's fork-safety check to the harness.

The module graph is read from the source (every ``import`` and ``from ... import`` statement,
also those inside functions and under ``TYPE_CHECKING``: a type-only import is still a
dependency a reader must follow). An edge goes to the module an import names, resolved against
the project's own files; ``from p import name`` goes to ``p.name`` when that is a module, else
to ``p``. The package ``__init__`` files an import runs on the way are not edges (every
sub-module would otherwise form a circle with the ``__init__`` that re-exports it). Imports by
string (``importlib.import_module``) are not seen. Two rules:

- no cycle between modules: of two modules, at most one imports the other, also through others;
- between top-level packages, imports go down the floors of :data:`MAY_IMPORT`:
  ``allocator -> runtime -> suites/bench``, and ``harness`` beside the allocator, neither
  knowing the other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import allocator
import harness
from allocator.device import base

ROOT = Path(__file__).resolve().parents[2]
"""The repository: the project's top-level packages and modules live here."""

MAY_IMPORT = {
    "devmem_gpus": set(),
    "allocator": {"devmem_gpus"},
    "harness": {"devmem_gpus"},
    "runtime": {"allocator", "devmem_gpus"},
    "bench": {"runtime", "allocator", "harness", "devmem_gpus"},
    "suites": {"runtime", "allocator", "harness", "devmem_gpus"},
    "conftest": {"suites", "runtime", "allocator", "harness", "devmem_gpus"},
    "ci": {"suites", "bench", "runtime", "allocator", "harness", "devmem_gpus"},
}
"""For each top-level package or module, the others it may import (DESIGN 1): the floors
``devmem_gpus`` < ``allocator``, ``harness`` < ``runtime`` < ``suites``, ``bench`` <
``conftest.py``, ``ci/``. Anything not named is an import pointing up or sideways."""

FORBIDDEN = ("harness", "pytest", "_pytest")


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_allocator_imports_neither_the_harness_nor_pytest():
    package = Path(allocator.__file__).parent
    offenders = {
        str(path.relative_to(package)): sorted(_imported_roots(path) & set(FORBIDDEN))
        for path in sorted(package.rglob("*.py"))
    }
    assert {name: roots for name, roots in offenders.items() if roots} == {}


def test_the_checker_sees_an_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import harness.plugin\nfrom pytest import fixture\nfrom . import x\n")
    assert _imported_roots(module) == {"harness", "pytest"}


def test_the_conftest_hands_the_allocators_check_to_the_harness(monkeypatch):
    assert allocator.fork_unsafe_reason() is None  # this process never initialized CUDA
    assert harness.fork_unsafe_reason() is None
    monkeypatch.setattr(base, "_fork_unsafe", ["allocator: the cuda backend initialized CUDA"])
    assert allocator.fork_unsafe_reason() == "allocator: the cuda backend initialized CUDA"
    assert harness.fork_unsafe_reason() == "allocator: the cuda backend initialized CUDA"


def test_fork_unsafe_reasons_are_recorded_once_and_joined(monkeypatch):
    monkeypatch.setattr(base, "_fork_unsafe", [])
    base.mark_fork_unsafe("first")
    base.mark_fork_unsafe("second")
    base.mark_fork_unsafe("first")
    assert allocator.fork_unsafe_reason() == "first; second"


def module_files(root: Path, tops: Iterable[str]) -> dict[str, Path]:
    """The project's modules by dotted name: every ``.py`` file of each top-level package in
    ``tops`` (a folder under ``root``) or top-level module (``root/<name>.py``), and every C
    extension's source (``allocator/_cstacks.c``: a module that imports none of the project's).
    A package's ``__init__.py`` is named for the package."""
    files = {}
    for top in tops:
        paths = [root / f"{top}.py"] if (root / f"{top}.py").is_file() else []
        if (root / top).is_dir():
            paths += sorted((root / top).rglob("*.py")) + sorted((root / top).rglob("*.c"))
        for path in paths:
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


def module_graph(files: Mapping[str, Path]) -> dict[str, set[str]]:
    """Which project modules each module imports (see the module docstring for the rules);
    imports of anything outside ``files`` (the standard library, numpy) are left out.

    Raises:
        SyntaxError: a file does not parse.
    """

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in files.items():
        if path.suffix == ".c":
            graph[module] = set()
            continue
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(resolve(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base_name = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base_name = ".".join([*parts, *([node.module] if node.module else [])])
                for alias in node.names:
                    full = f"{base_name}.{alias.name}"
                    targets.add(full if full in files else resolve(base_name))
        graph[module] = targets - {None, module}
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The graph's circles: each strongly connected set of two or more modules, sorted
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                circle = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    circle.append(member)
                    if member == node:
                        break
                if len(circle) > 1:
                    found.append(sorted(circle))
    return sorted(found)


def upward_imports(graph: Mapping[str, set[str]], may_import: Mapping[str, set[str]]) -> list[str]:
    """Each import between top-level packages that ``may_import`` does not allow, as
    ``"importer -> imported"``; a top-level package missing from ``may_import`` allows none."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if (top := module.split(".")[0]) != (target_top := target.split(".")[0])
        and target_top not in may_import.get(top, set())
    )


WHITE_BOX = {
    "suites.runtime._mutants": {
        "runtime.checkpoint._policies",
        "runtime.pipeline._cli",
        "runtime.pipeline._statefile",
    },
    "suites.runtime._ring_mutants": {
        "runtime.ring._program",
        "runtime.ring._sim",
        "runtime.tensormap._map",
    },
    "suites.runtime.test_checkpoint_executor": {
        "runtime.checkpoint._chain",
        "runtime.checkpoint._policies",
        "runtime.checkpoint._revolve",
    },
    "suites.runtime.test_checkpoint_knobs": {"runtime.checkpoint._knobs"},
    "suites.runtime.test_pipeline_statefile": {"runtime.pipeline._statefile"},
    "suites.runtime.test_ring_fatals": {"runtime.ring._sim"},
    "suites.runtime.test_ring_writers": {"runtime.ring._program"},
    "suites.runtime.test_tensormap": {"runtime.tensormap._map", "runtime.tensormap._strided"},
}
"""The runtime's private modules that a suite module may import: each patches a name inside the
module that looks it up (a mutant probe putting a seed's bug back, or a spy counting calls),
which the package's re-exported name cannot reach, or tests a primitive below the public API
(``_strided.values_in``'s closed interval, which no public call reaches at one value;
``_statefile.Layout.for_dims``, the layout a header without one packs with).
Anything else uses the public names."""


def private_imports(graph: Mapping[str, set[str]], allowed: Mapping[str, set[str]]) -> list[str]:
    """Each import of a private module of a runtime package (a name component after
    ``runtime`` that starts with one underscore, e.g. ``runtime.ring._sim``) from outside the
    package that owns it, as ``"importer -> imported"``, unless ``allowed[importer]`` names it.
    ``runtime._checks`` belongs to all of ``runtime``."""
    found = []
    for module, targets in graph.items():
        for target in targets:
            parts = target.split(".")
            if parts[0] != "runtime":
                continue
            private = [i for i, p in enumerate(parts) if i and p[:1] == "_" and p[:2] != "__"]
            if not private:
                continue
            owner = ".".join(parts[: private[0]])
            if (module + ".").startswith(owner + ".") or target in allowed.get(module, set()):
                continue
            found.append(f"{module} -> {target}")
    return sorted(found)


def _project_graph() -> dict[str, set[str]]:
    return module_graph(module_files(ROOT, MAY_IMPORT))


def test_every_top_level_package_has_a_floor():
    tops = {path.stem for path in ROOT.glob("*.py")}
    tops |= {path.parent.name for path in ROOT.glob("*/*.py") if path.parent.name[0] != "."}
    assert tops - set(MAY_IMPORT) == set()


def test_no_two_modules_import_each_other():
    assert cycles(_project_graph()) == []


def test_imports_point_down_the_floors():
    assert upward_imports(_project_graph(), MAY_IMPORT) == []


def test_nothing_outside_a_runtime_package_imports_its_private_modules():
    assert private_imports(_project_graph(), WHITE_BOX) == []


def test_the_private_import_check_fires(tmp_path):
    _write(
        tmp_path,
        {
            "runtime/__init__.py": "",
            "runtime/_checks.py": "",
            "runtime/ring/__init__.py": "from ._sim import x\nfrom .. import _checks\n",
            "runtime/ring/_sim.py": "from ..tensormap import _map\nfrom runtime import _checks\n",
            "runtime/tensormap/__init__.py": "",
            "runtime/tensormap/_map.py": "",
            "suites/__init__.py": "",
            "suites/t.py": "from runtime.ring import _sim\nimport runtime.ring\n",
        },
    )
    graph = module_graph(module_files(tmp_path, ["runtime", "suites"]))
    assert private_imports(graph, {}) == [
        "runtime.ring._sim -> runtime.tensormap._map",
        "suites.t -> runtime.ring._sim",
    ]
    assert private_imports(graph, {"suites.t": {"runtime.ring._sim"}}) == [
        "runtime.ring._sim -> runtime.tensormap._map"
    ]


def _write(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_cycle_check_fires_on_a_circle(tmp_path):
    # a -> b (relative, under TYPE_CHECKING) -> c (inside a function) -> a: one circle of three;
    # d imports a (no circle); the package __init__ re-exporting a is not an edge back
    _write(
        tmp_path,
        {
            "allocator/__init__.py": "from .a import A\n",
            "allocator/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from .b import B\n",
            "allocator/b.py": "def f():\n    from allocator import c\n",
            "allocator/c.py": "import allocator.a\nimport numpy\n",
            "allocator/d.py": "from . import a\n",
        },
    )
    graph = module_graph(module_files(tmp_path, ["allocator"]))
    assert graph["allocator.d"] == {"allocator.a"}
    assert cycles(graph) == [["allocator.a", "allocator.b", "allocator.c"]]
    graph["allocator.c"].clear()
    assert cycles(graph) == []


def test_the_floor_check_fires_on_an_upward_import(tmp_path):
    _write(
        tmp_path,
        {
            "allocator/__init__.py": "",
            "allocator/low.py": "from runtime.ring import x\n",
            "harness/__init__.py": "import allocator.low\n",
            "runtime/__init__.py": "",
            "runtime/ring.py": "from allocator import low\nfrom suites import helpers\n",
            "suites/__init__.py": "",
            "suites/helpers.py": "import runtime\nimport harness\nimport allocator\n",
        },
    )
    graph = module_graph(module_files(tmp_path, ["allocator", "harness", "runtime", "suites"]))
    assert upward_imports(graph, MAY_IMPORT) == [
        "allocator.low -> runtime.ring",
        "harness -> allocator.low",
        "runtime.ring -> suites.helpers",
    ]
    assert upward_imports(graph, {}) != []  # a package with no floor may import nothing
