"""The simulator's race check against a brute-force happens-before oracle (DESIGN 2.4).

Random programs of three streams, two blocks and two events (kernels that write and read the
blocks, ``wait_stream``, host waits, queries, time passing, frees with their events, the cache's
event polls, events recorded, waited for by streams, queried and synchronized) run on the
simulator with its ``fatal`` patched to raise; :mod:`._race_oracle` decides independently, from
the program and the answers its queries got, which kernel first races. In both directions: the
simulator is silent on every ordered program and aborts every unordered conflicting pair, at the
kernel the oracle names, with a line naming a racing partner.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.device import sim as sim_module

from . import _race_oracle
from ._race_oracle import BLOCKS, EVENTS, STREAMS, Raced

_stream = st.integers(0, len(STREAMS) - 1)
_block = st.integers(0, BLOCKS - 1)
_event = st.integers(0, EVENTS - 1)
_op = st.one_of(
    st.tuples(
        st.just("kernel"),
        _stream,
        st.one_of(st.none(), _block),
        st.lists(_block, max_size=2, unique=True).map(tuple),
    ).filter(lambda op: op[2] is not None or op[3]),
    st.tuples(st.just("wait_stream"), _stream, _stream),
    st.tuples(st.sampled_from(["sync_stream", "query"]), _stream),
    st.tuples(st.just("sync_device")),
    st.tuples(st.just("advance"), st.integers(1, 40)),
    st.tuples(st.just("record"), _block, st.lists(_stream, max_size=2, unique=True).map(tuple)),
    st.tuples(st.sampled_from(["ready", "peek", "wait"]), _block),
    st.tuples(st.sampled_from(["record_event", "wait_event"]), _stream, _event),
    st.tuples(st.sampled_from(["event_sync", "event_query"]), _event),
)


@pytest.fixture
def raising(monkeypatch):
    def fatal(message: str) -> None:
        raise Raced(message)

    monkeypatch.setattr(sim_module, "fatal", fatal)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    program=st.lists(_op, min_size=1, max_size=24),
    latency=st.integers(1, 30),
    owners=st.tuples(_stream, _stream),
)
def test_the_race_check_agrees_with_the_oracle(program, latency, owners):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sim_module, "fatal", _raise)
        _race_oracle.check(program, latency, owners)


def _raise(message: str) -> None:
    raise Raced(message)


def _batch(seed: int, count: int) -> list[tuple]:
    rng = random.Random(seed)
    return [
        (
            _race_oracle.random_program(rng, rng.randrange(1, 25)),
            rng.randrange(1, 31),
            (rng.randrange(len(STREAMS)), rng.randrange(len(STREAMS))),
        )
        for _ in range(count)
    ]


def test_the_random_programs_are_both_racy_and_ordered(raising):
    # the oracle's two directions are both exercised: a fair share of each kind of verdict
    racy = reuse = ordered = 0
    for program, latency, owners in _batch(1, 400):
        message = _race_oracle.check(program, latency, owners)
        if message is None:
            ordered += 1
        elif "reused" in message:
            reuse += 1
        else:
            racy += 1
    assert racy >= 80 and ordered >= 80 and reuse >= 10, (racy, reuse, ordered)


def _reads_unchecked(monkeypatch) -> None:  # misses a read of an unwaited write
    original = sim_module.SimDevice._read

    def read(self, block, name, key, epoch, done, vc):
        writer, block.writer = block.writer, None
        try:
            return original(self, block, name, key, epoch, done, vc)
        finally:
            block.writer = writer

    monkeypatch.setattr(sim_module.SimDevice, "_read", read)


def _wait_stream_orders_nothing(monkeypatch) -> None:  # aborts ordered programs
    def wait_stream(self, stream, other):
        stream.handle.tail_us = max(stream.handle.tail_us, other.handle.tail_us)

    monkeypatch.setattr(sim_module.SimDevice, "wait_stream", wait_stream)


def _host_learns_nothing(monkeypatch) -> None:  # aborts programs a host wait orders
    monkeypatch.setattr(sim_module.SimDevice, "_observe", lambda self, vc: None)


def _a_look_orders(monkeypatch) -> None:  # a snapshot's look would change the verdict
    def ready(self, block):
        events = block.use_events
        done = not events or all(t <= self.now_us for t in events.values())
        if done and block.use_clock:
            self._observe(block.use_clock)
        return done

    monkeypatch.setattr(sim_module.SimDevice, "ready", ready)


def _timing_decides(monkeypatch) -> None:  # the old rule: a kernel completed in time is ordered
    original = sim_module.SimDevice.launch
    join = sim_module._join

    def launch(self, stream, out=None, *inputs):
        start = max(self.now_us, stream.handle.tail_us)
        for block in (out, *inputs):
            for access in () if block is None else (block.writer, *(block.readers or {}).values()):
                if access is not None and access[2] <= start:
                    join(stream.handle.vc, {access[0]: access[1]})
        return original(self, stream, out, *inputs)

    monkeypatch.setattr(sim_module.SimDevice, "launch", launch)


# Programs that each direction of the check must get right, besides the random ones: a race
# that only a snapshot's look at a freed block's events could hide (it orders nothing), the
# same program ordered by the reuse cache's query of those events, and a host wait for a freed
# block's own event ordering what its stream wrote before.
FIXED = [
    (
        [
            ("kernel", 1, 0, ()),  # stream a writes block #1
            ("record", 1, (1,)),  # block #2 (the default stream's) freed, recorded on a
            ("advance", 50),
            ("peek", 1),
            ("kernel", 0, None, (0,)),  # the default stream reads block #1
        ],
        10,
        (0, 0),
    ),
    (
        [
            ("kernel", 1, 0, ()),  # stream a writes block #1
            ("record", 1, (1,)),  # block #2 (the default stream's) freed, recorded on a
            ("advance", 50),
            ("ready", 1),
            ("kernel", 0, None, (0,)),  # the default stream reads block #1
        ],
        10,
        (0, 0),
    ),
    (
        [
            ("kernel", 1, 1, ()),  # stream a writes block #2
            ("record", 0, ()),  # block #1 (stream a's) freed: its event follows that write
            ("wait", 0),  # the host waits for block #1's event
            ("kernel", 0, None, (1,)),  # so the default stream's read of block #2 is ordered
        ],
        10,
        (1, 0),
    ),
]


def test_the_fixed_programs(raising):
    verdicts = [_race_oracle.check(*case) for case in FIXED]
    assert verdicts == [
        "sim: stream default reads block #1 while stream a's write (until t=10) is not waited for",
        None,
        None,
    ]


@pytest.mark.parametrize(
    "mutant",
    [
        _reads_unchecked,
        _wait_stream_orders_nothing,
        _host_learns_nothing,
        _timing_decides,
        _a_look_orders,
    ],
)
def test_teeth_the_oracle_catches_a_broken_race_check(raising, monkeypatch, mutant):
    mutant(monkeypatch)
    with pytest.raises(AssertionError):
        for program, latency, owners in FIXED + _batch(1, 400):
            _race_oracle.check(program, latency, owners)
