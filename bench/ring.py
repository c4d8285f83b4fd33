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
(e) Strided lookups as the map grows (issue 39): a column tile (4 rows x 2 columns) of a
    4 x 2n float32 matrix among n column tiles, and a 16x16 tile of a square matrix among n
    such tiles, for n = 1,000, 10,000 and 100,000 (the quick run: up to 10,000), timed as in
    (b). Reference: n = 1,000. Target: at most 3x at 100,000 (entries are indexed by the rows
    they touch; by their bounding byte range, one column lookup took 8 ms / 141 ms / 1.6 s).
    And planning 2,000 writers of column tiles against 2,000 writers of row tiles of the same
    size (``gather_fanin`` then ``insert``, as the ring plans a ``writes=`` task). Target: at
    most 3x (it was 23.8 s against 0.16 s).
(f) End to end at 100,000 tasks (the quick run: 10,000): ``paged_attention`` (batch 6,250,
    ``q_tiles=2, kv_blocks=2``, 4 cores, busy-wait, exact reclaim): CPU time of planning, of
    the simulation, and of ``check_trace``, medians of ``min(--repeat, 3)`` runs; and the
    checker's peak memory (``tracemalloc``) at 10,000 and 100,000 tasks. Targets: at least
    20,000 tasks/s end to end (planning plus simulation), ``check_trace`` at most 2x the run's
    time, and its peak memory flat (at most 2x from 10,000 to 100,000 tasks).
