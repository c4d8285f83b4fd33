"""Random stream programs through the allocator's API, for the sim-vs-cuda differential of the
race check (no pytest import).

A *program* is a list of operations on an allocator with ``streams`` streams (the default one
and ``s1``...), :data:`SLOTS` buffer slots and :data:`EVENTS` events: fills, copies and adds
on a stream (a kernel writing a new buffer and reading its operands; a *borrow* is a copy on
another stream after it waited for the operand's), views, readbacks (``sum``, ``to_numpy``),
``release``, dropping a slot (a free by the finalizer, drained at the next call), *recycling*
one (dropped, then a fill of its size on its stream), ``record_stream``, ``wait_stream``, a
stream's, an event's and the device's synchronize, stream and event queries (once, or polled
until true), events recorded and waited for, ``empty_cache``.

:func:`run` executes one on an allocator whose race check raises
(:class:`~allocator.StreamRaceError`) and returns its verdict: the index of the operation that
raised and the line's head in the simulator's words, or ``None``. Queries are answered from
``answers`` where given (the ``cuda`` side gets the answers the simulator's queries got, see
:func:`script_answers`), and every answer, the reuse cache's polls included, is logged.
"""

from __future__ import annotations

import collections
import random

from allocator import Allocator, StreamRaceError

from . import _race_oracle, _stream_check_oracle

SLOTS = 4
EVENTS = 2
SIZES = (4, 8)  # elements: two sizes, so that the reuse cache hands blocks back
KINDS = (
    ["full"] * 4
    + ["copy"] * 4
    + ["add"] * 2
    + ["view", "sum", "read", "read", "release", "drop", "drop", "record_stream", "record_stream"]
    + ["wait_stream"] * 2
    + ["borrow"] * 3
    + ["recycle"] * 2
    + ["sync_stream", "sync_device", "query", "event_query", "event_sync", "poll", "event_poll"]
    + ["record_event", "record_event", "wait_event", "wait_event", "empty_cache"]
)


def random_program(rng: random.Random, streams: int, length: int) -> list[tuple]:
    """A random program of ``length`` operations over ``streams`` streams."""
    ops = []
    for _ in range(length):
        kind = rng.choice(KINDS)
        s, t = rng.randrange(streams), rng.randrange(streams)
        a, b, c = (rng.randrange(SLOTS) for _ in range(3))
        e = rng.randrange(EVENTS)
        if kind == "full":
            ops.append((kind, s, a, rng.choice(SIZES)))
        elif kind in ("copy", "borrow"):
            ops.append((kind, s, a, b))
        elif kind == "add":
            ops.append((kind, s, a, b, c))
        elif kind == "view":
            ops.append((kind, a, b))
        elif kind in ("sum", "read"):
            ops.append((kind, s, a))
        elif kind in ("release", "drop", "recycle"):
            ops.append((kind, a))
        elif kind == "record_stream":
            ops.append((kind, a, s))
        elif kind == "wait_stream":
            ops.append((kind, s, t))
        elif kind in ("sync_stream", "query", "poll"):
            ops.append((kind, s))
        elif kind in ("event_query", "event_sync", "event_poll"):
            ops.append((kind, e))
        elif kind in ("record_event", "wait_event"):
            ops.append((kind, s, e))
        else:
            ops.append((kind,))
    return ops


def head(line: str) -> str:
    """A race line of either backend (the first line) as the simulator's line's head."""
    first = line.split("\n", 1)[0]
    if first.startswith("sim: "):
        return _race_oracle.head(first)
    return _stream_check_oracle.sim_head(first)


