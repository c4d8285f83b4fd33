"""The backends alone: the CPU stub, the simulated device and their shared helpers (DESIGN 2.2).

The allocator's suites drive them through every layer; these pin what a backend itself promises:
block ids and sizes, float32 arrays, the simulator's capacity, failure injection and logical
clock, the host-memory guard, and the fatal line.
"""

from __future__ import annotations

import os
import types

import numpy as np
import pytest

from allocator.device import CpuDevice, DeviceAllocationError, SimDevice
from allocator.device import base as device_base

from . import _fatal_probes


def test_cpu_blocks_are_numbered_float32_arrays_always_ready():
    cpu = CpuDevice()
    first, second = cpu.malloc(64), cpu.malloc(128)
    assert (first.id, second.id, first.nbytes) == (1, 2, 64)
    assert first.array.dtype == np.float32 and first.array.shape == (16,)
    # fresh: no event yet, no stream until the device layer sets one, no record_stream
    assert (first.event, first.stream, first.stream_id) == (None, None, 0)
    assert (first.stream_uses, first.use_events) == (None, None)
    stream = cpu.new_stream(default=True)
    first.stream = stream
    first.stream_uses = {cpu.new_stream("side")}
    cpu.record(first)
    assert cpu.ready(first) and first.event is None  # events always complete on the stub
    assert cpu.pending_streams(first) == () and stream.query() and stream.handle is None
    stream.synchronize()
    stream.wait_stream(cpu.new_stream())
    cpu.free(first)
    assert first.array is None
    assert cpu.memory_info() == (0, 0)


def test_sim_blocks_are_numbered_and_accounted():
    sim = SimDevice(256)
    assert (sim.latency_us, sim.used_bytes, sim.now_us) == (0, 0, 0)
    first, second = sim.malloc(64), sim.malloc(128)
    assert (first.id, second.id, first.event, first.busy_until) == (1, 2, 0, 0)
    assert first.array.dtype == np.float32 and sim.memory_info() == (64, 256)
    sim.free(first)
    assert first.array is None and sim.used_bytes == 128


def test_a_one_byte_sim_device_is_a_device():
    sim = SimDevice(1)
    with pytest.raises(DeviceAllocationError, match=r"^sim: 4 bytes requested, 1 of 1 free$"):
        sim.malloc(4)


def test_injected_failures_count_down_one_by_one():
    sim = SimDevice(1024)
    sim.fail_next_mallocs()  # one
    with pytest.raises(DeviceAllocationError, match=r"^sim: injected allocation failure$"):
        sim.malloc(4)
    sim.malloc(4)
    sim.fail_next_mallocs(2)
    for _ in range(2):
        with pytest.raises(DeviceAllocationError, match=r"^sim: injected allocation failure$"):
            sim.malloc(4)
    sim.malloc(4)
    sim.fail_next_mallocs(0)
    sim.malloc(4)
    assert sim.used_bytes == 12


def test_a_host_allocation_failure_gives_the_capacity_back(monkeypatch):
    sim = SimDevice(1024)

    def no_memory(nbytes):
        raise DeviceAllocationError("host: none left")

    monkeypatch.setattr("allocator.device.sim.host_array", no_memory)
    with pytest.raises(DeviceAllocationError, match=r"^host: none left$"):
        sim.malloc(64)
    assert sim.used_bytes == 0


def test_the_logical_clock():
    sim = SimDevice(1 << 20, latency_us=5)
    s = sim.new_stream(default=True)
    a, b = sim.malloc(64), sim.malloc(64)
    a.stream = b.stream = s
    sim.launch(s, a)  # t = 0..5
    sim.launch(s, b)  # queued behind it: t = 5..10
    assert (a.busy_until, b.busy_until, sim.tail_us, s.handle.tail_us) == (5, 10, 10, 10)
    sim.advance(0)
    sim.advance(30)
    sim.advance(20)
    assert sim.now_us == 50
    sim.launch(s, a)  # the stream is idle: starts now
    assert a.busy_until == 55
    sim.record(a)  # freed at t=50: its event completes at t=55
    assert (a.event, sim.ready(a)) == (55, True)  # reusable on its own stream at once
    s2 = sim.new_stream("other")
    s2.wait_stream(s)  # the next life's kernels on s2 start once s's have completed
    sim.launch(s2, a)  # t = 55..60 on the other stream
    a.stream_uses = {s2}  # what record_stream(s2) does
    sim.record(a)  # events on s (t=55) and on s2 (t=60)
    assert (a.event, a.use_events, sim.ready(a)) == (60, {s2: 60}, False)
    sim.wait(a)
    assert (sim.now_us, sim.ready(a)) == (60, True)
    sim.launch(s, b)
    sim.synchronize()
    assert sim.now_us == 65


def test_each_stream_has_its_own_clock():
    sim = SimDevice(1 << 20, latency_us=10)
    one, two = sim.new_stream(default=True), sim.new_stream()
    assert (one.id, one.name, two.id, two.name) == (0, "default", 1, "#1")
    block, other = sim.malloc(64), sim.malloc(64)
    for _ in range(3):
        sim.launch(one, block)  # t = 0..30
    sim.launch(two, other)  # another stream starts at once: t = 0..10
    assert (one.handle.tail_us, two.handle.tail_us, sim.tail_us) == (30, 10, 30)
    assert not one.query() and not two.query()
    two.synchronize()  # the host waits for two only
    assert (sim.now_us, two.query(), one.query()) == (10, True, False)  # each query: 1 us
    two.wait_stream(one)  # two's next kernel starts after one's queued kernels
    sim.launch(two, block)
    assert two.handle.tail_us == 40 and sim.now_us == 12  # the host did not wait
    one.wait_stream(two)
    assert one.handle.tail_us == 40
    one.wait_stream(one)  # waiting on itself changes nothing
    sim.synchronize()
    assert sim.now_us == 40 and one.query() and two.query()


