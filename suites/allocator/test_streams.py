"""Streams (DESIGN 2.4): the API on every backend, the current stream per thread, record_stream,
and the simulator's race check as a death test.

The reuse rules themselves (same-stream reuse at once, no other stream ever, recorded streams'
events first) are in ``test_cache.py`` and, layer by layer, ``test_layers.py``.
"""

from __future__ import annotations

import threading

import pytest

import allocator
from allocator import Allocator, AllocatorConfig, Event, Stream

from . import _stream_probes
from ._knobs import pinned_env

RACE = (
    r"(?m)^sim: block #1 reused on stream default while stream consumer's kernel is in flight"
    r" \(until t=200\)$"
)


def test_the_default_stream_and_new_ones(alloc):
    default = alloc.default_stream
    assert isinstance(default, Stream) and alloc.current_stream() is default
    assert (default.id, default.name, default.device) == (0, "default", alloc.device)
    first, named = alloc.new_stream(), alloc.new_stream("gather")
    assert (first.id, first.name, named.id, named.name) == (1, "#1", 2, "gather")
    assert repr(named) == f"<Stream 'gather' (#2) on {alloc.backend}>"
    assert alloc.current_stream() is default  # making one does not make it current


def test_stream_names_are_checked(alloc):
    with pytest.raises(TypeError, match=r"^name must be a str, got int$"):
        alloc.new_stream(3)
    with pytest.raises(ValueError, match=r"^name must be a non-empty string \(or None"):
        alloc.new_stream("")


def test_use_stream_makes_a_stream_current_for_the_block(alloc):
    side, inner = alloc.new_stream("side"), alloc.new_stream("inner")
    x = alloc.full(8, 2.0)
    side.wait_stream(alloc.default_stream)  # x is written on the default stream
    with alloc.use_stream(side) as entered:
        assert entered is side and alloc.current_stream() is side
        y = alloc.add(x, x)  # allocated on, and computed on, the current stream
        with alloc.use_stream(inner):
            z = alloc.full(8, 1.0)
            assert alloc.current_stream() is inner
        assert alloc.current_stream() is side  # nested blocks restore
    assert alloc.current_stream() is alloc.default_stream
    assert (x.stream, y.stream, z.stream) == (alloc.default_stream, side, inner)
    alloc.default_stream.wait_stream(side)  # y is written on side (sim's race check aborts,
    assert alloc.sum(y) == 32.0  # and a GPU may read it early, without this wait)
    with pytest.raises(RuntimeError, match="boom"), alloc.use_stream(side):
        raise RuntimeError("boom")
    assert alloc.current_stream() is alloc.default_stream  # restored after an exception too
    for buf in (x, y, z):
        alloc.release(buf)


def test_one_scope_object_entered_again_restores_each_time(alloc):
    side = alloc.new_stream("side")
    scope = alloc.use_stream(side)
    with scope:
        with scope:  # nested: its exit restores side, the outer exit the default stream
            assert alloc.current_stream() is side
        assert alloc.current_stream() is side
    assert alloc.current_stream() is alloc.default_stream
    with scope:  # later, again
        assert alloc.current_stream() is side
    assert alloc.current_stream() is alloc.default_stream


def test_the_current_stream_is_per_thread(alloc):
    side = alloc.new_stream("side")
    entered, leave = threading.Event(), threading.Event()
    seen = {}

    def other_thread() -> None:
        with alloc.use_stream(side):
            entered.set()
            leave.wait(10)
            seen["inside"] = alloc.current_stream()

    thread = threading.Thread(target=other_thread)
    thread.start()
    assert entered.wait(10)
    seen["main"] = alloc.current_stream()  # while the other thread is inside its block
    leave.set()
    thread.join(10)
    assert seen == {"main": alloc.default_stream, "inside": side}


def test_use_stream_refuses_what_is_not_one_of_its_streams(alloc, make_alloc):
    other = make_alloc()
    theirs = other.new_stream("theirs")
    with pytest.raises(TypeError, match=r"^stream must be a Stream, got str$"):
        alloc.use_stream("side")  # refused at the call, before any ``with``
    with pytest.raises(ValueError, match=r"^stream \('theirs'\) belongs to another allocator$"):
        alloc.use_stream(theirs)
    with pytest.raises(ValueError, match=r"^stream \('default'\) belongs to another allocator$"):
        alloc.use_stream(other.default_stream)
    assert alloc.current_stream() is alloc.default_stream


