"""Blocks cached for a stream nobody uses again (DESIGN 2.4, docs/streams.md).

A dropped stream's free list goes back to the device at the next allocation, free or
``stats()`` (cause ``stream_dropped``): a cached block holds no reference to its stream, so the
stream dies with its last user, and a weak reference's callback (which only queues its id)
tells the cache. Under a cap, a freed block makes room by evicting the oldest cached blocks
rather than being refused, so a block that nobody reuses cannot hold the cap for good.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from allocator import Allocator, AllocatorConfig
from runtime.zero3 import Zero3

MIB = 1 << 20
N = MIB // 4  # elements: 1 MiB blocks


def _sim(**knobs) -> Allocator:
    return Allocator(AllocatorConfig(backend="sim", **knobs))


def test_a_dropped_streams_cached_blocks_go_back_to_the_device():
    alloc = _sim()
    alloc.record_history(True, stacks=False)
    side = alloc.new_stream("side")
    with alloc.use_stream(side):
        alloc.release(alloc.empty(N))
    assert alloc.stats().cache_bytes == MIB
    alive = weakref.ref(side)
    del side  # the cached block holds no reference to it
    assert alive() is None
    stats = alloc.stats()
    assert (stats.cache_bytes, stats.device_frees, stats.cap_evictions) == (0, 1, 0)
    trace = alloc.snapshot()["device_traces"][0]
    assert [e["action"] for e in trace][-1] == "segment_free"


def test_a_hundred_zero3_instances_leave_nothing_cached():
    # every Zero3 makes its own gather stream; before, 100 instances left 100 MiB cached
    alloc = _sim()
    for _ in range(100):
        z3 = Zero3(alloc, 2)
        z3.register("w", N - 1)  # padded to N elements over 2 ranks
        z3.release(z3.allgather("w"), "w", 1)
    del z3
    stats = alloc.stats()
    assert (stats.cache_bytes, stats.cache_misses, stats.device_frees) == (0, 100, 100)


def test_dropped_streams_die_at_once_in_thousands():
    # before, every dropped stream with a cached block stayed alive until empty_cache
    alloc = _sim()
    refs = []
    for _ in range(2000):
        stream = alloc.new_stream()
        with alloc.use_stream(stream):
            alloc.release(alloc.empty(4))
        refs.append(weakref.ref(stream))
    del stream
    assert sum(ref() is not None for ref in refs) == 0
    assert alloc.stats().cache_bytes == 0


def test_a_stream_collected_in_a_cycle_is_reaped_at_the_next_call():
    alloc = _sim()
    side = alloc.new_stream("side")
    with alloc.use_stream(side):
        alloc.release(alloc.empty(N))
    cycle = [side]
    cycle.append(cycle)
    del side, cycle
    gc.collect()  # the weak reference's callback runs inside the collector: it only queues
    assert alloc._cache.dropped and alloc._cache.cache_bytes == MIB
    alloc.release(alloc.empty(4))  # the next call frees the dropped stream's block
    assert not alloc._cache.dropped and alloc.stats().device_frees == 1


@pytest.mark.parametrize("drop", [False, True])
def test_under_a_cap_the_oldest_cached_block_makes_room(drop):
    # a block of another stream fills the cap, then the default stream allocates and frees
    # 1000 times. Before: each free was refused (hits=0, misses=1001, cap_evictions=1000).
    alloc = _sim(cache_cap_bytes=MIB)
    side = alloc.new_stream("idle")
    with alloc.use_stream(side):
        alloc.release(alloc.empty(N))
    if drop:
        del side
    for _ in range(1000):
        alloc.release(alloc.empty(N))
    stats = alloc.stats()
    counters = (stats.cache_hits, stats.cache_misses, stats.cap_evictions, stats.device_frees)
    # dropped: its block went back to the device (stream_dropped); kept: evicted as the oldest
    assert counters == ((999, 2, 0, 1) if drop else (999, 2, 1, 1))
    assert stats.cache_bytes == MIB


def test_the_cap_evicts_the_oldest_blocks_first_as_many_as_it_takes():
    alloc = _sim(cache_cap_bytes=3 * MIB)
    small = [alloc.empty(N) for _ in range(3)]
    blocks = [buf.storage.block for buf in small]
    for buf in small:
        alloc.release(buf)  # cached in this order: 3 MiB, the cap
    big = alloc.empty(2 * N)
    big_block = big.storage.block
    alloc.release(big)  # 2 MiB: the two oldest leave the cache
    assert alloc._cache.blocks() == [blocks[2], big_block]
    stats = alloc.stats()
    assert (stats.cache_bytes, stats.cap_evictions, stats.device_frees) == (3 * MIB, 2, 2)
    huge = alloc.empty(4 * N)
    alloc.release(huge)  # larger than the cap: never cached, nothing evicted for it
    stats = alloc.stats()
    assert (stats.cache_bytes, stats.cap_evictions, stats.device_frees) == (3 * MIB, 3, 3)


def test_a_block_recorded_on_a_dropped_stream_keeps_it_alive_only_while_it_waits():
    sim = _sim(sim_latency_us=10)
    consumer = sim.new_stream("consumer")
    a = sim.full(4, 1.0)
    consumer.wait_stream(sim.default_stream)
    with sim.use_stream(consumer):
        sim.release(sim.copy(a))  # read on the consumer stream: t = 10..20
    a.record_stream(consumer)
    sim.release(a)  # awaits the consumer's event (t=20): it holds the consumer stream
    alive = weakref.ref(consumer)
    del consumer
    assert alive() is not None
    sim.device.advance(20)
    sim.release(sim.empty(8))  # the cache finds the event done: the block forgets the stream
    assert alive() is None and sim._cache.awaiting() == ()


def test_every_size_a_dropped_stream_cached_goes_back_to_the_device():
    alloc = _sim()
    side = alloc.new_stream("side")
    with alloc.use_stream(side):
        bufs = [alloc.empty(N), alloc.empty(2 * N), alloc.empty(N)]
        for buf in bufs:
            alloc.release(buf)
    del buf, bufs
    assert alloc.stats().cache_bytes == 4 * MIB
    del side
    stats = alloc.stats()
    assert (stats.cache_bytes, stats.device_frees) == (0, 3)
    assert alloc._cache.blocks() == [] and alloc.empty_cache() == 0


def test_a_dropped_stream_takes_only_its_own_awaiting_blocks_with_it():
    sim = _sim(sim_latency_us=10)
    consumer = sim.new_stream("consumer")
    doomed = sim.new_stream("doomed")
    kept = sim.full(4, 1.0)  # on the default stream, kept alive
    with sim.use_stream(doomed):
        gone = sim.full(4, 1.0)
    consumer.wait_stream(sim.default_stream)
    consumer.wait_stream(doomed)
    with sim.use_stream(consumer):
        sim.release(sim.copy(kept))  # both read on the consumer stream until t = 20
        sim.release(sim.copy(gone))  # the same 16-byte block again, cached on consumer
    kept_block, gone_block = kept.storage.block, gone.storage.block
    for buf in (kept, gone):
        buf.record_stream(consumer)
        sim.release(buf)  # both await the consumer's event
    del kept, gone, buf
    assert [block for block, _ in sim._cache.awaiting()] == [kept_block, gone_block]
    del doomed
    stats = sim.stats()  # reaps the dropped stream: its awaiting block goes to the device
    assert (stats.cache_bytes, stats.device_frees) == (32, 1)
    assert [block for block, _ in sim._cache.awaiting()] == [kept_block]
    assert kept_block in sim._cache.blocks() and gone_block not in sim._cache.blocks()
    sim.device.advance(20)
    assert sim.empty_cache() == 32 and sim.stats().device_frees == 3
