"""Benchmark: peak memory and recomputation of each checkpoint policy, measured on the allocator.

For chains of N = 8, 16, ..., 1024 layers, every policy runs through the executor
(``runtime.checkpoint.run_checkpointed``) on a fresh allocator: the peak live bytes come from the
allocator's own statistics, the forward calls from the executor. Each row is set against its
bound: Chen et al.'s ``k + ceil(N/k)`` activations for the segment policies (k segments of
``ceil(N/k)`` layers: the ``sqrt``, ``every_n`` and ``sequential`` plans) and, for ``revolve``
with ``s`` snapshots, Griewank and Walther's recomputation ``t(N, s)`` (the minimum in their
model, where a snapshot does not serve its own step's backward) with at most
``s+1`` activations live. A second sweep, at N = 1024, traces the memory/recompute trade-off of
each family (``every_n`` over its interval, ``sequential`` over its segments, ``revolve`` over
its snapshots).

Units: a buffer is one layer's activation scaled down (``--elems`` float32 elements); "peak
buffers" is the allocator's ``peak_bytes`` divided by the buffer size (input, activations and
the gradient, two during each backward); "activations" is the most layer activations live at
once; "recomputes" is the forward calls beyond one per layer; for ``revolve``, "t(N,s)" is
Griewank and Walther's count and "optimum" the fewest recomputes this executor needs at the same
peak (``runtime.checkpoint.min_forward_calls``, N <= 256), which is lower. Time is the median
wall time of one run (``--repeat`` runs), for information only.

A third section times ``python -m runtime.pipeline plan`` itself (``main()`` in this process,
output discarded, interpreter start-up excluded) for N = 3,125 .. 100,000 layers, doubling, for
every policy at its default parameter and ``revolve`` with one snapshot, with the growth per
doubling (2.0 is linear) and, up to N = 12,500, the time the prediction took the old way
(replaying the whole schedule) as the reference. Target: under 1 s at N = 100,000.

Usage::

    .venv/bin/python bench/checkpoint.py [--quick] [--repeat 3] [--backend cpu] [--check]
        [--scale-only]

Prints a table, writes JSON (default ``bench/results/checkpoint.json``) and plots
``bench/results/checkpoint.png`` (matplotlib, the ``plot`` extra; skipped with a message when it
is missing). Exits non-zero only under ``--check``, when a measurement differs from the plan's
prediction or a bound is broken. Not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import statistics
import sys
import time
from pathlib import Path

import _common  # bench/_common.py, beside this script

ROOT = _common.ROOT
sys.path.insert(0, str(ROOT))

from allocator import Allocator, AllocatorConfig  # noqa: E402
from runtime.checkpoint import (  # noqa: E402
    checkpoint_plan,
    min_forward_calls,
    replay,
    revolve_forward_count,
    run_checkpointed,
    sqrt_interval,
)
from runtime.pipeline import main as pipeline_main  # noqa: E402

SIZES = (8, 16, 32, 64, 128, 256, 512, 1024)
EXECUTOR_OPTIMUM_MAX = 256  # the dynamic program is O(N * N * s)
SCALE_SIZES = (3125, 6250, 12500, 25000, 50000, 100000)
SCALE_REFERENCE_MAX = 12500  # replaying whole schedules beyond this takes minutes
SCALE_POLICIES = (
    ("all", None),
    ("boundary", None),
    ("sqrt", None),
    ("every_n", None),
    ("none", None),
    ("sequential", None),
    ("revolve", None),
    ("revolve", 1),
)
GROUP_LAYERS = 17  # the presets' compile groups (107 usable kernels, 6 per layer)
RESULTS = _common.RESULTS


def policies(n: int) -> list[tuple[str, int | None]]:
    """The policies of the main table for ``n`` layers, with their parameters."""
    k = sqrt_interval(n)
    rows = [
        ("all", None),
        ("none", None),
        ("boundary", None),
        ("sqrt", None),
        ("every_n", 4),
        ("sequential", k),
        ("revolve", k),
    ]
    return rows if k == 2 else [*rows, ("revolve", 2)]


def chen_bound(policy: str, n: int, interval: int | None) -> int | None:
    """Chen's ``k + ceil(N/k)`` activations for a plan of segments, else None."""
    if policy in ("sqrt", "every_n"):  # segments of `interval` layers
        return interval + math.ceil(n / interval)
    if policy == "sequential":  # `interval` segments
        return interval + math.ceil(n / interval)
    return None


