"""AllocatorStats: every counter on every backend, and the one-line format (DESIGN 2.7)."""

from __future__ import annotations

import dataclasses

import pytest

from allocator import AllocatorStats

FIELDS = [
    "backend",
    "live_bytes",
    "peak_bytes",
    "live_buffers",
    "alloc_count",
    "free_count",
    "cache_bytes",
    "cache_cap_bytes",
    "cache_hits",
    "cache_misses",
    "cap_evictions",
    "device_mallocs",
    "device_frees",
    "oom_flushes",
    "device_free_bytes",
    "device_total_bytes",
    "arena_depth",
    "arena_reclaimed_buffers",
    "arena_reclaimed_bytes",
]


def _stats(**values) -> AllocatorStats:
    base = dict.fromkeys(FIELDS, 0)
    base["backend"] = "sim"
    return AllocatorStats(**{**base, **values})


def test_every_design_field_is_present():
    assert [f.name for f in dataclasses.fields(AllocatorStats)] == FIELDS


def test_stats_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        _stats().live_bytes = 1


def test_format_matches_the_design_example():
    stats = _stats(
        live_bytes=1 << 18,
        peak_bytes=1 << 20,
        alloc_count=64,
        free_count=60,
        cache_bytes=1 << 20,
        cache_cap_bytes=1 << 20,
    )
    assert stats.format() == (
        "backend=sim live=0.25MiB peak=1.00MiB allocs=64 frees=60 cache=1.00MiB cache_cap=1.00MiB"
    )
    assert _stats().format().endswith("cache=0.00MiB cache_cap=unbounded")


def test_counters_follow_a_workload(alloc):
    a = alloc.full(256, 1.0)  # 1 KiB
    b = alloc.full(256, 2.0)
    c = alloc.add(a, b)
    stats = alloc.stats()
    assert (stats.live_bytes, stats.peak_bytes, stats.live_buffers) == (3072, 3072, 3)
    assert (stats.alloc_count, stats.free_count) == (3, 0)
    alloc.release(a)
    del b
    alloc.arena_enter()
    scratch = alloc.full(256, 0.0)
    assert alloc.stats().arena_depth == 1
    alloc.arena_exit()
    assert scratch.size == 0
    stats = alloc.stats()
    assert (stats.live_bytes, stats.peak_bytes, stats.live_buffers) == (1024, 3072, 1)
    assert (stats.alloc_count, stats.free_count) == (4, 3)
    assert (stats.arena_reclaimed_buffers, stats.arena_reclaimed_bytes) == (1, 1024)
    assert stats.backend == alloc.backend
    assert stats.device_mallocs == stats.alloc_count - stats.cache_hits
    del c


def test_device_memory_fields(alloc):
    stats = alloc.stats()
    if alloc.backend == "cpu":
        assert (stats.device_free_bytes, stats.device_total_bytes) == (0, 0)
    else:
        assert 0 < stats.device_free_bytes <= stats.device_total_bytes
