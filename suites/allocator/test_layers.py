"""Each layer of the allocator alone, over a recording upstream (DESIGN 2.9).

The suites above drive the whole stack; these check what each layer adds over its upstream and
the order in which it calls it: the device layer waits before it frees and counts; the caching
layer reuses, caps, and collects-flushes-retries on a failure; the statistics layer counts and
folds epochs as RMM's statistics adaptor does; the arena registry owns storages, frees each once
and queues what finalizers hand it.
"""

from __future__ import annotations

import gc
import itertools
import threading
import weakref

import pytest

from allocator import Allocator, AllocatorConfig, EpochStats, FreeCause, _locks
from allocator._arena import SWEEP_MIN, ArenaRegistry, Epoch
from allocator._buffer import Buffer, Storage
from allocator._cache import CachingLayer
from allocator._device_layer import DeviceLayer
from allocator._free_cause import FINALIZE, RELEASE
from allocator._statistics import FOLD_EVERY, Statistics
from allocator.device import DeviceAllocationError, SimDevice
from allocator.device.stream import Stream

KIB = 1024
S = SimDevice(1).new_stream(default=True)
"""The stream the layers' allocations name: a key to the caching layer's free lists (the devices
here have no latency, so no layer reads its clock)."""


class Recorder:
    """An upstream over a ``SimDevice`` that records every call (and fails on demand)."""

    def __init__(self, capacity: int = 1 << 20, latency: int = 0) -> None:
        self.device = SimDevice(capacity, latency)
        self.calls: list[tuple] = []
        self.fail = 0

    def allocate(self, nbytes: int, stream):
        if self.fail:
            self.fail -= 1
            self.calls.append(("fail", nbytes))
            raise DeviceAllocationError("recorder: no room")
        self.calls.append(("allocate", nbytes))
        block = self.device.malloc(nbytes)
        block.stream = stream
        return block

    def deallocate(self, block, cause: FreeCause) -> None:
        self.calls.append(("deallocate", block.nbytes, cause.kind))
        self.device.wait(block)
        self.device.free(block)

    def deallocate_many(self, blocks, cause: FreeCause) -> None:
        self.calls.append(("deallocate_many", [block.nbytes for block in blocks], cause.kind))
        for block in blocks:
            self.device.wait(block)
            self.device.free(block)

    def take_calls(self) -> list[tuple]:
        calls, self.calls = self.calls, []
        return calls


# -- the device layer ----------------------------------------------------------------------------


def test_device_layer_counts_only_what_the_device_did():
    device = SimDevice(2 * KIB)
    layer = DeviceLayer(device)
    block = layer.allocate(KIB, S)
    assert block.stream is S and block.stream_uses is None  # it belongs to its stream
    with pytest.raises(DeviceAllocationError, match="sim: 2048 bytes requested, 1024 of 2048"):
        layer.allocate(2 * KIB, S)
    assert layer.counters() == (1, 0)
    layer.deallocate(block, RELEASE)
    assert layer.counters() == (1, 1) and device.used_bytes == 0


class _CallLog(SimDevice):
    """A simulator that logs its ``wait`` and ``free`` calls with the host clock."""

    def __init__(self, latency_us: int) -> None:
        super().__init__(1 << 20, latency_us)
        self.log: list[tuple[str, int, int]] = []

    def wait(self, block) -> None:
        super().wait(block)
        self.log.append(("wait", block.id, self.now_us))

    def free(self, block) -> None:
        self.log.append(("free", block.id, self.now_us))
        super().free(block)


def test_device_layer_waits_on_the_event_before_it_frees():
    device = _CallLog(latency_us=7)
    stream = device.new_stream(default=True)
    layer = DeviceLayer(device)
    blocks = [layer.allocate(KIB, stream) for _ in range(3)]
    for block in blocks:
        device.launch(stream, block)  # kernels in flight until t=7, 14, 21
        device.record(block)
    layer.deallocate(blocks[0], RELEASE)
    assert device.log == [("wait", 1, 7), ("free", 1, 7)]
    assert device.now_us == 21  # the free is cudaFree: it synchronized the whole device
    layer.deallocate_many(blocks[1:], RELEASE)
    assert device.log[2:] == [("wait", 2, 21), ("free", 2, 21), ("wait", 3, 21), ("free", 3, 21)]
    assert layer.counters() == (3, 3) and device.used_bytes == 0


