"""The work behind the project's ``memory_history`` fixture (``conftest.py`` holds only the glue).

While a test runs, the allocators it watches record their memory history with stacks. If the
test fails (or its teardown does, e.g. ``make_alloc``'s leak check), :meth:`MemoryHistory.report`
dumps one snapshot per allocator beside the test's temporary directory and returns the text the
failure report shows: the snapshot paths, how to open them, and the blocks still live with the
frames that allocated them (down to the test function: the runner's own frames are counted, not
listed; the snapshot has them all).
"""

from __future__ import annotations

import contextlib
import gc
import os
from pathlib import Path

import _pytest
import pluggy

from allocator import Allocator, AllocatorStats, LiveBlock
from allocator._timeline import format_bytes

__all__ = ["MAX_LISTED", "MemoryHistory"]

MAX_LISTED = 20
"""Live blocks listed per allocator (the largest first); the snapshot has them all."""


class MemoryHistory:
    """The allocators one test watches.

    Args:
        tmp_path: the test's temporary directory; snapshots go beside it, as
            ``<its name>-memory.pickle`` (``-memory-2.pickle`` and so on for more allocators).
    """

    def __init__(self, tmp_path: Path) -> None:
        self._tmp_path = tmp_path
        self.allocators: list[Allocator] = []
        self._recordings = contextlib.ExitStack()
        self._report: str | None = None

    def watch(self, alloc: Allocator) -> Allocator:
        """Record ``alloc``'s memory history (with stacks) until the test ends; returns it.

        Raises:
            TypeError: ``alloc`` is not an :class:`~allocator.Allocator`.
        """
        if not isinstance(alloc, Allocator):
            raise TypeError(f"alloc must be an allocator.Allocator, got {type(alloc).__name__}")
        if all(alloc is not other for other in self.allocators):
            self._recordings.enter_context(alloc.history(stacks=True))
            self.allocators.append(alloc)
        return alloc

    def stop(self) -> None:
        """Put each allocator's recording back as it was (off, unless ``DEVMEM_HISTORY`` or
        the test had it on); the histories are kept for :meth:`report`. The collector runs and
        each allocator frees the blocks its finalizers queued first, so that a buffer the test
        left in a reference cycle is freed while recording (``make_alloc``'s leak check, which
        collects too, runs after this)."""
        gc.collect()
        for alloc in self.allocators:
            alloc.stats()  # drains the finalizers' queue
        self._recordings.close()

    def snapshot_path(self, index: int) -> Path:
        """Where the snapshot of the ``index``-th watched allocator (from 0) goes."""
        suffix = "" if index == 0 else f"-{index + 1}"
        return self._tmp_path.with_name(f"{self._tmp_path.name}-memory{suffix}.pickle")

    def report(self) -> str:
        """Dump the snapshots (once) and describe them and the live blocks."""
        if self._report is None:
            parts = [
                "open a snapshot with: python -m allocator.memory summary|plot SNAPSHOT, or drop"
                " it on https://pytorch.org/memory_viz"
            ]
            unwatched = _unwatched(self.allocators)
            if unwatched:
                parts.append(
                    f"{unwatched} other allocators are alive and not watched (built without"
                    " make_alloc, e.g. allocator.Allocator(...), or the default allocator): pass"
                    " them to memory_history.watch(alloc) to record them"
                )
            for i, alloc in enumerate(self.allocators):
                path = self.snapshot_path(i)
                try:
                    alloc.dump_snapshot(path)
                except OSError as exc:
                    path = f"not written ({exc})"
                parts.append(_describe(i + 1, alloc, path, alloc.live_blocks()))
            self._report = "\n".join(parts)
        return self._report


_RUNNER_DIRS = tuple(os.path.dirname(module.__file__) + os.sep for module in (_pytest, pluggy))


def _own_frames(block: LiveBlock) -> int:
    """How many of ``block``'s frames come before the test runner's own (pytest, pluggy)."""
    for i, frame in enumerate(block.frames):
        if frame.filename.startswith(_RUNNER_DIRS):
            return max(i, 1)
    return len(block.frames)


def _unwatched(watched: list[Allocator]) -> int:
    """How many allocators other than ``watched`` are alive (a walk of the collector's
    objects; a report is written only when a test failed)."""
    return sum(
        1
        for obj in gc.get_objects()
        # type(), not isinstance(): some objects' __class__ is a property that warns or raises
        if issubclass(type(obj), Allocator) and all(obj is not alloc for alloc in watched)
    )


def _stats_line(stats: AllocatorStats) -> str:
    """:meth:`AllocatorStats.format`'s fields with each byte count in the unit that shows it
    (``live=64 B``, not ``live=0.00MiB``)."""
    cap = format_bytes(stats.cache_cap_bytes) if stats.cache_cap_bytes else "unbounded"
    return (
        f"backend={stats.backend} live={format_bytes(stats.live_bytes)}"
        f" peak={format_bytes(stats.peak_bytes)} allocs={stats.alloc_count}"
        f" frees={stats.free_count} cache={format_bytes(stats.cache_bytes)} cache_cap={cap}"
    )


def _describe(number: int, alloc: Allocator, path: Path | str, live: list[LiveBlock]) -> str:
    stats = alloc.stats()
    lines = [
        f"allocator {number} ({_stats_line(stats)}): snapshot {path}",
        f"  {len(live)} live blocks, {format_bytes(sum(block.size for block in live))}"
        + (":" if live else ""),
    ]
    largest = sorted(live, key=lambda block: (-block.size, block.address))
    lines += [block.format("  ", _own_frames(block)) for block in largest[:MAX_LISTED]]
    if len(live) > MAX_LISTED:
        lines.append(f"  ... and {len(live) - MAX_LISTED} more (all are in the snapshot)")
    return "\n".join(lines)
