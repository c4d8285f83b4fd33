"""Imports point one way (DESIGN 1): the allocator imports neither the harness nor pytest, and
the project's conftest hands the allocator's fork-safety check to the harness."""

from __future__ import annotations

import ast
from pathlib import Path

import allocator
import harness
from allocator.device import base

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
