"""Death-test targets for the simulator's free-as-synchronize and its race check.

No pytest import: children import this module by name. Each target builds an explicit ``sim``
allocator with a latency, and returns plain data or aborts.
"""

from __future__ import annotations

from allocator import Allocator, AllocatorConfig

from . import _mutants

N = 1024  # elements: 4 KiB blocks
LATENCY_US = 100


def teardown_after_a_cross_stream_read(mutant: str | None = None) -> dict:
    """Fill ``x`` on stream G, read it on the default stream after ``wait_stream(G)``, drop
    both without ``record_stream``, then drop the allocator: its caching layer's finalizer
    frees the cached blocks to the device. CUDA-safe; before the fix (``mutant``
    ``"free_without_device_sync"``) the free aborted inside the finalizer."""
    _mutants.apply(mutant)
    alloc = Allocator(AllocatorConfig(backend="sim", sim_latency_us=LATENCY_US))
    gather = alloc.new_stream("G")
    with alloc.use_stream(gather):
        x = alloc.full(N, 1.0)  # t = 0..100 on G
    alloc.default_stream.wait_stream(gather)
    y = alloc.mul(x, x)  # t = 100..200 on the default stream
    device = alloc.device
    del x, y
    del alloc  # reference counting runs CachingLayer.__del__ here
    return {"now_us": device.now_us, "used_bytes": device.used_bytes}


def read_without_wait() -> dict:
    """Read, on the default stream, a buffer that stream G writes, without waiting for G."""
    alloc = Allocator(AllocatorConfig(backend="sim", sim_latency_us=LATENCY_US))
    gather = alloc.new_stream("G")
    with alloc.use_stream(gather):
        x = alloc.full(N, 1.0)
    alloc.mul(x, x)
    return {"aborted": False}