def test_record_stream_marks_the_block_and_checks_its_argument(alloc, make_alloc):
    side = alloc.new_stream("side")
    buf = alloc.full(16, 1.0)
    view = buf.view(4, 8)
    assert buf.storage.stream_uses == frozenset()
    buf.record_stream(alloc.default_stream)  # its own stream: nothing to record
    assert buf.storage.stream_uses == frozenset()
    view.record_stream(side)  # a view records on the storage it shares
    assert buf.storage.stream_uses == {side} and view.stream is alloc.default_stream
    with pytest.raises(TypeError, match=r"^stream must be a Stream, got NoneType$"):
        buf.record_stream(None)
    with pytest.raises(TypeError, match=r"^stream must be a Stream, got int$"):
        buf.record_stream(3)
    other = alloc.new_stream("other")
    buf.record_stream(other)  # a second stream joins the first
    assert buf.storage.stream_uses == {side, other}
    with pytest.raises(ValueError, match=r"^stream \('far'\) belongs to another allocator$"):
        buf.record_stream(make_alloc().new_stream("far"))
    alloc.release(buf)
    assert buf.stream is None and buf.storage.stream_uses == frozenset()
    with pytest.raises(ValueError) as info:
        view.record_stream(side)
    assert str(info.value) == (
        "record_stream('side') on a buffer whose block is gone (it was released by"
        " release()): record the stream before the free"
    )
    off = make_alloc()  # detector off: an op on freed operands gives an empty buffer
    gone = off.full(4, 1.0)
    off.release(gone)
    empty = off.add(gone, gone)
    with pytest.raises(ValueError, match=r"^record_stream\('#1'\) on an empty buffer: it has no"):
        empty.record_stream(off.new_stream())


def test_streams_synchronize_and_wait_on_every_backend(alloc):
    side = alloc.new_stream("side")
    buf = alloc.full(64, 1.0)
    side.wait_stream(alloc.default_stream)
    with alloc.use_stream(side):
        out = alloc.mul(buf, buf)
    side.synchronize()
    assert side.query() and alloc.default_stream.query()
    assert alloc.to_numpy(out).tolist() == [1.0] * 64
    out.record_stream(alloc.default_stream)
    alloc.release(out)
    alloc.release(buf)
    stats = alloc.stats()
    assert (stats.live_bytes, stats.live_buffers) == (0, 0)


def test_on_cpu_streams_are_accounting_only():
    cpu = Allocator(AllocatorConfig(backend="cpu"))
    side = cpu.new_stream("side")
    buf = cpu.full(16, 1.0)
    buf.record_stream(side)
    assert buf.stream is cpu.default_stream and buf.storage.stream_uses == {side}
    cpu.release(buf)  # no cache: handed back to the device at once, nothing to wait for
    stats = cpu.stats()
    assert (stats.device_frees, stats.cache_bytes, stats.live_bytes) == (1, 0, 0)
    assert side.query() and side.handle is None


@pytest.mark.parametrize("guard", ["record_stream", "wait_stream"])
def test_a_guarded_reuse_passes_the_race_check(death, guard):
    report = death.run(_stream_probes.reuse_across_streams, guard).assert_clean().returned
    assert report["sum"] == 4096.0
    if guard == "record_stream":  # the cache kept the block until the consumer's event
        assert report == {
            **report,
            "reused_at_once": False,
            "reused_after_the_wait": True,
            "now_us": 0,
            "hits": 1,
            "misses": 3,
        }
    else:  # stream order protects the reuse: the block comes back at once
        assert (report["reused_at_once"], report["hits"], report["misses"]) == (True, 1, 3)


def test_teeth_a_reuse_without_record_stream_aborts_in_the_race_check(death):
    outcome = death.run(_stream_probes.reuse_across_streams, "none")
    outcome.assert_aborted(match=RACE)


def test_module_level_stream_functions_act_on_the_default_allocator(death):
    report = death.run(_stream_probes.module_level_streams, env=pinned_env("sim")).returned
    assert report == {
        "default": [0, "default", True],
        "side": [1, "side"],
        "same_device": True,
        "inside": [True, True, True],
        "uses": ["default"],
        "after": True,
        "query": True,
        "live": 0,
    }


def test_module_level_stream_functions_are_exported():
    for name in ("new_stream", "default_stream", "current_stream", "use_stream", "Stream"):
        assert name in allocator.__all__


@pytest.mark.backends("sim")
@pytest.mark.parametrize("latency", [0, 1])
def test_ops_queue_on_the_streams_clock_from_a_latency_of_one(make_alloc, latency):
    # the allocator skips launch bookkeeping only where every kernel is done at once
    alloc = make_alloc(sim_latency_us=latency)
    buf = alloc.full(4, 1.0)
    assert alloc.default_stream.handle.tail_us == latency
    alloc.release(buf)


