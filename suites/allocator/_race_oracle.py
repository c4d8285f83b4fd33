"""A brute-force happens-before oracle for the simulator's race check (no pytest import).

A *program* is a list of operations on a :class:`~allocator.device.SimDevice` with a few streams
and blocks (:func:`run` lists them). :func:`run` executes it on the simulator, whose ``fatal``
the caller has patched to raise :class:`Raced`, and records what each operation returned.
:func:`verdict` then decides, from the program and those results alone, which kernel is the
first that races, by building the happens-before graph CUDA's rules give and searching it
(depth-first, for every pair of accesses): no vector clocks, nothing shared with the simulator.

The graph's edges: kernels of one stream in issue order; ``wait_stream(s, t)`` from every kernel
queued on ``t`` so far to every kernel queued on ``s`` later; a host wait (a stream's or the
device's ``synchronize``, a query that returned true, a block's ``wait``, a block whose recorded
events the reuse cache found ready (``take_ready``; a snapshot's ``ready`` looks without
ordering anything), an event's ``synchronize`` or true ``query``) from every kernel it
waited for to every kernel launched later, on any stream; ``s.wait_event(e)`` from every kernel
queued on ``e``'s stream before its last record to every kernel queued on ``s`` later (nothing
for an event never recorded). Two accesses of one block conflict when one of them writes; a
kernel races when one of its accesses conflicts with an earlier kernel's access that no path
leads from.
"""

from __future__ import annotations

import dataclasses
import random
import re

from allocator.device import SimDevice
from allocator.device.stream import Event

STREAMS = ("default", "a", "b")
BLOCKS = 2
EVENTS = 2


class Raced(Exception):
    """The simulator's fatal line, raised instead of aborting."""


@dataclasses.dataclass
class Kernel:
    op: int  # index of its operation in the program
    stream: int
    writes: tuple[int, ...]
    reads: tuple[int, ...]
    lives: dict[int, int]  # block -> its life when the kernel ran


def random_program(rng: random.Random, length: int) -> list[tuple]:
    """A random program of ``length`` operations (the same shapes the hypothesis strategy
    draws)."""
    ops = []
    for _ in range(length):
        kind = rng.choice(
            ["kernel"] * 6
            + ["wait_stream"] * 2
            + ["sync_stream", "sync_device", "query"]
            + ["advance", "record", "ready", "peek", "wait"]
            + ["record_event", "wait_event", "event_sync", "event_query"]
        )
        s, t = rng.randrange(len(STREAMS)), rng.randrange(len(STREAMS))
        b = rng.randrange(BLOCKS)
        if kind == "kernel":
            out = rng.choice([None, *range(BLOCKS)])
            inputs = tuple(sorted({rng.randrange(BLOCKS) for _ in range(rng.randrange(3))}))
            if out is None and not inputs:
                inputs = (b,)
            ops.append(("kernel", s, out, inputs))
        elif kind == "wait_stream":
            ops.append(("wait_stream", s, t))
        elif kind in ("sync_stream", "query"):
            ops.append((kind, s))
        elif kind == "sync_device":
            ops.append((kind,))
        elif kind == "advance":
            ops.append((kind, rng.randrange(1, 40)))
        elif kind == "record":
            uses = tuple(sorted({rng.randrange(len(STREAMS)) for _ in range(rng.randrange(3))}))
            ops.append((kind, b, uses))
        elif kind in ("record_event", "wait_event"):
            ops.append((kind, s, rng.randrange(EVENTS)))
        elif kind in ("event_sync", "event_query"):
            ops.append((kind, rng.randrange(EVENTS)))
        else:
            ops.append((kind, b))
    return ops


def run(program: list[tuple], latency: int, owners: tuple[int, ...]) -> tuple[list, str | None]:
    """Execute ``program`` on a fresh simulator (kernels of ``latency`` us; block ``i``
    belongs to stream ``owners[i]``).

    Returns:
        ``(results, message)``: what each operation executed returned (a query's and a
        ``ready``'s bool, else ``None``), up to and including the one that raised; and the
        fatal line it raised, or ``None`` if the program ran to its end.
    """
    sim = SimDevice(1 << 20, latency_us=latency)
    streams = [sim.new_stream(default=True), *(sim.new_stream(n) for n in STREAMS[1:])]
    blocks = []
    for owner in owners:
        block = sim.malloc(64)
        block.stream = streams[owner]
        blocks.append(block)
    events = [Event(sim) for _ in range(EVENTS)]
    results: list = []
    for op in program:
        kind = op[0]
        result = None
        try:
            if kind == "kernel":
                _, s, out, inputs = op
                sim.launch(
                    streams[s], None if out is None else blocks[out], *[blocks[i] for i in inputs]
                )
            elif kind == "wait_stream":
                streams[op[1]].wait_stream(streams[op[2]])
            elif kind == "sync_stream":
                streams[op[1]].synchronize()
            elif kind == "sync_device":
                sim.synchronize()
            elif kind == "query":
                result = streams[op[1]].query()
            elif kind == "advance":
                sim.advance(op[1])
            elif kind == "record":
                block = blocks[op[1]]
                others = {streams[u] for u in op[2]} - {block.stream}
                block.stream_uses = others or None
                sim.record(block)
            elif kind == "ready":  # the reuse cache's query before it reuses the block
                result = sim.take_ready(blocks[op[1]])
            elif kind == "peek":  # a snapshot's or a history's look: orders nothing
                result = sim.ready(blocks[op[1]])
            elif kind == "wait":
                sim.wait(blocks[op[1]])
            elif kind == "record_event":
                streams[op[1]].record_event(events[op[2]])
            elif kind == "wait_event":
                streams[op[1]].wait_event(events[op[2]])
            elif kind == "event_sync":
                events[op[1]].synchronize()
            elif kind == "event_query":
                result = events[op[1]].query()
        except Raced as exc:
            results.append(None)
            return results, str(exc)
        results.append(result)
    return results, None


