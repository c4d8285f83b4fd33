"""The ``cuda`` stream check's rules against the race oracle, in both directions (DESIGN 2.4).

The stream check (:class:`~allocator.device._happens_before.StreamCheck`) is the simulator's
happens-before bookkeeping without the simulator's clock. Here it runs the race oracle's random
programs (:mod:`._race_oracle`: three streams, two blocks, two events, kernels, ``wait_stream``,
host waits, queries, frees with their events, the cache's polls, events recorded, waited for,
queried and synchronized), each query answered true or false at random as a GPU would at some
moment; the oracle decides from the program and those answers alone which kernel first races.
A mutant of each rule is caught. The backend's wiring of the check (which call feeds which rule)
is proven against the simulator in ``test_stream_check_cuda.py``.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import AllocatorConfig, ConfigError, StreamRaceError
from allocator.device import _happens_before as hb
from allocator.device._happens_before import StreamCheck

from . import _race_oracle, _stream_check_oracle
from ._race_oracle import STREAMS
from .test_race_oracle import _op


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    program=st.lists(_op, min_size=1, max_size=24),
    owners=st.tuples(st.integers(0, 2), st.integers(0, 2)),
    bits=st.randoms(use_true_random=False),
)
def test_the_stream_check_agrees_with_the_oracle(program, owners, bits):
    _stream_check_oracle.check(program, owners, lambda: bits.random() < 0.5)


def _batch(seed: int, count: int) -> list[tuple]:
    rng = random.Random(seed)
    return [
        (
            _race_oracle.random_program(rng, rng.randrange(1, 25)),
            (rng.randrange(len(STREAMS)), rng.randrange(len(STREAMS))),
            random.Random(rng.random()),
        )
        for _ in range(count)
    ]


# Programs each rule must get right, besides the random ones (the random ones seldom order a
# pair by an event alone): a write on stream a read by the default stream after waiting for an
# event recorded after it; the same with the event recorded before the write (a race); a block
# freed with record_stream(a) that the host then learns a's use of by synchronizing a.
FIXED = [
    (
        [
            ("kernel", 1, 0, ()),
            ("record_event", 1, 0),
            ("wait_event", 0, 0),
            ("kernel", 0, None, (0,)),
        ],
        (0, 0),
    ),
    (
        [
            ("record_event", 1, 0),
            ("kernel", 1, 0, ()),
            ("wait_event", 0, 0),
            ("kernel", 0, None, (0,)),
        ],
        (0, 0),
    ),
    (
        [
            ("kernel", 1, None, (0,)),
            ("record", 0, (1,)),
            ("sync_stream", 1),
            ("ready", 0),
            ("kernel", 0, 0, ()),
        ],
        (0, 0),
    ),
    ([("kernel", 1, None, (0,)), ("record", 0, (1,)), ("ready", 0), ("kernel", 0, 0, ())], (0, 0)),
]


def test_the_fixed_programs():
    verdicts = [_stream_check_oracle.check(*case, lambda: True) for case in FIXED]
    assert verdicts == [
        None,
        "devmem cuda: stream check: stream default reads block #1 (kernel) while stream a's"
        " write (kernel, its kernel 1) is not waited for",
        None,
        "devmem cuda: stream check: block #1 reused on stream default, which writes it (kernel),"
        " while stream a's read (kernel, its kernel 1) of its previous life is not waited for",
    ]


def _run_batch(seed: int = 1, count: int = 400) -> tuple[int, int, int]:
    racy = reuse = ordered = 0
    for program, owners in FIXED:
        _stream_check_oracle.check(program, owners, lambda: True)
    for program, owners, bits in _batch(seed, count):
        message = _stream_check_oracle.check(program, owners, lambda b=bits: b.random() < 0.5)
        if message is None:
            ordered += 1
        elif " reused " in message:
            reuse += 1
        else:
            racy += 1
    return racy, reuse, ordered


def test_the_random_programs_are_both_racy_and_ordered():
    racy, reuse, ordered = _run_batch()
    assert racy >= 80 and ordered >= 80 and reuse >= 10, (racy, reuse, ordered)


def test_a_verdict_depends_on_the_program_and_its_answers_only():
    # the same program and the same query answers: the same line, every run
    for program, owners, bits in _batch(2, 50):
        state = bits.getstate()
        first = _stream_check_oracle.run(program, owners, lambda b=bits: b.random() < 0.5)
        bits.setstate(state)
        again = _stream_check_oracle.run(program, owners, lambda b=bits: b.random() < 0.5)
        assert first == again


def test_the_lines_name_the_block_both_streams_and_both_ops():
    check = StreamCheck("raise")
    g, d = check.new_clock(), check.new_clock()
    block = _block(7)
    assert check.launch(g, "G", block, (), "full") is None
    line = check.launch(d, "default", None, (block,), "to_numpy")
    assert line == (
        "devmem cuda: stream check: stream default reads block #7 (to_numpy) while stream G's"
        " write (full, its kernel 1) is not waited for"
    )
    check.wait_stream(d, g)
    assert check.launch(d, "default", None, (block,), "sum") is None
    check.record(block, d, [])  # freed without record_stream(G): G's read is not covered
    assert check.launch(g, "G", None, (block,), "add") is None  # the old life, on G
    check.record(block, d, [])
    line = check.launch(d, "default", block, (), "full")
    assert line == (
        "devmem cuda: stream check: block #7 reused on stream default, which writes it (full),"
        " while stream G's read (add, its kernel 2) of its previous life is not waited for"
    )


def test_with_stacks_the_report_gives_both_accesses_frames():
    from allocator import _stacks

    check = StreamCheck("raise", stacks=True)
    g, d = check.new_clock(), check.new_clock()
    block = _block(1)

    def writer():
        return check.launch(g, "G", block, (), "full", _stacks.capture(1))

    def reader():
        return check.launch(d, "default", None, (block,), "sum", _stacks.capture(1))

    assert writer() is None
    report = reader().split("\n")
    assert report[0].startswith("devmem cuda: stream check: stream default reads block #1 (sum)")
    assert report[1] == "  stream default's read:"
    assert report[2].endswith("in reader") and __file__ in report[2]
    title = report.index("  stream G's write:")
    assert report[title + 1].endswith("in writer")


def _block(block_id: int):
    import types

    block = types.SimpleNamespace(id=block_id)
    StreamCheck.reset_block(block)
    return block


def test_the_knob_reads_like_the_detectors():
    def mode(value):
        env = {} if value is None else {"DEVMEM_STREAM_CHECK": value}
        return AllocatorConfig.from_env(env).stream_check

    assert [mode(v) for v in (None, "", "0", "1", "raise", "abort", "yes", "RAISE")] == [
        "off",
        "off",
        "off",
        "abort",
        "raise",
        "abort",
        "abort",
        "abort",
    ]
    with pytest.raises(ValueError, match="stream_check='on': expected one of off, abort, raise"):
        AllocatorConfig(stream_check="on")
    with pytest.raises(ValueError, match="mode='off': expected abort or raise"):
        StreamCheck("off")
    assert issubclass(StreamRaceError, RuntimeError) and not issubclass(
        ConfigError, StreamRaceError
    )


def test_sim_raises_in_raise_mode():
    from allocator import Allocator

    alloc = Allocator(AllocatorConfig(backend="sim", sim_latency_us=10, stream_check="raise"))
    gather = alloc.new_stream("G")
    with alloc.use_stream(gather):
        x = alloc.full(16, 1.0)
    with pytest.raises(StreamRaceError, match=r"^sim: stream default reads block #1 while"):
        alloc.mul(x, x)
    alloc.default_stream.wait_stream(gather)
    assert alloc.sum(alloc.mul(x, x)) == 16.0


# -- a mutant of each rule is caught ---------------------------------------------------------


def _reads_unchecked(patch):
    original = StreamCheck._read

    def read(self, block, name, key, epoch, until, vc):
        writer, block.writer = block.writer, None
        try:
            return original(self, block, name, key, epoch, until, vc)
        finally:
            if block.writer is None:
                block.writer = writer

    patch.setattr(StreamCheck, "_read", read)


def _writes_ignore_reads(patch):
    original = StreamCheck._write

    def write(self, block, name, key, epoch, until, vc):
        block.readers = None
        return original(self, block, name, key, epoch, until, vc)

    patch.setattr(StreamCheck, "_write", write)


def _writes_ignore_writes(patch):
    original = StreamCheck._write

    def write(self, block, name, key, epoch, until, vc):
        block.writer = None
        return original(self, block, name, key, epoch, until, vc)

    patch.setattr(StreamCheck, "_write", write)


def _wait_stream_orders_nothing(patch):
    patch.setattr(StreamCheck, "wait_stream", lambda self, mine, theirs: None)


def _wait_event_orders_nothing(patch):
    patch.setattr(StreamCheck, "wait_mark", lambda self, clock, vc: None)


def _an_event_is_its_streams_clock(patch):  # not a copy: later kernels move the event
    def mark(self, clock):
        return clock.vc

    patch.setattr(StreamCheck, "mark", mark)


def _host_learns_nothing(patch):
    patch.setattr(StreamCheck, "_observe", lambda self, vc: None)


def _device_sync_learns_nothing(patch):
    patch.setattr(StreamCheck, "_observe_all", lambda self: None)


def _block_wait_learns_nothing(patch):
    patch.setattr(StreamCheck, "_observe_block", lambda self, block: None)


def _kernels_ignore_the_host(patch):  # a launch never joins what the host learned
    original = StreamCheck._access

    def access(self, clock, name, out, inputs, until):
        clock.host_seen = self._host_version
        return original(self, clock, name, out, inputs, until)

    patch.setattr(StreamCheck, "_access", access)


def _a_free_starts_no_life(patch):
    original = StreamCheck._record_block

    def record(self, block, own, uses):
        original(self, block, own, uses)
        block.life -= 1

    patch.setattr(StreamCheck, "_record_block", record)


def _the_cache_trusts_its_poll(patch):  # the cache's query orders nothing but says true
    def take_ready(self, block):
        block.use_clock = None
        return True

    patch.setattr(StreamCheck, "take_ready", take_ready)


def _join_keeps_the_lower(patch):
    def join(into, other):
        for key, epoch in other.items():
            into.setdefault(key, epoch)
        return True

    patch.setattr(hb, "join", join)


MUTANTS = [
    _reads_unchecked,
    _writes_ignore_reads,
    _writes_ignore_writes,
    _wait_stream_orders_nothing,
    _wait_event_orders_nothing,
    _an_event_is_its_streams_clock,
    _host_learns_nothing,
    _device_sync_learns_nothing,
    _block_wait_learns_nothing,
    _kernels_ignore_the_host,
    _a_free_starts_no_life,
    _the_cache_trusts_its_poll,
    _join_keeps_the_lower,
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.__name__.strip("_") for m in MUTANTS])
def test_teeth_the_oracle_catches_a_broken_rule(monkeypatch, mutant):
    mutant(monkeypatch)
    with pytest.raises(AssertionError):
        _run_batch(1, 400)


def test_the_suites_allocators_check_streams(make_alloc, backend, pin):
    # make_alloc and pinned children run every cuda item with the stream check aborting, as
    # every sim item runs with a latency: a racy test cannot pass on either by luck
    alloc = make_alloc()
    if backend == "cuda":
        assert alloc.device.stream_check.mode == "abort"
        assert pin()["DEVMEM_STREAM_CHECK"] == "1"
    elif backend == "sim":
        assert alloc.device.tracks_launches and alloc.device.latency_us > 0
        assert pin()["DEVMEM_STREAM_CHECK"] is None


def test_sim_and_the_cuda_check_share_one_implementation_of_the_rules():
    from allocator.device.sim import SimDevice

    for rule in ("_access", "_write", "_read", "_observe", "_observe_all", "_record_block"):
        assert getattr(SimDevice, rule) is getattr(hb.HappensBefore, rule), rule
        assert getattr(StreamCheck, rule) is getattr(hb.HappensBefore, rule), rule
    assert "_write" not in vars(SimDevice) and "_read" not in vars(StreamCheck)
