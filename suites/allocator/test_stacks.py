"""The memory history's stacks alone: captured as code objects and offsets, turned into files,
lines and names only when a snapshot asks, without the allocator's own frames."""

from __future__ import annotations

import inspect

from allocator import _stacks
from allocator._stacks import FINALIZED, FINALIZED_MARK, FrameCache, capture, frame_dicts, frames_of


def here() -> tuple[tuple, int]:
    """A captured stack whose first frame is this function, and the line that captured it."""
    return capture(1), inspect.currentframe().f_lineno


def codes(stack: tuple) -> list:
    """The stack's code objects, without those of skipped files (mutmut's trampolines, when the
    suites run under it)."""
    return [
        code for code in stack[::2] if not code.co_filename.startswith(_stacks.SKIPPED_PREFIXES)
    ]


def test_capture_starts_at_its_caller_and_resolves_to_its_line():
    stack, line = here()
    assert codes(stack)[:2] == [
        here.__code__,
        test_capture_starts_at_its_caller_and_resolves_to_its_line.__code__,
    ]
    assert all(isinstance(lasti, int) for lasti in stack[1::2])
    first, second = frames_of(stack, FrameCache())[:2]
    assert first == (__file__, line, "here")
    assert second[0] == __file__ and second[2] == inspect.currentframe().f_code.co_name


def test_every_offset_resolves_to_the_line_of_its_range():
    def spread():
        a = 1
        b = a + 1
        return b

    code = spread.__code__
    ranges = [(start, end, line) for start, end, line in code.co_lines() if line is not None]
    assert len({line for _, _, line in ranges}) >= 3
    for start, end, line in ranges:
        assert _stacks._line(code, start) == line  # the first offset of a range
        assert _stacks._line(code, end - 2) == line  # its last instruction
    last = max(end for _, end, _ in ranges)
    assert _stacks._line(code, last) == code.co_firstlineno  # past the code: its first line


def test_the_allocators_frames_and_the_skipped_prefixes_are_left_out(monkeypatch):
    stack, _ = here()
    monkeypatch.setattr(_stacks, "SKIPPED_PREFIXES", (__file__,))
    frames = frames_of(stack, FrameCache())
    assert all(frame[0] != __file__ for frame in frames)
    monkeypatch.undo()
    import allocator as dm

    alloc = dm.Allocator(dm.AllocatorConfig(backend="cpu"))
    alloc.record_history(True)
    buf = alloc.full(4, 1.0)
    (entry,) = [e for e in alloc._history.ring if e[0] == "alloc"]
    assert any(code.co_filename.startswith(_stacks.SKIPPED_PREFIXES) for code in entry[5][::2])
    resolved = frames_of(entry[5], FrameCache())
    assert resolved[0][0] == __file__
    assert not any(f[0].startswith(_stacks.SKIPPED_PREFIXES) for f in resolved)
    alloc.release(buf)


def test_the_finalizer_mark_becomes_the_marker_frame():
    stack, _ = here()
    frames = frames_of((*FINALIZED_MARK, *stack), FrameCache())
    assert frames[0] == FINALIZED and frames[1][2] == "here"


def test_a_cache_works_each_frame_out_once_and_shares_its_dict():
    stack, line = here()
    cache = FrameCache()
    first = frame_dicts(stack, cache)
    again = frame_dicts(stack, cache)
    assert first == again and all(a is b for a, b in zip(first, again, strict=True))
    assert first[0] == {"filename": __file__, "line": line, "name": "here"}
    cache.triples[(stack[0], stack[1])] = ("elsewhere.py", 7, "f")  # a remembered triple wins
    assert frames_of(stack, cache)[0] == ("elsewhere.py", 7, "f")
    assert frame_dicts(stack, cache)[0] == {"filename": "elsewhere.py", "line": 7, "name": "f"}
    assert frame_dicts((), cache) == []
