"""The current stream, per thread: what ``with alloc.use_stream(s):`` sets.

Every allocation and op of an allocator runs on the calling thread's current stream of that
allocator: its default stream until a ``use_stream`` block makes another one current, for that
thread only, until the block exits (PyTorch's ``torch.cuda.stream(s)`` context, whose current
stream is per thread too). Blocks nest; leaving one restores the stream that was current
before, also after an exception.
"""

from __future__ import annotations

import threading

from .device.base import Device
from .device.stream import Stream

__all__ = ["CurrentStream", "StreamScope"]


class CurrentStream(threading.local):
    """One allocator's current stream in each thread (``stream``), its default stream in a
    thread that never entered a :class:`StreamScope`."""

    def __init__(self, default: Stream) -> None:
        self.stream = default


class StreamScope:
    """The context manager ``use_stream`` returns: ``stream`` (validated by the caller) is the
    thread's current stream in the ``with`` block, and the one current before is restored at
    its exit, also after an exception. On ``cuda`` the device's own scope
    (:meth:`~allocator.device.base.Device.stream_scope`) is entered too, so that CuPy's kernels
    in the block run on the stream. One object may be entered again, nested or later (each
    entry keeps what it restores), from the thread that made it. A plain class rather than a
    generator: entering one is on the path of every ZeRO-3 gather."""

    __slots__ = ("_current", "_device", "_entered", "_stream")

    def __init__(self, current: CurrentStream, stream: Stream, device: Device) -> None:
        self._current = current
        self._stream = stream
        self._device = device
        self._entered: list[tuple[Stream, object]] = []  # (previous stream, device scope)

    def __enter__(self) -> Stream:
        current = self._current
        scope = self._device.stream_scope(self._stream)
        if scope is not None:
            scope.__enter__()
        self._entered.append((current.stream, scope))
        current.stream = self._stream
        return self._stream

    def __exit__(self, *exc) -> None:
        previous, scope = self._entered.pop()
        self._current.stream = previous
        if scope is not None:
            scope.__exit__(*exc)
