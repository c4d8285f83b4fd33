"""Benchmark: what one death-test child costs in each style, against pytest-forked per test.

Measures the median wall time of ``harness.run_child`` (launch, run, reap, read back) for the
fork, forkserver and exec styles, with a trivial target (``os.getpid``) and with a target that
imports NumPy (``pkgutil.resolve_name("numpy:__version__")``). Like a test process of this
project, the benchmark process has NumPy imported, and the forkserver zygote preloads it.
Beside them, pytest-forked's cost per test: N trivial tests run under ``--forked`` and without,
in the same run, (forked - plain) / N.

Targets (issue 3): fork at most 3 ms; forkserver at most 15 ms, and at least 5 times cheaper
than exec for the NumPy target.

Usage::

    .venv/bin/python bench/children.py [--repeat 50] [--forked-tests 200] [--out PATH] [--check]

Prints a table and writes JSON (default ``bench/results/children.json``). Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRIVIAL = ("os:getpid", ())
NUMPY = ("pkgutil:resolve_name", ("numpy:__version__",))
STYLES = ("fork", "forkserver", "exec")
LIMITS = {"fork_ms": 3.0, "forkserver_ms": 15.0, "exec_over_forkserver_numpy": 5.0}
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "children.json"


def time_children(style: str, target: str, args: tuple, repeat: int) -> list[float]:
    """Wall seconds of ``repeat`` children (after one warm-up child, which may start a zygote).

    Raises:
      RuntimeError: a child did not end cleanly (the figures would mean nothing).
    """
    import harness

    def one() -> float:
        start = time.perf_counter()
        outcome = harness.run_child(target, *args, style=style, timeout=120.0)
        elapsed = time.perf_counter() - start
        if outcome.kind != "exited" or outcome.exit_code != 0:
            raise RuntimeError(f"{style} child of {target} did not end cleanly: {outcome!r}")
        return elapsed

    one()
    return [one() for _ in range(repeat)]


def time_pytest_forked(tests: int, repeat: int) -> dict:
    """pytest-forked's cost per test: ``tests`` trivial tests with and without ``--forked``."""
    with tempfile.TemporaryDirectory(prefix="bench-forked-") as directory:
        body = "".join(f"def test_{i}():\n    pass\n\n\n" for i in range(tests))
        Path(directory, "test_trivial.py").write_text(body)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", directory]

        def run(extra: list[str]) -> tuple[float, int]:
            start = time.perf_counter()
            result = subprocess.run(
                command + extra, cwd=directory, capture_output=True, text=True, check=False
            )
            return time.perf_counter() - start, result.returncode

        per_test, plain_runs, forked_runs, codes = [], [], [], set()
        for _ in range(repeat):
            plain, plain_code = run([])
            forked, forked_code = run(["--forked"])
            codes |= {plain_code, forked_code}
            plain_runs.append(plain)
            forked_runs.append(forked)
            per_test.append((forked - plain) / tests)
    return {
        "tests": tests,
        "runs": repeat,
        "plain_s": statistics.median(plain_runs),
        "forked_s": statistics.median(forked_runs),
        "per_test_ms": statistics.median(per_test) * 1000,
        "all_passed": codes == {0},
    }


def measure(repeat: int, forked_tests: int, forked_repeat: int) -> dict:
    """Run every measurement; return the results as plain data."""
    import pkgutil  # the NumPy target's own module: its import is not what we measure

    import numpy

    import harness

    assert pkgutil.resolve_name  # imported for the fork style's sake
    harness.set_forkserver_preload(["numpy", "pkgutil"])
    children: dict[str, dict[str, float]] = {}
    for style in STYLES:
        children[style] = {}
        for name, (target, args) in (("trivial", TRIVIAL), ("numpy", NUMPY)):
            times = time_children(style, target, args, repeat)
            children[style][f"{name}_ms"] = statistics.median(times) * 1000
            children[style][f"{name}_min_ms"] = min(times) * 1000
    forked = time_pytest_forked(forked_tests, forked_repeat)
    ratio = children["exec"]["numpy_ms"] / children["forkserver"]["numpy_ms"]
    worst_fork = max(children["fork"]["trivial_ms"], children["fork"]["numpy_ms"])
    worst_forkserver = max(children["forkserver"]["trivial_ms"], children["forkserver"]["numpy_ms"])
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "numpy": numpy.__version__,
        },
        "repeat": repeat,
        "children": children,
        "pytest_forked": forked,
        "exec_over_forkserver_numpy": ratio,
        "limits": LIMITS,
        "checks": {
            "fork_ms": worst_fork <= LIMITS["fork_ms"],
            "forkserver_ms": worst_forkserver <= LIMITS["forkserver_ms"],
            "exec_over_forkserver_numpy": ratio >= LIMITS["exec_over_forkserver_numpy"],
        },
    }


def format_table(results: dict) -> str:
    """The results as a Markdown table plus the pytest-forked line and the target checks."""
    lines = [
        "| style | trivial target | NumPy-importing target |",
        "|---|---:|---:|",
    ]
    for style in STYLES:
        row = results["children"][style]
        lines.append(f"| {style} | {row['trivial_ms']:.1f} ms | {row['numpy_ms']:.1f} ms |")
    forked = results["pytest_forked"]
    label = "pytest-forked, per test" + ("" if forked["all_passed"] else " (tests FAILED)")
    lines.append(f"| {label} | {forked['per_test_ms']:.1f} ms | |")
    checks = results["checks"]
    verdict = {True: "met", False: "MISSED"}
    lines += [
        "",
        f"Median of {results['repeat']} children each; pytest-forked: {forked['tests']} trivial "
        f"tests, {forked['forked_s']:.2f} s with --forked vs {forked['plain_s']:.2f} s without "
        f"(median of {forked['runs']} runs).",
        f"Targets: fork <= 3 ms {verdict[checks['fork_ms']]}; forkserver <= 15 ms "
        f"{verdict[checks['forkserver_ms']]}; exec / forkserver for the NumPy target = "
        f"{results['exec_over_forkserver_numpy']:.1f}x >= 5x "
        f"{verdict[checks['exec_over_forkserver_numpy']]}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table; write the JSON. Returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=50, help="children per measurement")
    parser.add_argument(
        "--forked-tests", type=int, default=200, help="trivial tests per pytest-forked run"
    )
    parser.add_argument(
        "--forked-repeat", type=int, default=3, help="pytest runs with and without --forked"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON file to write")
    parser.add_argument(
        "--check", action="store_true", help="exit with status 1 if a target is missed"
    )
    options = parser.parse_args(argv)
    for name in ("repeat", "forked_tests", "forked_repeat"):
        if getattr(options, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")

    results = measure(options.repeat, options.forked_tests, options.forked_repeat)
    print(format_table(results))
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {options.out}")
    return 1 if options.check and not all(results["checks"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
