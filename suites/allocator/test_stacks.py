"""The memory history's stacks alone: captured as code objects and offsets, turned into files,
lines and names only when a snapshot asks, without the allocator's own frames."""

from __future__ import annotations

import gc
import inspect
import os
import re
import subprocess
import sys
import textwrap
import threading
import tracemalloc
import weakref

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# -- the C capture (allocator/_cstacks.c) against the Python one --------------------------------

needs_c = pytest.mark.skipif(
    not _stacks.CAPTURE_IN_C, reason="allocator._cstacks is not built (no C compiler at install?)"
)


def test_the_c_capture_is_built_where_ci_requires_it():
    # ci/check.sh sets DEVMEM_REQUIRE_C_STACKS=1: there the build must not fall back silently
    # (where it can build at all: CPython 3.11 or newer, as the C source requires)
    if os.environ.get("DEVMEM_REQUIRE_C_STACKS") != "1":
        pytest.skip("DEVMEM_REQUIRE_C_STACKS is not set (ci/check.sh sets it)")
    if sys.implementation.name != "cpython" or sys.version_info < (3, 11):
        pytest.skip(f"allocator/_cstacks.c needs CPython 3.11 or newer, not {sys.version}")
    from allocator import _cstacks

    assert _stacks.CAPTURE_IN_C
    assert capture is _cstacks.capture and capture is not _stacks.capture_python


def _theirs(stack: tuple) -> tuple:
    """``stack`` without the frames of :data:`allocator._stacks.SKIPPED_PREFIXES` files."""
    pairs = zip(stack[::2], stack[1::2], strict=True)
    return tuple(
        item
        for code, lasti in pairs
        if not code.co_filename.startswith(_stacks.SKIPPED_PREFIXES)
        for item in (code, lasti)
    )


def _between() -> int:
    """How many frames of the allocator's own files stand between ``capture_python`` and its
    caller: none, but under mutmut its trampolines do (and count towards ``skip``)."""
    stack = _stacks.capture_python(1)
    codes = stack[::2]
    return next(
        (
            i
            for i, code in enumerate(codes)
            if not code.co_filename.startswith(_stacks.SKIPPED_PREFIXES)
        ),
        len(codes),
    )


def both(skip: int) -> list[tuple]:
    """The C and the Python capture, called from one instruction of one frame."""
    extra = _between()
    return [
        cap(skip + more) for cap, more in ((_stacks.capture, 0), (_stacks.capture_python, extra))
    ]


def assert_same_stack(c: tuple, py: tuple) -> None:
    """The two captures hold the same frames: the same code objects and offsets, but for the
    innermost offset when that frame is the one that called them, which CPython 3.11 stamps
    at the call instruction for a C callee and at the end of the call's inline cache for a
    Python one: the same line either way."""
    assert len(c) == len(py) and len(c) % 2 == 0
    assert c[::2] == py[::2]  # the same code objects, in the same order
    assert c[3::2] == py[3::2]  # every outer frame's offset
    assert _stacks._line(c[0], c[1]) == _stacks._line(py[0], py[1])
    assert all(type(lasti) is int for lasti in c[1::2])


# What a frame on the way down can be: each kind calls ``inner()`` from its own kind of frame.
def _plain(inner):
    return inner()


def _generator(inner):
    def gen():
        yield inner()

    return next(gen())


def _coroutine(inner):
    async def coro():
        return inner()

    try:
        coro().send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("the coroutine did not finish")


def _handler(inner):
    try:
        raise KeyError("x")
    except KeyError:
        return inner()


def _finally(inner):
    try:
        pass
    finally:
        result = inner()
    return result


def _lambda(inner):
    return (lambda: inner())()


def _comprehension(inner):
    (result,) = [inner() for _ in range(1)]
    return result


def _method(inner):
    class Holder:
        def call(self):
            return inner()

    return Holder().call()


def _property(inner):
    class Holder:
        @property
        def value(self):
            return inner()

    return Holder().value


def _finalizer(inner):
    out = []

    class Dying:
        def __del__(self):
            out.append(inner())

    Dying()  # dropped at once: __del__ runs here, under this frame
    return out[0]


def _gc_callback(inner):
    out = []

    def callback(phase, info):
        if phase == "start" and not out:
            out.append(inner())

    gc.callbacks.append(callback)
    try:
        gc.collect()  # a collection does not nest: inside another one's callback it runs none
    finally:
        gc.callbacks.remove(callback)
    return out[0] if out else inner()


