"""The project's own pytest options and output (root conftest.py), seen from outside."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from suites.ci import path_without_a_driver, read_toml

ROOT = Path(__file__).resolve().parents[2]
SMALL = "suites/allocator/test_stats.py"
"""A quick module that runs on every backend."""


def _pytest(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("DEVMEM_", "PYTEST_"))
    }
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("args", "env", "line"),
    [
        ((), {"DEVMEM_BACKEND": "gpu"}, "DEVMEM_BACKEND='gpu': expected a comma-separated list"),
        (("--backend", "gpu"), {}, "--backend='gpu': expected a comma-separated list of cpu"),
        (("--backend", ","), {}, "--backend=',': expected"),
    ],
)
def test_a_bad_backend_is_one_line_naming_where_it_came_from(args, env, line):
    # Issue 14: DEVMEM_BACKEND=gpu used to be reported as an option the user never passed.
    result = _pytest("--co", "-q", *args, SMALL, **env)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR
    assert line in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_an_unavailable_backend_is_one_summary_line(tmp_path):
    # Issue 14: one line per backend and reason, not one per test. No nvidia-smi on PATH, so
    # cuda is unavailable here whatever the machine has (a GPU box has it in /usr/bin).
    path = path_without_a_driver(tmp_path)
    result = _pytest(
        "-q", "--backend", "cpu,cuda", SMALL, "suites/allocator/test_config.py", PATH=path
    )
    assert result.returncode == 0, result.stdout[-3000:]
    skipped = re.findall(r"(?m)^SKIPPED \[(\d+)\] (.*)$", result.stdout)
    assert len(skipped) == 1, skipped
    count, where = skipped[0]
    assert where.startswith("cuda: "), where  # then the reason and how to get cuda (issue 41)
    assert f"{count} skipped" in result.stdout.splitlines()[-1]


def test_interop_tests_without_the_option_are_one_summary_line():
    result = _pytest("-q", "suites/allocator/test_memory_interop.py")
    assert result.returncode == 0, result.stdout[-3000:]
    skipped = re.findall(r"(?m)^SKIPPED \[(\d+)\] (.*)$", result.stdout)
    assert [where for _, where in skipped] == [
        "interop: run with --interop (PyTorch installed); ci/check.sh --interop installs"
        " torch==2.13.0 (CPU) and runs them"
    ], skipped
    assert int(skipped[0][0]) > 1


def test_notes_are_one_line_unless_verbose():
    result = _pytest("-q", "--backend", "cpu", "suites/allocator/test_cache_cap.py")
    assert result.returncode == 0, result.stdout[-3000:]
    assert re.search(r"(?m)^devmem notes: \d+ \(measured values", result.stdout)
    assert "cpu keeps no cache" not in result.stdout
    verbose = _pytest("-v", "--backend", "cpu", "suites/allocator/test_cache_cap.py")
    assert "= devmem notes =" in verbose.stdout
    assert "cpu keeps no cache: cache_bytes == 0, the cap is not exercised" in verbose.stdout


def test_installing_us_forces_no_test_plugins_on_a_project():
    # Issue 14: the runtime dependencies used to pull in pytest-xdist and pytest-forked and cap
    # pytest below 9.2 in every user's environment. The cap exists for pytest-forked only.
    project = read_toml(ROOT / "pyproject.toml")["project"]
    runtime = " ".join(project["dependencies"])
    assert "xdist" not in runtime and "forked" not in runtime and "<" not in runtime
    test_extra = " ".join(project["optional-dependencies"]["test"])
    assert "pytest-xdist" in test_extra and "pytest-forked" in test_extra
    assert "pytest<9.2" in test_extra
    assert isinstance(project["license"], str)  # the SPDX form; a table is deprecated


def _module_level_skips(source: str) -> list[int]:
    """Lines of module-level statements (not in a function or class) that call
    ``pytest.importorskip`` or ``pytest.skip``."""
    lines = []
    for statement in ast.parse(source).body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for node in ast.walk(statement):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("importorskip", "skip")
            ):
                lines.append(node.lineno)
    return lines


def test_no_module_skips_while_it_is_collected():
    # A module skipped at collection (a module-level importorskip) counts in the run's totals
    # but not in xdist's "N items", so the two disagreed by one; a skip belongs to items.
    found = {
        str(path.relative_to(ROOT)): _module_level_skips(path.read_text())
        for path in sorted((ROOT / "suites").rglob("test_*.py"))
    }
    assert {path: lines for path, lines in found.items() if lines} == {}
    assert _module_level_skips("import pytest\ntorch = pytest.importorskip('torch')\n") == [2]
    assert _module_level_skips("def f():\n    pytest.importorskip('torch')\n") == []


LEAVES_FORK_UNSAFE = """
import pytest

from allocator.device import base


@pytest.mark.own_process
def test_does_it_in_a_process_of_its_own():
    base.mark_fork_unsafe("pretend: the cuda backend initialized CUDA on device 0")


def test_initializes_cuda_in_the_test_process():
    base.mark_fork_unsafe("pretend: the cuda backend initialized CUDA on device 0")
"""


def test_a_test_that_leaves_the_pytest_process_fork_unsafe_fails_by_name(tmp_path):
    # The root conftest's guard, both ways: the test in its own process (as the conftest runs
    # every cuda item) passes, the one that marks the pytest process is an error saying why.
    (tmp_path / "test_unsafe.py").write_text(LEAVES_FORK_UNSAFE)
    result = _pytest("-p", "conftest", "-rA", "--rootdir", str(tmp_path), str(tmp_path))
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout[-3000:]
    assert "2 passed, 1 error" in result.stdout.splitlines()[-1], result.stdout[-3000:]
    assert (
        "this test made the pytest process unsafe to fork (pretend: the cuda backend initialized"
        " CUDA on device 0): the fork-style death tests after it in this process would be refused"
    ) in result.stdout
    errors = [line for line in result.stdout.splitlines() if line.startswith("ERROR ")]
    assert len(errors) == 1 and "::test_initializes_cuda_in_the_test_process" in errors[0]
