"""The simulator's verdicts follow CUDA's rules in both directions (DESIGN 2.4).

- A free to the device is ``cudaFree``, which synchronizes the device: a program that is safe
  on a GPU never aborts in ``empty_cache``, the OOM flush or a cap eviction, and the memory
  history says the host waited (``device_synchronize``).
- ``Stream.query()`` costs host time, so a polling loop ends.
- The race check within one life: a read of another stream's write (or a write over another
  stream's read or write) that no ``wait_stream``, event or host wait orders aborts.

The checks run in-process with the simulator's ``fatal`` patched to raise :class:`Raced` (so a
verdict is an exception, not the end of the session); the death tests at the end show the real
abort, and that the simulator before the fix (a mutant) aborts the CUDA-safe program. The
simulator is proven against a brute-force happens-before oracle in ``test_race_oracle.py``.
"""

from __future__ import annotations

import pytest

from allocator import Allocator, AllocatorConfig
from allocator.device import SimDevice
from allocator.device import sim as sim_module

from . import _race_probes

N = 1024  # elements: 4 KiB blocks
LATENCY = 100


class Raced(Exception):
    """The simulator's fatal line, raised instead of aborting."""


@pytest.fixture
def raced(monkeypatch):
    def fatal(message: str) -> None:
        raise Raced(message)

    monkeypatch.setattr(sim_module, "fatal", fatal)


def _sim(**knobs) -> Allocator:
    return Allocator(AllocatorConfig(backend="sim", sim_latency_us=LATENCY, **knobs))


# -- 1. a free to the device synchronizes it --------------------------------------------------


@pytest.mark.parametrize("how", ["empty_cache", "cap_evict", "oom_flush", "teardown"])
def test_a_free_after_a_waited_read_on_another_stream_synchronizes_the_device(raced, how):
    # fill x on G, read it on the default stream after wait_stream(G), release it without
    # record_stream: CUDA-safe (cudaFree synchronizes the device). Before the fix the free
    # waited only on x's own event (G's, t=100) and aborted: the read runs until t=200.
    alloc = _sim(cache_cap_bytes=4 if how == "cap_evict" else 0)
    alloc.record_history(True, stacks=False)
    gather = alloc.new_stream("G")
    with alloc.use_stream(gather):
        x = alloc.full(N, 1.0)  # t = 0..100 on G
    alloc.default_stream.wait_stream(gather)
    y = alloc.mul(x, x)  # t = 100..200 on the default stream
    alloc.release(x)  # no record_stream: x's block waits on G's event only
    if how == "empty_cache":
        assert alloc.empty_cache() == 4 * N
    elif how == "oom_flush":
        alloc.device.fail_next_mallocs(1)
        alloc.release(alloc.full(1, 0.0))  # the failure flushes the cache, then retries
    elif how == "teardown":
        device = alloc.device
        del alloc, x, y  # the caching layer's finalizer flushes it
        assert (device.now_us, device.used_bytes) == (200, 0)
        return
    assert alloc.device.now_us == 200  # the free waited for the whole device
    syncs = [
        n for n in alloc.snapshot()["devmem"]["annotations"] if n["action"] == "device_synchronize"
    ]
    assert [(n["from_us"], n["to_us"]) for n in syncs] == [(0, 200)]
    assert alloc.sum(y) == float(N)


def test_a_finalizer_never_aborts_a_legacy_teardown(death):
    report = death.run(_race_probes.teardown_after_a_cross_stream_read).assert_clean().returned
    assert report == {"now_us": 200, "used_bytes": 0}


def test_teeth_the_free_that_does_not_synchronize_aborts_the_safe_program(death):
    outcome = death.run(_race_probes.teardown_after_a_cross_stream_read, "free_without_device_sync")
    outcome.assert_aborted(
        match=r"(?m)^devmem sim: fatal: free of block #1 \(4096 bytes\) while a kernel using it is"
        r" still in flight \(completes at t=200us, now t=100us\)$"
    )


# -- 2. a query costs host time ---------------------------------------------------------------


