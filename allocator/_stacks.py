"""Python stacks for the memory history: the frames of the call that caused an event.

A stack is a tuple of ``(filename, line, name)`` triples, innermost first (PyTorch's order:
``frames[0]`` is the most recent call). The allocator's own frames are left out, so the first
frame is the user's line that allocated or freed: in ``x = dm.full(n, 1.0)`` it is that line,
not ``Allocator.full``. Snapshots turn each triple into PyTorch's frame dict
``{"filename", "line", "name"}`` (:func:`frame_dicts`).

A finalizer never captures a stack (DESIGN 2.9): the free of a block whose last reference died
is recorded when the next public call drains the finalizers' queue, with the drain's stack under
the marker frame :data:`FINALIZED`, so no reader takes the drain point for the release point.
"""

from __future__ import annotations

import os
import sys

__all__ = ["FINALIZED", "capture", "frame_dicts"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep

FINALIZED = ("<devmem finalizer>", 0, "last reference dropped before the call below")
"""The innermost frame of a free done by the finalizer: the block's last reference died some
time before the call whose stack follows (the one that drained the queue)."""


def capture(skip: int = 1) -> tuple[tuple[str, int, str], ...]:
    """The caller's Python stack, innermost first, without the allocator's own frames.

    Args:
        skip: frames to drop above this function before walking (1: this function's caller).

    Returns:
        ``(filename, line, name)`` triples; empty if every frame is the allocator's.
    """
    frame = sys._getframe(skip)
    out = []
    append = out.append
    package = _PACKAGE
    while frame is not None:
        code = frame.f_code
        filename = code.co_filename
        if not filename.startswith(package):
            append((filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    return tuple(out)


def frame_dicts(frames, cache: dict) -> list[dict]:
    """PyTorch's frame dicts for ``frames`` (triples). ``cache`` maps a triple to its dict, so
    that equal frames share one dict (the pickle then stores each frame once)."""
    out = []
    for frame in frames:
        entry = cache.get(frame)
        if entry is None:
            filename, line, name = frame
            entry = cache[frame] = {"filename": filename, "line": line, "name": name}
        out.append(entry)
    return out