def test_device_layer_waits_on_every_recorded_streams_event_before_it_frees():
    device = _CallLog(latency_us=10)
    own, side = device.new_stream(default=True), device.new_stream("side")
    layer = DeviceLayer(device)
    block = layer.allocate(KIB, own)
    device.launch(own, block)  # a write: t = 0..10 on its own stream
    side.wait_stream(own)
    for _ in range(3):
        device.launch(side, None, block)  # reads: t = 10..40 on the side stream
    block.stream_uses = {side}  # what record_stream(side) does
    device.record(block)
    assert (block.event, block.use_events) == (40, {side: 40})
    assert device.pending_streams(block) == (side,)
    assert not device.ready(block)
    layer.deallocate(block, RELEASE)
    assert device.log == [("wait", 1, 40), ("free", 1, 40)]
    assert device.now_us == 40 and device.pending_streams(block) == ()


# -- the caching layer ---------------------------------------------------------------------------


def test_caching_layer_reuses_exact_sizes_and_counts_hits_and_misses():
    upstream = Recorder()
    layer = CachingLayer(upstream)
    a = layer.allocate(KIB, S)
    layer.deallocate(a, RELEASE)
    assert layer.allocate(KIB, S) is a  # a hit: the upstream is not asked
    b = layer.allocate(2 * KIB, S)
    assert upstream.take_calls() == [("allocate", KIB), ("allocate", 2 * KIB)]
    assert layer.counters() == (0, 0, 1, 2, 0, 0)
    layer.deallocate(a, RELEASE)
    layer.deallocate(b, RELEASE)
    assert len(layer) == 2 and layer.counters()[0] == 3 * KIB


def _streamed(cap_bytes: int = 0) -> tuple[Recorder, CachingLayer, Stream, Stream]:
    """A caching layer over a recorder whose kernels take 10 us, and two of its streams: the
    default one and another."""
    upstream = Recorder(latency=10)
    device = upstream.device
    streams = device.new_stream(default=True), device.new_stream("other")
    return upstream, CachingLayer(upstream, cap_bytes), *streams


def test_caching_layer_keeps_a_free_list_per_stream():
    # PyTorch's caching allocator: get_free_block looks only at the requesting stream's blocks
    upstream, layer, own, other = _streamed()
    device = upstream.device
    a = layer.allocate(KIB, own)
    device.launch(own, a)  # in flight until t=10
    layer.deallocate(a, RELEASE)
    b = layer.allocate(KIB, other)  # another stream never gets it, whatever its events say
    assert b is not a and b.stream is other
    assert layer.allocate(KIB, own) is a  # its own stream at once: stream order makes it safe
    assert device.now_us == 0 and layer.counters()[2:4] == (1, 2)


def test_caching_layer_holds_a_recorded_block_until_the_other_streams_events_complete():
    upstream, layer, own, side = _streamed()
    device = upstream.device
    a = layer.allocate(KIB, own)
    device.launch(side, a)  # a kernel of the side stream reads it: t = 0..10
    a.stream_uses = {side}  # record_stream(side)
    layer.deallocate(a, RELEASE)
    assert layer.awaiting() == ((a, (side,)),)
    assert (layer.counters()[0], len(layer)) == (KIB, 1)  # cached bytes, not reusable yet
    b = layer.allocate(KIB, own)
    assert b is not a
    device.advance(10)
    assert layer.awaiting() == ((a, ()),)  # done: moved to its free list at the next take
    assert layer.allocate(KIB, own) is a
    assert (a.stream_uses, layer.awaiting(), device.now_us) == (None, (), 10)


