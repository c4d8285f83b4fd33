"""ZeRO-3 benchmark: a parameter's gather+release round trip against plain allocations.

Not a test: run it by hand (``.venv/bin/python bench/zero3.py``). It prints a table and writes
JSON (``bench/results/zero3.json`` by default). Every figure is the median of ``--repeat`` runs,
each run interleaving the three loops below, and every ratio is the median of each run over the
reference run beside it (``_common.paired_ratio``), on the same allocator.

For each backend (``cpu``, ``sim``, and ``cuda`` where a GPU is visible; otherwise the ``cuda``
column says why it was skipped) and each parameter size (4,097 and 262,145 float32 elements
over 2 ranks: padded bases of 16 KiB and 1 MiB):

- ``zero3``: ``Zero3.allgather`` + ``Zero3.release(n_users=1)`` of a non-persistent parameter
  (the gather stream waits for the current one, the base is allocated and filled on the gather
  stream, the final release records the current stream and frees the storage with ``resize_``);
- ``alloc+free``: ``empty(padded)`` + ``release``, the reference the issue names;
- ``alloc+upload+free``: ``from_numpy(padded host array)`` + ``release``: the same data movement
  as the gather's, without ZeRO-3's bookkeeping.

A second table, ``overlap``, is simulated time, not wall time: a chain of 6 layers (a weight and
a bias each, 4,097 elements over 2 ranks) replayed by ``runtime.zero3_graph.run_graph`` on
``sim`` with kernels of 100 logical us, with prefetch 0, 1 and 2, each on a fresh allocator: the
time at which the last kernel completes, with ``Zero3.wait`` waiting on the parameter's own
all-gather event (as DeepSpeed does) and, as the reference in the same run, waiting for the
whole gather stream. Target: with events, prefetch 2 ends before prefetch 0 (the compute of
layer k overlaps the gathers of layers k+1 and k+2).

Every loop's allocation is a cache hit after the first (on ``sim`` and ``cuda``; ``cpu`` keeps
no cache). Target (checked with ``--check``, which exits 1 when it is missed): ``zero3`` at
most 4x ``alloc+upload+free`` for every backend and size, i.e. ZeRO-3's bookkeeping (two stream
waits, a stream scope, a view, the checks, ``record_stream`` and ``resize_``) costs at most
three times the gather's own allocation and data movement.
"""

from __future__ import annotations

import statistics
import sys

import _common  # bench/_common.py, beside this script
import numpy as np
from _common import paired_ratio, per_call_us

ROOT = _common.ROOT
sys.path.insert(0, str(ROOT))

from allocator import Allocator, AllocatorConfig  # noqa: E402
from allocator.device import backend_unavailable_reason  # noqa: E402
from runtime.zero3 import Zero3  # noqa: E402
from runtime.zero3_graph import run_graph  # noqa: E402

WORLD = 2
SIZES = (4097, 262145)
TARGET_RATIO = 4.0
LOOPS = ("zero3", "alloc+free", "alloc+upload+free")


def bench_backend(backend: str, numel: int, repeat: int, number: int) -> dict:
    """The three loops of one backend and parameter size: medians, ratios and the verdict."""
    alloc = Allocator(AllocatorConfig(backend=backend))
    z3 = Zero3(alloc, WORLD)
    param = z3.register("w", numel)
    # written host memory, as the parameter's is (untouched zeros would all read one page)
    host = np.full(param.padded_numel, 0.5, dtype=np.float32)
    allgather, release, free = z3.allgather, z3.release, alloc.release
    empty, from_numpy, padded = alloc.empty, alloc.from_numpy, param.padded_numel

    def gather_release() -> None:
        release(allgather("w"), "w", 1)

    def alloc_free() -> None:
        free(empty(padded))

    def upload_free() -> None:
        free(from_numpy(host))

    loops = dict(zip(LOOPS, (gather_release, alloc_free, upload_free), strict=True))
    for loop in loops.values():  # warm the cache for every loop
        loop()
    runs: dict[str, list[float]] = {name: [] for name in LOOPS}
    for i in range(repeat):  # interleaved, in an order that rotates, so drift hits all alike
        order = LOOPS[i % 3 :] + LOOPS[: i % 3]
        for name in order:
            runs[name] += per_call_us(loops[name], number, 1)
    if backend == "cuda":
        alloc.device.synchronize()
    medians = {name: statistics.median(values) for name, values in runs.items()}
    stats = alloc.stats()
    ratio = paired_ratio(runs["zero3"], runs["alloc+upload+free"])
    return {
        "numel": numel,
        "padded_bytes": param.padded_bytes,
        "median_us": medians,
        "runs_us": runs,
        "ratio_vs_alloc_free": paired_ratio(runs["zero3"], runs["alloc+free"]),
        "ratio_vs_alloc_upload_free": ratio,
        "overhead_us": medians["zero3"] - medians["alloc+upload+free"],
        "cache_hits": stats.cache_hits,
        "live_bytes_after": stats.live_bytes,
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio <= TARGET_RATIO,
    }


