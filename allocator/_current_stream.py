"""The current stream, per thread: what ``with alloc.use_stream(s):`` sets.

Every allocation and op of an allocator runs on the calling thread's current stream of that
allocator: its default stream until a ``use_stream`` block makes another one current, for that
thread only, until the block exits (PyTorch's ``torch.cuda.stream(s)`` context, whose current
stream is per thread too). Blocks nest; leaving one restores the stream that was current
before, also after an exception.
"""

from __future__ import annotations

import threading
from threading import get_ident

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
    entry keeps what it restores), by one thread at a time: entering it from another thread
    while it is entered raises (each thread's entries would restore the other's stream). A plain
    class rather than a generator: entering one is on the path of every ZeRO-3 gather.

    Raises:
        RuntimeError: (at ``__enter__``) the object is entered now by another thread.
    """

    __slots__ = ("_busy", "_current", "_device", "_entered", "_stream", "_thread")

    def __init__(self, current: CurrentStream, stream: Stream, device: Device) -> None:
        self._current = current
        self._stream = stream
        self._device = device
        self._entered: list[tuple[Stream, object]] = []  # (previous stream, device scope)
        self._busy = threading.Lock()  # held while entered (taken without waiting: atomic)
        self._thread = 0  # the thread that entered it, while ``_busy`` is held

    def __enter__(self) -> Stream:
        me = get_ident()
        if self._thread != me:  # not entered by this thread: claim it
            if not self._busy.acquire(blocking=False):
                raise RuntimeError(
                    f"use_stream({self._stream.name!r}): this scope object is entered by"
                    " another thread now; call alloc.use_stream(stream) in each thread"
                )
            self._thread = me
        current = self._current
        try:
            scope = self._device.stream_scope(self._stream)
            if scope is not None:
                scope.__enter__()
        except BaseException:
            if not self._entered:
                self._thread = 0
                self._busy.release()
            raise
        self._entered.append((current.stream, scope))
        current.stream = self._stream
        return self._stream

    def __exit__(self, *exc) -> None:
        previous, scope = self._entered.pop()
        self._current.stream = previous
        if not self._entered:
            self._thread = 0
            self._busy.release()
        if scope is not None:
            scope.__exit__(*exc)
