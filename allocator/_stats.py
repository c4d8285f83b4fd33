"""Telemetry: frozen snapshots of an allocator's counters and of one arena epoch."""

from __future__ import annotations

import dataclasses

__all__ = ["AllocatorStats", "EpochStats", "format_mib"]


def format_mib(nbytes: int) -> str:
    """Format a byte count as MiB with two decimals: ``262144 -> "0.25MiB"``."""
    return f"{nbytes / (1 << 20):.2f}MiB"


@dataclasses.dataclass(frozen=True, slots=True)
class AllocatorStats:
    """One consistent snapshot of an allocator's counters (from ``stats()``).

    Byte counts are in bytes, counts in buffers (a view is not a buffer of its own: it shares
    its storage's block).

    Attributes:
        backend: ``"cpu"``, ``"sim"`` or ``"cuda"``.
        live_bytes: bytes of blocks held by live storages. A block returned to the reuse cache
            is accounted as freed first, so cached bytes are never included.
        peak_bytes: the highest ``live_bytes`` seen since the allocator was built.
        live_buffers: storages whose block is not yet freed.
        alloc_count: buffer allocations, cache hits included.
        free_count: buffers freed by ``release``, ``resize_(0)``, finalization or ``arena_exit``.
        cache_bytes: bytes held by the reuse cache (0 on ``cpu``, which keeps no cache).
        cache_cap_bytes: the cache's byte cap; 0 means unbounded (always 0 on ``cpu``).
        cache_hits: allocations served from the reuse cache.
        cache_misses: allocations the cache could not serve (they went to the device).
        cap_evictions: returned blocks freed at once because caching them would pass the cap.
        device_mallocs: blocks obtained from the device.
        device_frees: blocks handed back to the device.
        oom_flushes: whole-cache flushes done because a device allocation failed.
        device_free_bytes: the device's free memory when the snapshot was taken (0 on ``cpu``).
        device_total_bytes: the device's size (0 on ``cpu``).
        arena_depth: the number of open arenas (the innermost one has depth
            ``arena_depth - 1``; 0 means none is open).
        arena_reclaimed_buffers: buffers freed by ``arena_exit`` since the allocator was built.
        arena_reclaimed_bytes: bytes freed by ``arena_exit`` since the allocator was built.
    """

    backend: str
    live_bytes: int
    peak_bytes: int
    live_buffers: int
    alloc_count: int
    free_count: int
    cache_bytes: int
    cache_cap_bytes: int
    cache_hits: int
    cache_misses: int
    cap_evictions: int
    device_mallocs: int
    device_frees: int
    oom_flushes: int
    device_free_bytes: int
    device_total_bytes: int
    arena_depth: int
    arena_reclaimed_buffers: int
    arena_reclaimed_bytes: int

    def format(self) -> str:
        """One line for logs, e.g. ``backend=sim live=0.25MiB peak=1.00MiB allocs=64 frees=60
        cache=1.00MiB cache_cap=1.00MiB`` (``cache_cap=unbounded`` when the cap is 0)."""
        cap = format_mib(self.cache_cap_bytes) if self.cache_cap_bytes else "unbounded"
        return (
            f"backend={self.backend} live={format_mib(self.live_bytes)}"
            f" peak={format_mib(self.peak_bytes)} allocs={self.alloc_count}"
            f" frees={self.free_count} cache={format_mib(self.cache_bytes)} cache_cap={cap}"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class EpochStats:
    """What one arena epoch did, returned by ``arena_exit`` (and kept by an ``arena()`` scope).

    Attributes:
        depth: the epoch's depth; the outermost epoch has depth 0.
        allocs: storages allocated while this epoch was the innermost open one.
        reclaimed_buffers: storages whose blocks this epoch's exit freed.
        reclaimed_bytes: the bytes of those blocks.
        kept_buffers: storages promoted by ``keep`` to the parent epoch (at depth 0: untracked,
            left to ordinary finalization).
        kept_bytes: the bytes of those storages.
        peak_bytes: the most bytes live at once in storages tracked by this epoch, with each
            child epoch's peak folded in on top of what this epoch held when the child closed
            (as RMM's statistics adaptor folds nested scopes).
    """

    depth: int
    allocs: int
    reclaimed_buffers: int
    reclaimed_bytes: int
    kept_buffers: int
    kept_bytes: int
    peak_bytes: int
