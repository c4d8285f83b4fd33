"""The reuse cache: an exact-size free list of device blocks, with an optional byte cap.

What it adds over a device: a block returned by a dead or released storage is kept for the next
allocation of exactly the same byte size, instead of going back to the device. Source: TorchLean's
``take_cached_block``/``return_cached_block`` and its cache cap
(``../shared/seeds/torchlean-cuda-arena-and-cache-cap.txt``).

Order of operations:

- ``put``: record the block's completion event, then decide. With a cap, a block that would grow
  the cache past it (``nbytes > cap or cache_bytes > cap - nbytes``) is not cached: ``put``
  returns it, and the caller frees it after waiting on its event (``cap_evictions`` counts it).
- ``take``: reuse a cached block of that size only if its event is done; never wait.
- ``drain``: empty the cache and return every block; the caller waits and frees them.

The cache has no lock of its own: every method is called under the owning allocator's lock, and
``bytes`` is the running total the cap decision reads (up on push, down on reuse, zero on drain).
Device waits and frees happen outside that lock, in the allocator.
"""

from __future__ import annotations

from .device.base import Block, Device

__all__ = ["ReuseCache"]


class ReuseCache:
    """Exact-size free lists keyed by byte size, bounded by ``cap_bytes`` (0 = unbounded).

    Attributes:
        bytes: the bytes held now, in bytes.
        cap_bytes: the cap in bytes; 0 means unbounded.
        evictions: blocks ``put`` refused because of the cap.
    """

    __slots__ = ("_device", "_free", "bytes", "cap_bytes", "evictions")

    def __init__(self, device: Device, cap_bytes: int = 0) -> None:
        self._device = device
        self._free: dict[int, list[Block]] = {}
        self.bytes = 0
        self.cap_bytes = cap_bytes
        self.evictions = 0

    def take(self, nbytes: int) -> Block | None:
        """A cached block of exactly ``nbytes`` bytes whose event is done, or ``None``."""
        blocks = self._free.get(nbytes)
        if not blocks:
            return None
        ready = self._device.ready
        if ready(blocks[-1]):
            block = blocks.pop()
        else:
            # The newest block's kernels are still running; an older one may be done.
            for i in range(len(blocks) - 1):
                if ready(blocks[i]):
                    block = blocks.pop(i)
                    break
            else:
                return None
        self.bytes -= nbytes
        return block

    def put(self, block: Block) -> Block | None:
        """Return ``block`` to the cache; give it back if the cap refuses it (to be freed)."""
        self._device.record(block)
        nbytes = block.nbytes
        cap = self.cap_bytes
        if cap and (nbytes > cap or self.bytes > cap - nbytes):
            self.evictions += 1
            return block
        blocks = self._free.get(nbytes)
        if blocks is None:
            self._free[nbytes] = [block]
        else:
            blocks.append(block)
        self.bytes += nbytes
        return None

    def drain(self) -> list[Block]:
        """Empty the cache; return every block it held (the caller waits on each, then frees)."""
        blocks = [block for size_list in self._free.values() for block in size_list]
        self._free = {}
        self.bytes = 0
        return blocks

    def __len__(self) -> int:
        """The number of blocks cached."""
        return sum(len(blocks) for blocks in self._free.values())