def test_caching_layer_caps_and_flushes_awaiting_blocks_too():
    upstream, layer, own, side = _streamed(cap_bytes=KIB)
    device = upstream.device
    blocks = [layer.allocate(KIB, own) for _ in range(2)]
    for block in blocks:
        device.launch(side, block)  # t = 0..10, then 10..20
        block.stream_uses = {side}
    upstream.take_calls()
    layer.deallocate(blocks[0], RELEASE)  # cached, awaiting
    layer.deallocate(blocks[1], RELEASE)  # past the cap: the oldest cached block makes room
    assert upstream.take_calls() == [("deallocate_many", [KIB], "cap_evict")]
    assert layer.awaiting() == ((blocks[1], ()),)  # the newest stays (its event done: synced)
    assert device.now_us == 20 and layer.counters()[4] == 1  # cudaFree: the device synchronized
    assert layer.flush() == KIB and layer.awaiting() == () and len(layer) == 0
    assert upstream.take_calls() == [("deallocate_many", [KIB], "empty_cache")]


def test_caching_layer_evicts_past_the_cap_with_the_cap_evict_cause():
    upstream = Recorder()
    layer = CachingLayer(upstream, cap_bytes=2 * KIB)
    blocks = [layer.allocate(KIB, S) for _ in range(3)] + [layer.allocate(4 * KIB, S)]
    upstream.take_calls()
    layer.deallocate_many(blocks[:3], RELEASE)
    layer.deallocate(blocks[3], RELEASE)
    assert upstream.take_calls() == [
        ("deallocate_many", [KIB], "cap_evict"),  # the oldest, blocks[0], made room
        ("deallocate_many", [4 * KIB], "cap_evict"),  # larger than the cap: never cached
    ]
    assert sorted(layer.blocks(), key=blocks.index) == blocks[1:3]
    cached, cap, hits, misses, evictions, flushes = layer.counters()
    assert (cached, cap, hits, misses, evictions, flushes) == (2 * KIB, 2 * KIB, 0, 4, 2, 0)


def test_caching_layer_collects_then_flushes_then_retries_once():
    upstream = Recorder()
    order = []
    layer = CachingLayer(upstream, on_oom=lambda: order.append("on_oom"))
    layer.deallocate(layer.allocate(KIB, S), RELEASE)
    upstream.take_calls()
    upstream.fail = 1
    block = layer.allocate(8 * KIB, S)
    assert order == ["on_oom"]
    assert upstream.take_calls() == [
        ("fail", 8 * KIB),
        ("deallocate_many", [KIB], "oom_flush"),
        ("allocate", 8 * KIB),
    ]
    assert layer.counters() == (0, 0, 0, 2, 0, 1)
    assert block.nbytes == 8 * KIB


def test_caching_layer_flushes_what_on_oom_handed_back():
    upstream = Recorder()
    layer = CachingLayer(upstream)
    freed_by_collection = layer.allocate(KIB, S)
    layer.on_oom = lambda: layer.deallocate(freed_by_collection, FINALIZE)
    upstream.take_calls()
    upstream.fail = 1
    layer.allocate(2 * KIB, S)
    assert upstream.take_calls() == [
        ("fail", 2 * KIB),
        ("deallocate_many", [KIB], "oom_flush"),
        ("allocate", 2 * KIB),
    ]


def test_caching_layer_second_failure_propagates_and_counts_no_miss():
    upstream = Recorder()
    layer = CachingLayer(upstream)
    upstream.fail = 2
    with pytest.raises(DeviceAllocationError, match="recorder: no room"):
        layer.allocate(KIB, S)
    assert layer.counters() == (0, 0, 0, 0, 0, 1)


def test_caching_layer_flush_returns_the_bytes_with_its_cause():
    upstream = Recorder()
    layer = CachingLayer(upstream)
    layer.deallocate_many([layer.allocate(KIB, S), layer.allocate(3 * KIB, S)], RELEASE)
    upstream.take_calls()
    assert layer.flush() == 4 * KIB
    assert upstream.take_calls() == [("deallocate_many", [KIB, 3 * KIB], "empty_cache")]
    assert layer.flush() == 0 and len(layer) == 0


