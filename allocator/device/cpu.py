"""The CPU stub: NumPy arrays as blocks, no reuse cache, every event already complete.

It lets CI run every suite without a device. As in the original stub, the allocator keeps no
cache over it, so ``cache_bytes`` and ``cache_cap_bytes`` stay 0, and ``device_total_bytes`` is 0.
Streams are accounting only: a block still belongs to the stream it was allocated on and
remembers the streams ``record_stream`` named, but every kernel has completed at once, so
waiting on a stream, or on a block's events, never waits.
"""

from __future__ import annotations

import itertools

from .base import Block, Device, host_array

__all__ = ["CpuDevice"]


class CpuDevice(Device):
    """The CPU stub backend (``DEVMEM_BACKEND=cpu``, the default)."""

    name = "cpu"
    has_cache = False

    def __init__(self) -> None:
        super().__init__()
        self._ids = itertools.count(1)

    def malloc(self, nbytes: int) -> Block:
        """A new NumPy block; :class:`DeviceAllocationError` past the host's memory."""
        return Block(next(self._ids), nbytes, host_array(nbytes))

    def free(self, block: Block) -> None:
        """Drop the block's array (NumPy frees it when the last reference goes)."""
        block.array = None
