"""The statistics layer: live and peak bytes, buffer counts, and a stack of epoch counters.

What it adds over its upstream (the caching layer, or the device layer on ``cpu``): the
allocator-wide counters (live and peak bytes, live buffers, allocations, frees) and, for arenas,
a stack of epoch counters pushed and popped like RMM's ``statistics_resource_adaptor``: an
allocation or a free is charged to the innermost epoch, whoever allocated the block, and popping
an epoch folds it into its parent::

    parent.peak_bytes = max(parent.peak_bytes, parent.live_bytes + child.peak_bytes)
    parent.live_bytes += child.live_bytes

(``live_bytes`` of an epoch is what was allocated minus what was freed while it was innermost,
so it can be negative.) Example, DESIGN 2.5: the outer epoch holds 1000 B, the inner allocates
2000 B, the outer's buffer is released inside the inner: the inner's peak is 2000, its live
bytes 1000, and the outer's peak becomes ``max(1000, 1000 + 2000) = 3000``.

Order of operations:

- ``allocate(nbytes)``: get the block from upstream first; count it only once it exists (a
  failed allocation changes no counter).
- ``deallocate(block, cause)``: count the block as freed first, then hand it upstream (to the
  reuse cache, so cached bytes are never live).

The lock guards the counters and the epoch stack; the upstream is called with it released.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from . import _locks
from ._free_cause import FreeCause
from .device.base import Block

__all__ = ["EpochCounter", "Statistics", "Upstream"]


class Upstream(Protocol):
    """What a layer needs of the layer under it (RMM's ``device_memory_resource``)."""

    def allocate(self, nbytes: int) -> Block:
        """A block of ``nbytes`` bytes; raises ``DeviceAllocationError`` if there is none."""

    def deallocate(self, block: Block, cause: FreeCause) -> None:
        """Take back ``block``, freed because of ``cause``."""

    def deallocate_many(self, blocks: Sequence[Block], cause: FreeCause) -> None:
        """Take back every one of ``blocks``, freed because of ``cause``."""


@dataclasses.dataclass(slots=True)
class EpochCounter:
    """The counters of one epoch (mutated under the statistics lock).

    Attributes:
        live_bytes: bytes allocated minus bytes freed while this epoch was the innermost (child
            epochs folded in); may be negative.
        peak_bytes: the highest ``live_bytes`` seen, child peaks folded in on top of what this
            epoch held when each child opened.
        allocs: allocations made while this epoch was the innermost.
    """

    live_bytes: int = 0
    peak_bytes: int = 0
    allocs: int = 0


class Statistics:
    """Counters over ``upstream``.

    Args:
        upstream: the layer it allocates from and frees to.

    Attributes:
        live_bytes: bytes of blocks handed out and not yet freed.
        peak_bytes: the highest ``live_bytes`` so far.
        live_buffers: blocks handed out and not yet freed.
        allocs: blocks handed out.
        frees: blocks freed.
    """

    __slots__ = (
        "__weakref__",
        "_epochs",
        "_lock",
        "_upstream",
        "allocs",
        "frees",
        "live_buffers",
        "live_bytes",
        "peak_bytes",
    )

    def __init__(self, upstream: Upstream) -> None:
        self._upstream = upstream
        self._lock = _locks.new_lock(self, _locks.STATISTICS)
        self._epochs: list[EpochCounter] = []
        self.live_bytes = 0
        self.peak_bytes = 0
        self.live_buffers = 0
        self.allocs = 0
        self.frees = 0

    def allocate(self, nbytes: int) -> Block:
        """A block of ``nbytes`` bytes from upstream, counted.

        Raises:
            DeviceAllocationError: from upstream; nothing is counted.
        """
        block = self._upstream.allocate(nbytes)
        with self._lock:
            live = self.live_bytes + nbytes
            self.live_bytes = live
            if live > self.peak_bytes:
                self.peak_bytes = live
            self.live_buffers += 1
            self.allocs += 1
            epochs = self._epochs
            if epochs:
                epoch = epochs[-1]
                epoch.allocs += 1
                live = epoch.live_bytes + nbytes
                epoch.live_bytes = live
                if live > epoch.peak_bytes:
                    epoch.peak_bytes = live
        return block

    def deallocate(self, block: Block, cause: FreeCause) -> None:
        """Count ``block`` as freed (charged to the innermost epoch), then hand it upstream."""
        nbytes = block.nbytes
        with self._lock:
            self.live_bytes -= nbytes
            self.live_buffers -= 1
            self.frees += 1
            epochs = self._epochs
            if epochs:
                epochs[-1].live_bytes -= nbytes
        self._upstream.deallocate(block, cause)

    def deallocate_many(self, blocks: Sequence[Block], cause: FreeCause) -> None:
        """:meth:`deallocate` every one of ``blocks``, counted under one acquisition."""
        nbytes = sum(block.nbytes for block in blocks)
        with self._lock:
            self.live_bytes -= nbytes
            self.live_buffers -= len(blocks)
            self.frees += len(blocks)
            epochs = self._epochs
            if epochs:
                epochs[-1].live_bytes -= nbytes
        self._upstream.deallocate_many(blocks, cause)

    def push(self) -> None:
        """Open an epoch: from now on allocations and frees are charged to it."""
        with self._lock:
            self._epochs.append(EpochCounter())

    def pop(self) -> EpochCounter:
        """Close the innermost epoch and fold it into its parent (see the module docstring).

        Returns:
            The closed epoch's counters.

        Raises:
            IndexError: no epoch is open.
        """
        with self._lock:
            epochs = self._epochs
            child = epochs.pop()
            if epochs:
                parent = epochs[-1]
                parent.peak_bytes = max(parent.peak_bytes, parent.live_bytes + child.peak_bytes)
                parent.live_bytes += child.live_bytes
            return child

    def counters(self) -> tuple[int, int, int, int, int]:
        """``(live_bytes, peak_bytes, live_buffers, allocs, frees)``, read together."""
        with self._lock:
            return self.live_bytes, self.peak_bytes, self.live_buffers, self.allocs, self.frees
