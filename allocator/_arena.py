"""The arena registry: the layer that owns storages, tracks them in epochs, and frees them.

What it adds over its upstream (the :class:`~allocator._statistics.Statistics` layer): storages
(the owners of blocks, see :mod:`allocator._buffer`), the one free path every way of freeing
one goes through, the queue of blocks that finalizers hand over, and arena epochs. Long pure
loops keep every intermediate buffer reachable until the end, so reference counting never frees
them: an arena opens an epoch, every storage allocated while it is open is tracked, and closing
it frees the block of every tracked storage still alive, reachable or not, except those of
``keep``, which move to the parent epoch (at the outermost level they become untracked, left to
ordinary finalization). Source: TorchLean's ``withCudaArena``
(``../shared/seeds/torchlean-cuda-arena-and-cache-cap.txt``).

Order of operations:

- ``allocate(nbytes, stream)``: a block from upstream (for ``stream``), then a :class:`Storage`
  over it, then, if an arena is open, its registration in the innermost epoch (under the
  registry lock). With no arena open, no lock of this layer is taken.
- ``free(storage, cause)`` (``release``, ``resize_``): take the block from the storage (one
  atomic ``list.pop``: whoever gets it frees it), record the cause, untrack it if an epoch
  tracks it (under the registry lock), then hand the block upstream.
- finalization: ``Storage.__del__`` takes the block and appends it to :attr:`pending`; nothing
  else (it may run inside any critical section). ``drain()``, called by every public call with
  no lock held, hands the queued blocks upstream with the cause ``finalize``. Their epochs'
  registry entries are dead weak references, pruned when an epoch's registry has doubled since
  the last pruning (so at most twice the live entries, plus 64, are kept).
- ``close(keep, expected)``: validate ``keep`` first (a bad one changes nothing), then under the
  registry lock: pop the epoch, walk its registry (skip dead entries and storages freed or moved
  since), promote the kept storages to the parent, take the blocks of the others, free them
  upstream (charged to the closing epoch) and pop the statistics epoch. The lock is held across
  the frees, so the registry and the statistics epochs stay in step.

Arenas are process-wide, like the native registry: open and close them from one thread (other
threads may allocate meanwhile).
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING

from . import _free_cause, _locks
from ._buffer import Buffer, Storage
from ._errors import ArenaError
from ._stats import EpochStats

if TYPE_CHECKING:
    from ._free_cause import FreeCause
    from ._statistics import Statistics
    from .device.base import Stream

__all__ = ["SWEEP_MIN", "ArenaRegistry", "Epoch", "keep_storages"]

SWEEP_MIN = 64
"""An epoch's registry is pruned of dead entries once it holds this many, then whenever it has
doubled since the last pruning."""


@dataclasses.dataclass(slots=True, eq=False)
class Epoch:
    """One open arena. Mutated only under the registry lock.

    Attributes:
        depth: 0 for the outermost epoch.
        tracked: weak references to the storages it tracks, keyed by ``id(storage)``. A storage
            finalized mid-scope leaves a dead entry, which the exit walk skips and the next
            pruning removes; a storage freed explicitly is removed at once.
        sweep_at: the registry size that triggers the next pruning.
    """

    depth: int
    tracked: dict[int, weakref.ref] = dataclasses.field(default_factory=dict)
    sweep_at: int = SWEEP_MIN

    def track(self, st: Storage, ref: weakref.ref) -> None:
        """Register ``st`` (whose weak reference is ``ref``); prune dead entries when due."""
        tracked = self.tracked
        tracked[id(st)] = ref
        st.epoch = self
        if len(tracked) >= self.sweep_at:
            for key in [key for key, entry in tracked.items() if entry() is None]:
                del tracked[key]
            self.sweep_at = max(SWEEP_MIN, 2 * len(tracked))


def keep_storages(home: ArenaRegistry, keep: Iterable[Buffer]) -> set[int]:
    """Validate ``keep`` and return the ids of the storages it names.

    Raises:
        TypeError: ``keep`` is a single buffer or not iterable, or an item is not a Buffer.
        ValueError: an item belongs to another allocator, or was already freed.
    """
    if isinstance(keep, Buffer):
        raise TypeError("keep must be an iterable of Buffers, got a Buffer (write keep=[buf])")
    try:
        items = list(keep)
    except TypeError:
        raise TypeError(f"keep must be an iterable of Buffers, got {type(keep).__name__}") from None
    ids = set()
    for i, buf in enumerate(items):
        if not isinstance(buf, Buffer):
            raise TypeError(f"keep[{i}] must be a Buffer, got {type(buf).__name__}")
        st = buf._st
        if st._home is not home:
            raise ValueError(f"keep[{i}] belongs to another allocator")
        if st.cause is not None:
            raise ValueError(f"keep[{i}] cannot be kept: it was already {st.freed_reason}")
        ids.add(id(st))
    return ids


class ArenaRegistry:
    """Storages over ``upstream``, their free path, and arena epochs.

    Args:
        upstream: the statistics layer.
        backend: the backend's name, for reprs.

    Attributes:
        backend: the backend's name.
        pending: blocks of finalized storages, waiting for :meth:`drain`.
        reclaimed_buffers: storages freed by arena exits so far.
        reclaimed_bytes: the bytes of their blocks.
    """

    __slots__ = (
        "__weakref__",
        "_epochs",
        "_lock",
        "_upstream",
        "backend",
        "pending",
        "reclaimed_buffers",
        "reclaimed_bytes",
    )

    def __init__(self, upstream: Statistics, backend: str) -> None:
        self._upstream = upstream
        self.backend = backend
        self.pending: collections.deque = collections.deque()
        self._epochs: list[Epoch] = []
        self._lock = _locks.new_lock(self, _locks.REGISTRY)
        self.reclaimed_buffers = 0
        self.reclaimed_bytes = 0

    # -- storages ------------------------------------------------------------------------------

    def allocate(self, nbytes: int, stream: Stream) -> Storage:
        """A new storage over a block of ``nbytes`` bytes on ``stream``, tracked by the
        innermost epoch.

        Raises:
            DeviceAllocationError: from upstream.
        """
        st = Storage(self, self._upstream.allocate(nbytes, stream), nbytes)
        if self._epochs:
            lock = self._lock
            lock.acquire()
            try:
                epochs = self._epochs
                if epochs:
                    epochs[-1].track(st, weakref.ref(st))
            finally:
                lock.release()
        return st

    def free(self, st: Storage, cause: FreeCause) -> int:
        """Free ``st``'s block now, for the reason ``cause``; 1 if this call freed it, else 0."""
        try:  # the claim: whoever pops the block frees it (the exit walk claims the same way)
            block = st._cell.pop()
        except IndexError:
            return 0
        st.cause = cause
        if st.epoch is not None:
            with self._lock:
                epoch = st.epoch
                if epoch is not None:
                    del epoch.tracked[id(st)]
                    st.epoch = None
        self._upstream.deallocate(block, cause)
        return 1

    def drain(self) -> None:
        """Free the blocks that finalizers queued (cause ``finalize``). Call with no lock held."""
        pending = self.pending
        deallocate = self._upstream.deallocate
        while pending:
            try:
                block = pending.popleft()
            except IndexError:  # another thread drained it in between
                return
            deallocate(block, _free_cause.FINALIZE)

    # -- epochs --------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """The number of open epochs."""
        return len(self._epochs)

    def open(self) -> Epoch:
        """Open an epoch (and its statistics epoch); return it."""
        with self._lock:
            epoch = Epoch(len(self._epochs))
            self._epochs.append(epoch)
            self._upstream.push()
            return epoch

    def close(self, keep: Iterable[Buffer], expected: Epoch | None) -> EpochStats:
        """Close the innermost epoch: free every storage it tracks except ``keep``'s.

        Args:
            keep: buffers whose storages move to the parent epoch (untracked at depth 0).
            expected: the epoch the caller opened (an arena scope), or ``None`` for any.

        Raises:
            TypeError, ValueError: ``keep`` is malformed (see :func:`keep_storages`); nothing
                changes.
            ArenaError: no epoch is open, or the innermost one is not ``expected``.
        """
        keep_ids = keep_storages(self, keep)  # validate before touching anything
        with self._lock:
            epochs = self._epochs
            if not epochs:
                raise ArenaError("arena_exit() called with no open arena; call arena_enter() first")
            epoch = epochs[-1]
            if expected is not None and epoch is not expected:
                raise ArenaError(
                    f"the arena scope at depth {expected.depth} exited while the epoch at depth"
                    f" {epoch.depth} is still open; scopes must close innermost first"
                )
            epochs.pop()
            parent = epochs[-1] if epochs else None
            cause = _free_cause.arena_exit(epoch.depth)
            blocks = []
            kept = kept_bytes = reclaimed_bytes = 0
            for ref in epoch.tracked.values():
                st = ref()
                if st is None or st.epoch is not epoch:
                    continue  # finalized mid-scope, or freed already
                if keep_ids and id(st) in keep_ids:
                    kept += 1
                    kept_bytes += st.nbytes
                    if parent is None:
                        st.epoch = None
                    else:
                        parent.track(st, ref)
                    continue
                st.epoch = None
                try:  # the claim, as in free()
                    blocks.append(st._cell.pop())
                except IndexError:  # freed by another thread meanwhile
                    continue
                st.cause = cause
                reclaimed_bytes += st.nbytes
            st = None
            epoch.tracked = {}
            self.reclaimed_buffers += len(blocks)
            self.reclaimed_bytes += reclaimed_bytes
            upstream = self._upstream
            upstream.deallocate_many(blocks, cause)
            counter = upstream.pop()
        return EpochStats(
            depth=epoch.depth,
            allocs=counter.allocs,
            reclaimed_buffers=len(blocks),
            reclaimed_bytes=reclaimed_bytes,
            kept_buffers=kept,
            kept_bytes=kept_bytes,
            peak_bytes=counter.peak_bytes,
        )

    def counters(self) -> tuple[int, int, int]:
        """``(depth, reclaimed_buffers, reclaimed_bytes)``, read together."""
        with self._lock:
            return len(self._epochs), self.reclaimed_buffers, self.reclaimed_bytes

    def __del__(self) -> None:
        # The allocator and its last storage are gone: the blocks still queued go upstream, so
        # that the caching layer, dropped right after, hands them back to the device. Nothing
        # can hold this layer's lock now; during interpreter shutdown the device may be gone.
        if self.pending and not sys.is_finalizing():
            self.drain()
