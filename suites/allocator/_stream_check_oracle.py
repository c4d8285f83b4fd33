"""The ``cuda`` stream check (:class:`~allocator.device._happens_before.StreamCheck`) run on the
race oracle's programs (no pytest import).

:func:`run` executes a program of :mod:`._race_oracle` on a bare ``StreamCheck`` (the calls the
``cuda`` backend makes for each operation, with no device under it), answering each query from
``answers`` as a GPU would at some moment; :func:`check` compares its verdict with the oracle's
(:func:`._race_oracle.verdict`, which decides from the program and the answers alone).
:func:`sim_head` words a stream-check line as the simulator's, so that the oracle's predicted
lines apply to both.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable

from allocator.device._happens_before import StreamCheck, StreamRaceError

from . import _race_oracle
from ._race_oracle import STREAMS

CUDA_LINE = re.compile(
    r"^devmem cuda: stream check: (?:"
    r"stream (?P<s>\S+) (?P<verb>reads|writes) block #(?P<n>\d+) \(\w+\) while stream (?P<w>\S+)'s"
    r" (?P<kind>read|write) \(\w+, its kernel \d+\) is not waited for"
    r"|block #(?P<rn>\d+) reused on stream (?P<rs>\S+), which (?:reads|writes) it \(\w+\), while"
    r" stream (?P<rw>\S+)'s (?:read|write) \(\w+, its kernel \d+\) of its previous life is not"
    r" waited for)$"
)


def sim_head(line: str) -> str:
    """The stream check's ``line`` (its first line) as the head of the simulator's line.

    Raises:
        AssertionError: ``line`` is not a stream-check line.
    """
    match = CUDA_LINE.match(line.split("\n", 1)[0])
    assert match is not None, f"not a stream-check line: {line!r}"
    if match["rn"] is not None:
        return (
            f"sim: block #{match['rn']} reused on stream {match['rs']} while stream {match['rw']}'s"
        )
    return (
        f"sim: stream {match['s']} {match['verb']} block #{match['n']} while stream"
        f" {match['w']}'s {match['kind']}"
    )


def run(
    program: list[tuple],
    owners: tuple[int, ...],
    answers: Callable[[], bool],
    check: StreamCheck | None = None,
) -> tuple[list, str | None]:
    """Execute ``program`` on a fresh :class:`StreamCheck` in raise mode (block ``i`` belongs to
    stream ``owners[i]``); each stream or event query gets ``answers()``.

    Returns:
        As :func:`._race_oracle.run`: what each operation returned, and the race's line or
        ``None``.
    """
    check = StreamCheck("raise") if check is None else check
    clocks = [check.new_clock() for _ in STREAMS]
    blocks = []
    for i in range(len(owners)):
        block = types.SimpleNamespace(id=i + 1)
        StreamCheck.reset_block(block)
        blocks.append(block)
    marks: dict[int, dict] = {}
    results: list = []
    for op in program:
        kind = op[0]
        result = None
        if kind == "kernel":
            _, s, out, inputs = op
            message = check.launch(
                clocks[s],
                STREAMS[s],
                None if out is None else blocks[out],
                [blocks[i] for i in inputs],
                "kernel",
            )
            if message is not None:
                results.append(None)
                return results, message
        elif kind == "wait_stream":
            if op[1] != op[2]:
                check.wait_stream(clocks[op[1]], clocks[op[2]])
        elif kind == "sync_stream":
            check.observe(clocks[op[1]].vc)
        elif kind == "sync_device":
            check.synchronize()
        elif kind == "query":
            result = answers()
            if result:
                check.observe(clocks[op[1]].vc)
        elif kind == "record":
            b = op[1]
            uses = sorted(set(op[2]) - {owners[b]})
            check.record(blocks[b], clocks[owners[b]], [clocks[u] for u in uses])
        elif kind == "ready":
            result = check.take_ready(blocks[op[1]])
        elif kind == "wait":
            check.wait(blocks[op[1]])
        elif kind == "record_event":
            marks[op[2]] = check.mark(clocks[op[1]])
        elif kind == "wait_event":
            if op[2] in marks:
                check.wait_mark(clocks[op[1]], marks[op[2]])
        elif kind == "event_sync":
            if op[1] in marks:
                check.observe(marks[op[1]])
        elif kind == "event_query":
            result = True
            if op[1] in marks:
                result = answers()
                if result:
                    check.observe(marks[op[1]])
        results.append(result)  # advance and peek: no call (time orders nothing)
    return results, None


def check(program: list[tuple], owners: tuple[int, ...], answers: Callable[[], bool]) -> str | None:
    """Run ``program`` on the stream check and compare its verdict with the oracle's.

    Returns:
        The stream check's line, or ``None`` if it ran the program to its end.

    Raises:
        AssertionError: they differ (a missed race, a race the oracle finds ordered, another
            operation, or a line the oracle does not predict).
    """
    try:
        results, message = run(program, owners, answers)
    except StreamRaceError as exc:  # run uses launch's return value; raise mode is the backend's
        raise AssertionError(f"raised from the check itself: {exc}") from None
    first, lines = _race_oracle.verdict(program, results, owners)
    if message is None:
        assert first == -1, f"missed race at op {first}: {program[first]} ({sorted(lines)})"
        return None
    at = len(results) - 1
    assert first == at, f"raced at op {at} {program[at]}, oracle says {first}: {message}"
    assert sim_head(message) in lines, f"{message!r} not among {sorted(lines)}"
    return message
