"""Memory timelines of the arena stress and the cache-cap run, for the nightly report.

Usage: ``python ci/memory_pictures.py [--out reports/memory] [--scale 1]``

Runs each workload on a fresh ``sim`` allocator recording its memory history with stacks (the
suites' own workloads: ``suites/allocator/_stress.py``'s arena stress, and the cache-cap
workload of ``test_cache_cap.py``, 32 blocks of 256 KiB released under a 1 MiB cap), and writes
for each ``<name>.pickle`` (the snapshot: open it with PyTorch's memory_viz),
``<name>.png`` (``python -m allocator.memory plot``) and ``<name>.txt`` (``... summary``).
``ci/nightly_summary.py --memory DIR`` links them. ``--scale`` multiplies the buffer counts,
as ``--stress-scale`` does; at 1 every round is visible in the picture.

Exit status: 0, 1 when a workload or a picture fails (the message says which), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from allocator import Allocator, AllocatorConfig, memory  # noqa: E402
from suites.allocator import _stress  # noqa: E402


def arena_stress(scale: int) -> Allocator:
    """The arena stress: 4 rounds of 64 buffers of 16 KiB, a promotion and a nested round."""
    alloc = Allocator(AllocatorConfig(backend="sim"))
    with alloc.history():
        _stress.arena_stress(alloc, n=4096, k=64 * scale, arenas=4)
    return alloc


def cache_cap(scale: int) -> Allocator:
    """The cache-cap run: 32 buffers of 256 KiB released under a 1 MiB cap."""
    alloc = Allocator(AllocatorConfig(backend="sim", cache_cap_bytes=1 << 20))
    with alloc.history():
        buffers = [alloc.full(65536, 1.0) for _ in range(32 * scale)]
        for buf in buffers:
            alloc.release(buf)
    return alloc


RUNS: dict[str, tuple[Callable[[int], Allocator], str]] = {
    "arena-stress": (arena_stress, "arena stress (sim)"),
    "cache-cap": (cache_cap, "cache-cap run, 1 MiB cap (sim)"),
}


def main(argv: list[str] | None = None) -> int:
    """Write each run's snapshot, picture and summary to ``--out``. Returns the exit status: 0,
    1 when a run cannot be drawn or written (the reason on stderr), 2 on bad arguments
    (``--scale`` below 1)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "memory")
    parser.add_argument("--scale", type=int, default=1, help="buffer counts x this (default 1)")
    args = parser.parse_args(argv)
    if args.scale < 1:
        parser.error(f"--scale must be >= 1, got {args.scale}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (workload, title) in RUNS.items():
        try:
            alloc = workload(args.scale)
            alloc.dump_snapshot(args.out / f"{name}.pickle")
            snapshot = memory.load(args.out / f"{name}.pickle")  # what was written, read back
            memory.plot(snapshot, args.out / f"{name}.png", title=f"{title}: memory timeline")
            (args.out / f"{name}.txt").write_text(memory.summary(snapshot))
        except (ImportError, OSError, ValueError) as exc:
            print(f"memory_pictures: {name}: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {args.out / name}.pickle, .png and .txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