def test_one_scope_object_entered_from_two_threads_is_refused(alloc):
    side = alloc.new_stream("side")
    scope = alloc.use_stream(side)
    entered, leave = threading.Event(), threading.Event()
    seen = {}

    def other_thread() -> None:
        with scope:
            entered.set()
            leave.wait(10)
            seen["inside"] = alloc.current_stream()
        seen["after"] = alloc.current_stream()

    thread = threading.Thread(target=other_thread)
    thread.start()
    assert entered.wait(10)
    with pytest.raises(RuntimeError) as info:
        scope.__enter__()  # the object is the other thread's now: its exits would swap streams
    assert str(info.value) == (
        "use_stream('side'): this scope object is entered by another thread now; call"
        " alloc.use_stream(stream) in each thread"
    )
    assert alloc.current_stream() is alloc.default_stream
    leave.set()
    thread.join(10)
    assert seen == {"inside": side, "after": alloc.default_stream}
    with scope:  # free again once that thread left it
        assert alloc.current_stream() is side
    assert alloc.current_stream() is alloc.default_stream


def test_events_record_wait_query_and_synchronize_on_every_backend(alloc, make_alloc):
    side = alloc.new_stream("side")
    never = alloc.new_event()
    assert isinstance(never, Event) and never.recorded is False and never.device is alloc.device
    assert repr(never) == f"<Event never recorded on {alloc.backend}>"
    assert never.query()  # an event never recorded is complete
    never.synchronize()
    alloc.default_stream.wait_event(never)  # nothing to wait for
    x = alloc.full(64, 1.0)
    side.wait_stream(alloc.default_stream)
    with alloc.use_stream(side):
        y = alloc.mul(x, x)
    done = side.record_event()  # a new event, recorded after y's kernel
    assert isinstance(done, Event) and done.recorded and done is not never
    assert repr(done) == f"<Event recorded on {alloc.backend}>"
    assert side.record_event(never) is never and never.recorded  # records the one given
    alloc.default_stream.wait_event(done)  # the default stream's next kernels follow y's
    assert alloc.sum(y) == 64.0
    done.synchronize()
    assert done.query()
    with pytest.raises(TypeError, match=r"^event must be an Event, got str$"):
        side.record_event("e")
    with pytest.raises(TypeError, match=r"^event must be an Event, got NoneType$"):
        side.wait_event(None)
    theirs = make_alloc().new_event()
    with pytest.raises(ValueError, match=r"^event belongs to another allocator$"):
        side.wait_event(theirs)
    with pytest.raises(ValueError, match=r"^event belongs to another allocator$"):
        side.record_event(theirs)
    assert not theirs.recorded
    y.record_stream(alloc.default_stream)
    for buf in (x, y):
        alloc.release(buf)


class _FailingScope:
    """A device stream scope whose entry fails (as CuPy's could), ``fails`` times."""

    def __init__(self, fails: int) -> None:
        self.fails = fails

    def __enter__(self):
        if self.fails:
            self.fails -= 1
            raise OSError("the device refused the stream")
        return self

    def __exit__(self, *exc) -> None:
        return None


def _entered_elsewhere(scope) -> str:
    """Enter ``scope`` in another thread: ``"entered"``, or the error's text."""
    out = []

    def other() -> None:
        try:
            with scope:
                out.append("entered")
        except RuntimeError as exc:
            out.append(str(exc))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(10)
    return out[0]


def test_a_failed_device_scope_leaves_the_scope_object_as_it_was(alloc, monkeypatch):
    side = alloc.new_stream("side")
    failing = _FailingScope(fails=1)
    monkeypatch.setattr(type(alloc.device), "stream_scope", lambda self, stream: failing)
    scope = alloc.use_stream(side)
    with pytest.raises(OSError, match="refused"):
        scope.__enter__()  # its first entry fails: nothing is entered, nothing is held
    assert alloc.current_stream() is alloc.default_stream
    assert _entered_elsewhere(scope) == "entered"
    with scope:  # entered for real; a nested entry that fails keeps the outer one's claim
        failing.fails = 1
        with pytest.raises(OSError, match="refused"):
            scope.__enter__()
        assert alloc.current_stream() is side
        assert _entered_elsewhere(scope).startswith("use_stream('side'): this scope object")
    assert alloc.current_stream() is alloc.default_stream
    assert _entered_elsewhere(scope) == "entered"
