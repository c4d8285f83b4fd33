"""Arenas: allocation epochs that free everything allocated in them at exit, except a keep set.

Long pure loops keep every intermediate buffer reachable until the end, so reference counting
never frees them. An arena opens an epoch; every storage allocated while it is open is tracked,
and ``arena_exit(keep)`` frees the block of every tracked storage still alive, reachable or not,
except those of ``keep``, which are promoted to the parent epoch (at the outermost level they
become untracked, left to ordinary finalization). Source: TorchLean's ``withCudaArena``
(``../shared/seeds/torchlean-cuda-arena-and-cache-cap.txt``).

The registry holds weak references: a storage finalized mid-scope leaves a dead entry that the
exit walk skips, never a dangling one. The walk itself lives in the allocator, which owns the
locks and counters; this module holds the epoch records, the scope object and keep parsing.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ._buffer import Buffer
from ._errors import ArenaError
from ._stats import EpochStats

if TYPE_CHECKING:
    from ._allocator import Allocator

__all__ = ["ArenaScope", "Epoch", "buffers_in", "keep_storages"]


@dataclasses.dataclass(slots=True, eq=False)
class Epoch:
    """One open arena. Mutated only under the allocator's lock.

    Attributes:
        depth: 0 for the outermost epoch.
        refs: weak references to the storages it tracks (dead ones are skipped at exit).
        allocs: storages allocated while it was the innermost epoch.
        live_bytes: bytes of tracked storages whose blocks are live.
        peak_bytes: the most ``live_bytes`` seen, child peaks folded in.
    """

    depth: int
    refs: list[weakref.ref] = dataclasses.field(default_factory=list)
    allocs: int = 0
    live_bytes: int = 0
    peak_bytes: int = 0

    def closed(
        self, reclaimed: int, reclaimed_bytes: int, kept: int, kept_bytes: int
    ) -> EpochStats:
        """The :class:`EpochStats` of this epoch after its exit walk."""
        return EpochStats(
            depth=self.depth,
            allocs=self.allocs,
            reclaimed_buffers=reclaimed,
            reclaimed_bytes=reclaimed_bytes,
            kept_buffers=kept,
            kept_bytes=kept_bytes,
            peak_bytes=self.peak_bytes,
        )


def keep_storages(alloc: Allocator, keep: Iterable[Buffer]) -> set[int]:
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
        if st._alloc is not alloc:
            raise ValueError(f"keep[{i}] belongs to another allocator")
        if st.freed_by is not None:
            raise ValueError(f"keep[{i}] cannot be kept: it was already {st.freed_reason}")
        ids.add(id(st))
    return ids


def buffers_in(value: Any) -> list[Buffer]:
    """The buffers in a function's result: a Buffer, or those inside tuples, lists and dict
    values (searched recursively). Anything else holds none."""
    if isinstance(value, Buffer):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [buf for item in value for buf in buffers_in(item)]
    return []


class ArenaScope:
    """The context manager returned by ``arena()``: one epoch for the ``with`` block.

    Use :meth:`keep` inside the block to name the buffers to promote; at a normal exit the epoch
    exits keeping them, and after an exception it exits keeping nothing and the exception
    propagates. After the block, :attr:`stats` holds the epoch's :class:`EpochStats`.
    """

    __slots__ = ("_alloc", "_epoch", "_keep", "stats")

    def __init__(self, alloc: Allocator) -> None:
        self._alloc = alloc
        self._epoch: Epoch | None = None
        self._keep: list[Buffer] = []
        self.stats: EpochStats | None = None

    def keep(self, *buffers: Buffer) -> None:
        """Promote ``buffers`` to the parent epoch when the scope exits normally.

        Raises:
            TypeError: an argument is not a Buffer.
            ArenaError: the scope is not open.
        """
        if self._epoch is None:
            raise ArenaError("keep() called on an arena scope that is not open")
        for i, buf in enumerate(buffers):
            if not isinstance(buf, Buffer):
                raise TypeError(f"buffers[{i}] must be a Buffer, got {type(buf).__name__}")
        self._keep.extend(buffers)

    @property
    def depth(self) -> int | None:
        """The epoch's depth while the scope is open, else ``None``."""
        return None if self._epoch is None else self._epoch.depth

    def __enter__(self) -> ArenaScope:
        if self._epoch is not None or self.stats is not None:
            raise ArenaError("an arena scope can be entered only once")
        self._epoch = self._alloc._open_epoch()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        keep = () if exc_type is not None else self._keep
        epoch, self._epoch, self._keep = self._epoch, None, []
        try:
            self.stats = self._alloc._close_epoch(keep, expected=epoch)
        except (TypeError, ValueError):
            # A bad keep set must not leave the epoch open: close it keeping nothing, then
            # report the bad keep.
            self.stats = self._alloc._close_epoch((), expected=epoch)
            raise


def run_scoped(alloc: Allocator, fn: Callable[..., Any], args, kwargs) -> Any:
    """Call ``fn`` inside a fresh arena of ``alloc`` and keep the buffers it returns."""
    with ArenaScope(alloc) as scope:
        result = fn(*args, **kwargs)
        scope.keep(*buffers_in(result))
    return result
