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
    }
    verdicts = {
        f"{backend} {row['padded_bytes']} B zero3 <= {TARGET_RATIO:g}x alloc+upload+free": row[
            "meets_target"
        ]
        for backend, rows in backends.items()
        for row in rows.get("sizes", ())
    }
    return _common.finish(args, results, render(results), verdicts)


if __name__ == "__main__":
    sys.exit(main())