def test_streams_check_their_peers():
    sim, other = SimDevice(1 << 20), SimDevice(1 << 20)
    mine, theirs = sim.new_stream(default=True), other.new_stream("far")
    with pytest.raises(TypeError, match=r"^other must be a Stream, got int$"):
        mine.wait_stream(3)
    with pytest.raises(ValueError, match=r"^other \('far'\) belongs to another allocator$"):
        mine.wait_stream(theirs)
    assert repr(theirs) == "<Stream 'far' (#1) on sim>"


def test_the_host_memory_guard(monkeypatch):
    total = device_base._host_memory_bytes()
    page = os.sysconf("SC_PAGE_SIZE")
    assert total >= 1 << 28 and total % page == 0
    monkeypatch.setattr(device_base, "_HOST_BYTES", 4096)
    assert device_base.host_array(4096).shape == (1024,)  # exactly the host's memory: allowed
    assert device_base.host_array(64).dtype == np.float32
    with pytest.raises(DeviceAllocationError) as info:
        device_base.host_array(4100)
    assert str(info.value) == "4100 bytes exceeds the host's physical memory (4096 bytes)"


def test_the_host_memory_probe_says_0_where_the_platform_does_not_tell(monkeypatch):
    def unknown(name):
        raise ValueError(name)

    monkeypatch.setattr(device_base.os, "sysconf", unknown)
    assert device_base._host_memory_bytes() == 0


def test_numpy_refusing_an_allocation_is_a_device_failure(monkeypatch):
    def refuse(count, dtype):
        raise MemoryError("Unable to allocate")

    fake_numpy = types.SimpleNamespace(empty=refuse, float32=np.float32)
    monkeypatch.setattr(device_base, "np", fake_numpy)
    with pytest.raises(DeviceAllocationError) as info:
        device_base.host_array(64)
    assert str(info.value) == "host allocation of 64 bytes failed: Unable to allocate"


def test_readbacks_copy_and_sum_in_float64(alloc):
    buf = alloc.from_numpy(np.array([1e8, 1.0, -1e8], dtype=np.float32))
    assert alloc.sum(buf) == 1.0  # float32 accumulation would give 0.0
    host = alloc.to_numpy(buf)
    host[:] = 7.0
    assert alloc.to_numpy(buf).tolist() == [1e8, 1.0, -1e8]  # a copy, not the device array
    alloc.release(buf)


def test_a_fatal_line_survives_characters_it_cannot_encode(death):
    outcome = death.run(_fatal_probes.fatal_with_a_lone_surrogate)
    outcome.assert_aborted(r"(?m)^devmem: fatal: bad byte \?$")


def test_a_fresh_simulator_synchronizes_without_moving_its_clock():
    sim = SimDevice(1 << 20, latency_us=5)
    sim.synchronize()
    assert (sim.now_us, sim.tail_us, sim.clock_us()) == (0, 0, 0)


def test_a_blocks_accesses_are_kept_per_stream_across_its_lives():
    sim = SimDevice(1 << 20, latency_us=1)
    default, side = sim.new_stream(default=True), sim.new_stream("side")
    block = sim.malloc(64)
    block.stream = default
    sim.launch(default, block)  # a write on its own stream: t = 0..1
    side.wait_stream(default)
    sim.launch(side, None, block)  # a read on side, after it: t = 1..2
    sim.launch(default, None, block)  # a read on its own stream: t = 1..2
    assert block.writer[2:] == (1, 0, "default")  # (completion time, life, stream name)
    assert sorted(read[2:] for read in block.readers.values()) == [
        (2, 0, "default"),
        (2, 0, "side"),
    ]
    sim.record(block)  # freed: its accesses stay, for the race check against its next life
    assert block.life == 1 and len(block.readers) == 2
    default.wait_stream(side)
    sim.launch(default, block)  # the next life's write, after both reads: they are forgotten
    assert (block.writer[2:], block.readers) == ((3, 1, "default"), None)


def test_the_host_clock_is_whole_microseconds_since_the_epoch():
    import time

    before = time.time_ns() // 1000
    now = CpuDevice().clock_us()
    assert type(now) is int and before <= now <= time.time_ns() // 1000


def test_the_sims_vector_clocks_count_kernels_and_events_start_empty():
    sim = SimDevice(1 << 20, latency_us=1)
    own, side = sim.new_stream(default=True), sim.new_stream("side")
    event = sim.new_event_handle()
    assert (event.time_us, event.vc, repr(event)) == (0, {}, "<SimEvent at t=0us>")
    key = own.handle.key
    assert own.handle.vc == {key: 0}  # no kernel of its own yet
    block = sim.malloc(64)
    block.stream = own
    sim.launch(own, block)
    sim.launch(own, None, block)
    assert own.handle.vc == {key: 2}  # its own entry counts its own kernels
    sim.record(block)  # no record_stream: no event on another stream
    assert (block.event, block.use_events) == (2, None)
    side.wait_stream(own)
    sim.launch(side, None, block)
    block.stream_uses = {side}
    sim.record(block)
    assert block.use_events == {side: 3}
    sim.advance(3)
    assert sim.take_ready(block) and block.use_events is None  # forgotten once queried done
