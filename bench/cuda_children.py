"""What a cuda death-test child costs under pytest, against what CUDA itself costs.

(a) the floor: a fresh interpreter that imports the allocator, builds it on ``cuda`` (CuPy's
    import, a CUDA context, the availability kernel) and runs ``full`` + ``add`` + ``sum``:
    the work of a cuda death-test child with nothing of the harness or pytest around it
    (1.15 s on the first H200 run, ``../shared/gpu-run/README.md``). Wall time, median of
    ``--repeat`` runs.
(b) the suites' cuda death tests under ``pytest -n <workers> --backend cuda
    --strict-backends``: the median child duration the harness's summary line reports (from
    the child's launch to its reaping). Target: at most 1.2x (a) (the H200 run measured 2.30 s,
    2.0x, before the suites kept CUDA out of their workers and the zygote preloaded CuPy).

Runs where the cuda backend can (a GPU, or the fake-GPU lane, whose figures are no GPU's);
elsewhere it says why it skipped. ``--quick`` runs one suite module's cuda items and 3 floor
runs.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time

import _common  # bench/_common.py, beside this script

sys.path.insert(0, str(_common.ROOT))

from allocator.device import backend_unavailable_reason

TARGET_OVER_FLOOR = 1.2
FLOOR_CODE = (
    "from allocator import Allocator, AllocatorConfig\n"
    "a = Allocator(AllocatorConfig(backend='cuda'))\n"
    "assert a.sum(a.add(a.full(16, 1.0), a.full(16, 2.0))) == 48.0\n"
)
QUICK_SUITE = ["suites/allocator/test_detector_death.py"]
FULL_SUITE = ["suites/allocator", "suites/runtime"]
SUMMARY = re.compile(r"^death tests: (\d+) child(?:ren)? \(([^)]*)\); median ([\d.]+) (ms|s)", re.M)


def floor_s(repeat: int) -> list[float]:
    """Wall seconds of ``repeat`` fresh interpreters doing a cuda child's work alone."""
    path = [str(_common.ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(part for part in path if part)}
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", FLOOR_CODE], check=True, env=env, cwd=_common.ROOT)
        runs.append(time.perf_counter() - start)
    return runs


def under_pytest(paths: list[str], workers: int) -> dict:
    """Run the cuda items of ``paths``; the harness's summary of their death-test children."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers)]
    argv += ["--backend", "cuda", "--strict-backends", "-m", "not interop", *paths]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=_common.ROOT)
    wall = time.perf_counter() - start
    found = SUMMARY.search(done.stdout)
    if done.returncode != 0 or found is None:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise SystemExit(
            f"bench/cuda_children.py: pytest failed (status {done.returncode}):\n{tail}"
        )
    value = float(found.group(3)) / (1000 if found.group(4) == "ms" else 1)
    return {
        "command": " ".join(argv[1:]),
        "children": int(found.group(1)),
        "styles": found.group(2),
        "median_child_s": value,
        "pytest_wall_s": wall,
    }


def render(results: dict) -> str:
    if "skipped" in results:
        return f"cuda death-test children: skipped ({results['skipped']})"
    run = results["pytest"]
    ok = "yes" if results["meets_target"] else "NO"
    return "\n".join(
        [
            f"{'cuda death-test child (wall)':<58} {'median':>10} {'target':>10} {'ok':>4}",
            "-" * 85,
            f"{'(a) fresh interpreter: allocator on cuda, full+add+sum':<58}"
            f" {results['floor_s']:>8.3f} s",
            f"{'(b) under pytest -n ' + str(results['workers']) + ' (' + run['styles'] + ')':<58}"
            f" {run['median_child_s']:>8.3f} s",
            f"{'    (b) / (a)':<58} {results['ratio']:>9.2f}x {'<= 1.2x':>10} {ok:>4}",
            f"    {run['children']} children; pytest took {run['pytest_wall_s']:.1f} s",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = _common.parser(
        "cuda_children", __doc__, repeat=5, quick="one suite module, 3 floor runs"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=min(12, os.cpu_count() or 1),
        help="xdist workers of the pytest run (default: min(12, CPU count))",
    )
    args = _common.parse(parser, argv)
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    results: dict = {
        "machine": _common.machine(),
        "command": " ".join(["bench/cuda_children.py", *(sys.argv[1:] if argv is None else argv)]),
    }
    reason = backend_unavailable_reason("cuda")
    if reason is not None:
        results["skipped"] = reason
        return _common.finish(args, results, render(results), {})
    floors = floor_s(3 if args.quick else args.repeat)
    run = under_pytest(QUICK_SUITE if args.quick else FULL_SUITE, args.workers)
    results |= {
        "workers": args.workers,
        "floor_runs_s": floors,
        "floor_s": statistics.median(floors),
        "pytest": run,
    }
    results["ratio"] = run["median_child_s"] / results["floor_s"]
    results["meets_target"] = results["ratio"] <= TARGET_OVER_FLOOR
    verdicts = {"cuda death-test child <= 1.2x a fresh interpreter's": results["meets_target"]}
    return _common.finish(args, results, render(results), verdicts)


if __name__ == "__main__":
    sys.exit(main())