def test_dropping_the_caching_layer_hands_its_blocks_back():
    upstream = Recorder()
    layer = CachingLayer(upstream)
    layer.deallocate(layer.allocate(KIB, S), RELEASE)
    upstream.take_calls()
    del layer
    assert upstream.take_calls() == [("deallocate_many", [KIB], "teardown")]
    assert upstream.device.used_bytes == 0


# -- the statistics layer ------------------------------------------------------------------------


def test_statistics_count_once_the_block_exists():
    upstream = Recorder()
    stats = Statistics(upstream)
    a = stats.allocate(KIB, S)
    b = stats.allocate(3 * KIB, S)
    upstream.fail = 1
    with pytest.raises(DeviceAllocationError):
        stats.allocate(KIB, S)
    assert stats.counters() == (4 * KIB, 4 * KIB, 2, 2, 0)
    stats.deallocate(a, RELEASE)
    stats.deallocate_many([b], RELEASE)
    assert stats.counters() == (0, 4 * KIB, 0, 2, 2)
    assert upstream.take_calls()[-2:] == [
        ("deallocate", KIB, "release"),
        ("deallocate_many", [3 * KIB], "release"),
    ]


def test_statistics_fold_epochs_as_rmm_pushes_and_pops():
    # DESIGN 2.5's example: outer holds 1000 B, the inner allocates 2000 B, the outer's buffer
    # is freed inside the inner epoch (charged to it).
    stats = Statistics(Recorder())
    stats.push()
    outer = stats.allocate(1000, S)
    stats.push()
    inner = stats.allocate(2000, S)
    stats.deallocate(outer, RELEASE)
    stats.deallocate(inner, RELEASE)
    child = stats.pop()
    assert (child.live_bytes, child.peak_bytes, child.allocs) == (-1000, 2000, 1)
    parent = stats.pop()
    assert (parent.live_bytes, parent.peak_bytes, parent.allocs) == (0, 3000, 1)
    with pytest.raises(IndexError):
        stats.pop()


def test_statistics_start_at_zero():
    stats = Statistics(Recorder())
    assert stats.counters() == (0, 0, 0, 0, 0)
    stats.push()
    epoch = stats.pop()
    assert (epoch.live_bytes, epoch.peak_bytes, epoch.allocs) == (0, 0, 0)


@pytest.mark.parametrize("path", ["allocate", "deallocate", "deallocate_many"])
def test_statistics_fold_their_log_when_it_reaches_fold_every(path):
    stats = Statistics(Recorder())
    blocks = [stats.allocate(4, S) for _ in range(FOLD_EVERY - 2)]
    stats.deallocate(blocks.pop(), RELEASE)
    assert len(stats._log) == FOLD_EVERY - 1 and stats.allocs == 0  # nothing folded yet
    if path == "allocate":
        blocks.append(stats.allocate(4, S))
    elif path == "deallocate":
        stats.deallocate(blocks.pop(), RELEASE)
    else:
        stats.deallocate_many([blocks.pop()], RELEASE)
    assert len(stats._log) == 0  # the FOLD_EVERY-th entry folded the log
    allocs = FOLD_EVERY - 2 + (path == "allocate")
    assert (stats.allocs, stats.frees, stats.live_buffers) == (
        allocs,
        allocs - len(blocks),
        len(blocks),
    )
    assert (stats.live_bytes, stats.peak_bytes) == (4 * len(blocks), 4 * (FOLD_EVERY - 2))
    stats.deallocate_many(blocks, RELEASE)
    assert stats.counters()[:3] == (0, 4 * (FOLD_EVERY - 2), 0)


def test_statistics_from_several_threads_add_up():
    stats = Statistics(Recorder(capacity=1 << 30))

    def work() -> None:
        for _ in range(2000):
            stats.deallocate(stats.allocate(16, S), RELEASE)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    live, peak, buffers, allocs, frees = stats.counters()
    assert (live, buffers, allocs, frees) == (0, 0, 8000, 8000)
    assert 16 <= peak <= 4 * 16


# -- the arena registry --------------------------------------------------------------------------