def measure(policy: str, n: int, interval: int | None, args: argparse.Namespace) -> dict:
    """One policy over ``n`` layers, ``args.repeat`` runs on fresh allocators."""
    starts = list(range(0, n, GROUP_LAYERS)) if policy == "boundary" else None
    plan = checkpoint_plan(policy, n, interval=interval, group_starts=starts)
    predicted = plan.predict()
    times, run = [], None
    for _ in range(args.repeat):
        alloc = Allocator(AllocatorConfig(backend=args.backend))
        start = time.perf_counter()
        run = run_checkpointed(alloc, plan, elems=args.elems)
        times.append(time.perf_counter() - start)
    assert run is not None
    row = {
        "n_layers": n,
        "policy": policy,
        "interval": plan.interval,
        "n_checkpointed": plan.n_checkpointed,
        "peak_bytes": run.peak_bytes,
        "peak_buffers": run.peak_bytes // run.buffer_bytes,
        "peak_activations": run.peak_activations,
        "recomputes": run.recomputes,
        "chen_bound": chen_bound(policy, n, plan.interval),
        "time_ms": statistics.median(times) * 1e3,
        "matches_prediction": (
            run.forward_calls == predicted.forward_calls
            and run.peak_bytes == predicted.peak_bytes(args.elems)
            and run.result == 1 + n * (n + 3) / 2
        ),
    }
    problems = [] if row["matches_prediction"] else ["differs from the plan's prediction"]
    if policy in ("sqrt", "every_n") and row["peak_activations"] > row["chen_bound"]:
        problems.append("above Chen's bound")
    if policy == "revolve":
        row["revolve_minimum"] = revolve_forward_count(n, plan.interval)  # t(N, s)
        if row["recomputes"] != row["revolve_minimum"]:
            problems.append("not Revolve's t(N, s)")
        if n <= EXECUTOR_OPTIMUM_MAX:  # this executor's optimum at the same peak
            row["executor_optimum"] = min_forward_calls(n, min(n, plan.interval + 1)) - n
        if row["peak_activations"] > plan.interval + 1:
            problems.append("more than s+1 activations")
    row["problems"] = problems
    row["note"] = ""
    if policy == "sequential" and row["peak_activations"] > row["chen_bound"]:
        # checkpoint_sequential's last segment takes the remainder of N // k and runs plain
        row["note"] = "above: the plain last segment holds the remainder"
    return row


def tradeoff(n: int, args: argparse.Namespace) -> dict[str, list[dict]]:
    """Each family over its parameter at ``n`` layers: (activations, recomputes) points."""
    families = {
        "every_n": [("every_n", k) for k in range(1, 65)],
        "sequential": [("sequential", k) for k in range(1, 65)],
        "revolve": [("revolve", s) for s in range(2, 65)],
        "sqrt": [("sqrt", None)],
    }
    quick = argparse.Namespace(**{**vars(args), "repeat": 1})
    return {
        family: [measure(policy, n, k, quick) for policy, k in points]
        for family, points in families.items()
    }


