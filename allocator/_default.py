"""The process-wide default allocator and the module-level functions that act on it.

The default allocator is built at first use from :func:`~allocator.default_config` (the
environment, read once). A forked child drops it and builds its own from its own environment at
its first call, so death-test children configured through ``env`` see their settings. Buffers the
child inherited from the parent keep pointing at the parent's allocator object.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ._allocator import Allocator
from ._buffer import Buffer
from ._errors import ConfigError
from ._history import DEFAULT_MAX_ENTRIES
from ._per_process import PerProcess
from ._scope import ArenaScope
from ._snapshot import LiveBlock
from ._stats import AllocatorStats, EpochStats
from .device.stream import Event, Stream

__all__ = [
    "add",
    "arena",
    "arena_enter",
    "arena_exit",
    "copy",
    "current_stream",
    "default_stream",
    "dump_snapshot",
    "empty",
    "empty_cache",
    "fma",
    "from_numpy",
    "full",
    "get_allocator",
    "history",
    "live_blocks",
    "mul",
    "new_event",
    "new_stream",
    "record_history",
    "release",
    "run_in_arena",
    "snapshot",
    "stats",
    "sum",
    "to_numpy",
    "use_stream",
    "zeros",
]

_default: PerProcess[Allocator] = PerProcess(Allocator)


def get_allocator() -> Allocator:
    """The process-wide default allocator, built from the environment at the first call.

    Raises:
        ConfigError: (a ``ValueError``) a ``DEVMEM_*`` variable holds a value it cannot use.
        BackendUnavailable: ``DEVMEM_BACKEND`` names a backend that cannot run here.
    """
    return _get()


def _get() -> Allocator:
    """The default allocator; a bad ``DEVMEM_*`` value is raised from here, so its traceback
    shows the caller's line and the one-line message, not the configuration's internals."""
    try:
        return _default.get()
    except ConfigError as exc:
        raise exc.with_traceback(None) from None


def _on_default(method: Callable) -> Callable[[Callable], Callable]:
    """Give a module-level function the docstring of the Allocator method it forwards to."""

    def decorate(fn: Callable) -> Callable:
        fn.__doc__ = f"On the default allocator: {method.__doc__}"
        return fn

    return decorate


@_on_default(Allocator.empty)
def empty(n: int) -> Buffer:
    return _get().empty(n)


@_on_default(Allocator.full)
def full(n: int, value: float) -> Buffer:
    return _get().full(n, value)


@_on_default(Allocator.zeros)
def zeros(n: int) -> Buffer:
    return _get().zeros(n)


@_on_default(Allocator.from_numpy)
def from_numpy(a: np.ndarray) -> Buffer:
    return _get().from_numpy(a)


@_on_default(Allocator.to_numpy)
def to_numpy(a: Buffer) -> np.ndarray:
    return _get().to_numpy(a)


@_on_default(Allocator.add)
def add(a: Buffer, b: Buffer) -> Buffer:
    return _get().add(a, b)


@_on_default(Allocator.mul)
def mul(a: Buffer, b: Buffer) -> Buffer:
    return _get().mul(a, b)


@_on_default(Allocator.fma)
def fma(a: Buffer, b: Buffer, c: Buffer) -> Buffer:
    return _get().fma(a, b, c)


@_on_default(Allocator.sum)
def sum(a: Buffer) -> float:
    return _get().sum(a)


@_on_default(Allocator.copy)
def copy(a: Buffer) -> Buffer:
    return _get().copy(a)


@_on_default(Allocator.release)
def release(buf: Buffer) -> int:
    return _get().release(buf)


@_on_default(Allocator.stats)
def stats() -> AllocatorStats:
    return _get().stats()


@_on_default(Allocator.empty_cache)
def empty_cache() -> int:
    return _get().empty_cache()


@_on_default(Allocator.arena_enter)
def arena_enter() -> int:
    return _get().arena_enter()


@_on_default(Allocator.arena_exit)
def arena_exit(keep: Iterable[Buffer] = ()) -> EpochStats:
    return _get().arena_exit(keep)


@_on_default(Allocator.arena)
def arena() -> ArenaScope:
    return _get().arena()


@_on_default(Allocator.run_in_arena)
def run_in_arena(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return _get().run_in_arena(fn, *args, **kwargs)


@_on_default(Allocator.new_stream)
def new_stream(name: str | None = None) -> Stream:
    return _get().new_stream(name)


@_on_default(Allocator.new_event)
def new_event() -> Event:
    return _get().new_event()


def default_stream() -> Stream:
    """The default allocator's default stream (see :attr:`Allocator.default_stream`)."""
    return _get().default_stream


@_on_default(Allocator.current_stream)
def current_stream() -> Stream:
    return _get().current_stream()


@_on_default(Allocator.use_stream)
def use_stream(stream: Stream):
    return _get().use_stream(stream)


@_on_default(Allocator.record_history)
def record_history(
    enabled: bool = True, *, max_entries: int = DEFAULT_MAX_ENTRIES, stacks: bool = True
) -> None:
    _get().record_history(enabled, max_entries=max_entries, stacks=stacks)


@_on_default(Allocator.history)
def history(
    *, max_entries: int = DEFAULT_MAX_ENTRIES, stacks: bool = True
) -> contextlib.AbstractContextManager[Allocator]:
    return _get().history(max_entries=max_entries, stacks=stacks)


@_on_default(Allocator.snapshot)
def snapshot() -> dict:
    return _get().snapshot()


@_on_default(Allocator.dump_snapshot)
def dump_snapshot(path: str | os.PathLike) -> None:
    _get().dump_snapshot(path)


@_on_default(Allocator.live_blocks)
def live_blocks() -> list[LiveBlock]:
    return _get().live_blocks()