OVERLAP_LAYERS, OVERLAP_NUMEL, OVERLAP_LATENCY_US = 6, 4097, 100


class _StreamWaitZero3(Zero3):
    """The reference: ``wait`` makes the current stream wait for the whole gather stream."""

    def wait(self, view, param_id):
        self._check_view(view, param_id, "wait")
        self.alloc.current_stream().wait_stream(self.gather_stream)
        return view


def simulated_end_us(kind: type[Zero3], prefetch: int) -> int:
    """The logical time at which the graph's last kernel completes on ``sim``."""
    alloc = Allocator(AllocatorConfig(backend="sim", sim_latency_us=OVERLAP_LATENCY_US))
    z3 = kind(alloc, WORLD)
    layers = [(f"w{k}", f"b{k}") for k in range(OVERLAP_LAYERS)]
    for params in layers:
        for param_id in params:
            z3.register(param_id, OVERLAP_NUMEL)
    x = alloc.full(OVERLAP_NUMEL, 1.0)
    run_graph(z3, layers, x, prefetch=prefetch)
    return alloc.device.tail_us


def overlap() -> dict:
    """The ``overlap`` table: simulated end times per prefetch depth, both waits."""
    rows = [
        {
            "prefetch": prefetch,
            "end_us_event": simulated_end_us(Zero3, prefetch),
            "end_us_stream_wait": simulated_end_us(_StreamWaitZero3, prefetch),
        }
        for prefetch in (0, 1, 2)
    ]
    return {
        "layers": OVERLAP_LAYERS,
        "numel": OVERLAP_NUMEL,
        "latency_us": OVERLAP_LATENCY_US,
        "rows": rows,
        "meets_target": rows[2]["end_us_event"] < rows[0]["end_us_event"],
    }


def render(results: dict) -> str:
    """The results as a plain-text table."""
    header = (
        f"{'backend':<8} {'param':>14} {'zero3':>10} {'alloc+free':>11} {'+upload':>10}"
        f" {'/ alloc':>8} {'/ upload':>9} {'ok':>4}"
    )
    lines = [header, "-" * len(header)]
    for backend, rows in results["backends"].items():
        if "skipped" in rows:
            lines.append(f"{backend:<8} skipped ({rows['skipped']})")
            continue
        for row in rows["sizes"]:
            us = row["median_us"]
            label = f"{row['padded_bytes'] // 1024} KiB"
            lines.append(
                f"{backend:<8} {label:>14} {us['zero3']:>7.2f} us {us['alloc+free']:>8.2f} us"
                f" {us['alloc+upload+free']:>7.2f} us {row['ratio_vs_alloc_free']:>7.2f}x"
                f" {row['ratio_vs_alloc_upload_free']:>8.2f}x"
                f" {'yes' if row['meets_target'] else 'NO':>4}"
            )
    lines.append(f"target: zero3 <= {TARGET_RATIO:g}x alloc+upload+free (the '/ upload' column)")
    table = results["overlap"]
    lines += [
        "",
        f"overlap on sim: {table['layers']} layers, kernels of {table['latency_us']} logical us;"
        " the graph's simulated end time",
        f"{'prefetch':>8} {'per-parameter event':>20} {'whole gather stream':>20}",
    ]
    for row in table["rows"]:
        lines.append(
            f"{row['prefetch']:>8} {row['end_us_event']:>17} us {row['end_us_stream_wait']:>17} us"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = _common.parser("zero3", __doc__, repeat=9, quick="fewer iterations")
    args = _common.parse(parser, argv)
    number = 200 if args.quick else 2_000
    backends: dict[str, dict] = {}
    for backend in ("cpu", "sim", "cuda"):
        reason = backend_unavailable_reason(backend)
        if reason is not None:
            backends[backend] = {"skipped": reason}
            continue
        sizes = [bench_backend(backend, numel, args.repeat, number) for numel in SIZES]
        for row in sizes:  # every gathered base was freed by its final release
            assert row["live_bytes_after"] == 0, row
        backends[backend] = {"sizes": sizes}
    results = {
        "machine": _common.machine(),
        "repeat": args.repeat,
        "calls_per_run": number,
        "world_size": WORLD,
        "backends": backends,
        "overlap": overlap(),
    }
    verdicts = {
        f"{backend} {row['padded_bytes']} B zero3 <= {TARGET_RATIO:g}x alloc+upload+free": row[
            "meets_target"
        ]
        for backend, rows in backends.items()
        for row in rows.get("sizes", ())
    }
    verdicts["sim: with per-parameter events, prefetch 2 ends before prefetch 0"] = results[
        "overlap"
    ]["meets_target"]
    return _common.finish(args, results, render(results), verdicts)


if __name__ == "__main__":
    sys.exit(main())
