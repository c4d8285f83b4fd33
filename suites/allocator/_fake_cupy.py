"""A stand-in for CuPy over NumPy, to exercise the ``cuda`` backend's logic without a GPU.

It models only what :mod:`allocator.device.cuda` relies on, after CuPy 14's documented API:
``cuda.runtime.malloc/free/memGetInfo/getDeviceCount/getDevice/setDevice`` and
``CUDARuntimeError`` (with ``status``), ``cuda.Device(id)`` as a context manager,
``cuda.Event(disable_timing=True)`` (``record(stream)``, ``done``, ``synchronize``),
``cuda.Stream`` (``Stream.null``, ``Stream(non_blocking=True)``, ``with stream:``, ``done``,
``synchronize``, ``wait_event``), ``cuda.UnownedMemory``, ``cuda.MemoryPointer``,
``cuda.get_current_stream``, ``cuda.Device(id).synchronize``,
``cuda.memory.OutOfMemoryError``, ``ndarray(shape, dtype, memptr=...)`` over a device pointer
with ``set``/``get``/``fill``, ``zeros``, ``ElementwiseKernel`` (only the availability probe's
kernel) and the element-wise functions. Device memory is host NumPy memory.

Every pointer belongs to the device that was current when it was allocated. A free, a kernel or
an event operation while another device is current is recorded in ``FakeCuda.wrong_device``
(real CUDA would fail, or touch the wrong device). ``install(nvrtc=False)`` makes every
``ElementwiseKernel`` fail at its first call, as CuPy does on a host without NVRTC.

Kernels stay in flight on the stream that was current when they ran, until the host waits: an
event recorded on a stream after them completes when it is synchronized, or after it has been
queried ``latency`` times; a stream's synchronize, or a readback, completes that stream's
kernels; ``Device(id).synchronize()`` completes every stream's. Freeing a pointer that an
in-flight kernel (of any stream) uses is recorded in ``FakeCuda.violations`` (the real GPU
would corrupt memory silently). Every event record, stream wait and kernel's stream is logged
(``FakeCuda.log``), for checks of which stream the backend used.

Nothing here is a claim about real CUDA timing; it checks the order of operations only.
"""

from __future__ import annotations

import sys
import types

import numpy as np

OUT_OF_MEMORY = 2
ILLEGAL_ADDRESS = 700
NVRTC_MISSING = (
    "CuPy failed to load libnvrtc.so.12: OSError: libnvrtc.so.12: cannot open shared object"
    " file: No such file or directory"
)
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

    def __init__(
        self, total_bytes: int, device_count: int, latency: int, nvrtc: bool, current: int
    ) -> None:
        self.total = total_bytes
        self.device_count = device_count
        self.latency = latency
        self.nvrtc = nvrtc
        self.current = current
        self.memory: dict[int, np.ndarray] = {}
        self.device_of: dict[int, int] = {}
        self.wrong_device: list[tuple[str, int]] = []
        self.next_ptr = 1 << 20
        self.in_flight: dict[object, set[int]] = {}
        self.stream = None  # the current stream (the null stream once installed)
        self.log: list[tuple] = []
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
        self.device_of[ptr] = self.current
        self.mallocs += 1
        return ptr

    def free(self, ptr: int) -> None:
        if any(ptr in ptrs for ptrs in self.in_flight.values()):
            self.violations.append(ptr)
        self.check_device("free", self.device_of.pop(ptr))
        del self.memory[ptr]
        self.frees += 1

    def check_device(self, what: str, device: int) -> None:
        if device != self.current:
            self.wrong_device.append((what, device))

    def launch(self, *arrays) -> None:
        for array in arrays:
            ptr = getattr(array, "_ptr", None)
            if ptr is not None:
                self.check_device("kernel", self.device_of[ptr])
                self.in_flight.setdefault(self.stream, set()).add(ptr)
                self.log.append(("kernel", self.stream.name, ptr))

    def synchronize(self, stream=None) -> None:
        """Complete ``stream``'s kernels (default: the current stream's)."""
        self.in_flight.pop(self.stream if stream is None else stream, None)


