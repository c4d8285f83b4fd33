"""Death-test targets for streams: the simulator's race check and the module-level stream API.

No pytest import: children import this module by name. Each target builds what it needs (an
explicit ``sim`` allocator with a latency, or the default allocator from the environment the
parent pinned) and returns plain data, or aborts in the simulator's race check.
"""

from __future__ import annotations

import allocator
from allocator import Allocator, AllocatorConfig

N = 4096  # elements: 16 KiB blocks
LATENCY_US = 100


def reuse_across_streams(guard: str) -> dict:
    """A block of the default stream is read by a kernel on a consumer stream, then freed from
    there and allocated again on the default stream, with ``guard`` between the read and the
    free:

    - ``"record_stream"``: the consumer stream is recorded on the block (the fix): the cache
      keeps the block until the consumer's event completes, so the next allocation gets another
      block, and the one after the host waited gets it back;
    - ``"wait_stream"``: the default stream waits for the consumer stream before reusing it
      (stream order protects the reuse; no record needed);
    - ``"none"``: neither (the bug): the default stream reuses the block at once while the
      consumer's kernel is in flight, and the simulator's race check aborts.
    """
    alloc = Allocator(AllocatorConfig(backend="sim", sim_latency_us=LATENCY_US))
    consumer = alloc.new_stream("consumer")
    a = alloc.full(N, 1.0)  # default stream: t = 0..100
    block = a.storage.block
    consumer.wait_stream(alloc.default_stream)
    with alloc.use_stream(consumer):
        out = alloc.mul(a, a)  # reads a on the consumer stream: t = 100..200
        if guard == "record_stream":
            a.record_stream(consumer)
        alloc.release(a)  # freed from the consumer stream, as ZeRO-3's release_param is
    if guard == "wait_stream":
        alloc.default_stream.wait_stream(consumer)
    b = alloc.full(N, 2.0)  # on the default stream
    report = {"reused_at_once": b.storage.block is block, "now_us": alloc.device.now_us}
    consumer.synchronize()
    c = alloc.full(N, 3.0)
    report["reused_after_the_wait"] = c.storage.block is block
    report["sum"] = alloc.sum(out)
    stats = alloc.stats()
    report["hits"], report["misses"] = stats.cache_hits, stats.cache_misses
    return report


def module_level_streams() -> dict:
    """The module-level stream functions act on the default allocator (``DEVMEM_BACKEND`` set by
    the parent)."""
    side = allocator.new_stream("side")
    default = allocator.default_stream()
    report = {
        "default": [default.id, default.name, allocator.current_stream() is default],
        "side": [side.id, side.name],
        "same_device": side.device is allocator.get_allocator().device,
    }
    with allocator.use_stream(side) as entered:
        buf = allocator.full(16, 1.0)
        report["inside"] = [entered is side, allocator.current_stream() is side, buf.stream is side]
        buf.record_stream(default)
        report["uses"] = [s.name for s in buf.storage.stream_uses]
    report["after"] = allocator.current_stream() is default
    side.wait_stream(default)
    side.synchronize()
    report["query"] = side.query()
    allocator.release(buf)
    report["live"] = allocator.stats().live_bytes
    return report