def _median_s(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def plan_scale(args: argparse.Namespace) -> list[dict]:
    """Median seconds of the ``plan`` command per N and policy, and of the old prediction
    (a replay of the whole schedule) where it is affordable."""
    sizes = [n for n in SCALE_SIZES if n <= 12500] if args.quick else list(SCALE_SIZES)
    rows, previous = [], {}
    for n in sizes:
        for policy, interval in SCALE_POLICIES:
            argv = ["plan", "--layers", str(n), "--checkpoint", policy]
            argv += [] if interval is None else ["--interval", str(interval)]

            def command(argv=argv) -> None:
                with contextlib.redirect_stdout(io.StringIO()):
                    if pipeline_main(argv) != 0:
                        raise RuntimeError(f"plan {argv} failed")

            seconds = _median_s(command, args.repeat)
            key = (policy, interval)
            row = {
                "n_layers": n,
                "policy": policy,
                "interval": interval,
                "plan_s": seconds,
                "growth": seconds / previous[key] if key in previous else None,
                "replay_s": None,
            }
            if n <= SCALE_REFERENCE_MAX and interval != 1:  # s=1: N*N/2 steps, gigabytes
                starts = list(range(0, n, GROUP_LAYERS))
                plan = checkpoint_plan(policy, n, interval=interval, group_starts=starts)
                row["replay_s"] = _median_s(lambda plan=plan, n=n: replay(n, plan.schedule()), 1)
            previous[key] = seconds
            rows.append(row)
        print(f"  plan N={n}: done", file=sys.stderr)
    return rows


def render_scale(rows: list[dict]) -> str:
    """The plan-scale table as text."""
    head = f"{'N':>7} {'policy':<13} {'plan s':>8} {'x per 2N':>8} {'replay s':>9} {'ratio':>7}"
    lines = ["", "plan command time (median; replay: the old prediction, for reference)", head]
    lines.append("-" * len(head))
    for row in rows:
        name = row["policy"] + ("" if row["interval"] is None else f" s={row['interval']}")
        growth = "" if row["growth"] is None else f"{row['growth']:.2f}"
        replay_s = "" if row["replay_s"] is None else f"{row['replay_s']:.3f}"
        ratio = "" if row["replay_s"] is None else f"{row['plan_s'] / row['replay_s']:.3f}"
        lines.append(
            f"{row['n_layers']:>7} {name:<13} {row['plan_s']:>8.3f} {growth:>8} {replay_s:>9}"
            f" {ratio:>7}"
        )
    return "\n".join(lines)


def render(rows: list[dict]) -> str:
    """The main table as text."""
    head = (
        f"{'N':>5} {'policy':<11} {'k/s':>4} {'saved':>5} {'peak buffers':>12} "
        f"{'activations':>11} {'bound':>7} {'recomputes':>10} {'t(N,s)':>8} {'optimum':>8}"
        f" {'ms':>7}  ok"
    )
    lines = [head, "-" * len(head)]
    for row in rows:
        interval = "" if row["interval"] is None else str(row["interval"])
        bound = "" if row["chen_bound"] is None else str(row["chen_bound"])
        if row["policy"] == "revolve":
            bound = f"<={row['interval'] + 1}"
        minimum = str(row.get("revolve_minimum", ""))
        optimum = str(row.get("executor_optimum", ""))
        ok = "yes" if not row["problems"] else "NO: " + ", ".join(row["problems"])
        if row["note"]:
            ok += f" ({row['note']})"
        lines.append(
            f"{row['n_layers']:>5} {row['policy']:<11} {interval:>4} {row['n_checkpointed']:>5}"
            f" {row['peak_buffers']:>12} {row['peak_activations']:>11} {bound:>7}"
            f" {row['recomputes']:>10} {minimum:>8} {optimum:>8} {row['time_ms']:>7.1f}  {ok}"
        )
    return "\n".join(lines)


def plot(rows: list[dict], curves: dict[str, list[dict]], n_curve: int, path: Path) -> str:
    """Draw the two panels to ``path``; returns a message (written, or why not)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return (
            "no plot: matplotlib is not installed (pip install 'devmem-harness[plot]',"
            " or pass --no-plot)"
        )
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    series: dict[str, list[dict]] = {}
    for row in rows:
        label = row["policy"] + (" s=2" if row["policy"] == "revolve" and row["interval"] == 2
                                 else "")  # fmt: skip
        series.setdefault(label, []).append(row)
    for label, points in series.items():
        left.plot(
            [p["n_layers"] for p in points],
            [p["peak_activations"] for p in points],
            marker="o",
            markersize=3,
            linestyle="--" if label == "none" else "-",  # on top of "all": both hold N
            label=label,
        )
    sizes = sorted({row["n_layers"] for row in rows})
    left.plot(sizes, [2 * math.sqrt(n) for n in sizes], "k--", linewidth=1, label="2*sqrt(N)")
    left.set(xscale="log", yscale="log", xlabel="layers N", ylabel="peak activations live",
             title="Memory: most activations live at once (revolve: s = sqrt N)")  # fmt: skip
    left.legend(fontsize=7, ncol=2)
    for family, points in curves.items():
        style = {"marker": "*", "s": 150} if family == "sqrt" else {"marker": "o", "s": 12}
        right.scatter(
            [p["peak_activations"] for p in points],
            [p["recomputes"] for p in points],
            label=family,
            zorder=3 if family == "sqrt" else 2,
            **style,
        )
    right.set(xscale="log", yscale="log", xlabel="peak activations live",
              ylabel="recomputed forward calls",
              title=f"Trade-off at N = {n_curve} (each family over its parameter)")  # fmt: skip
    right.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return f"wrote {path}"


def main(argv: list[str] | None = None) -> int:
    parser = _common.parser("checkpoint", __doc__, repeat=3, quick="N up to 128 only")
    parser.add_argument("--backend", choices=("cpu", "sim"), default="cpu")
    parser.add_argument("--elems", type=int, default=64, help="floats per buffer (default 64)")
    parser.add_argument("--plot", type=Path, default=RESULTS / "checkpoint.png")
    parser.add_argument("--no-plot", action="store_true", help="skip the plot")
    parser.add_argument(
        "--scale-only", action="store_true", help="only the plan command's time per N"
    )
    args = _common.parse(parser, argv)
    if args.scale_only:
        scale = plan_scale(args)
        largest = max(row["n_layers"] for row in scale)
        verdicts = {
            f"plan under 1 s at N = {largest:,} for every policy": all(
                row["plan_s"] < 1.0 for row in scale if row["n_layers"] == largest
            )
        }
        results = {"machine": _common.machine(), "repeat": args.repeat, "plan_scale": scale}
        return _common.finish(args, results, render_scale(scale), verdicts)
    if args.elems < 1:
        parser.error(f"--elems must be >= 1, got {args.elems}")
    sizes = [n for n in SIZES if n <= 128] if args.quick else list(SIZES)
    started = time.perf_counter()
    rows = []
    for n in sizes:
        for policy, interval in policies(n):
            rows.append(measure(policy, n, interval, args))
        print(f"  N={n}: done ({time.perf_counter() - started:.1f} s)", file=sys.stderr)
    n_curve = sizes[-1]
    curves = tradeoff(n_curve, args)
    scale = plan_scale(args)
    results = {
        "machine": _common.machine(),
        "backend": args.backend,
        "elems": args.elems,
        "repeat": args.repeat,
        "rows": rows,
        "tradeoff": {"n_layers": n_curve, "families": curves},
        "plan_scale": scale,
    }
    table = render(rows) + "\n" + render_scale(scale)
    if not args.no_plot:
        table += "\n" + plot(rows, curves, n_curve, args.plot)
    every = rows + [point for points in curves.values() for point in points]
    verdicts = {
        "counts and peaks as planned": all(
            "differs from the plan's prediction" not in row["problems"] for row in every
        ),
        "sqrt/every_n within Chen's bound": all(
            "above Chen's bound" not in row["problems"] for row in every
        ),
        "revolve at Griewank-Walther t(N, s) with s+1 activations": all(
            not {"not Revolve's t(N, s)", "more than s+1 activations"} & set(row["problems"])
            for row in every
        ),
    }
    largest = max(row["n_layers"] for row in scale)
    verdicts[f"plan under 1 s at N = {largest:,} for every policy"] = all(
        row["plan_s"] < 1.0 for row in scale if row["n_layers"] == largest
    )
    return _common.finish(args, results, table, verdicts)


if __name__ == "__main__":
    sys.exit(main())