KINDS = [
    _plain,
    _generator,
    _coroutine,
    _handler,
    _finally,
    _lambda,
    _comprehension,
    _method,
    _property,
    _finalizer,
    _gc_callback,
]


def _down(kinds: list, skip: int):
    """Go down through a frame of each of ``kinds``, then capture with both."""
    if not kinds:
        return both(skip)
    first, rest = kinds[0], kinds[1:]
    return first(lambda: _down(rest, skip))


@needs_c
@settings(max_examples=150, deadline=None)
@given(kinds=st.lists(st.sampled_from(KINDS), max_size=12), skip=st.integers(1, 4))
def test_c_and_python_captures_agree_on_every_kind_of_frame(kinds, skip):
    c, py = _down(kinds, skip)
    assert_same_stack(c, py)
    if skip > 1:  # the innermost frame is not the caller's: every offset is the same
        assert c == py


def _deep(depth: int, at_bottom):
    return at_bottom() if depth <= 0 else _deep(depth - 1, at_bottom)


@needs_c
@pytest.mark.parametrize("depth", [0, 127, 128, 129, 300, 700])
def test_c_and_python_captures_agree_past_the_c_stack_buffer(depth):
    # 128 frames fill the C function's stack buffer (256 items); deeper ones go to the heap
    c, py = _deep(depth, lambda: both(1))
    assert_same_stack(c, py)
    assert c[2:] == py[2:]
    assert len(c) // 2 >= depth + 2


@needs_c
def test_c_and_python_captures_agree_in_another_thread():
    out = []
    thread = threading.Thread(target=lambda: out.append(_deep(5, lambda: both(1))))
    thread.start()
    thread.join()
    c, py = out[0]
    assert_same_stack(c, py)
    # a thread's stack is its own: it ends in threading's bootstrap, not in this test
    assert test_c_and_python_captures_agree_in_another_thread.__code__ not in c[::2]
    assert c[-2].co_filename == threading.__file__


@pytest.mark.parametrize("name", ["capture", "capture_python"])
@pytest.mark.parametrize(
    ("skip", "error", "message"),
    [
        (0, ValueError, "skip must be at least 1, got 0"),
        (-3, ValueError, "skip must be at least 1, got -3"),
        (10**6, ValueError, "call stack is not deep enough"),
        (2.0, TypeError, "'float' object cannot be interpreted as an integer"),
        (10**30, OverflowError, "too large to convert"),
    ],
)
def test_a_bad_skip_is_refused(name, skip, error, message):
    with pytest.raises(error, match=re.escape(message)):
        getattr(_stacks, name)(skip)


@pytest.mark.parametrize("name", ["capture", "capture_python"])
def test_a_capture_keeps_no_frame_and_leaks_nothing(name):
    cap = getattr(_stacks, name)

    class Local:
        pass

    def holder():
        local = Local()
        return weakref.ref(local), cap(1)

    gc.disable()
    try:
        ref, stack = holder()
        assert _theirs(stack)[0] is holder.__code__
        assert ref() is None  # the frame's locals died with it: the stack holds no frame
        code = holder.__code__
        before = sys.getrefcount(code)
        for _ in range(1000):
            holder()
        assert sys.getrefcount(code) == before  # each capture's reference to code was dropped
        tracemalloc.start()
        try:
            _deep(300, lambda: [cap(1) for _ in range(50)])  # warm up, past the stack buffer
            start, _ = tracemalloc.get_traced_memory()
            _deep(300, lambda: [cap(1) for _ in range(2000)])
            end, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert end - start < 64 * 1024  # 2,000 stacks of 300 frames kept would be megabytes
    finally:
        gc.enable()


def test_without_the_c_module_python_captures_and_the_history_still_works(tmp_path):
    script = tmp_path / "no_c.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            sys.modules["allocator._cstacks"] = None  # as if it was never built
            import allocator as dm
            from allocator import _stacks

            assert not _stacks.CAPTURE_IN_C and _stacks.capture is _stacks.capture_python
            alloc = dm.Allocator(dm.AllocatorConfig(backend="sim"))
            alloc.record_history(True)
            buf = alloc.full(4, 1.0)  # the line below must be this one
            line = sys._getframe().f_lineno - 1
            snapshot = alloc.snapshot()
            (alloc_event,) = [
                e for e in snapshot["device_traces"][0] if e["action"] == "alloc"
            ]
            first = alloc_event["frames"][0]
            assert (first["filename"], first["line"]) == (__file__, line), first
            print("ok")
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
