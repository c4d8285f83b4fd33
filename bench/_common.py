"""What every benchmark under ``bench/`` shares: its command line, the machine it names, and how
it reports.

A benchmark prints a table, writes its results as JSON (``bench/results/<name>.json`` unless
``--out`` says otherwise), and ends with one ``verdict:`` line that says whether each target was
met. Targets are ratios against a reference measured in the same run, so the verdict holds on a
busy or slow machine. The exit status is 0 unless ``--check`` is given and a target was missed.
Benchmarks are never part of pytest; run them by hand (``.venv/bin/python bench/<name>.py``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

__all__ = [
    "RESULTS",
    "ROOT",
    "finish",
    "interleaved_us",
    "machine",
    "min_ratio",
    "paired_ratio",
    "parse",
    "parser",
    "per_call_us",
    "write_atomically",
]


def parser(name: str, doc: str, *, repeat: int, quick: str) -> argparse.ArgumentParser:
    """The shared command line: ``--repeat N``, ``--quick``, ``--check`` and ``--out PATH``.

    Args:
        name: the benchmark's name; the JSON goes to ``bench/results/<name>.json`` by default.
        doc: the module docstring; its first paragraph is the description.
        repeat: the default ``--repeat`` (runs per figure; each benchmark says whether a figure
            is their median or their minimum).
        quick: what ``--quick`` cuts, for its help line.

    Returns:
        A parser to which a benchmark may add its own options; parse with :func:`parse`.
    """
    out = RESULTS / f"{name}.json"
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument(
        "--repeat", type=int, default=repeat, help=f"runs per figure (default {repeat})"
    )
    parser.add_argument("--quick", action="store_true", help=f"{quick} (a smoke run)")
    parser.add_argument(
        "--check", action="store_true", help="exit with status 1 when a target is missed"
    )
    parser.add_argument(
        "--out", type=Path, default=out, help=f"the JSON to write (default {out.relative_to(ROOT)})"
    )
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``; exit with status 2 and a usage line when ``--repeat`` is below 1."""
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    return args


def machine() -> dict:
    """The machine the figures come from: Python, NumPy, platform, processor, CPU count, and
    its load when the benchmark started (``os.getloadavg()``'s 1-minute figure: runnable
    processes, on average; above the CPU count, the machine was shared)."""
    import numpy

    return {
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 2),
    }


def finish(args: argparse.Namespace, results: dict, table: str, verdicts: dict[str, bool]) -> int:
    """Print ``table``, write ``results`` as JSON to ``args.out``, print the verdict line.

    Args:
        verdicts: each target's label (e.g. ``"(a) <= 20x numpy.empty"``) and whether it was met.

    Returns:
        The exit status: 1 when ``--check`` was given and a target was missed, else 0.
    """
    results = {**results, "verdicts": verdicts}
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(args.out, json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    words = "; ".join(f"{label} {'met' if met else 'MISSED'}" for label, met in verdicts.items())
    print(f"verdict: {words or 'no target measured here (' + results.get('skipped', '?') + ')'}")
    missed = [label for label, met in verdicts.items() if not met]
    if missed and args.check:
        print(f"{Path(sys.argv[0]).name} --check: missed {', '.join(missed)}", file=sys.stderr)
        return 1
    return 0


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all: a temporary file in the same
    directory, flushed to disk, then ``os.replace``. The checked-in results under
    ``docs/results/`` and the docs ``ci/doc_tables.py`` rewrites are kept by the user: a
    benchmark killed while writing leaves the old file, never a truncated one.

    Raises:
        OSError: the directory cannot be written (the temporary file is removed, ``path``
            is left as it was).
    """
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise


def per_call_us(
    fn: Callable[[], None],
    number: int,
    repeat: int,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """``repeat`` timings of ``number`` calls of ``fn``, each in microseconds per call.

    ``clock`` is read before and after each run, in seconds: wall time by default;
    ``time.thread_time`` (this thread's CPU time) for host-only code on a busy machine, where
    the time the scheduler gives other processes is wall time but not this thread's CPU time.
    """
    runs = []
    for _ in range(repeat):
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            start = clock()
            for _ in range(number):
                fn()
            elapsed = clock() - start
        finally:
            if gc_was_enabled:
                gc.enable()
        runs.append(elapsed / number * 1e6)
    return runs


def interleaved_us(
    fns: dict[str, Callable[[], None]], number: int, repeat: int
) -> dict[str, list[float]]:
    """``repeat`` rounds; in each, every function timed once (``number`` calls, in microseconds
    per call), in an order rotated by one every round, so that a change of the machine's load
    hits every function alike rather than whichever was measured then.

    Returns:
        Each function's name to its ``repeat`` timings, in round order. On a busy machine take
        their ``min`` as the figure a ratio compares: the load only ever adds time, and a
        median still moves with it when it lasts longer than a few runs.
    """
    names = list(fns)
    runs: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeat):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name] += per_call_us(fns[name], number, 1)
    return runs


def min_ratio(runs: list[float], reference: list[float]) -> float:
    """``min(runs) / min(reference)``: the fastest run against the fastest reference run.

    On a busy machine the load only ever adds time (preemption, caches shared with other
    processes), and it hits a long run more often than a short one; the fastest of enough runs
    is the one it disturbed least, so this ratio is the one that holds when the reference is
    noisy (``bench/alloc.py``'s targets use it, with CPU time).

    Raises:
        ValueError: either list is empty.
    """
    if not runs or not reference:
        raise ValueError("min_ratio needs at least one run and one reference run")
    return min(runs) / min(reference)


def paired_ratio(runs: list[float], reference: list[float]) -> float:
    """The median of ``runs[i] / reference[i]``: each run against the reference run beside it,
    so that a change of the machine's load between runs cancels (a ratio of two medians does
    not when the load moves during the benchmark).

    Args:
        runs, reference: timings in any one unit, taken in pairs (``runs[i]`` beside
            ``reference[i]``), at least one pair.

    Raises:
        ValueError: the lists differ in length (``zip(strict=True)``).
        statistics.StatisticsError: they are empty.
    """
    return statistics.median(a / b for a, b in zip(runs, reference, strict=True))