class Log:
    """What a run's queries and the reuse cache's polls answered, in order."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, str, bool]] = []  # (operation index, what, answer)
        self.at = 0  # the operation running


def run(
    alloc: Allocator, program: list[tuple], streams: int, answers: collections.deque | None = None
) -> tuple[tuple[int, str] | None, Log]:
    """Execute ``program`` on ``alloc`` (its race check in raise mode).

    Args:
        answers: where given, each stream or event query's answer is taken from it (the
            caller makes the backend return it, :func:`script_answers`); else the backend's.

    Returns:
        ``(verdict, log)``: ``(index, head)`` of the operation that raised, or ``None``; and
        the log of answers (queries, and ``take_ready``: the cache's polls).
    """
    log = Log()
    device = alloc.device
    take_ready = device.take_ready

    def logged_take_ready(block) -> bool:
        ready = take_ready(block)
        log.answers.append((log.at, "take_ready", ready))
        return ready

    device.take_ready = logged_take_ready  # the cache looks it up at each poll
    names = ["default", *(f"s{i}" for i in range(1, streams))]
    lanes = [alloc.default_stream, *(alloc.new_stream(n) for n in names[1:])]
    events = [alloc.new_event() for _ in range(EVENTS)]
    bufs: list = [None] * SLOTS
    owners = [0] * SLOTS  # the stream each slot's buffer was made on
    for i, op in enumerate(program):
        kind = op[0]
        log.at = i
        try:
            if kind == "full":
                with alloc.use_stream(lanes[op[1]]):
                    bufs[op[2]] = alloc.full(op[3], float(i))
                owners[op[2]] = op[1]
            elif kind in ("copy", "borrow") and bufs[op[3]] is not None:
                if kind == "borrow":  # an ordered use on another stream (a reuse race's start)
                    lanes[op[1]].wait_stream(lanes[owners[op[3]]])
                with alloc.use_stream(lanes[op[1]]):
                    bufs[op[2]] = alloc.copy(bufs[op[3]])
                owners[op[2]] = op[1]
            elif kind == "add" and _same_size(bufs[op[3]], bufs[op[4]]):
                with alloc.use_stream(lanes[op[1]]):
                    bufs[op[2]] = alloc.add(bufs[op[3]], bufs[op[4]])
                owners[op[2]] = op[1]
            elif kind == "view" and bufs[op[2]] is not None and bufs[op[2]].size > 1:
                src = bufs[op[2]]
                bufs[op[1]] = src.view(src.size // 2, src.size - src.size // 2)
                owners[op[1]] = owners[op[2]]
            elif kind in ("sum", "read") and bufs[op[2]] is not None:
                with alloc.use_stream(lanes[op[1]]):
                    (alloc.sum if kind == "sum" else alloc.to_numpy)(bufs[op[2]])
            elif kind == "release" and bufs[op[1]] is not None:
                storage = bufs[op[1]]._st
                alloc.release(bufs[op[1]])
                bufs = [None if b is not None and b._st is storage else b for b in bufs]
            elif kind == "drop":
                bufs[op[1]] = None
            elif kind == "recycle" and bufs[op[1]] is not None:
                # drop it and fill one of its size on its stream: its block, if it was the
                # last reference, comes back at once (a reuse race's end)
                size, bufs[op[1]] = bufs[op[1]].size, None
                with alloc.use_stream(lanes[owners[op[1]]]):
                    bufs[op[1]] = alloc.full(size, float(i))
            elif kind == "record_stream" and bufs[op[1]] is not None:
                bufs[op[1]].record_stream(lanes[op[2]])
            elif kind == "wait_stream":
                lanes[op[1]].wait_stream(lanes[op[2]])
            elif kind == "sync_stream":
                lanes[op[1]].synchronize()
            elif kind == "sync_device":
                device.synchronize()
            elif kind == "query":
                log.answers.append((i, "query", _ask(lanes[op[1]].query, answers)))
            elif kind == "event_query":
                event = events[op[1]]
                if event.recorded:  # one never recorded is complete: the device is not asked
                    log.answers.append((i, "event_query", _ask(event.query, answers)))
            elif kind == "poll":  # until true: the host learns that the stream completed
                while not _ask(lanes[op[1]].query, answers):
                    log.answers.append((i, "query", False))
                log.answers.append((i, "query", True))
            elif kind == "event_poll" and events[op[1]].recorded:
                while not _ask(events[op[1]].query, answers):
                    log.answers.append((i, "event_query", False))
                log.answers.append((i, "event_query", True))
            elif kind == "event_sync":
                events[op[1]].synchronize()
            elif kind == "record_event":
                lanes[op[1]].record_event(events[op[2]])
            elif kind == "wait_event":
                lanes[op[1]].wait_event(events[op[2]])
            elif kind == "empty_cache":
                alloc.empty_cache()
        except StreamRaceError as exc:
            return (i, head(str(exc))), log
    return None, log


def _same_size(a, b) -> bool:
    return a is not None and b is not None and a.size == b.size


def _ask(query, answers: collections.deque | None) -> bool:
    """``query()``; with ``answers``, the backend is to answer the next one of them."""
    if answers is None:
        return query()
    expected = answers[0] if answers else None
    got = query()
    assert expected is None or got == expected, "the scripted answer did not reach the query"
    return got


def script_answers(cupy, answers: collections.deque) -> None:
    """Make the fake CuPy's stream and event ``done`` answer from ``answers`` (left first),
    and true once it is empty, as a GPU would answer at some moment; the backend then calls
    nothing else that asks (with the stream check on, the cache does not poll events)."""
    for cls in (cupy.cuda.Stream, cupy.cuda.Event):

        def done(self) -> bool:
            return answers.popleft() if answers else True  # at last, everything completes

        cls.done = property(done)


def queries_of(log: Log) -> collections.deque:
    """The answers ``log``'s stream and event queries that asked the device got, in order."""
    return collections.deque(ok for _, what, ok in log.answers if what != "take_ready")


def comparable(program: list[tuple], runs: list[tuple]) -> bool:
    """Whether the runs ``(verdict, log)`` got the same answers up to the first operation
    at which one of them stopped (raised, or the program's end)."""
    stop = min(len(program) if verdict is None else verdict[0] for verdict, _ in runs)
    seen = [[entry for entry in log.answers if entry[0] <= stop] for _, log in runs]
    return all(answers == seen[0] for answers in seen)


def racy_read_on_cuda() -> dict:
    """Death-test target: on ``cuda`` over the fake CuPy (its own check off), with the
    allocator configured from the environment (``DEVMEM_STREAM_CHECK``, ``DEVMEM_HISTORY``), read
    on the default stream a buffer stream G fills, without waiting for G. Returns what it read
    if nothing stopped it."""
    from . import _fake_cupy

    _fake_cupy.install(race_check=False)
    alloc = Allocator()
    gather = alloc.new_stream("G")
    with alloc.use_stream(gather):
        x = alloc.full(16, 1.0)
    return {"sum": alloc.sum(x)}
