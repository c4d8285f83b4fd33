"""CuPy interop: let CuPy arrays draw their device memory from this allocator.

::

    import cupy
    import allocator
    from allocator.cuda import cupy_allocator

    cupy.cuda.set_allocator(cupy_allocator())   # the default allocator; DEVMEM_BACKEND=cuda
    x = cupy.ones(1 << 20, dtype=cupy.float32)  # counted in allocator.stats().live_bytes

Every CuPy allocation becomes a buffer of this allocator (rounded up to whole float32 elements),
so its statistics, its reuse cache and byte cap, and its arenas apply to CuPy arrays too: when
CuPy drops the memory, the buffer is finalized and its block goes back to the reuse cache at the
allocator's next call.

When the device is full even after the allocator collected cyclic garbage, flushed its cache and
retried (as CuPy's own pool does), the error raised is both a
:class:`~allocator.DeviceOutOfMemory` and a ``cupy.cuda.memory.OutOfMemoryError``, so CuPy's own
fallbacks (which catch the latter, e.g. to free a plan cache and retry) keep working.

Caveat: the use-after-free detector checks only this allocator's own ops. It cannot see CuPy's
kernels, so a CuPy array whose memory an ``arena_exit`` reclaimed is a silent use-after-free.
Allocate CuPy arrays outside arenas, or keep them (``keep=``) past the exit. The stream check
(``DEVMEM_STREAM_CHECK``) cannot see them either: it counts the memory it hands CuPy as written
on the allocator's current stream at the allocation, so that the allocator's own ops on another
stream are ordered after it (or reported).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ._allocator import Allocator
from ._default import get_allocator
from ._errors import DeviceOutOfMemory

__all__ = ["cupy_allocator", "cupy_out_of_memory"]


@functools.cache
def cupy_out_of_memory(cupy_oom: type) -> type:
    """The error type the interop raises: a :class:`~allocator.DeviceOutOfMemory` that is also
    ``cupy_oom`` (``cupy.cuda.memory.OutOfMemoryError``).

    Its message and fields are :class:`~allocator.DeviceOutOfMemory`'s; CuPy's ``_size``,
    ``_total`` and ``_limit`` are the requested bytes, the live bytes and 0. It pickles as a
    plain :class:`~allocator.DeviceOutOfMemory`, so a process without CuPy can read it.
    """

    class CupyDeviceOutOfMemory(DeviceOutOfMemory, cupy_oom):
        __doc__ = cupy_out_of_memory.__doc__

        def __init__(self, requested_bytes, stats, reason="") -> None:
            DeviceOutOfMemory.__init__(self, requested_bytes, stats, reason)
            self._size, self._total, self._limit = requested_bytes, stats.live_bytes, 0

        def __reduce__(self):
            return (DeviceOutOfMemory, (self.requested_bytes, self.stats, self.reason))

    CupyDeviceOutOfMemory.__module__ = __name__
    return CupyDeviceOutOfMemory


def cupy_allocator(alloc: Allocator | None = None) -> Callable[[int], object]:
    """A function for ``cupy.cuda.set_allocator`` that allocates from ``alloc``.

    Args:
        alloc: an allocator on the ``cuda`` backend; default the process-wide default
            allocator (configured by ``DEVMEM_BACKEND=cuda``).

    Returns:
        ``allocate(size_bytes) -> cupy.cuda.MemoryPointer``. The pointer's memory owns a
        buffer of ``ceil(size_bytes / 4)`` float32 elements; a request of 0 bytes gets a null
        pointer and allocates nothing. When the device is full even after the reuse cache was
        flushed it raises an error that is both a :class:`~allocator.DeviceOutOfMemory` and a
        ``cupy.cuda.memory.OutOfMemoryError`` (see :func:`cupy_out_of_memory`).

    Raises:
        ValueError: ``alloc`` is not on the ``cuda`` backend.
        BackendUnavailable: no ``alloc`` was given and the default allocator's backend cannot
            run here.
    """
    alloc = get_allocator() if alloc is None else alloc
    if alloc.backend != "cuda":
        raise ValueError(
            f"cupy_allocator needs an allocator on the cuda backend, got {alloc.backend!r}"
            " (set DEVMEM_BACKEND=cuda or pass Allocator(AllocatorConfig(backend='cuda')))"
        )
    cupy = alloc.device.xp
    device_id = alloc.device.device_id
    oom = cupy_out_of_memory(cupy.cuda.memory.OutOfMemoryError)

    def allocate(size: int):
        if size == 0:
            return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, device_id), 0)
        try:
            buf = alloc.empty((size + 3) // 4)
        except DeviceOutOfMemory as exc:
            raise oom(exc.requested_bytes, exc.stats, exc.reason) from None
        if alloc.device.stream_check is not None:
            # CuPy's kernels are not seen: its memory counts as written on the current stream
            # (where CuPy runs them) from the allocation on
            alloc.device.launch(alloc.current_stream(), buf.storage.block)
        memory = cupy.cuda.UnownedMemory(buf.storage.block.ptr, size, buf, device_id)
        return cupy.cuda.MemoryPointer(memory, 0)

    return allocate
