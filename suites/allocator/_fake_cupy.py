"""A stand-in for CuPy over NumPy, to exercise the ``cuda`` backend's logic without a GPU.

It models only what :mod:`allocator.device.cuda` relies on, after CuPy's documented API:
``cuda.runtime.malloc/free/memGetInfo/getDeviceCount/getDevice`` and ``CUDARuntimeError``
(with ``status``), ``cuda.Event(disable_timing=True)`` (``record``, ``done``,
``synchronize``), ``cuda.UnownedMemory``, ``cuda.MemoryPointer``, ``cuda.get_current_stream``,
``ndarray(shape, dtype, memptr=...)`` over a device pointer with ``set``/``get``/``fill``, and
the element-wise functions. Device memory is host NumPy memory.

Kernels stay in flight on the one stream until the host waits: an event recorded after them
completes when it is synchronized, or after it has been queried ``latency`` times; a stream
synchronize or a readback completes everything. Freeing a pointer that an in-flight kernel uses
is recorded in ``FakeCuda.violations`` (the real GPU would corrupt memory silently).

Nothing here is a claim about real CUDA timing; it checks the order of operations only.
"""

from __future__ import annotations

import sys
import types

import numpy as np

OUT_OF_MEMORY = 2
ILLEGAL_ADDRESS = 700
_NAMES = {
    OUT_OF_MEMORY: "cudaErrorMemoryAllocation: out of memory",
    ILLEGAL_ADDRESS: "cudaErrorIllegalAddress: an illegal memory access was encountered",
    100: "cudaErrorNoDevice: no CUDA-capable device is detected",
}


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__(_NAMES.get(status, f"cudaError {status}"))


class FakeCuda:
    """The fake device's state; :func:`install` builds one and the ``cupy`` module over it."""

    def __init__(self, total_bytes: int, device_count: int, latency: int) -> None:
        self.total = total_bytes
        self.device_count = device_count
        self.latency = latency
        self.memory: dict[int, np.ndarray] = {}
        self.next_ptr = 1 << 20
        self.in_flight: set[int] = set()
        self.violations: list[int] = []
        self.fail_next: list[int] = []
        self.events_made = 0
        self.mallocs = 0
        self.frees = 0

    # runtime
    def malloc(self, size: int) -> int:
        if self.fail_next:
            raise CUDARuntimeError(self.fail_next.pop(0))
        if size > self.total - sum(m.nbytes for m in self.memory.values()):
            raise CUDARuntimeError(OUT_OF_MEMORY)
        ptr, self.next_ptr = self.next_ptr, self.next_ptr + size + 256
        self.memory[ptr] = np.zeros(size, dtype=np.uint8)
        self.mallocs += 1
        return ptr

    def free(self, ptr: int) -> None:
        if ptr in self.in_flight:
            self.violations.append(ptr)
        del self.memory[ptr]
        self.frees += 1

    def launch(self, *arrays) -> None:
        for array in arrays:
            ptr = getattr(array, "_ptr", None)
            if ptr is not None:
                self.in_flight.add(ptr)

    def synchronize(self) -> None:
        self.in_flight.clear()


def install(total_bytes: int = 1 << 24, device_count: int = 1, latency: int = 0) -> FakeCuda:
    """Put a fake ``cupy`` in ``sys.modules`` and return its state. Call it in a child."""
    fake = FakeCuda(total_bytes, device_count, latency)

    class FakeArray(np.ndarray):
        _ptr: int | None = None

        def __array_finalize__(self, obj) -> None:
            self._ptr = getattr(obj, "_ptr", None)

        def fill(self, value) -> None:
            fake.launch(self)
            np.ndarray.fill(self, value)

        def set(self, host) -> None:
            fake.launch(self)
            self[...] = host

        def get(self) -> np.ndarray:
            fake.synchronize()
            return np.array(self)

    class Event:
        def __init__(self, disable_timing: bool = False) -> None:
            assert disable_timing, "the backend must pool timing-free events"
            fake.events_made += 1
            self._pending: set[int] = set()
            self._queries = 0

        def record(self, stream=None) -> None:
            self._pending = set(fake.in_flight)
            self._queries = 0

        @property
        def done(self) -> bool:
            self._queries += 1
            if self._queries > fake.latency:
                fake.in_flight.difference_update(self._pending)
                self._pending = set()
            return not (self._pending & fake.in_flight)

        def synchronize(self) -> None:
            fake.in_flight.difference_update(self._pending)
            self._pending = set()

    class UnownedMemory:
        def __init__(self, ptr: int, size: int, owner, device_id: int = -1) -> None:
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

    class MemoryPointer:
        def __init__(self, mem, offset: int) -> None:
            self.mem, self.ptr = mem, mem.ptr + offset

    class Stream:
        def synchronize(self) -> None:
            fake.synchronize()

    def ndarray(shape, dtype, memptr):
        count = int(np.prod(shape))
        raw = fake.memory[memptr.mem.ptr]
        array = np.frombuffer(raw, dtype=dtype, count=count).reshape(shape).view(FakeArray)
        array._ptr = memptr.mem.ptr
        return array

    def _ufunc(func):
        def kernel(*arrays, out=None, **kwargs):
            fake.launch(*arrays, out)
            return func(*arrays, out=out, **kwargs)

        return kernel

    def copyto(dst, src) -> None:
        fake.launch(dst, src)
        np.copyto(dst, src)

    def total(array, dtype=None):
        fake.synchronize()  # a reduction read back by float(): synchronous
        return np.sum(np.asarray(array), dtype=dtype)

    def get_device_count() -> int:
        if fake.device_count < 1:
            raise CUDARuntimeError(100)
        return fake.device_count

    runtime = types.SimpleNamespace(
        CUDARuntimeError=CUDARuntimeError,
        malloc=fake.malloc,
        free=fake.free,
        memGetInfo=lambda: (fake.total - sum(m.nbytes for m in fake.memory.values()), fake.total),
        getDeviceCount=get_device_count,
        getDevice=lambda: 0,
    )
    cuda = types.SimpleNamespace(
        runtime=runtime,
        Event=Event,
        UnownedMemory=UnownedMemory,
        MemoryPointer=MemoryPointer,
        get_current_stream=Stream,
    )
    module = types.ModuleType("cupy")
    module.__dict__.update(
        cuda=cuda,
        ndarray=ndarray,
        float32=np.float32,
        float64=np.float64,
        add=_ufunc(np.add),
        multiply=_ufunc(np.multiply),
        copyto=copyto,
        sum=total,
        _fake=fake,
    )
    sys.modules["cupy"] = module
    return fake
