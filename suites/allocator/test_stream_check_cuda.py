"""The ``cuda`` stream check against the simulator: the same verdicts, both directions.

Random programs through the allocator's API (:mod:`._stream_programs`: two to four streams,
fills, copies and adds, views, readbacks, releases and finalizer frees, ``record_stream``,
``wait_stream``, events, stream, event and device synchronization, queries, ``empty_cache``)
run on ``sim`` with a latency and on ``cuda`` over the fake CuPy with ``DEVMEM_STREAM_CHECK=raise``
and the fake's own race check off, so that only the stream check judges. The fake answers each
query as the simulator's did (the answers are the program's inputs: a GPU gives either at some
moment). Where the reuse cache's polls got the same answers on both (the simulator's depend on
its clock; the stream check's on what the host learned, so that no timing decides), the two
verdicts agree: the same operation raises, with the same block, streams and accesses, or
neither does. A mutant of each call the backend feeds the check is caught.

Every test here runs in a process of its own (``own_process``): building a ``cuda`` allocator
initializes (fake) CUDA.
"""

from __future__ import annotations

import collections
import random
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import Allocator, AllocatorConfig

from . import _fake_cupy, _stream_programs
from ._knobs import pinned_env

LATENCY_US = 10

pytestmark = pytest.mark.own_process


def _fake():
    """The fake CuPy with its own race check off, installed once in this process (in place of
    the fake-GPU lane's, whose clocks would judge too)."""
    cupy = sys.modules.get("cupy")
    if not getattr(cupy, "_stream_check_differential", False):
        _fake_cupy.install(total_bytes=1 << 24, race_check=False)
        cupy = sys.modules["cupy"]
        cupy._stream_check_differential = True
    return cupy


def _scripted(cupy) -> collections.deque:
    script = getattr(cupy, "_script", None)
    if script is None:
        script = cupy._script = collections.deque()
        _stream_programs.script_answers(cupy, script)
    return script


def differ(program: list[tuple], streams: int) -> tuple:
    """Run ``program`` on both backends: ``(sim verdict, cuda verdict, comparable)``."""
    cupy = _fake()
    script = _scripted(cupy)
    sim = Allocator(AllocatorConfig(backend="sim", sim_latency_us=LATENCY_US, stream_check="raise"))
    sim_run = _stream_programs.run(sim, program, streams)
    script.clear()
    script.extend(_stream_programs.queries_of(sim_run[1]))
    cuda = Allocator(AllocatorConfig(backend="cuda", stream_check="raise"))
    cuda_run = _stream_programs.run(cuda, program, streams, script)
    script.clear()
    return sim_run[0], cuda_run[0], _stream_programs.comparable(program, [sim_run, cuda_run])


def _batch(seed: int, count: int) -> list[tuple]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        streams = rng.randrange(2, 5)
        out.append((_stream_programs.random_program(rng, streams, rng.randrange(1, 30)), streams))
    return out


