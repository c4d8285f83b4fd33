"""Heap-ring and TensorMap benchmarks: simulated tasks per second, lookup cost per live entry.

Not a test: run it by hand (``.venv/bin/python bench/ring.py``). It prints a table and writes JSON
(``bench/results/ring.json`` by default). Every ratio is taken against a reference measured in
the same run. (a) and (d) are medians of ``--repeat`` runs; the lookups of (b) and (c) are
timed in ``4 x --repeat`` interleaved rounds of 50 lookups (every map once per round, the order
rotating) and each figure is its fastest round, so that a busy machine's load, which only adds
time and moves a median while it lasts, cannot flip their verdicts.

(a) Simulated tasks per second (wall clock: planning plus simulation) of ``paged_attention``
    (``q_tiles=2, kv_blocks=2``, 4 cores, seed 0, exact reclaim) for batch 16, 32, 64, 128 and
    256, in ``busy-wait`` and ``kernel`` replay (``kernel`` on ``cpu`` runs every kernel's ops).
    Reference: batch 16 of the same mode. Target: the rate at batch 256 is at least 0.5x the
    rate at batch 16 (the simulator scales linearly in tasks).
(b) TensorMap lookup time against the number of live entries: n disjoint 64-element tiles of
    one buffer (n = 1 .. 100,000), then lookups of single tiles spread over the buffer; and the
    same lookup with 100,000 entries in 100 other buffers. Reference: n = 1. Targets: at most
    3x from 1 to 100,000 entries (a lookup looks only at entries that can reach its bytes), and
    other buffers' entries cost nothing (at most 1.5x).
(c) The same tile lookups with one whole-buffer entry present (a writer of the whole buffer):
    1,000, 10,000 and 100,000 tiles (the quick run: 1,000 and 10,000). Reference: 1,000 tiles.
    Target: flat within 2x (the entries' length classes keep a long entry from widening the
    tiles' window; the single sorted list before them scanned every entry starting before the
    lookup: 18.9 us at 1,000 tiles, 11.1 ms at 100,000).
(d) ``classify`` of a 256x128 tile with column stride 2 inside a 256x256 tile of one float32
    matrix (512 columns): a strided view inside a dense one. Target: under 1 ms (a check per
    run of the strided tile took 238 ms).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable

import _common  # bench/_common.py, beside this script
from _common import interleaved_us, per_call_us

ROOT = _common.ROOT
sys.path.insert(0, str(ROOT))

from allocator import Allocator, AllocatorConfig  # noqa: E402
from runtime import ring  # noqa: E402
from runtime.tensormap import Overlap, Region, TensorMap, classify  # noqa: E402

BATCHES = (16, 32, 64, 128, 256)
ENTRIES = (1, 10, 100, 1_000, 10_000, 100_000)
TARGET_RATE_RATIO = 0.5
TARGET_LOOKUP_GROWTH = 3.0
TARGET_OTHER_BUFFERS = 1.5
WHOLE_TILES = (1_000, 10_000, 100_000)
TARGET_WHOLE_GROWTH = 2.0
TARGET_CLASSIFY_US = 1000.0
TILE = 64
LOOKUPS = 50
"""Lookups per timed round of (b) and (c): short rounds, so that few are hit by another
process's burst, and their minimum is the lookup's own cost."""
LOOKUP_ROUNDS_PER_REPEAT = 4
"""(b) and (c) time ``4 x --repeat`` interleaved rounds (28 by default)."""


def bench_tasks_per_second(repeat: int, batches: tuple[int, ...]) -> dict:
    """(a) simulated tasks per second per batch, in each replay mode."""
    alloc = Allocator(AllocatorConfig(backend="cpu"))
    modes = {}
    for replay in ring.REPLAY_MODES:
        config = ring.RingConfig(replay=replay)
        rows = {}
        for batch in batches:
            tasks = ring.run("paged_attention", config, alloc, batch=batch).tasks
            us = per_call_us(
                lambda c=config, b=batch: ring.run("paged_attention", c, alloc, batch=b), 1, repeat
            )
            rows[str(batch)] = {"tasks": tasks, "tasks_per_s": tasks / statistics.median(us) * 1e6}
        ratio = rows[str(batches[-1])]["tasks_per_s"] / rows[str(batches[0])]["tasks_per_s"]
        modes[replay] = {
            "per_batch": rows,
            "ratio_last_to_first": ratio,
            "meets_target": ratio >= TARGET_RATE_RATIO,
        }
    return modes


def _lookups(tmap: TensorMap, n: int, lookups: int) -> Callable[[], None]:
    """``lookups`` single-tile lookups spread over ``n`` tiles of ``tmap`` (warmed once)."""
    stride = max(1, n // lookups)
    queries = [Region.contiguous("x", (i * stride % n) * TILE + 3, 8) for i in range(lookups)]
    lookup = tmap.lookup
    for q in queries:  # warm
        lookup(q)

    def go() -> None:
        for q in queries:
            lookup(q)

    return go


def _floors_per_lookup(fns: dict[str, Callable[[], None]], lookups: int, repeat: int) -> dict:
    """Each lookup loop's fastest of ``repeat`` interleaved rounds, in us per lookup."""
    runs = interleaved_us(fns, 1, repeat)
    return {name: min(times) / lookups for name, times in runs.items()}


