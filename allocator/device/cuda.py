"""The CUDA backend on CuPy (the ``cuda`` extra): real device blocks, events and kernels.

- Blocks come from ``cupy.cuda.runtime.malloc``/``free``; each is wrapped once, at allocation,
  as a float32 ``cupy.ndarray`` over the raw pointer (``UnownedMemory`` + ``MemoryPointer``), and
  the kernels are CuPy element-wise operations on those arrays.
- A block returned to the reuse cache records a ``cupy.cuda.Event(disable_timing=True)`` on the
  current stream. Events come from a pool: a block keeps its event while it cycles through the
  cache, and gives it back to the pool when the block is freed to the device.
- ``ready`` is ``event.done`` (never waits); ``wait`` is ``event.synchronize()``.
- Only an out-of-memory error (``cudaErrorMemoryAllocation``) becomes
  :class:`~allocator.device.DeviceAllocationError`, so the cache flushes and retries; every other
  CUDA error propagates as CuPy raised it, with its name.
- ``memory_info`` is ``runtime.memGetInfo()``.

Importing this module never touches CuPy. Building a :class:`CudaDevice` imports CuPy, checks for
a device, raises :class:`~allocator.BackendUnavailable` with CuPy's reason where there is none,
and calls ``harness.mark_fork_unsafe``: once CUDA is initialized, death tests must use the
forkserver or exec styles instead of forking this process.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np

from .._errors import BackendUnavailable
from .base import Block, Device, DeviceAllocationError

__all__ = ["CUDA_ERROR_MEMORY_ALLOCATION", "CudaBlock", "CudaDevice", "load_cupy"]

CUDA_ERROR_MEMORY_ALLOCATION = 2
"""``cudaErrorMemoryAllocation``: the one CUDA error that means "out of memory"."""


def load_cupy():
    """Import CuPy and check that it can reach a device.

    Returns:
        The ``cupy`` module.

    Raises:
        BackendUnavailable: CuPy is missing, or reports no driver or no device; the message
            carries CuPy's own reason (e.g. ``cudaErrorInsufficientDriver: ...``).
    """
    try:
        import cupy
    except ImportError as exc:
        raise BackendUnavailable(
            f"CuPy is not installed ({exc}); install devmem-harness[cuda]"
        ) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError, or a missing libcuda surfacing otherwise
        raise BackendUnavailable(f"CuPy cannot reach a CUDA device: {exc}") from None
    if count < 1:
        raise BackendUnavailable("CuPy reports no CUDA device")
    return cupy


class CudaBlock(Block):
    """A ``cudaMalloc`` allocation; ``ptr`` is the device address (0 once freed).

    A block that is garbage-collected while still allocated (an allocator dropped with blocks
    in its cache) is freed then, as CuPy frees its own memory; ``cudaFree`` synchronizes the
    device first.
    """

    __slots__ = ("_free", "ptr")

    def __init__(self, block_id: int, nbytes: int, array, ptr: int, free) -> None:
        super().__init__(block_id, nbytes, array)
        self.ptr = ptr
        self._free = free

    def __del__(self) -> None:
        if self.ptr:
            try:
                self._free(self.ptr)
            except Exception:
                pass  # at interpreter exit the driver may be gone: nothing left to free


class CudaDevice(Device):
    """The CUDA backend (``DEVMEM_BACKEND=cuda``) on the current CuPy device.

    Raises:
        BackendUnavailable: see :func:`load_cupy`.
    """

    name = "cuda"
    has_cache = True

    def __init__(self) -> None:
        cupy = load_cupy()
        import harness

        self.xp = cupy
        self._runtime = cupy.cuda.runtime
        self._device_id = cupy.cuda.runtime.getDevice()
        self._events: list = []
        self._events_lock = threading.Lock()
        self._ids = itertools.count(1)
        harness.mark_fork_unsafe(
            f"allocator: the cuda backend initialized CUDA on device {self._device_id}"
        )

    def after_fork_in_child(self) -> None:
        self._events_lock = threading.Lock()

    # -- blocks ------------------------------------------------------------------------------

    def malloc(self, nbytes: int) -> CudaBlock:
        """``cudaMalloc`` a block; :class:`DeviceAllocationError` on out-of-memory only."""
        cupy = self.xp
        try:
            ptr = self._runtime.malloc(nbytes)
        except cupy.cuda.runtime.CUDARuntimeError as exc:
            if getattr(exc, "status", None) != CUDA_ERROR_MEMORY_ALLOCATION:
                raise
            raise DeviceAllocationError(f"cudaMalloc({nbytes}): {exc}") from None
        try:
            memory = cupy.cuda.UnownedMemory(ptr, nbytes, None, self._device_id)
            array = cupy.ndarray(
                (nbytes // 4,), dtype=cupy.float32, memptr=cupy.cuda.MemoryPointer(memory, 0)
            )
        except BaseException:
            self._runtime.free(ptr)
            raise
        return CudaBlock(next(self._ids), nbytes, array, ptr, self._runtime.free)

    def free(self, block: CudaBlock) -> None:
        """``cudaFree`` the block (the cache has waited on its event); pool its event."""
        block.array = None
        ptr, block.ptr = block.ptr, 0
        self._runtime.free(ptr)
        event, block.event = block.event, None
        if event is not None:
            with self._events_lock:
                self._events.append(event)

    def memory_info(self) -> tuple[int, int]:
        free, total = self._runtime.memGetInfo()
        return int(free), int(total)

    # -- events ------------------------------------------------------------------------------

    def record(self, block: CudaBlock) -> None:
        event = block.event
        if event is None:
            with self._events_lock:
                event = self._events.pop() if self._events else None
            if event is None:
                event = self.xp.cuda.Event(disable_timing=True)
            block.event = event
        event.record()  # on the current stream, after every kernel launched so far

    def ready(self, block: CudaBlock) -> bool:
        event = block.event
        return event is None or event.done

    def wait(self, block: CudaBlock) -> None:
        event = block.event
        if event is not None:
            event.synchronize()

    def synchronize(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()

    # -- host transfers and readback ---------------------------------------------------------

    def upload(self, dst, host: np.ndarray) -> None:
        dst.set(np.ascontiguousarray(host))

    def download(self, src) -> np.ndarray:
        return src.get()

    def sum(self, src) -> float:
        return float(self.xp.sum(src, dtype=self.xp.float64))