# Programs each direction must get right, besides the random ones: the reuse cache's poll of a
# block freed with record_stream(s1) while s1 still reads it (neither backend reuses it: the
# simulator's clock says not yet, the stream check that the host has not learned it), then the
# same after a sync of s1 (both reuse it, ordered); a read of another stream's write ordered by
# an event only; and the same event recorded before the write (a race); a reuse race; host
# waits of each kind (an event's synchronize, a free to the device, a readback, polls).
FIXED = [
    (
        [
            ("full", 0, 0, 4),
            ("wait_stream", 1, 0),
            ("copy", 1, 1, 0),  # s1 reads the default stream's block #1
            ("record_stream", 0, 1),
            ("drop", 0),  # freed: awaits s1's event
            ("full", 0, 2, 4),  # the cache polls block #1: not reusable yet
            ("sum", 0, 2),
        ],
        2,
        None,
    ),
    (
        [
            ("full", 0, 0, 4),
            ("wait_stream", 1, 0),
            ("copy", 1, 1, 0),
            ("record_stream", 0, 1),
            ("drop", 0),
            ("sync_stream", 1),
            ("full", 0, 2, 4),  # reuses block #1, after s1's read: ordered
            ("sum", 0, 2),
        ],
        2,
        None,
    ),
    (
        [("full", 1, 0, 4), ("record_event", 1, 0), ("wait_event", 0, 0), ("read", 0, 0)],
        2,
        None,
    ),
    (
        [("record_event", 1, 0), ("full", 1, 0, 4), ("wait_event", 0, 0), ("read", 0, 0)],
        2,
        (3, "sim: stream default reads block #1 while stream s1's write"),
    ),
    (
        [("full", 0, 0, 4), ("borrow", 1, 1, 0), ("drop", 0), ("full", 0, 2, 4)],
        2,
        (3, "sim: block #1 reused on stream default while stream s1's"),
    ),
    (
        [("full", 1, 0, 4), ("record_event", 1, 0), ("event_sync", 0), ("read", 0, 0)],
        2,
        None,
    ),
    (
        [("full", 1, 0, 4), ("full", 0, 1, 8), ("drop", 1), ("empty_cache",), ("read", 0, 0)],
        2,
        None,  # cudaFree synchronized the device
    ),
    (
        [("full", 1, 0, 4), ("read", 1, 0), ("read", 0, 0)],  # s1's readback orders the host
        2,
        None,
    ),
    (
        [("full", 1, 0, 4), ("sum", 1, 0), ("sum", 0, 0)],
        2,
        None,
    ),
    (
        [("full", 1, 0, 4), ("poll", 1), ("read", 0, 0)],  # so does a query that said true
        2,
        None,
    ),
    (
        [("full", 1, 0, 4), ("record_event", 1, 0), ("event_poll", 0), ("read", 0, 0)],
        2,
        None,
    ),
]


def test_the_fixed_programs():
    for program, streams, expected in FIXED:
        sim_verdict, cuda_verdict, comparable = differ(program, streams)
        assert comparable and sim_verdict == cuda_verdict == expected, (program, cuda_verdict)


def run_batch(seed: int = 1, count: int = 300) -> dict:
    """Both backends on the fixed programs and a seeded batch; raise AssertionError at the
    first disagreement, or when more than a tenth of the batch was not comparable."""
    for program, streams, expected in FIXED:
        sim_verdict, cuda_verdict, comparable = differ(program, streams)
        assert comparable and sim_verdict == cuda_verdict == expected, (program, cuda_verdict)
    counts = collections.Counter()
    for program, streams in _batch(seed, count):
        sim_verdict, cuda_verdict, comparable = differ(program, streams)
        if not comparable:
            counts["diverged"] += 1
            continue
        assert sim_verdict == cuda_verdict, (program, streams, sim_verdict, cuda_verdict)
        if sim_verdict is None:
            counts["ordered"] += 1
        elif " reused " in sim_verdict[1]:
            counts["reuse"] += 1
        else:
            counts["racy"] += 1
    assert counts["diverged"] <= count // 10, f"the caches' polls got other answers: {counts}"
    return dict(counts)


def test_the_verdicts_agree_on_a_seeded_batch():
    counts = run_batch(1, 300)
    # both directions, reuse races too (rarer at random: a borrow, a free and a reuse in order)
    assert counts.get("racy", 0) >= 50 and counts.get("ordered", 0) >= 150, counts
    assert counts.get("reuse", 0) >= 2, counts
    assert counts.get("diverged", 0) <= 30, counts  # (run_batch checks it too)


def _op(streams: int):
    s = st.integers(0, streams - 1)
    slot = st.integers(0, _stream_programs.SLOTS - 1)
    event = st.integers(0, _stream_programs.EVENTS - 1)
    return st.one_of(
        st.tuples(st.just("full"), s, slot, st.sampled_from(_stream_programs.SIZES)),
        st.tuples(st.sampled_from(["copy", "borrow"]), s, slot, slot),
        st.tuples(st.just("add"), s, slot, slot, slot),
        st.tuples(st.just("view"), slot, slot),
        st.tuples(st.sampled_from(["sum", "read"]), s, slot),
        st.tuples(st.sampled_from(["release", "drop", "recycle"]), slot),
        st.tuples(st.just("record_stream"), slot, s),
        st.tuples(st.just("wait_stream"), s, s),
        st.tuples(st.sampled_from(["sync_stream", "query", "poll"]), s),
        st.tuples(st.sampled_from(["event_query", "event_sync", "event_poll"]), event),
        st.tuples(st.sampled_from(["record_event", "wait_event"]), s, event),
        st.tuples(st.sampled_from(["sync_device", "empty_cache"])),
    )


