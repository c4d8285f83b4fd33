"""Python stacks for the memory history: the frames of the call that caused an event.

Recording a stack must be cheap, so :func:`capture` only walks the frames and keeps each one's
code object and last instruction offset, in one flat tuple ``(code, lasti, code, lasti, ...)``,
innermost first (PyTorch's order: the most recent call first). As PyTorch gathers its Python
frames in C++, :func:`capture` is the C function ``allocator._cstacks.capture`` where the
package was built with it (``pip install`` compiles it when a C compiler and the Python headers
are there, CPython 3.11 or newer; ``bench/alloc.py`` times both), else it is
:func:`capture_python`; :data:`CAPTURE_IN_C` says which. Both return the same frames: the same
code objects and offsets, but the innermost offset where that frame is the caller's, which
CPython stamps at the call for a C callee and past the call's inline cache for a Python one (the
same line). Everything else waits for a snapshot: :func:`frame_dicts` turns a stack into PyTorch's
frame dicts ``{"filename", "line", "name"}``, leaving out the allocator's own frames, so that the
first frame is the user's line that allocated or freed (in ``x = dm.full(n, 1.0)`` that line, not
``Allocator.full``).

A finalizer never captures a stack (DESIGN 2.9): the free of a block whose last reference died is
recorded when the next public call drains the finalizers' queue, with the drain's stack under the
marker frame :data:`FINALIZED`, so no reader takes the drain point for the release point.
"""

from __future__ import annotations

import os
import sys
from types import CodeType

__all__ = [
    "CAPTURE_IN_C",
    "FINALIZED",
    "FINALIZED_MARK",
    "SKIPPED_PREFIXES",
    "FrameCache",
    "capture",
    "capture_python",
    "frame_dicts",
    "frames_of",
]

SKIPPED_PREFIXES: tuple[str, ...] = (os.path.dirname(os.path.abspath(__file__)) + os.sep,)
"""File path prefixes of the frames left out of stacks: the allocator package's own. A tool
that wraps the allocator's functions may add its wrappers' (the suites' mutmut plugin does)."""

FINALIZED = ("<devmem finalizer>", 0, "last reference dropped before the call below")
"""The innermost frame of a free done by the finalizer: the block's last reference died some
time before the call whose stack follows (the one that drained the queue)."""

FINALIZED_MARK = (None, 0)
"""How :data:`FINALIZED` starts a captured stack (a code of ``None``)."""


def capture_python(skip: int) -> tuple:
    """The Python stack as ``(code, lasti, ...)`` pairs, innermost first: :func:`capture`
    written in Python (the fallback where the C one is not built).

    Args:
        skip: how many frames to leave out, this function's own included: 1 starts at its
            caller. Frames left out at resolution (:data:`SKIPPED_PREFIXES`) need no skipping.

    Raises:
        ValueError: ``skip`` is below 1, or the stack is less than ``skip`` frames deep.
        TypeError: ``skip`` is not an integer.
    """
    if skip < 1:
        raise ValueError(f"skip must be at least 1, got {skip}")
    frame = sys._getframe(skip)
    out: list = []
    append = out.append
    while frame is not None:
        append(frame.f_code)
        append(frame.f_lasti)
        frame = frame.f_back
    return tuple(out)


try:
    from ._cstacks import capture
except ImportError:  # not built: no C compiler or Python headers at install, CPython < 3.11
    capture = capture_python
    CAPTURE_IN_C = False
else:
    CAPTURE_IN_C = True
"""Whether :func:`capture` is the C function (``allocator._cstacks``) or :func:`capture_python`."""


def _line(code: CodeType, lasti: int) -> int:
    """The source line of the instruction at byte offset ``lasti`` of ``code``."""
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return line
    return code.co_firstlineno


class FrameCache:
    """What turning stacks into frames remembers, for one snapshot.

    Attributes:
        triples: ``(code, lasti)`` to its ``(filename, line, name)``, or to ``None`` for the
            allocator's own frames.
        dicts: a triple to its one PyTorch frame dict.
    """

    __slots__ = ("dicts", "triples")

    def __init__(self) -> None:
        self.triples: dict[tuple, tuple[str, int, str] | None] = {}
        self.dicts: dict[tuple[str, int, str], dict] = {}


def frames_of(stack: tuple, cache: FrameCache) -> list[tuple[str, int, str]]:
    """``(filename, line, name)`` for each frame of a captured ``stack`` that is not the
    allocator's own, innermost first, each worked out once per ``cache``."""
    out = []
    triples = cache.triples
    for i in range(0, len(stack), 2):
        code, lasti = stack[i], stack[i + 1]
        key = (code, lasti)
        frame = triples.get(key, key)
        if frame is key:
            if code is None:
                frame = FINALIZED
            elif code.co_filename.startswith(SKIPPED_PREFIXES):
                frame = None
            else:
                frame = (code.co_filename, _line(code, lasti), code.co_name)
            triples[key] = frame
        if frame is not None:
            out.append(frame)
    return out


def frame_dicts(stack: tuple, cache: FrameCache) -> list[dict]:
    """PyTorch's frame dicts for a captured ``stack`` (see :func:`frames_of`). Equal frames
    share one dict (the pickle then stores each frame once)."""
    dicts = cache.dicts
    out = []
    for frame in frames_of(stack, cache):
        entry = dicts.get(frame)
        if entry is None:
            filename, line, name = frame
            entry = dicts[frame] = {"filename": filename, "line": line, "name": name}
        out.append(entry)
    return out
