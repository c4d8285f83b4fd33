"""Arena scopes: the ``with alloc.arena() as scope:`` context manager and ``run_in_arena``.

What it adds over the arena registry (:mod:`allocator._arena`): a scope opens one epoch on
entry and closes it on exit, keeping what ``scope.keep`` named; after an exception it keeps
nothing and the exception propagates. ``run_in_arena`` keeps the buffers a function returns.

Imports run one way: the allocator (:mod:`allocator._allocator`) imports this module, and this
module knows nothing of it. A scope opens and closes its epoch through the :class:`EpochHost`
protocol below, which the allocator satisfies with its ``_open_epoch``/``_close_epoch``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from ._buffer import Buffer
from ._errors import ArenaError
from ._stats import EpochStats

if TYPE_CHECKING:
    from ._arena import Epoch

__all__ = ["ArenaScope", "EpochHost", "buffers_in", "run_scoped"]


class EpochHost(Protocol):
    """What a scope needs of its allocator (an :class:`~allocator.Allocator`; a protocol, so
    that this module need not import the allocator's)."""

    def _open_epoch(self) -> Epoch:
        """Open a new innermost arena epoch and return it."""

    def _close_epoch(self, keep: Iterable[Buffer], expected: Epoch | None) -> EpochStats:
        """Close the innermost epoch (which must be ``expected``), keeping ``keep``.

        Raises:
            TypeError, ValueError: a bad keep set.
        """


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
    propagates. A keep set that turns out bad at the exit (a buffer freed meanwhile) still
    closes the epoch, keeping nothing, then raises. After the block, :attr:`stats` holds the
    epoch's :class:`EpochStats`.
    """

    __slots__ = ("_alloc", "_epoch", "_keep", "stats")

    def __init__(self, alloc: EpochHost) -> None:
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
            # A bad keep set must not leave the epoch open: close it keeping nothing (still only
            # if it is the innermost one), then report the bad keep.
            self.stats = self._alloc._close_epoch((), expected=epoch)
            raise


def run_scoped(alloc: EpochHost, fn: Callable[..., Any], args, kwargs) -> Any:
    """Call ``fn`` inside a fresh arena of ``alloc`` and keep the buffers it returns."""
    with ArenaScope(alloc) as scope:
        result = fn(*args, **kwargs)
        scope.keep(*buffers_in(result))
    return result