def bench_lookup(repeat: int, entries: tuple[int, ...], lookups: int) -> dict:
    """(b) lookup time per live entry count, and with other buffers' entries."""
    fns = {}
    for n in entries:
        tmap = TensorMap()
        for i in range(n):
            tmap.insert(Region.contiguous("x", i * TILE, TILE), i)
        fns[str(n)] = _lookups(tmap, n, lookups)
    alone, crowded = TensorMap(), TensorMap()
    for tmap in (alone, crowded):
        tmap.insert(Region.contiguous("x", 0, TILE), 0)
    for i in range(entries[-1]):
        crowded.insert(Region.contiguous(("other", i % 100), i * TILE, TILE), i + 1)
    fns["alone"], fns["crowded"] = _lookups(alone, 1, lookups), _lookups(crowded, 1, lookups)
    floors = _floors_per_lookup(fns, lookups, repeat)
    rows = {str(n): floors[str(n)] for n in entries}
    growth = rows[str(entries[-1])] / rows[str(entries[0])]
    alone_us, crowded_us = floors["alone"], floors["crowded"]
    return {
        "per_entries_us": rows,
        "growth_first_to_last": growth,
        "other_buffers_entries": entries[-1],
        "alone_us": alone_us,
        "with_other_buffers_us": crowded_us,
        "other_buffers_ratio": crowded_us / alone_us,
        "meets_target": growth <= TARGET_LOOKUP_GROWTH
        and crowded_us / alone_us <= TARGET_OTHER_BUFFERS,
    }


def bench_lookup_with_whole_entry(repeat: int, tiles: tuple[int, ...], lookups: int) -> dict:
    """(c) tile lookup time with one whole-buffer entry present, per tile count."""
    fns = {}
    for n in tiles:
        tmap = TensorMap()
        tmap.insert(Region.contiguous("x", 0, n * TILE), 0)
        for i in range(n):
            tmap.insert(Region.contiguous("x", i * TILE, TILE), i + 1)
        fns[str(n)] = _lookups(tmap, n, lookups)
    rows = _floors_per_lookup(fns, lookups, repeat)
    growth = rows[str(tiles[-1])] / rows[str(tiles[0])]
    return {
        "per_tiles_us": rows,
        "growth_first_to_last": growth,
        "meets_target": growth <= TARGET_WHOLE_GROWTH,
    }


def bench_classify(repeat: int) -> dict:
    """(d) classify of a stride-2 tile inside a dense tile of the same matrix."""
    outer = Region("m", 0, (256, 256), (512, 1), 4)
    inner = Region("m", 0, (256, 128), (512, 2), 4)
    assert classify(inner, outer) is Overlap.COVERED
    us = statistics.median(per_call_us(lambda: classify(inner, outer), 10, repeat))
    return {"us": us, "meets_target": us < TARGET_CLASSIFY_US}


