"""The reuse cache and its byte cap, the OOM flush, and the CPU stub's lack of a cache
(DESIGN 2.4). Cache behaviour is checked on ``sim``, whose events and capacity tests control."""

from __future__ import annotations

import pickle

import pytest

from allocator import Allocator, AllocatorConfig, DeviceOutOfMemory

N = 4096  # elements: 16 KiB blocks
BLOCK = 4 * N


@pytest.fixture
def sim(request):
    """A fresh ``sim`` allocator; ``indirect`` parametrization passes config overrides."""
    overrides = getattr(request, "param", {})
    return Allocator(AllocatorConfig(backend="sim", **overrides))


def test_exact_size_reuse(sim):
    a = sim.empty(N)
    block = a.storage.block
    sim.release(a)
    assert sim.stats().cache_bytes == BLOCK
    b = sim.empty(N)
    assert b.storage.block is block
    c = sim.empty(N + 1)  # another size never reuses it
    assert c.storage.block is not block
    stats = sim.stats()
    assert (stats.cache_hits, stats.cache_misses, stats.device_mallocs) == (1, 2, 2)
    assert stats.alloc_count == 3 and stats.cache_bytes == 0


def test_cached_bytes_are_not_live(sim):
    sim.release(sim.full(N, 1.0))
    stats = sim.stats()
    assert (stats.live_bytes, stats.cache_bytes, stats.peak_bytes) == (0, BLOCK, BLOCK)


@pytest.mark.parametrize("sim", [{"sim_latency_us": 10}], indirect=True)
def test_the_same_stream_reuses_a_block_at_once(sim):
    # The stream rule (DESIGN 2.4, PyTorch's caching allocator): the block's own stream runs
    # the next life's kernels after the last life's, so its event need not be done.
    a = sim.full(N, 1.0)  # its fill completes at t=10
    first = a.storage.block
    sim.release(a)  # event recorded at t=10; the host clock is still 0
    assert (first.event, sim.device.now_us) == (10, 0)
    b = sim.full(N, 2.0)  # queued behind the old fill: t = 10..20, no race
    assert b.storage.block is first
    assert (sim.stats().cache_hits, sim.device.now_us, first.busy_until) == (1, 0, 20)


@pytest.mark.parametrize("sim", [{"sim_latency_us": 10}], indirect=True)
def test_another_stream_never_gets_the_block(sim):
    a = sim.full(N, 1.0)
    first = a.storage.block
    sim.release(a)
    side = sim.new_stream("side")
    with sim.use_stream(side):
        b = sim.empty(N)
    assert b.storage.block is not first and b.stream is side
    sim.device.advance(100)  # even once every event is done
    with sim.use_stream(side):
        c = sim.empty(N)
    assert c.storage.block is not first and c.stream is side
    stats = sim.stats()
    assert (stats.cache_hits, stats.cache_misses, stats.cache_bytes) == (0, 3, BLOCK)
    assert sim.empty(N).storage.block is first  # its own stream still gets it


@pytest.mark.parametrize("sim", [{"sim_latency_us": 10}], indirect=True)
def test_a_block_recorded_on_another_stream_waits_for_that_streams_event(sim):
    a = sim.full(N, 1.0)  # default stream: t = 0..10
    first = a.storage.block
    side = sim.new_stream("side")
    side.wait_stream(sim.default_stream)
    with sim.use_stream(side):
        sim.release(sim.copy(a))  # a read on side: t = 10..20
    a.record_stream(side)
    assert a.storage.stream_uses == {side} and a.stream is sim.default_stream
    sim.release(a)  # an event on side (t=20): cached, but not reusable before it completes
    assert sim.stats().cache_bytes == 2 * BLOCK  # awaiting blocks are cached bytes
    assert [(blk, streams) for blk, streams in sim._cache.awaiting()] == [(first, (side,))]
    b = sim.empty(N)
    assert b.storage.block is not first, "reused a block whose other stream's kernel was in flight"
    sim.device.advance(19)
    assert sim.empty(N).storage.block is not first  # t=19: still in flight
    side.synchronize()  # t=20
    assert sim._cache.awaiting() == ((first, ()),)  # done; moved at the next allocation
    c = sim.empty(N)
    assert c.storage.block is first and c.storage.stream_uses == frozenset()
    assert sim._cache.awaiting() == ()
    stats = sim.stats()
    assert (stats.cache_hits, stats.cache_misses) == (1, 4)


