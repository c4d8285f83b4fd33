"""The allocator's exception types.

Each type says whose fault the error is, in the manner of trio:

- misuse by the caller: :class:`UseAfterFreeError`, :class:`SizeMismatchError`,
  :class:`ArenaError` (and plain :class:`ValueError`/:class:`TypeError` for bad arguments);
- a resource limit: :class:`DeviceOutOfMemory`;
- the environment: :class:`BackendUnavailable`.

Every error pickles, so a death-test child can report it to its parent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._stats import AllocatorStats

__all__ = [
    "AllocatorError",
    "ArenaError",
    "BackendUnavailable",
    "ConfigError",
    "DeviceOutOfMemory",
    "SizeMismatchError",
    "UseAfterFreeError",
]


class AllocatorError(Exception):
    """Base class of every error the allocator raises on purpose."""


class SizeMismatchError(AllocatorError, ValueError):
    """The operands of an element-wise op have different element counts.

    The message has the form ``buffer_add: size mismatch (16 vs 0)``. With the use-after-free
    detector off, a freed operand (size 0) surfaces as this error, as in the native original.
    """


class UseAfterFreeError(AllocatorError):
    """An op used a buffer whose block was already freed (``DEVMEM_ARENA_DEBUG=raise``).

    The message is exactly the detector's line, e.g.
    ``use-after-arena-free: buffer_add lhs was reclaimed by arena_exit at depth 0`` or
    ``use-after-release: buffer_add lhs was released by release()``.
    Source: the TorchLean arena detector
    (``../shared/seeds/torchlean-cuda-arena-and-cache-cap.txt``).
    """


class ArenaError(AllocatorError):
    """Arena misuse: ``arena_exit`` with no open arena, or scopes closed out of order."""


class ConfigError(AllocatorError, ValueError):
    """A ``DEVMEM_*`` variable holds a value the allocator cannot use.

    Raised at the default allocator's first use (the environment is read once per process), by
    the module-level function that the caller called. The message is one line naming the
    variable, its value and what is accepted, e.g.
    ``DEVMEM_BACKEND='gpu': expected one of cpu, sim, cuda``. A malformed
    ``DEVMEM_CACHE_CAP_BYTES`` is not an error: it warns and the cache stays unbounded.
    """


class BackendUnavailable(AllocatorError):
    """The requested backend cannot run here (no CuPy, no driver, no GPU); the message says why."""


class DeviceOutOfMemory(AllocatorError, MemoryError):
    """A device allocation failed even after flushing the reuse cache and retrying once.

    The message carries ``requested=<n> bytes live=<n> peak=<n> allocs=<n> frees=<n> cache=<n>
    device_free=<n> device_total=<n>`` (all byte counts in bytes) followed by the device's own
    reason in parentheses.

    Attributes:
        requested_bytes: the size of the allocation that failed, in bytes.
        stats: the allocator's :class:`~allocator.AllocatorStats` at the moment of failure.
        reason: the device's explanation of the last failure (e.g. ``capacity exhausted``).
    """

    def __init__(self, requested_bytes: int, stats: AllocatorStats, reason: str = "") -> None:
        self.requested_bytes = requested_bytes
        self.stats = stats
        self.reason = reason
        message = (
            f"out of device memory on {stats.backend}: requested={requested_bytes} bytes"
            f" live={stats.live_bytes} peak={stats.peak_bytes} allocs={stats.alloc_count}"
            f" frees={stats.free_count} cache={stats.cache_bytes}"
            f" device_free={stats.device_free_bytes} device_total={stats.device_total_bytes}"
        )
        if reason:
            message += f" ({reason})"
        # Not super(): the CuPy interop's subclass also derives from CuPy's OutOfMemoryError,
        # whose __init__ takes other arguments.
        Exception.__init__(self, message)

    def __reduce__(self):
        return (type(self), (self.requested_bytes, self.stats, self.reason))
