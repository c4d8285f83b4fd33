"""Targets for the default-allocator tests (run in children; no pytest import)."""

from __future__ import annotations

import os

import allocator as dm


def read_twice() -> dict:
    """Build the default allocator, change the environment, and read the config again."""
    first = dm.get_allocator().config
    os.environ["DEVMEM_BACKEND"] = "cpu" if first.backend == "sim" else "sim"
    os.environ["DEVMEM_CACHE_CAP_BYTES"] = "7"
    again = dm.default_config()
    return {
        "backend": first.backend,
        "cap": first.cache_cap_bytes,
        "same": again == first and dm.get_allocator().config is first,
    }


def default_backend() -> str:
    """The backend of this process's default allocator."""
    return dm.get_allocator().backend


def done_when_cache_cap() -> dict:
    """Issue 2's check: 32 buffers of 65536 floats allocated, then released."""
    buffers = [dm.full(65536, 1.0) for _ in range(32)]
    for buf in buffers:
        dm.release(buf)
    stats = dm.stats()
    return {"cache_bytes": stats.cache_bytes, "cap_evictions": stats.cap_evictions}