@pytest.mark.parametrize("sim", [{"sim_latency_us": 10}], indirect=True)
def test_take_finds_an_older_ready_block_behind_a_busy_one(sim):
    side = sim.new_stream("side")
    old, busy = sim.full(N, 1.0), sim.full(N, 2.0)  # fills complete at t=10 and t=20
    old_block = old.storage.block
    side.wait_stream(sim.default_stream)
    with sim.use_stream(side):
        sim.release(sim.copy(old))  # t = 20..30 on side
        old.record_stream(side)
    sim.release(old)  # waits for side's event at t=30
    sim.device.advance(30)  # the old block's event is done
    with sim.use_stream(side):
        sim.release(sim.copy(busy))  # t = 30..40 on side
        busy.record_stream(side)
    sim.release(busy)  # waits for side's event at t=40: the newest awaiting block is busy
    assert sim.empty(N).storage.block is old_block
    assert [streams for _, streams in sim._cache.awaiting()] == [(side,)]


@pytest.mark.parametrize("sim", [{"cache_cap_bytes": 3 * BLOCK}], indirect=True)
def test_admission_exactly_at_the_cap(sim):
    buffers = [sim.empty(N) for _ in range(4)]
    for buf in buffers:
        sim.release(buf)
    stats = sim.stats()
    assert stats.cache_bytes == 3 * BLOCK == stats.cache_cap_bytes  # the third fills it exactly
    assert stats.cap_evictions == 1
    assert stats.device_frees == 1
    assert sim.device.used_bytes == 3 * BLOCK


@pytest.mark.parametrize("sim", [{"cache_cap_bytes": BLOCK - 1}], indirect=True)
def test_a_block_larger_than_the_cap_is_never_cached(sim):
    sim.release(sim.empty(N))
    stats = sim.stats()
    assert (stats.cache_bytes, stats.cap_evictions) == (0, 1)


@pytest.mark.parametrize("sim", [{"cache_cap_bytes": 1 << 20}], indirect=True)
def test_the_seed_workload_fills_exactly_to_the_cap(sim):
    buffers = [sim.full(65536, 1.0) for _ in range(32)]
    for buf in buffers:
        sim.release(buf)
    stats = sim.stats()
    assert (stats.cache_bytes, stats.cap_evictions) == (1 << 20, 28)


def test_unbounded_cache_keeps_everything(sim):
    buffers = [sim.full(65536, 1.0) for _ in range(32)]
    del buffers
    assert sim.stats().cache_bytes == 8 << 20


@pytest.mark.parametrize("sim", [{"sim_latency_us": 5, "cache_cap_bytes": BLOCK}], indirect=True)
def test_evictions_wait_for_the_completion_event(sim):
    a, b = sim.full(N, 1.0), sim.full(N, 2.0)  # kernels complete at t=5 and t=10
    sim.release(a)  # cached
    assert sim.device.now_us == 0
    sim.release(b)  # evicted: freed only after waiting on its event (else the sim aborts)
    assert sim.stats().cap_evictions == 1
    assert sim.device.now_us == 10


def test_empty_cache_frees_every_cached_block(sim):
    buffers = [sim.empty(n) for n in (N, N, 2 * N)]
    for buf in buffers:
        sim.release(buf)
    assert sim.empty_cache() == 4 * BLOCK
    stats = sim.stats()
    assert (stats.cache_bytes, stats.device_frees) == (0, 3)
    assert sim.device.used_bytes == 0
    assert sim.empty_cache() == 0


def test_injected_failure_flushes_then_succeeds(sim):
    for _ in range(3):
        sim.release(sim.empty(N))  # the same block three times: one cached block
    sim.release(sim.empty(2 * N))
    sim.device.fail_next_mallocs(1)
    buf = sim.empty(3 * N)
    stats = sim.stats()
    assert buf.size == 3 * N
    assert (stats.oom_flushes, stats.cache_bytes, stats.device_frees) == (1, 0, 2)


@pytest.mark.parametrize("sim", [{"sim_capacity_bytes": 4 * BLOCK}], indirect=True)
def test_capacity_failure_flushes_then_succeeds(sim):
    held = sim.empty(N)
    for _ in range(2):
        sim.release(sim.empty(N))  # one cached 16 KiB block; the device has 2 blocks free
    big = sim.empty(3 * N)  # fits only once the cached block is freed
    assert big.size == 3 * N
    assert sim.stats().oom_flushes == 1
    assert held.size == N


