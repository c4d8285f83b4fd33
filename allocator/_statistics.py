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

- ``allocate(nbytes, stream)``: get the block from upstream first (for ``stream``, which this
  layer only passes down); count it only once it exists (a failed allocation changes no
  counter).
- ``deallocate(block, cause)``: count the block as freed first, then hand it upstream (to the
  reuse cache, so cached bytes are never live).

No lock per operation: counting one is appending its signed byte count to a deque (one atomic
operation, so this layer takes no lock on the allocation path, arena or not); a batch of frees
(an arena exit's) is applied at once under the lock instead. The counters are
folded from that log, in its order, under the layer's lock: when they are read
(:meth:`counters`), when an epoch is pushed or popped, and whenever :data:`FOLD_EVERY` entries
have piled up. A block is counted freed before it goes back to the cache and counted allocated
after it came out, so the log never holds one block live twice, and the peak folded from it is
exactly the peak of that order of operations.
"""

from __future__ import annotations

import collections
import dataclasses
import operator
from collections.abc import Sequence
from typing import Protocol

from . import _locks
from ._free_cause import FreeCause
from .device.base import Block, Stream

__all__ = ["FOLD_EVERY", "EpochCounter", "Statistics", "Upstream"]

_NBYTES = operator.attrgetter("nbytes")

FOLD_EVERY = 4096
"""Entries of the log that trigger a fold (so it holds at most about this many)."""


class Upstream(Protocol):
    """What a layer needs of the layer under it (RMM's ``device_memory_resource``)."""

    def allocate(self, nbytes: int, stream: Stream) -> Block:
        """A block of ``nbytes`` bytes belonging to ``stream``; raises
        ``DeviceAllocationError`` if there is none."""

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

    The attributes hold the values folded so far; :meth:`counters` folds first.
    """

    __slots__ = (
        "__weakref__",
        "_epochs",
        "_lock",
        "_log",
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
        self._log: collections.deque[int] = collections.deque()
        self._epochs: list[EpochCounter] = []
        self.live_bytes = 0
        self.peak_bytes = 0
        self.live_buffers = 0
        self.allocs = 0
        self.frees = 0

    def allocate(self, nbytes: int, stream: Stream) -> Block:
        """A block of ``nbytes`` bytes for ``stream`` from upstream, counted.

        Raises:
            DeviceAllocationError: from upstream; nothing is counted.
        """
        block = self._upstream.allocate(nbytes, stream)
        log = self._log
        log.append(nbytes)
        if len(log) >= FOLD_EVERY:
            self.counters()
        return block

    def deallocate(self, block: Block, cause: FreeCause) -> None:
        """Count ``block`` as freed (charged to the innermost epoch), then hand it upstream."""
        log = self._log
        log.append(-block.nbytes)
        if len(log) >= FOLD_EVERY:
            self.counters()
        self._upstream.deallocate(block, cause)

    def deallocate_many(self, blocks: Sequence[Block], cause: FreeCause) -> None:
        """:meth:`deallocate` every one of ``blocks``, counted together: the log is folded
        first, then the frees are applied at once (frees never raise a peak, so the counters
        are those of freeing them one by one)."""
        nbytes = sum(map(_NBYTES, blocks))
        with self._lock:
            self._fold()
            self.live_bytes -= nbytes
            self.frees += len(blocks)
            self.live_buffers = self.allocs - self.frees
            epochs = self._epochs
            if epochs:
                epochs[-1].live_bytes -= nbytes
        self._upstream.deallocate_many(blocks, cause)

    def _fold(self) -> None:
        """Apply the log's entries to the counters, in order (lock held)."""
        log = self._log
        count = len(log)  # entries appended after this are folded next time
        if not count:
            return
        start = live = high = self.live_bytes
        grew = 0
        popleft = log.popleft
        for _ in range(count):
            delta = popleft()
            live += delta
            if delta > 0:
                grew += 1
                if live > high:
                    high = live
        self.live_bytes = live
        if high > self.peak_bytes:
            self.peak_bytes = high
        self.allocs += grew
        self.frees += count - grew
        self.live_buffers = self.allocs - self.frees
        epochs = self._epochs
        if epochs:
            epoch = epochs[-1]
            epoch.peak_bytes = max(epoch.peak_bytes, epoch.live_bytes + high - start)
            epoch.live_bytes += live - start
            epoch.allocs += grew

    def push(self) -> None:
        """Open an epoch: from now on allocations and frees are charged to it."""
        with self._lock:
            self._fold()
            self._epochs.append(EpochCounter())

    def pop(self) -> EpochCounter:
        """Close the innermost epoch and fold it into its parent (see the module docstring).

        Returns:
            The closed epoch's counters.

        Raises:
            IndexError: no epoch is open.
        """
        with self._lock:
            self._fold()
            epochs = self._epochs
            child = epochs.pop()
            if epochs:
                parent = epochs[-1]
                parent.peak_bytes = max(parent.peak_bytes, parent.live_bytes + child.peak_bytes)
                parent.live_bytes += child.live_bytes
            return child

    def counters(self) -> tuple[int, int, int, int, int]:
        """``(live_bytes, peak_bytes, live_buffers, allocs, frees)``, folded and read
        together."""
        with self._lock:
            self._fold()
            return self.live_bytes, self.peak_bytes, self.live_buffers, self.allocs, self.frees
