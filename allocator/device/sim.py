"""The simulated device: host memory that behaves like a GPU's.

What it adds over the CPU stub:

- a capacity: an allocation past ``capacity_bytes`` fails like ``cudaMalloc`` does;
- completion events on a logical stream clock. The host clock ``now_us`` advances only when the
  host waits (``wait``, ``synchronize``, a readback) or when a test calls :meth:`advance`. A
  kernel launched at host time t on the in-order stream completes at
  ``max(t, previous kernel's completion) + latency_us``. With a latency of 0 every kernel is
  complete at once;
- a fatal check: freeing a block while a kernel that used it is still in flight aborts the
  process naming the block, which is how CI proves that the reuse cache waits on completion
  events before it frees;
- failure injection for tests: :meth:`fail_next_mallocs`.

Its lock is re-entrant and its critical sections allocate nothing (see :mod:`allocator._locks`),
so a finalizer or another callback can neither run inside one nor deadlock on it.

Kernels run eagerly on NumPy arrays; only the timing is simulated.
"""

from __future__ import annotations

import itertools

from .. import _locks
from .base import Block, Device, DeviceAllocationError, fatal, host_array

__all__ = ["SimBlock", "SimDevice"]


class SimBlock(Block):
    """A simulated device block. ``busy_until`` is the completion time (logical microseconds) of
    the last kernel that used it; ``event`` is the time at which its recorded event completes."""

    __slots__ = ("busy_until",)

    def __init__(self, block_id: int, nbytes: int, array) -> None:
        super().__init__(block_id, nbytes, array)
        self.busy_until = 0
        self.event = 0


class SimDevice(Device):
    """The simulated device backend (``DEVMEM_BACKEND=sim``).

    Args:
        capacity_bytes: the device's size in bytes (accounting only; blocks are host memory).
        latency_us: logical microseconds from a kernel's start to its completion; >= 0.

    Raises:
        ValueError: ``capacity_bytes`` < 1 or ``latency_us`` < 0.
    """

    name = "sim"
    has_cache = True

    def __init__(self, capacity_bytes: int, latency_us: int = 0) -> None:
        if capacity_bytes < 1:
            raise ValueError(f"capacity_bytes must be >= 1, got {capacity_bytes}")
        if latency_us < 0:
            raise ValueError(f"latency_us must be >= 0, got {latency_us}")
        self.capacity_bytes = capacity_bytes
        self.latency_us = latency_us
        self.used_bytes = 0
        self.now_us = 0
        self.tail_us = 0
        self._fail_next = 0
        self._ids = itertools.count(1)
        self._lock = _locks.new_lock(self, _locks.BACKEND)

    # -- allocation --------------------------------------------------------------------------

    def fail_next_mallocs(self, count: int = 1) -> None:
        """Make the next ``count`` allocations fail as if the device were full.

        Raises:
            ValueError: ``count`` is negative.
        """
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        with self._lock:
            self._fail_next = count

    def malloc(self, nbytes: int) -> SimBlock:
        """Allocate a block, or raise :class:`DeviceAllocationError` when the capacity (or an
        injected failure) says no."""
        with self._lock:  # allocates nothing: the error is built once the lock is released
            injected = self._fail_next > 0
            if injected:
                self._fail_next -= 1
            free = self.capacity_bytes - self.used_bytes
            fits = not injected and nbytes <= free
            if fits:
                self.used_bytes += nbytes
                block_id = next(self._ids)
        if injected:
            raise DeviceAllocationError("sim: injected allocation failure")
        if not fits:
            raise DeviceAllocationError(
                f"sim: {nbytes} bytes requested, {free} of {self.capacity_bytes} free"
            )
        try:
            array = host_array(nbytes)
        except DeviceAllocationError:
            with self._lock:
                self.used_bytes -= nbytes
            raise
        return SimBlock(block_id, nbytes, array)

    def free(self, block: SimBlock) -> None:
        """Free ``block``; abort the process if a kernel using it is still in flight."""
        if block.busy_until > self.now_us:
            fatal(
                f"devmem sim: fatal: free of block #{block.id} ({block.nbytes} bytes) while a"
                f" kernel using it is still in flight (completes at t={block.busy_until}us,"
                f" now t={self.now_us}us)"
            )
        with self._lock:
            self.used_bytes -= block.nbytes
        block.array = None

    def memory_info(self) -> tuple[int, int]:
        return self.capacity_bytes - self.used_bytes, self.capacity_bytes

    # -- the logical stream clock ------------------------------------------------------------

    def launch(self, *blocks: SimBlock) -> None:
        latency = self.latency_us
        if not latency:
            return
        with self._lock:
            start = self.now_us if self.now_us > self.tail_us else self.tail_us
            done = start + latency
            self.tail_us = done
        for block in blocks:
            block.busy_until = done

    def record(self, block: SimBlock) -> None:
        block.event = self.tail_us

    def ready(self, block: SimBlock) -> bool:
        return block.event <= self.now_us

    def wait(self, block: SimBlock) -> None:
        with self._lock:
            if block.event > self.now_us:
                self.now_us = block.event

    def synchronize(self) -> None:
        with self._lock:
            if self.tail_us > self.now_us:
                self.now_us = self.tail_us

    def download(self, src):
        self.synchronize()
        return super().download(src)

    def sum(self, src) -> float:
        self.synchronize()
        return super().sum(src)

    def advance(self, microseconds: int) -> None:
        """Let ``microseconds`` of host time pass (so in-flight kernels may complete).

        Raises:
            ValueError: ``microseconds`` is negative.
        """
        if microseconds < 0:
            raise ValueError(f"microseconds must be >= 0, got {microseconds}")
        with self._lock:
            self.now_us += microseconds