def render(results: dict) -> str:
    """The results as a plain-text table."""
    # (a) and (d): medians; (b) and (c): the fastest of the interleaved rounds
    lines = [f"{'benchmark':<58} {'median/min':>14} {'target':>10} {'ok':>4}", "-" * 89]
    for replay, mode in results["tasks_per_second"].items():
        for batch, row in mode["per_batch"].items():
            label = f"(a) paged_attention {replay}, batch {batch} ({row['tasks']} tasks)"
            lines.append(f"{label:<58} {row['tasks_per_s']:>8.0f} tasks/s {'':>10} {'':>4}")
        ok = "yes" if mode["meets_target"] else "NO"
        batches = list(mode["per_batch"])
        first, last = batches[0], batches[-1]
        label = f"    rate at batch {last} / batch {first} ({replay})"
        lines.append(
            f"{label:<58} {mode['ratio_last_to_first']:>13.2f}x"
            f" {f'>= {TARGET_RATE_RATIO:g}x':>10} {ok:>4}"
        )
    lookup = results["lookup"]
    for n, us in lookup["per_entries_us"].items():
        label = f"(b) TensorMap lookup, {int(n):,} live entries in its buffer"
        lines.append(f"{label:<58} {us:>11.2f} us {'':>10} {'':>4}")
    ok = "yes" if lookup["growth_first_to_last"] <= TARGET_LOOKUP_GROWTH else "NO"
    first, last = (f"{int(n):,}" for n in (ENTRIES[0], list(lookup["per_entries_us"])[-1]))
    label = f"    growth, {first} -> {last} entries"
    lines.append(
        f"{label:<58} {lookup['growth_first_to_last']:>13.2f}x"
        f" {f'<= {TARGET_LOOKUP_GROWTH:g}x':>10} {ok:>4}"
    )
    ok = "yes" if lookup["other_buffers_ratio"] <= TARGET_OTHER_BUFFERS else "NO"
    label = f"    with {lookup['other_buffers_entries']:,} entries in 100 other buffers"
    lines.append(
        f"{label:<58} {lookup['with_other_buffers_us']:>11.2f} us {'':>10} {'':>4}\n"
        f"{'    ... / alone':<58} {lookup['other_buffers_ratio']:>13.2f}x"
        f" {f'<= {TARGET_OTHER_BUFFERS:g}x':>10} {ok:>4}"
    )
    whole = results["lookup_with_whole_entry"]
    for n, us in whole["per_tiles_us"].items():
        label = f"(c) lookup, {int(n):,} tiles and one whole-buffer entry"
        lines.append(f"{label:<58} {us:>11.2f} us {'':>10} {'':>4}")
    ok = "yes" if whole["meets_target"] else "NO"
    counts = [f"{int(n):,}" for n in whole["per_tiles_us"]]
    first, last = counts[0], counts[-1]
    label = f"    growth, {first} -> {last} tiles"
    lines.append(
        f"{label:<58} {whole['growth_first_to_last']:>13.2f}x"
        f" {f'<= {TARGET_WHOLE_GROWTH:g}x':>10} {ok:>4}"
    )
    cls = results["classify"]
    ok = "yes" if cls["meets_target"] else "NO"
    label = "(d) classify, 256x128 stride-2 tile in a 256x256 tile"
    lines.append(f"{label:<58} {cls['us']:>11.2f} us {f'< {TARGET_CLASSIFY_US:g} us':>10} {ok:>4}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = _common.parser("ring", __doc__, repeat=7, quick="batch up to 64, entries up to 10,000")
    args = _common.parse(parser, argv)
    batches = BATCHES[:3] if args.quick else BATCHES
    entries = ENTRIES[:5] if args.quick else ENTRIES
    results = {
        "machine": _common.machine(),
        "repeat": args.repeat,
        "tasks_per_second": bench_tasks_per_second(args.repeat, batches),
        "lookup": bench_lookup(LOOKUP_ROUNDS_PER_REPEAT * args.repeat, entries, LOOKUPS),
        "lookup_with_whole_entry": bench_lookup_with_whole_entry(
            LOOKUP_ROUNDS_PER_REPEAT * args.repeat,
            WHOLE_TILES[:2] if args.quick else WHOLE_TILES,
            LOOKUPS,
        ),
        "classify": bench_classify(args.repeat),
    }
    lookup = results["lookup"]
    verdicts = {
        f"(a) {replay} rate at batch {batches[-1]} >= {TARGET_RATE_RATIO:g}x batch {batches[0]}": (
            mode["meets_target"]
        )
        for replay, mode in results["tasks_per_second"].items()
    }
    verdicts[f"(b) lookup growth <= {TARGET_LOOKUP_GROWTH:g}x"] = (
        lookup["growth_first_to_last"] <= TARGET_LOOKUP_GROWTH
    )
    verdicts[f"(b) other buffers <= {TARGET_OTHER_BUFFERS:g}x"] = (
        lookup["other_buffers_ratio"] <= TARGET_OTHER_BUFFERS
    )
    verdicts[f"(c) lookup with a whole-buffer entry flat within {TARGET_WHOLE_GROWTH:g}x"] = (
        results["lookup_with_whole_entry"]["meets_target"]
    )
    verdicts[f"(d) classify of a strided tile < {TARGET_CLASSIFY_US:g} us"] = results["classify"][
        "meets_target"
    ]
    return _common.finish(args, results, render(results), verdicts)


if __name__ == "__main__":
    sys.exit(main())