def verdict(program: list[tuple], results: list, owners: tuple[int, ...]) -> tuple[int, set]:
    """The oracle: the index of the first operation whose kernel races (or -1), and the fatal
    lines the simulator may print for it (one per racing access and partner)."""
    kernels: list[Kernel] = []
    edges: dict[object, set] = {}  # node -> successors; a node is a kernel index or a tuple

    def edge(a, b) -> None:
        edges.setdefault(a, set()).add(b)

    later: list[object] = []  # host-wait nodes: each has an edge to every later kernel
    waits: list[tuple[object, int]] = []  # (wait_stream node, the stream that waits)
    lives = [0] * BLOCKS
    recorded: dict[int, tuple[object, list]] = {}  # block -> (own event node, use event nodes)
    marks: dict[int, object] = {}  # user event -> its node at its last record

    def event(op: int, streams: set[int], tag: str) -> object:
        node = (tag, op, tuple(sorted(streams)))
        for j, kernel in enumerate(kernels):
            if kernel.stream in streams:
                edge(j, node)
        return node

    for i, op in enumerate(program[: len(results)]):
        kind = op[0]
        if kind == "kernel":
            _, s, out, inputs = op
            k = len(kernels)
            kernels.append(
                Kernel(i, s, () if out is None else (out,), inputs, dict(enumerate(lives)))
            )
            for j in range(k):
                if kernels[j].stream == s:
                    edge(j, k)
            for node in later:
                edge(node, k)
            for node, stream in waits:
                if stream == s:
                    edge(node, k)
            race = _races(kernels, k, edges, owners)
            if race:
                return i, race
        elif kind == "wait_stream":
            waits.append((event(i, {op[2]}, "wait_stream"), op[1]))
        elif kind == "sync_stream" or (kind == "query" and results[i]):
            later.append(event(i, {op[1]}, "host"))
        elif kind == "sync_device":
            later.append(event(i, set(range(len(STREAMS))), "host"))
        elif kind == "record":
            b = op[1]
            own = owners[b]
            uses = [event(i, {u}, "use") for u in op[2] if u != own]
            recorded[b] = (event(i, {own}, "own"), uses)
            lives[b] += 1
        elif kind == "ready" and results[i] and op[1] in recorded:
            later.extend(recorded[op[1]][1])
        elif kind == "wait" and op[1] in recorded:
            own, uses = recorded[op[1]]
            later.extend((own, *uses))
        elif kind == "record_event":
            marks[op[2]] = event(i, {op[1]}, "mark")
        elif kind == "wait_event" and op[2] in marks:
            waits.append((marks[op[2]], op[1]))
        elif (kind == "event_sync" or (kind == "event_query" and results[i])) and op[1] in marks:
            later.append(marks[op[1]])
    return -1, set()


def _reaches(edges: dict, start: object, goal: object) -> bool:
    seen, todo = {start}, [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        for nxt in edges.get(node, ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def _races(kernels: list[Kernel], k: int, edges: dict, owners: tuple[int, ...]) -> set[str]:
    """The fatal lines that kernel ``k``'s racing accesses may print (empty: no race)."""
    mine = kernels[k]
    lines = set()
    accesses = [(b, True) for b in mine.writes] + [(b, False) for b in mine.reads]
    for j in range(k):
        other = kernels[j]
        theirs = [(b, True) for b in other.writes] + [(b, False) for b in other.reads]
        for b, writes in accesses:
            for ob, other_writes in theirs:
                if ob != b or not (writes or other_writes) or _reaches(edges, j, k):
                    continue
                name, other_name = STREAMS[mine.stream], STREAMS[other.stream]
                if other.lives[b] < mine.lives[b]:
                    lines.add(
                        f"sim: block #{b + 1} reused on stream {name} while stream {other_name}'s"
                    )
                else:
                    verb = "writes" if writes else "reads"
                    theirs_kind = "write" if other_writes else "read"
                    lines.add(
                        f"sim: stream {name} {verb} block #{b + 1} while stream {other_name}'s"
                        f" {theirs_kind}"
                    )
    return lines


LINE = re.compile(
    r"^(?P<head>sim: (?:block #\d+ reused on stream \S+ while stream \S+'s|stream \S+ (?:reads|"
    r"writes) block #\d+ while stream \S+'s (?:read|write)))"
    r"(?: kernel is in flight \(until t=\d+\)| \(until t=\d+\) is not waited for)$"
)


def head(message: str) -> str:
    """The part of a fatal line :func:`verdict` predicts (all but the completion time)."""
    match = LINE.match(message)
    if match is None:
        raise AssertionError(f"not a race line: {message!r}")
    return match["head"]


def check(program: list[tuple], latency: int, owners: tuple[int, ...]) -> str | None:
    """Run ``program`` and compare the simulator's verdict with the oracle's.

    Returns:
        The simulator's fatal line, or ``None`` if it ran the program to its end.

    Raises:
        AssertionError: they differ: the simulator aborted a program the oracle finds ordered
            (or at another operation, or with a line the oracle does not predict), or it
            missed a race.
    """
    results, message = run(program, latency, owners)
    first, lines = verdict(program, results, owners)
    if message is None:
        assert first == -1, f"missed race at op {first}: {program[first]} ({sorted(lines)})"
        return None
    at = len(results) - 1
    assert first == at, f"aborted at op {at} {program[at]}, oracle says {first}: {message}"
    assert head(message) in lines, f"{message!r} not among {sorted(lines)}"
    return message