def install(
    total_bytes: int = 1 << 24,
    device_count: int = 1,
    latency: int = 0,
    nvrtc: bool = True,
    current: int = 0,
) -> FakeCuda:
    """Put a fake ``cupy`` in ``sys.modules`` and return its state. Call it in a child.

    Args:
        total_bytes: the memory of the (every) device.
        device_count: what ``getDeviceCount`` says (0: it raises ``cudaErrorNoDevice``).
        latency: event queries before a recorded event completes by itself.
        nvrtc: ``False`` makes kernels compiled at run time fail as without NVRTC.
        current: the device current at first.
    """
    fake = FakeCuda(total_bytes, device_count, latency, nvrtc, current)

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
            self.device = fake.current
            self.stream = None
            self._pending: set[int] = set()
            self._queries = 0

        def record(self, stream=None) -> None:
            fake.check_device("event.record", self.device)
            self.stream = fake.stream if stream is None else stream
            self._pending = set(fake.in_flight.get(self.stream, ()))
            self._queries = 0
            fake.log.append(("event.record", self.stream.name))

        def _complete(self) -> None:
            fake.in_flight.get(self.stream, set()).difference_update(self._pending)
            self._pending = set()

        @property
        def done(self) -> bool:
            fake.check_device("event.done", self.device)
            self._queries += 1
            if self._queries > fake.latency:
                self._complete()
            return not (self._pending & fake.in_flight.get(self.stream, set()))

        def synchronize(self) -> None:
            fake.check_device("event.synchronize", self.device)
            self._complete()

    class Device:
        def __init__(self, device: int = 0) -> None:
            self.id = device
            self._previous: list[int] = []

        def __enter__(self):
            self._previous.append(fake.current)
            fake.current = self.id
            return self

        def __exit__(self, *exc) -> None:
            fake.current = self._previous.pop()

        def synchronize(self) -> None:
            fake.in_flight.clear()

    class OutOfMemoryError(MemoryError):  # CuPy's signature
        def __init__(self, size, total, limit=0) -> None:
            self._size, self._total, self._limit = size, total, limit
            super().__init__(f"Out of memory allocating {size:,} bytes")

    class ElementwiseKernel:
        def __init__(self, in_params, out_params, operation, name) -> None:
            assert operation == "y = x + 1.0f", "the fake runs only the probe's kernel"

        def __call__(self, x):
            if not fake.nvrtc:
                raise RuntimeError(NVRTC_MISSING)
            return (np.asarray(x) + 1).view(FakeArray)

    def zeros(shape, dtype=np.float32):
        return np.zeros(shape, dtype=dtype).view(FakeArray)

    def set_device(device: int) -> None:
        fake.current = device

    class UnownedMemory:  # CuPy: (intptr_t ptr, size_t size, object owner, int device_id=-1)
        def __init__(self, ptr: int, size: int, owner, device_id: int = -1) -> None:
            for name, value in (("ptr", ptr), ("size", size), ("device_id", device_id)):
                if type(value) is not int:
                    raise TypeError(f"UnownedMemory: {name} must be an int, got {value!r}")
            if device_id < 0 and ptr == 0:
                raise RuntimeError("UnownedMemory requires explicit device ID for a null pointer.")
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

    class MemoryPointer:
        def __init__(self, mem, offset: int) -> None:
            if type(offset) is not int:
                raise TypeError(f"MemoryPointer: offset must be an int, got {offset!r}")
            self.mem, self.ptr, self.device_id = mem, mem.ptr + offset, mem.device_id

    class Stream:
        """CuPy: ``Stream(null=False, non_blocking=False, ptds=False)``; ``Stream.null``."""

        made = 0

        def __init__(self, null: bool = False, non_blocking: bool = False) -> None:
            self.device = fake.current
            self.non_blocking = non_blocking
            if null:
                self.name = "null"
            else:
                Stream.made += 1
                self.name = f"stream{Stream.made}"
            self._previous: list = []

        def __enter__(self):
            if self.name != "null":
                fake.check_device("stream.enter", self.device)
            self._previous.append(fake.stream)
            fake.stream = self
            return self

        def __exit__(self, *exc) -> None:
            fake.stream = self._previous.pop()

        @property
        def done(self) -> bool:
            return not fake.in_flight.get(self)

        def synchronize(self) -> None:
            fake.synchronize(self)

        def wait_event(self, event) -> None:
            fake.log.append(("stream.wait_event", self.name, event.stream.name))

    Stream.null = Stream(null=True)
    fake.stream = Stream.null

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
        fake.launch(array)
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
        getDevice=lambda: fake.current,
        setDevice=set_device,
    )
    cuda = types.SimpleNamespace(
        runtime=runtime,
        Device=Device,
        memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
        Event=Event,
        UnownedMemory=UnownedMemory,
        MemoryPointer=MemoryPointer,
        Stream=Stream,
        get_current_stream=lambda: fake.stream,
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
        zeros=zeros,
        ElementwiseKernel=ElementwiseKernel,
        _fake=fake,
    )
    sys.modules["cupy"] = module
    return fake