_programs = st.integers(2, 4).flatmap(
    lambda n: st.tuples(st.lists(_op(n), min_size=1, max_size=30), st.just(n))
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(case=_programs)
def test_the_verdicts_agree(case):
    program, streams = case
    sim_verdict, cuda_verdict, comparable = differ(program, streams)
    if comparable:
        assert sim_verdict == cuda_verdict


# -- a mutant of each call the backend feeds the check is caught -------------------------------


def _cuda():
    _fake()
    from allocator.device import cuda

    return cuda.CudaDevice


def _without(name: str, *, keep_result: bool = True):
    """The backend's ``name`` with the check off for that call only."""

    def apply(patch):
        device_class = _cuda()
        original = getattr(device_class, name)

        def call(self, *args):
            check, self.stream_check = self.stream_check, None
            try:
                return original(self, *args)
            finally:
                self.stream_check = check

        patch.setattr(device_class, name, call)

    apply.__name__ = f"{name}_unchecked"
    return apply


def _the_cache_trusts_the_gpu(patch):  # the cache's poll (timing) decides the reuse
    device_class = _cuda()
    patch.setattr(device_class, "take_ready", device_class.ready)


def _launch_reads_nothing(patch):
    device_class = _cuda()
    original = device_class.launch

    def launch(self, stream, out=None, *inputs):
        return original(self, stream, out)

    patch.setattr(device_class, "launch", launch)


WIRING = [
    _without("download"),
    _without("sum"),
    _without("wait_stream"),
    _without("record_event"),
    _without("wait_event"),
    _without("event_done"),
    _without("stream_done"),
    _without("synchronize_event"),
    _without("synchronize_stream"),
    _without("synchronize"),
    _without("free"),
    _without("record"),
    _the_cache_trusts_the_gpu,
    _launch_reads_nothing,
]


@pytest.mark.parametrize("mutant", WIRING, ids=[m.__name__.strip("_") for m in WIRING])
def test_teeth_the_simulator_catches_a_miswired_check(monkeypatch, mutant):
    mutant(monkeypatch)
    with pytest.raises(AssertionError):
        run_batch(1, 300)


# -- the knob, end to end, in a child of its own -----------------------------------------------

ABORT_LINE = (
    r"(?m)^devmem cuda: stream check: stream default reads block #1 \(sum\) while stream G's"
    r" write \(full, its kernel 1\) is not waited for$"
)


@pytest.mark.parametrize("value", ["1", "yes"])
def test_the_knob_aborts_with_one_line(death, value):
    env = pinned_env("cuda", DEVMEM_STREAM_CHECK=value)
    death.run(_stream_programs.racy_read_on_cuda, env=env).assert_aborted(ABORT_LINE)


def test_with_stacks_the_abort_gives_both_accesses_frames(death):
    env = pinned_env("cuda", DEVMEM_HISTORY="stacks")  # the check on: pinned_env's default
    outcome = death.run(_stream_programs.racy_read_on_cuda, env=env).assert_aborted(ABORT_LINE)
    stderr = outcome.stderr
    for title in ("stream default's read:", "stream G's write:"):
        after = stderr.split(f"  {title}\n", 1)[1].splitlines()[0]
        assert "_stream_programs.py:" in after and after.endswith("in racy_read_on_cuda"), stderr


@pytest.mark.parametrize("value", [None, "0", ""])
def test_off_the_race_goes_unnoticed(death, value):
    env = pinned_env("cuda", DEVMEM_STREAM_CHECK=value)
    outcome = death.run(_stream_programs.racy_read_on_cuda, env=env).assert_clean()
    assert outcome.returned == {"sum": 16.0}
