"""What a backend is: the raw device under the allocator.

A :class:`Device` allocates and frees blocks, records and queries each block's completion event,
and exposes an array module (``xp``: NumPy or CuPy) whose element-wise operations are the
kernels. It keeps no cache and no statistics: those are the allocator's layers above it.

Order of operations, the contract every backend keeps:

1. ``malloc`` either returns a block or raises :class:`DeviceAllocationError`; it never returns a
   partly made block.
2. ``launch(*blocks)`` is called before a kernel that reads or writes those blocks runs.
3. ``record(block)`` is called when a block is returned to the reuse cache: it records the
   block's completion event on the stream, after every kernel launched so far.
4. ``ready(block)`` says whether that event has completed, without waiting.
   ``wait(block)`` blocks until it has.
5. ``free(block)`` hands the block back. The reuse cache calls it only after ``wait(block)``;
   the simulator aborts the process if a block is freed while a kernel using it is in flight.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

import numpy as np

__all__ = [
    "Block",
    "Device",
    "DeviceAllocationError",
    "fatal",
    "fork_unsafe_reason",
    "host_array",
    "mark_fork_unsafe",
]


class DeviceAllocationError(Exception):
    """A device allocation failed (the equivalent of ``cudaErrorMemoryAllocation``).

    Internal to the allocator: the reuse cache reacts by flushing and retrying once, then raises
    :class:`~allocator.DeviceOutOfMemory`. The message is the device's reason.
    """


class Block:
    """One device allocation of ``nbytes`` bytes holding ``nbytes // 4`` float32 elements.

    Attributes:
        nbytes: the block's size in bytes (a multiple of 4).
        array: the whole block as a 1-D float32 array of the device's ``xp`` module.
        event: the completion event recorded when the block was last returned to the cache
            (backend-specific; ``None`` until then).
        id: a number unique per device, used in diagnostics (``block #7``).
    """

    __slots__ = ("array", "event", "id", "nbytes")

    def __init__(self, block_id: int, nbytes: int, array) -> None:
        self.id = block_id
        self.nbytes = nbytes
        self.array = array
        self.event = None

    def __repr__(self) -> str:
        return f"<Block #{self.id} {self.nbytes} bytes>"


class Device:
    """The interface every backend implements; see the module docstring for the order of calls.

    Attributes:
        name: the backend's name (``"cpu"``, ``"sim"``, ``"cuda"``).
        has_cache: whether the allocator keeps a reuse cache over this device. The CPU stub
            keeps none, as in the original.
        xp: the array module (NumPy or CuPy) whose ufuncs are the kernels.
    """

    name: str = ""
    has_cache: bool = True
    xp: ModuleType = np

    def malloc(self, nbytes: int) -> Block:
        """Allocate a block of ``nbytes`` bytes; raise :class:`DeviceAllocationError` if none."""
        raise NotImplementedError

    def free(self, block: Block) -> None:
        """Hand ``block`` back to the device."""
        raise NotImplementedError

    def launch(self, *blocks: Block) -> None:
        """A kernel that uses ``blocks`` is about to run on the stream (bookkeeping only)."""

    def record(self, block: Block) -> None:
        """Record ``block.event`` on the stream, after every kernel launched so far."""

    def ready(self, block: Block) -> bool:
        """Whether ``block.event`` has completed. Never waits."""
        return True

    def wait(self, block: Block) -> None:
        """Block the host until ``block.event`` has completed."""

    def synchronize(self) -> None:
        """Block the host until every kernel launched so far has completed."""

    def memory_info(self) -> tuple[int, int]:
        """``(free_bytes, total_bytes)`` of the device; ``(0, 0)`` where it has no such notion."""
        return 0, 0

    # Kernels: element-wise operations of ``xp`` writing into a fresh output array.

    def fill(self, out, value: float) -> None:
        """Set every element of ``out`` to ``value``."""
        out.fill(value)

    def add(self, out, a, b) -> None:
        """``out = a + b`` element-wise."""
        self.xp.add(a, b, out=out)

    def mul(self, out, a, b) -> None:
        """``out = a * b`` element-wise."""
        self.xp.multiply(a, b, out=out)

    def fma(self, out, a, b, c) -> None:
        """``out = a * b + c`` element-wise (``out`` never aliases ``c``)."""
        self.xp.multiply(a, b, out=out)
        self.xp.add(out, c, out=out)

    def copy(self, out, a) -> None:
        """``out = a``."""
        self.xp.copyto(out, a)

    def upload(self, dst, host: np.ndarray) -> None:
        """Copy the host array ``host`` into the device array ``dst`` (same length)."""
        dst[...] = host

    def download(self, src) -> np.ndarray:
        """Copy the device array ``src`` to a new host float32 array (synchronous)."""
        return np.array(src, dtype=np.float32, copy=True)

    def sum(self, src) -> float:
        """The sum of the device array ``src`` as a Python float, accumulated in float64
        (a readback: synchronous)."""
        return float(np.sum(src, dtype=np.float64))


def _host_memory_bytes() -> int:
    """The machine's physical memory in bytes (0 if the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


_HOST_BYTES = _host_memory_bytes()


def host_array(nbytes: int) -> np.ndarray:
    """An uninitialized host float32 array of ``nbytes`` bytes, as a device would allocate it.

    Raises:
        DeviceAllocationError: the request exceeds the machine's physical memory (refused up
            front, so that an overcommitting kernel cannot let a later fill kill the process)
            or NumPy cannot allocate it.
    """
    if _HOST_BYTES and nbytes > _HOST_BYTES:
        raise DeviceAllocationError(
            f"{nbytes} bytes exceeds the host's physical memory ({_HOST_BYTES} bytes)"
        )
    try:
        return np.empty(nbytes // 4, dtype=np.float32)
    except (MemoryError, ValueError) as exc:
        raise DeviceAllocationError(f"host allocation of {nbytes} bytes failed: {exc}") from None


def fatal(message: str) -> None:
    """Write ``message`` to file descriptor 2 as one line and abort the process (SIGABRT).

    Used for errors that, as in the native original, cannot be caught in-process.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os.write(2, (message + "\n").encode("utf-8", "replace"))
    os.abort()


_fork_unsafe: list[str] = []


def mark_fork_unsafe(reason: str) -> None:
    """Record that a backend did something a forked child cannot inherit (initialized CUDA).

    Args:
        reason: why, for :func:`fork_unsafe_reason` (recorded once).
    """
    if reason not in _fork_unsafe:
        _fork_unsafe.append(reason)


def fork_unsafe_reason() -> str | None:
    """Why forking this process is unsafe because of the allocator, or ``None`` if it is not.

    Returns:
        The reasons backends recorded, joined by ``"; "`` (e.g. ``"allocator: the cuda backend
        initialized CUDA on device 0"``), or ``None``. A forked child inherits them. The
        project's ``conftest.py`` hands this function to ``harness.add_fork_safety_check``, so
        death tests refuse to fork such a process; the allocator itself never imports the
        harness.
    """
    return "; ".join(_fork_unsafe) or None