@pytest.mark.parametrize("sim", [{"sim_capacity_bytes": 4 * BLOCK}], indirect=True)
def test_persistent_oom_raises_with_every_field_and_changes_nothing(sim):
    held = sim.full(N, 1.0)
    sim.release(sim.empty(2 * N))
    before = sim.stats()
    with pytest.raises(DeviceOutOfMemory) as info:
        sim.full(4 * N, 1.0)
    error = info.value
    after = sim.stats()
    assert isinstance(error, MemoryError)
    assert error.requested_bytes == 4 * BLOCK
    assert str(error) == (
        f"out of device memory on sim: requested={4 * BLOCK} bytes live={BLOCK}"
        f" peak={3 * BLOCK} allocs=2 frees=1 cache=0 device_free={3 * BLOCK}"
        f" device_total={4 * BLOCK} (sim: {4 * BLOCK} bytes requested, {3 * BLOCK} of"
        f" {4 * BLOCK} free)"
    )
    assert error.stats == after
    assert (after.live_bytes, after.live_buffers, after.alloc_count) == (
        before.live_bytes,
        before.live_buffers,
        before.alloc_count,
    )
    assert after.oom_flushes == 1
    # issue 8, defect 6: the failed allocation is neither a hit nor a miss
    assert (after.cache_misses, after.alloc_count) == (before.cache_misses, before.alloc_count)
    assert after.alloc_count == after.cache_hits + after.cache_misses
    bare = DeviceOutOfMemory(64, error.stats)  # no reason: no parenthesis, reason ""
    assert bare.reason == "" and str(bare).endswith(f"device_total={4 * BLOCK}")
    clone = pickle.loads(pickle.dumps(error))
    assert (type(clone), str(clone), clone.stats) == (DeviceOutOfMemory, str(error), error.stats)
    assert held.size == N


def test_a_huge_request_is_an_oom_not_a_crash(sim):
    with pytest.raises(DeviceOutOfMemory, match=r"requested=1099511627776 bytes"):
        sim.empty(1 << 38)


def test_the_cpu_stub_keeps_no_cache():
    cpu = Allocator(AllocatorConfig(backend="cpu", cache_cap_bytes=1 << 20))
    buffers = [cpu.full(65536, 1.0) for _ in range(32)]
    for buf in buffers:
        cpu.release(buf)
    stats = cpu.stats()
    assert (stats.cache_bytes, stats.cache_cap_bytes, stats.cap_evictions) == (0, 0, 0)
    assert (stats.cache_hits, stats.cache_misses, stats.device_total_bytes) == (0, 0, 0)
    assert (stats.device_mallocs, stats.device_frees) == (32, 32)
    assert cpu.empty_cache() == 0


def test_cpu_huge_request_raises_oom_without_flushing():
    cpu = Allocator(AllocatorConfig(backend="cpu"))
    with pytest.raises(DeviceOutOfMemory, match=r"^out of device memory on cpu: requested="):
        cpu.empty(1 << 50)
    stats = cpu.stats()
    assert (stats.oom_flushes, stats.live_bytes, stats.alloc_count) == (0, 0, 0)


def test_bad_simulator_arguments():
    from allocator.device import SimDevice

    with pytest.raises(ValueError, match="capacity_bytes must be >= 1, got 0"):
        SimDevice(0)
    with pytest.raises(ValueError, match="latency_us must be >= 0, got -1"):
        SimDevice(1 << 20, -1)
    device = SimDevice(1 << 20)
    with pytest.raises(ValueError, match="count must be >= 0, got -1"):
        device.fail_next_mallocs(-1)
    with pytest.raises(ValueError, match="microseconds must be >= 0, got -5"):
        device.advance(-5)
    assert device.now_us == 0


@pytest.mark.parametrize(("config", "kind"), [("sim", "str"), ({"backend": "sim"}, "dict")])
def test_allocator_config_must_be_an_allocator_config(config, kind):
    with pytest.raises(TypeError, match=f"^config must be an AllocatorConfig, got {kind}$"):
        Allocator(config)


@pytest.mark.parametrize("sim", [{"sim_latency_us": 5}], indirect=True)
def test_ops_and_readbacks_mark_every_block_they_touch_busy(sim):
    a, b = sim.full(N, 1.0), sim.full(N, 2.0)  # fills complete at t=5 and t=10
    c = sim.add(a, b)  # reads a and b, writes c: complete at t=15
    assert [buf.storage.block.busy_until for buf in (a, b, c)] == [15, 15, 15]
    assert sim.sum(c) == 3.0 * N  # a readback: its kernel ends at t=20, and the host waits
    assert (c.storage.block.busy_until, sim.device.now_us) == (20, 20)
    sim.to_numpy(a)
    assert (a.storage.block.busy_until, sim.device.now_us) == (25, 25)