def _registry() -> tuple[ArenaRegistry, Recorder]:
    upstream = Recorder()
    return ArenaRegistry(Statistics(upstream), "sim"), upstream


def test_registry_frees_a_storage_once_with_its_cause():
    registry, upstream = _registry()
    st = registry.allocate(KIB, S)
    assert (st.nbytes, st.size, st.epoch) == (KIB, KIB // 4, None)
    cause = FreeCause("release", "test")
    assert registry.free(st, cause) == 1
    assert registry.free(st, RELEASE) == 0
    assert st.cause is cause and st.block is None
    assert upstream.take_calls() == [("allocate", KIB), ("deallocate", KIB, "release")]


def test_a_finalizer_only_queues_its_block():
    registry, upstream = _registry()
    st = registry.allocate(KIB, S)
    upstream.take_calls()
    del st
    assert len(registry.pending) == 1 and upstream.take_calls() == []
    registry.drain()
    assert upstream.take_calls() == [("deallocate", KIB, "finalize")]
    assert not registry.pending


def test_registry_tracks_promotes_and_reclaims():
    registry, upstream = _registry()
    assert upstream.device.used_bytes == 0
    outer = registry.open()
    kept, scratch = registry.allocate(KIB, S), registry.allocate(2 * KIB, S)
    inner = registry.open()
    promoted, reclaimed = registry.allocate(4 * KIB, S), registry.allocate(8 * KIB, S)
    assert (kept.epoch, promoted.epoch) == (outer, inner)
    inner_stats = registry.close([Buffer(promoted, 0, 1)], expected=inner)
    assert inner.tracked == {} and reclaimed.epoch is None
    assert inner_stats == EpochStats(1, 2, 1, 8 * KIB, 1, 4 * KIB, 12 * KIB)
    assert promoted.epoch is outer and reclaimed.cause == FreeCause("arena_exit", "arena_exit", 1)
    registry.free(scratch, RELEASE)  # untracked at once
    assert set(outer.tracked) == {id(kept), id(promoted)}
    outer_stats = registry.close([Buffer(kept, 0, 1)], expected=None)
    assert (outer_stats.reclaimed_buffers, outer_stats.kept_bytes) == (1, KIB)
    assert kept.epoch is None and kept.cause is None  # untracked at depth 0, still live
    assert registry.counters() == (0, 2, 12 * KIB)
    assert upstream.device.used_bytes == KIB  # kept is live; every other block went back


class _Mortal:
    """Something a weak reference can point at, to make dead registry entries."""


def test_an_epoch_prunes_when_it_reaches_sweep_at_then_at_twice_the_live():
    registry, _ = _registry()  # no epoch open: its storages are untracked until we track them
    epoch = Epoch(0)

    def add_dead(count: int) -> None:
        for _ in range(count):
            epoch.tracked[-len(epoch.tracked) - 1] = weakref.ref(_Mortal())  # dead at once

    def add_live() -> Storage:
        st = registry.allocate(4, S)
        epoch.track(st, weakref.ref(st))
        return st

    add_dead(SWEEP_MIN - 1)
    live = [add_live()]  # the SWEEP_MIN-th entry prunes the dead ones
    assert (len(epoch.tracked), epoch.sweep_at) == (1, SWEEP_MIN)
    live += [add_live() for _ in range(99)]  # pruned at 64 entries, all live: next at 128
    assert (len(epoch.tracked), epoch.sweep_at) == (100, 128)
    add_dead(27)
    live.append(add_live())  # the 128th entry prunes 27 dead: next at twice the 101 live
    assert (len(epoch.tracked), epoch.sweep_at) == (101, 202)
    assert all(st.epoch is epoch for st in live)


def test_registry_prunes_dead_entries_when_it_doubles():
    registry, _ = _registry()
    epoch = registry.open()
    live = [registry.allocate(4, S) for _ in range(10)]
    for _ in range(5 * SWEEP_MIN):
        registry.allocate(4, S)  # finalized at once: a dead entry until the next pruning
    assert len(epoch.tracked) <= 2 * len(live) + SWEEP_MIN
    assert epoch.sweep_at >= SWEEP_MIN
    registry.drain()
    assert registry.close((), expected=epoch).reclaimed_buffers == 10


def test_a_dropped_registry_hands_its_queued_blocks_upstream():
    upstream = Recorder()
    registry = ArenaRegistry(Statistics(upstream), "sim")
    st = registry.allocate(KIB, S)
    upstream.take_calls()
    gc.disable()
    try:
        del st
        dropped = weakref.ref(registry)
        del registry
        assert dropped() is None
    finally:
        gc.enable()
    assert upstream.take_calls() == [("deallocate", KIB, "finalize")]


# -- the locks -----------------------------------------------------------------------------------


def test_lock_ranks_and_kinds():
    class Owner:
        pass

    assert _locks.ORDER == (
        "arena registry",
        "statistics",
        "reuse cache",
        "device layer",
        "memory history",
        "backend",
    )
    assert type(_locks.new_lock(Owner(), _locks.BACKEND)) is type(threading.RLock())
    assert type(_locks.new_lock(Owner(), _locks.CACHE)) is type(threading.Lock())
    assert type(_locks.new_lock(Owner(), _locks.HISTORY)) is type(threading.Lock())
    with pytest.raises(ValueError, match=r"^rank=6: expected 0 to 5 \(arena registry, statistics"):
        _locks.new_lock(Owner(), 6)


def test_the_fork_hooks_take_every_lock_and_give_them_back():
    registry, _ = _registry()
    locks = [registry._lock, registry._upstream._lock]
    _locks._before_fork()
    try:
        assert not any(lock.acquire(blocking=False) for lock in locks)
    finally:
        _locks._after_fork_in_parent()
    assert all(lock.acquire(blocking=False) for lock in locks)
    for lock in locks:
        lock.release()


def test_a_forked_child_gets_fresh_locks():
    # What the at-fork hook does in the child (called here directly): every registered owner
    # gets a new, unheld lock of its rank, whoever held the old one.
    class Owner:
        pass

    layer, backend = Owner(), Owner()
    layer._lock = _locks.new_lock(layer, _locks.CACHE)
    backend._lock = _locks.new_lock(backend, _locks.BACKEND)
    old = (layer._lock, backend._lock)
    for lock in old:
        lock.acquire()
    _locks._after_fork_in_child()
    assert layer._lock is not old[0] and backend._lock is not old[1]
    assert type(layer._lock) is type(threading.Lock())
    assert type(backend._lock) is type(threading.RLock())
    assert layer._lock.acquire(blocking=False) and backend._lock.acquire(blocking=False)
    for lock in (*old, layer._lock, backend._lock):
        lock.release()
    assert _locks._held == []


@pytest.mark.parametrize(
    ("name", "stack"),
    [
        ("sim", ["ArenaRegistry", "Statistics", "CachingLayer", "DeviceLayer"]),
        ("cpu", ["ArenaRegistry", "Statistics", "DeviceLayer"]),  # the stub has no cache
    ],
)
def test_the_allocator_stacks_its_layers(name, stack):
    alloc = Allocator(AllocatorConfig(backend=name))
    layers = alloc._layers()
    assert [type(layer).__name__ for layer in layers] == stack
    for layer, upstream in itertools.pairwise(layers):
        assert layer._upstream is upstream
    assert layers[-1].device is alloc.device


def test_the_exit_walk_skips_a_storage_claimed_meanwhile_and_goes_on():
    # Another thread's free() pops a storage's block before it untracks it: the walk finds a
    # tracked storage without a block, skips it, and reclaims the rest.
    registry, _ = _registry()
    epoch = registry.open()
    claimed, other = registry.allocate(KIB, S), registry.allocate(2 * KIB, S)
    block = claimed._cell.pop()  # what free() does first
    stats = registry.close((), expected=epoch)
    assert (stats.reclaimed_buffers, stats.reclaimed_bytes) == (1, 2 * KIB)
    assert (claimed.cause, other.cause) == (None, FreeCause("arena_exit", "arena_exit", 0))
    assert block.nbytes == KIB
