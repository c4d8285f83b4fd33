"""Mutants: the bugs the suites guard against, patched back in inside a death-test child.

Each suite runs at least one of these (DESIGN 4) and asserts that its own check catches it.
``apply(name)`` patches the allocator in the calling process only; call it in a child.
"""

from __future__ import annotations

from collections.abc import Callable

from allocator import Allocator, DeviceOutOfMemory, EpochStats
from allocator._cache import ReuseCache
from allocator._detector import Detector
from allocator.device import DeviceAllocationError
from allocator.device.sim import SimDevice

_leaked: list = []


def _cache_ignores_cap() -> None:
    original = ReuseCache.put

    def put(self, block):
        cap, self.cap_bytes = self.cap_bytes, 0
        try:
            return original(self, block)
        finally:
            self.cap_bytes = cap

    ReuseCache.put = put


def _evict_without_wait() -> None:
    SimDevice.wait = lambda self, block: None


def _exit_forgets_free() -> None:
    def close(self, keep, expected):
        with self._lock:
            epoch = self._epochs.pop()
        return EpochStats(epoch.depth, epoch.allocs, 0, 0, 0, 0, epoch.peak_bytes)

    Allocator._close_epoch = close


def _detector_checks_only_sizes() -> None:
    original = Detector.__init__

    def init(self, owner, mode):
        original(self, owner, mode)
        self.on = False

    Detector.__init__ = init


def _sum_leaks_a_temporary() -> None:
    original = Allocator.sum

    def leaky_sum(self, a):
        _leaked.append(self.copy(a))  # a scratch copy that nothing ever frees
        return original(self, a)

    Allocator.sum = leaky_sum


def _no_oom_flush() -> None:
    def malloc(self, nbytes):
        try:
            return self.device.malloc(nbytes)
        except DeviceAllocationError as exc:
            raise DeviceOutOfMemory(nbytes, self.stats(), str(exc)) from None

    Allocator._malloc = malloc


MUTANTS: dict[str, Callable[[], None]] = {
    "cache_ignores_cap": _cache_ignores_cap,
    "evict_without_wait": _evict_without_wait,
    "exit_forgets_free": _exit_forgets_free,
    "detector_checks_only_sizes": _detector_checks_only_sizes,
    "sum_leaks_a_temporary": _sum_leaks_a_temporary,
    "no_oom_flush": _no_oom_flush,
}


def apply(name: str | None) -> None:
    """Patch mutant ``name`` in (``None``: nothing).

    Raises:
        KeyError: no mutant has that name.
    """
    if name is not None:
        MUTANTS[name]()
