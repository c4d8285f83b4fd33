"""Mutants: the bugs the suites guard against, patched back in inside a death-test child.

Each suite runs at least one of these (DESIGN 4) and asserts that its own check catches it.
``apply(name)`` patches the allocator in the calling process only; call it in a child.
"""

from __future__ import annotations

from collections.abc import Callable

from allocator import Allocator, EpochStats, Storage, _snapshot
from allocator._arena import ArenaRegistry
from allocator._cache import CachingLayer
from allocator._detector import Detector
from allocator._free_cause import FINALIZE
from allocator._history import HistoryLayer, Recorder
from allocator.device.sim import SimDevice

_leaked: list = []


def _cache_ignores_cap() -> None:
    original = CachingLayer._put

    def put(self, block, evicted):
        cap, self.cap_bytes = self.cap_bytes, 0
        try:
            return original(self, block, evicted)
        finally:
            self.cap_bytes = cap

    CachingLayer._put = put


def _evict_without_wait() -> None:
    SimDevice.wait = lambda self, block: None


def _free_without_device_sync() -> None:
    # The simulator before cudaFree synchronized the device: a free waited only on the events
    # recorded on the block, and aborted if another stream's kernel still used it.
    SimDevice.free = SimDevice._release


def _exit_forgets_free() -> None:
    def close(self, keep, expected):
        with self._lock:
            epoch = self._epochs.pop()
            counter = self._upstream.pop()
        return EpochStats(epoch.depth, counter.allocs, 0, 0, 0, 0, counter.peak_bytes)

    ArenaRegistry.close = close


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
    def from_device(self, nbytes, stream):
        return self._upstream.allocate(nbytes, stream)

    CachingLayer._from_device = from_device


def _finalizer_frees_at_once() -> None:
    # The defect of issue 8: the finalizer runs the free path itself, wherever the collector
    # happens to run it (inside a device's or a layer's critical section included).
    def finalize(self):
        if self._cell:
            self._home.free(self, FINALIZE)

    Storage.__del__ = finalize


def _history_skips_free_completed() -> None:
    # A history that records a free's request but never its completion while the block waits
    # in the cache: PyTorch's trace then keeps counting the block (TOTAL MEM too high).
    # (a single free records its request through the general path, and never completes)
    Recorder.freed = lambda self, block, cause: self.free_requested((block,), cause) or False
    Recorder.returned = lambda self, blocks: None
    Recorder.returned_one = lambda self, block: None
    Recorder._complete_ready = lambda self, now, blocks=None: None


def _snapshot_counts_cache_as_live() -> None:
    # Cached blocks reported as allocated: _memory_viz stats' total_allocated is then too high.
    original = _snapshot.build

    def build(*args):
        snapshot = original(*args)
        for segment in snapshot["segments"]:
            for block in segment["blocks"]:
                block["state"] = "active_allocated"
            segment["allocated_size"] = segment["active_size"] = segment["total_size"]
        return snapshot

    _snapshot.build = build


def _finalizer_records_history() -> None:
    # A finalizer that records its free in the history itself (capturing a stack, taking the
    # history's lock) instead of only queueing the block: under the collector it re-enters
    # the recorder whose lock its own thread holds.
    def finalize(self):
        cell = self._cell
        if cell:
            block = cell.pop()
            upstream = self._home._upstream
            if isinstance(upstream, HistoryLayer):
                upstream._recorder.free_requested((block,), FINALIZE)
            self._home.pending.append(block)

    Storage.__del__ = finalize


MUTANTS: dict[str, Callable[[], None]] = {
    "cache_ignores_cap": _cache_ignores_cap,
    "evict_without_wait": _evict_without_wait,
    "free_without_device_sync": _free_without_device_sync,
    "exit_forgets_free": _exit_forgets_free,
    "detector_checks_only_sizes": _detector_checks_only_sizes,
    "sum_leaks_a_temporary": _sum_leaks_a_temporary,
    "no_oom_flush": _no_oom_flush,
    "finalizer_frees_at_once": _finalizer_frees_at_once,
    "history_skips_free_completed": _history_skips_free_completed,
    "snapshot_counts_cache_as_live": _snapshot_counts_cache_as_live,
    "finalizer_records_history": _finalizer_records_history,
}


def apply(name: str | None) -> None:
    """Patch mutant ``name`` in (``None``: nothing); ``"a+b"`` patches both ``a`` and ``b``.

    Raises:
        KeyError: no mutant has that name.
    """
    if name is not None:
        for part in name.split("+"):
            MUTANTS[part]()
