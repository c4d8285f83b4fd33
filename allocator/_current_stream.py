"""The current stream, per thread: what ``with alloc.use_stream(s):`` sets.

Every allocation and op of an allocator runs on the calling thread's current stream of that
allocator: its default stream until a ``use_stream`` block makes another one current, for that
thread only, until the block exits (PyTorch's ``torch.cuda.stream(s)`` context, whose current
stream is per thread too). Blocks nest; leaving one restores the stream that was current
before, also after an exception.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from .device.base import Device
from .device.stream import Stream

__all__ = ["CurrentStream", "check_stream"]


def check_stream(device: Device, stream: object, name: str = "stream") -> Stream:
    """Validate that ``stream`` is a stream of ``device``; return it.

    Raises:
        TypeError: ``stream`` is not a Stream.
        ValueError: it belongs to another allocator.
    """
    if not isinstance(stream, Stream):
        raise TypeError(f"{name} must be a Stream, got {type(stream).__name__}")
    if stream.device is not device:
        raise ValueError(f"{name} ({stream.name!r}) belongs to another allocator")
    return stream


class CurrentStream(threading.local):
    """One allocator's current stream in each thread (``stream``), its default stream in a
    thread that never entered a :meth:`scope`."""

    def __init__(self, default: Stream) -> None:
        self.stream = default

    @contextlib.contextmanager
    def scope(self, stream: Stream, device: Device) -> Iterator[Stream]:
        """Make ``stream`` (validated) current in this thread for the ``with`` block; on
        ``cuda`` its CuPy stream is current too, so CuPy's own kernels run on it."""
        previous = self.stream
        self.stream = stream
        try:
            with device.stream_scope(stream):
                yield stream
        finally:
            self.stream = previous