def test_a_query_polled_in_a_loop_turns_true(raced):
    alloc = _sim()
    side = alloc.new_stream("side")
    with alloc.use_stream(side):
        x = alloc.full(N, 1.0)  # t = 0..100
    polls = 1
    while not side.query() and polls < 1000:
        polls += 1
    assert (polls, alloc.device.now_us) == (LATENCY // sim_module.QUERY_COST_US, LATENCY)
    assert alloc.sum(x) == float(N)  # the true answer ordered the host after side's fill


def test_a_false_query_orders_nothing(raced):
    alloc = _sim()
    side = alloc.new_stream("side")
    with alloc.use_stream(side):
        x = alloc.full(N, 1.0)
    assert not side.query() and alloc.device.now_us == 1
    with pytest.raises(Raced, match=r"^sim: stream default reads block #1 while stream side's"):
        alloc.sum(x)


# -- 3. the race check within one life -------------------------------------------------------

READ_RACE = (
    r"^sim: stream default reads block #1 while stream G's write \(until t=100\) is not waited"
    r" for$"
)


def test_a_read_of_another_streams_unwaited_write_aborts(raced):
    alloc = _sim()
    gather = alloc.new_stream("G")
    with alloc.use_stream(gather):
        x = alloc.full(N, 1.0)  # t = 0..100 on G
    with pytest.raises(Raced, match=READ_RACE):
        alloc.mul(x, x)  # on the default stream at t=0: reads what G may still be writing


def test_a_read_aborts_even_once_the_write_completed_in_time_unless_the_host_knows(raced):
    alloc = _sim()
    gather = alloc.new_stream("G")
    with alloc.use_stream(gather):
        x = alloc.full(N, 1.0)
    alloc.device.advance(1000)  # time passing orders nothing: a GPU gives no such promise
    with pytest.raises(Raced, match=READ_RACE):
        alloc.mul(x, x)


@pytest.mark.parametrize("order", ["wait_stream", "synchronize", "device", "readback_on_G"])
def test_an_ordered_read_passes(raced, order):
    alloc = _sim()
    gather = alloc.new_stream("G")
    with alloc.use_stream(gather):
        x = alloc.full(N, 1.0)
    if order == "wait_stream":
        alloc.default_stream.wait_stream(gather)
    elif order == "synchronize":
        gather.synchronize()
    elif order == "device":
        alloc.device.synchronize()
    else:
        with alloc.use_stream(gather):
            assert alloc.sum(x) == float(N)
    assert alloc.sum(alloc.mul(x, x)) == float(N)


def test_a_write_over_another_streams_unwaited_read_aborts(raced):
    sim = SimDevice(1 << 20, latency_us=10)
    own, side = sim.new_stream(default=True), sim.new_stream("side")
    block = sim.malloc(64)
    sim.launch(own, block)  # written on its own stream: t = 0..10
    side.wait_stream(own)
    sim.launch(side, None, block)  # read on side, after the write: t = 10..20
    with pytest.raises(Raced) as info:
        sim.launch(own, block)  # overwritten while side may still read it
    assert str(info.value) == (
        "sim: stream default writes block #1 while stream side's read (until t=20) is not"
        " waited for"
    )
    own.wait_stream(side)
    sim.launch(own, block)  # ordered after the read: fine


def test_a_write_over_another_streams_unwaited_write_aborts(raced):
    sim = SimDevice(1 << 20, latency_us=10)
    own, side = sim.new_stream(default=True), sim.new_stream("side")
    block = sim.malloc(64)
    sim.launch(own, block)
    with pytest.raises(
        Raced, match=r"^sim: stream side writes block #1 while stream default's write"
    ):
        sim.launch(side, block)


def test_reads_of_several_streams_do_not_conflict(raced):
    sim = SimDevice(1 << 20, latency_us=10)
    own, one, two = sim.new_stream(default=True), sim.new_stream("one"), sim.new_stream("two")
    block = sim.malloc(64)
    sim.launch(own, block)
    for reader in (one, two):
        reader.wait_stream(own)
        sim.launch(reader, None, block)  # both read at t = 10..20
    with pytest.raises(Raced, match=r"stream default writes block #1 while stream one's read"):
        sim.launch(own, block)


@pytest.mark.parametrize("readback", ["sum", "to_numpy"])
def test_a_readback_is_a_read_beside_another_streams_unwaited_read(raced, readback):
    # A readback reads its operand: another stream still reading the block does not conflict
    # with it (a write there would be a race).
    alloc = _sim()
    reader = alloc.new_stream("R")
    x = alloc.full(N, 1.0)  # written on the default stream: t = 0..100
    reader.wait_stream(alloc.default_stream)
    with alloc.use_stream(reader):
        y = alloc.mul(x, x)  # R reads x at t = 100..200, which the default stream never waits for
    got = getattr(alloc, readback)(x)  # on the default stream, while R may still read x
    assert float(got if readback == "sum" else got.sum()) == float(N)
    with alloc.use_stream(reader):
        assert alloc.sum(y) == float(N)


def test_the_race_check_aborts_the_process(death):
    outcome = death.run(_race_probes.read_without_wait)
    outcome.assert_aborted(match=READ_RACE.replace("^", "(?m)^"))


# -- events ------------------------------------------------------------------------------------


def test_an_event_orders_what_was_queued_before_its_record_only(raced):
    alloc = _sim()
    gather = alloc.new_stream("G")
    with alloc.use_stream(gather):
        x = alloc.full(N, 1.0)  # t = 0..100 on G
        mark = gather.record_event()  # after x's fill
        y = alloc.full(N, 2.0)  # t = 100..200 on G, after the record
    alloc.default_stream.wait_event(mark)
    assert alloc.default_stream.handle.tail_us == 100  # waits for x's fill, not for y's
    assert alloc.sum(alloc.mul(x, x)) == float(N)  # t = 100..200, then the readback
    with pytest.raises(Raced) as info:
        alloc.mul(y, y)
    assert str(info.value) == (
        "sim: stream default reads block #2 while stream G's write (until t=200) is not waited for"
    )


def test_an_event_polled_in_a_loop_turns_true_and_orders_the_host(raced):
    alloc = _sim()
    gather = alloc.new_stream("G")
    with alloc.use_stream(gather):
        x = alloc.full(N, 1.0)
    mark = gather.record_event()
    polls = 1
    while not mark.query() and polls < 1000:
        polls += 1
    assert (polls, alloc.device.now_us) == (100, 100)
    assert alloc.sum(x) == float(N)  # ordered after the fill by the true answer


def test_an_events_synchronize_orders_the_host(raced):
    alloc = _sim()
    gather = alloc.new_stream("G")
    with alloc.use_stream(gather):
        x = alloc.full(N, 1.0)
    gather.record_event().synchronize()
    assert alloc.device.now_us == 100 and alloc.sum(x) == float(N)


def test_an_in_process_abort_fails_the_test_with_its_line():
    # no `raced` fixture: the suites' own conftest turns the abort into SimulatorAbort in the
    # pytest process (a death test's child aborts for real: test_the_race_check_aborts_...)
    from suites._sim_abort import SimulatorAbort

    alloc = _sim()
    gather = alloc.new_stream("G")
    with alloc.use_stream(gather):
        x = alloc.full(N, 1.0)
    with pytest.raises(SimulatorAbort, match=READ_RACE):
        alloc.mul(x, x)
