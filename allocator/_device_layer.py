"""The bottom layer: a backend in the layers' terms, with its own two counters.

What it adds over a backend (:mod:`allocator.device`): the ``allocate``/``deallocate`` interface
every layer above speaks (RMM's ``device_memory_resource``), the counts of blocks obtained from
and handed back to the device, and the one rule of a device free: wait on the block's completion
event first.

Order of operations:

- ``allocate(nbytes, stream)``: ``device.malloc``, then the block belongs to ``stream``
  (``block.stream``); count it only once it succeeded. A failure is the device's
  :class:`~allocator.device.DeviceAllocationError`, unchanged.
- ``deallocate(block, cause)``: ``device.wait(block)`` (every event recorded on it, on its own
  stream and on the streams ``record_stream`` named), then ``device.free(block)``, then count.

Its lock guards the two counters only; the device is called with it released.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import _locks
from ._free_cause import FreeCause
from .device.base import Block, Device, Stream

__all__ = ["DeviceLayer"]


class DeviceLayer:
    """The resource interface over ``device``.

    Args:
        device: the backend.

    Attributes:
        device: the backend.
        mallocs: blocks obtained from the device.
        frees: blocks handed back to it.
    """

    __slots__ = ("__weakref__", "_lock", "device", "frees", "mallocs")

    def __init__(self, device: Device) -> None:
        self.device = device
        self._lock = _locks.new_lock(self, _locks.DEVICE_LAYER)
        self.mallocs = 0
        self.frees = 0

    def allocate(self, nbytes: int, stream: Stream) -> Block:
        """A new device block of ``nbytes`` bytes, belonging to ``stream``.

        Raises:
            DeviceAllocationError: the device has no room (its reason is the message).
        """
        block = self.device.malloc(nbytes)
        block.stream = stream
        block.stream_id = stream.id
        with self._lock:
            self.mallocs += 1
        return block

    def deallocate(self, block: Block, cause: FreeCause) -> None:
        """Wait on ``block``'s completion event, then hand it back to the device."""
        device = self.device
        device.wait(block)
        device.free(block)
        with self._lock:
            self.frees += 1

    def deallocate_many(self, blocks: Iterable[Block], cause: FreeCause) -> None:
        """:meth:`deallocate` each of ``blocks``, in order, counted under one acquisition."""
        device = self.device
        freed = 0
        try:
            for block in blocks:
                device.wait(block)
                device.free(block)
                freed += 1
        finally:
            with self._lock:
                self.frees += freed

    def counters(self) -> tuple[int, int]:
        """``(mallocs, frees)``, read together."""
        with self._lock:
            return self.mallocs, self.frees