"""

from __future__ import annotations

import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable

import _common  # bench/_common.py, beside this script
from _common import interleaved_us, per_call_us

ROOT = _common.ROOT
sys.path.insert(0, str(ROOT))

from allocator import Allocator, AllocatorConfig  # noqa: E402
from runtime import ring  # noqa: E402
from runtime.tensormap import Overlap, Region, TensorMap, classify, gather_fanin  # noqa: E402

BATCHES = (16, 32, 64, 128, 256)
ENTRIES = (1, 10, 100, 1_000, 10_000, 100_000)
TARGET_RATE_RATIO = 0.5
TARGET_LOOKUP_GROWTH = 3.0
TARGET_OTHER_BUFFERS = 1.5
WHOLE_TILES = (1_000, 10_000, 100_000)
TARGET_WHOLE_GROWTH = 2.0
TARGET_CLASSIFY_US = 1000.0
STRIDED_ENTRIES = (1_000, 10_000, 100_000)
TARGET_STRIDED_GROWTH = 3.0
COLUMN_WRITERS = 2_000
TARGET_COLUMN_PLANNING = 3.0
E2E_TASKS = (10_000, 100_000)
"""paged_attention runs of (f): 16 tasks per batch element (q_tiles 2, kv_blocks 2)."""
TARGET_E2E_RATE = 20_000.0
TARGET_CHECK_RATIO = 2.0
TARGET_CHECK_MEMORY_GROWTH = 2.0
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


def _strided_tiles(layout: str, n: int) -> list[Region]:
    """n column tiles (4 rows x 2 columns) of a 4 x 2n matrix, or n 16x16 tiles of a square
    matrix of ``ceil(sqrt(n))`` tiles a side (float32)."""
    if layout == "column":
        return [Region("m", 2 * c, (4, 2), (2 * n, 1), 4) for c in range(n)]
    side = -(-int(n**0.5) // 1)
    while side * side < n:
        side += 1
    cols = 16 * side
    return [
        Region("m", (i // side * cols * 16) + (i % side) * 16, (16, 16), (cols, 1), 4)
        for i in range(n)
    ]


def bench_strided_lookup(repeat: int, entries: tuple[int, ...], lookups: int) -> dict:
    """(e) strided tile lookups per entry count, and planning column writers."""
    out = {}
    for layout in ("column", "2-D"):
        fns = {}
        for n in entries:
            tiles = _strided_tiles(layout, n)
            tmap = TensorMap()
            for i, tile in enumerate(tiles):
                tmap.insert(tile, i)
            step = max(1, n // lookups)
            queries = [tiles[i * step % n] for i in range(lookups)]
            for q in queries:
                tmap.lookup(q)

            def go(tmap=tmap, queries=queries) -> None:
                for q in queries:
                    tmap.lookup(q)

            fns[str(n)] = go
        rows = _floors_per_lookup(fns, lookups, repeat)
        growth = rows[str(entries[-1])] / rows[str(entries[0])]
        out[layout] = {
            "per_entries_us": rows,
            "growth_first_to_last": growth,
            "meets_target": growth <= TARGET_STRIDED_GROWTH,
        }

    def plan_writers(tiles: list[Region]) -> Callable[[], None]:
        def go() -> None:
            tmap = TensorMap()
            for i, tile in enumerate(tiles):
                gather_fanin(tmap, i, writes=[tile])
                tmap.insert(tile, i)

        return go

    columns = _strided_tiles("column", COLUMN_WRITERS)
    rows = [Region("m", 8 * r, (8,), None, 4) for r in range(COLUMN_WRITERS)]
    runs = interleaved_us({"column": plan_writers(columns), "row": plan_writers(rows)}, 1, repeat)
    col_us, row_us = statistics.median(runs["column"]), statistics.median(runs["row"])
    out["planning"] = {
        "writers": COLUMN_WRITERS,
        "column_ms": col_us / 1000,
        "row_ms": row_us / 1000,
        "ratio": col_us / row_us,
        "meets_target": col_us / row_us <= TARGET_COLUMN_PLANNING,
    }
    return out


def bench_end_to_end(repeat: int, sizes: tuple[int, ...]) -> dict:
    """(f) CPU time of planning, simulation and check_trace per task count; the checker's
    peak memory."""
    alloc = Allocator(AllocatorConfig(backend="cpu"))
    config = ring.RingConfig()
    workload = ring.WORKLOADS["paged_attention"]
    out = {}
    for tasks in sizes:
        batch = tasks // 16
        times: dict[str, list[float]] = {"plan": [], "simulate": [], "check": []}
        for _ in range(min(repeat, 3)):
            t0 = time.process_time()
            plan = ring.plan(workload, config.limits(), "paged_attention", batch=batch)
            t1 = time.process_time()
            result = ring.simulate(plan, alloc, config)
            t2 = time.process_time()
            problems = ring.check_trace(result)
            t3 = time.process_time()
            assert result.fatal is None and problems == [], (result.fatal, problems[:3])
            times["plan"].append(t1 - t0)
            times["simulate"].append(t2 - t1)
            times["check"].append(t3 - t2)
            del plan
        tracemalloc.start()
        ring.check_trace(result)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        med = {k: statistics.median(v) for k, v in times.items()}
        run_s = med["plan"] + med["simulate"]
        out[str(tasks)] = {
            "tasks": len(result.plan.tasks),
            "plan_s": med["plan"],
            "simulate_s": med["simulate"],
            "check_s": med["check"],
            "plan_tasks_per_s": tasks / med["plan"],
            "simulate_tasks_per_s": tasks / med["simulate"],
            "tasks_per_s": tasks / run_s,
            "check_ratio": med["check"] / run_s,
            "check_peak_mb": peak / 2**20,
        }
        del result
    first, last = out[str(sizes[0])], out[str(sizes[-1])]
    growth = last["check_peak_mb"] / first["check_peak_mb"]
    return {
        "per_tasks": out,
        "check_memory_growth": growth,
        "meets_rate": last["tasks_per_s"] >= TARGET_E2E_RATE,
        "meets_check_ratio": last["check_ratio"] <= TARGET_CHECK_RATIO,
        "meets_check_memory": growth <= TARGET_CHECK_MEMORY_GROWTH,
    }


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
    strided = results.get("strided_lookup")
    if strided:
        names = {"column": "a 4-row column tile", "2-D": "a 16x16 tile"}
        for layout in ("column", "2-D"):
            row = strided[layout]
            for n, us in row["per_entries_us"].items():
                label = f"(e) lookup of {names[layout]}, {int(n):,} tiles"
                lines.append(f"{label:<58} {us:>11.2f} us {'':>10} {'':>4}")
            counts = [f"{int(n):,}" for n in row["per_entries_us"]]
            ok = "yes" if row["meets_target"] else "NO"
            label = f"    growth, {counts[0]} -> {counts[-1]} tiles"
            lines.append(
                f"{label:<58} {row['growth_first_to_last']:>13.2f}x"
                f" {f'<= {TARGET_STRIDED_GROWTH:g}x':>10} {ok:>4}"
            )
        plan = strided["planning"]
        label = f"(e) planning {plan['writers']:,} column-tile writers"
        lines.append(f"{label:<58} {plan['column_ms']:>11.2f} ms {'':>10} {'':>4}")
        label = f"    ... {plan['writers']:,} row-tile writers"
        lines.append(f"{label:<58} {plan['row_ms']:>11.2f} ms {'':>10} {'':>4}")
        ok = "yes" if plan["meets_target"] else "NO"
        lines.append(
            f"{'    columns / rows':<58} {plan['ratio']:>13.2f}x"
            f" {f'<= {TARGET_COLUMN_PLANNING:g}x':>10} {ok:>4}"
        )
    e2e = results.get("end_to_end")
    if e2e:
        for n, row in e2e["per_tasks"].items():
            head = f"(f) paged_attention, {int(n):,} tasks:"
            lines.append(
                f"{head + ' planning':<58} {row['plan_tasks_per_s']:>8.0f} tasks/s {'':>10} {'':>4}"
            )
            lines.append(
                f"{'    simulation':<58} {row['simulate_tasks_per_s']:>8.0f} tasks/s"
                f" {'':>10} {'':>4}"
            )
            last = n == list(e2e["per_tasks"])[-1]
            ok = ("yes" if e2e["meets_rate"] else "NO") if last else ""
            target = f">= {TARGET_E2E_RATE / 1000:g}k/s" if last else ""
            lines.append(
                f"{'    end to end':<58} {row['tasks_per_s']:>8.0f} tasks/s {target:>10} {ok:>4}"
            )
            ok = ("yes" if e2e["meets_check_ratio"] else "NO") if last else ""
            target = f"<= {TARGET_CHECK_RATIO:g}x" if last else ""
            label = "    check_trace / the run"
            lines.append(f"{label:<58} {row['check_ratio']:>13.2f}x {target:>10} {ok:>4}")
            lines.append(
                f"{'    check_trace peak memory':<58} {row['check_peak_mb']:>11.1f} MB"
                f" {'':>10} {'':>4}"
            )
        ok = "yes" if e2e["meets_check_memory"] else "NO"
        counts = [f"{int(n):,}" for n in e2e["per_tasks"]]
        label = f"    check_trace memory growth, {counts[0]} -> {counts[-1]} tasks"
        lines.append(
            f"{label:<58} {e2e['check_memory_growth']:>13.2f}x"
            f" {f'<= {TARGET_CHECK_MEMORY_GROWTH:g}x':>10} {ok:>4}"
        )
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
        "strided_lookup": bench_strided_lookup(
            LOOKUP_ROUNDS_PER_REPEAT * args.repeat,
            STRIDED_ENTRIES[:2] if args.quick else STRIDED_ENTRIES,
            LOOKUPS,
        ),
        "end_to_end": bench_end_to_end(args.repeat, (1_000, 10_000) if args.quick else E2E_TASKS),
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
    strided = results["strided_lookup"]
    for layout in ("column", "2-D"):
        verdicts[f"(e) {layout} tile lookup growth <= {TARGET_STRIDED_GROWTH:g}x"] = strided[
            layout
        ]["meets_target"]
    verdicts[f"(e) planning column writers <= {TARGET_COLUMN_PLANNING:g}x row writers"] = strided[
        "planning"
    ]["meets_target"]
    e2e = results["end_to_end"]
    verdicts[f"(f) end to end >= {TARGET_E2E_RATE:g} tasks/s"] = e2e["meets_rate"]
    verdicts[f"(f) check_trace <= {TARGET_CHECK_RATIO:g}x the run"] = e2e["meets_check_ratio"]
    verdicts[f"(f) check_trace memory flat within {TARGET_CHECK_MEMORY_GROWTH:g}x"] = e2e[
        "meets_check_memory"
    ]
    return _common.finish(args, results, render(results), verdicts)


if __name__ == "__main__":
    sys.exit(main())
