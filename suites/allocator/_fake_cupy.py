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

Where the first H200 run showed that it matters (docs/gpus.md lists every difference), the fake
behaves as CUDA does:

- **Fork after initialization.** The first runtime call (``getDeviceCount``, ``malloc``, a
  stream, an event, a kernel...) initializes "CUDA" in this process; any call from a process
  forked after that raises ``CUDARuntimeError`` ``cudaErrorInitializationError``, as the real
  runtime does in a child of an initialized parent. Importing the module initializes nothing,
  as with CuPy.
- **Stream order.** With ``race_check`` (the default), every kernel, upload and readback is
  queued on the simulator's happens-before clocks (:class:`allocator.device.sim.SimDevice`,
  vector clocks per stream and for the host): a kernel or readback on one stream that touches
  a block written (or, for a write, read) by another stream's kernel that no ``wait_event``,
  event or stream synchronization, device synchronization or completed query has ordered before
  it aborts the process with one line, ``fake cuda: stream <S> reads block #<n> (the cudaMalloc
  at 0x...) while stream <W>'s write ... is not waited for``. On a GPU the same program reads
  stale data once in a while; here it fails every time.
- **Device-wide free memory.** ``memGetInfo`` reports the device's free bytes less what other
  tenants hold, and with ``other_tenants`` (the default) another tenant's usage changes at every
  call, as on a GPU shared with other processes (xdist workers, death-test children): only
  what this process itself allocated can be asserted exactly.

Nothing here is a claim about real CUDA timing; it checks the order of operations only.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types

import numpy as np

from allocator.device.base import fatal
from allocator.device.sim import SimBlock, SimDevice, SimEvent

OUT_OF_MEMORY = 2
INITIALIZATION_ERROR = 3
ILLEGAL_ADDRESS = 700
NVRTC_MISSING = (
    "CuPy failed to load libnvrtc.so.12: OSError: libnvrtc.so.12: cannot open shared object"
    " file: No such file or directory"
)
_NAMES = {
    OUT_OF_MEMORY: "cudaErrorMemoryAllocation: out of memory",
    INITIALIZATION_ERROR: "cudaErrorInitializationError: initialization error",
    ILLEGAL_ADDRESS: "cudaErrorIllegalAddress: an illegal memory access was encountered",
    100: "cudaErrorNoDevice: no CUDA-capable device is detected",
}
RACE_LATENCY_US = 10
"""Logical latency of a kernel on the race check's clocks (any value > 0 orders the same)."""
TENANT_STEP_BYTES = 1 << 20
"""How much another tenant's usage of the device changes between two ``memGetInfo`` calls."""


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__(_NAMES.get(status, f"cudaError {status}"))


class FakeCuda:
    """The fake device's state; :func:`install` builds one and the ``cupy`` module over it."""

    def __init__(
        self,
        total_bytes: int,
        device_count: int,
        latency: int,
        nvrtc: bool,
        current: int,
        race_check: bool = True,
        other_tenants: bool = True,
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
        self.used = 0
        self.initialized_in: int | None = None  # the pid whose runtime call initialized CUDA
        self.other_tenants = other_tenants
        self.info_calls = 0
        # the race check: the simulator's happens-before clocks, over one SimBlock per pointer
        self.clocks = SimDevice(max(total_bytes, 1), RACE_LATENCY_US) if race_check else None
        self.blocks: dict[int, SimBlock] = {}

    def init(self) -> None:
        """A runtime call: the first one initializes CUDA in this process; one from a process
        forked after that fails as CUDA does there."""
        pid = os.getpid()
        if self.initialized_in is None:
            self.initialized_in = pid
        elif self.initialized_in != pid:
            raise CUDARuntimeError(INITIALIZATION_ERROR)

    # runtime
    def malloc(self, size: int) -> int:
        self.init()
        if self.fail_next:
            raise CUDARuntimeError(self.fail_next.pop(0))
        if size > self.total - self.used:
            raise CUDARuntimeError(OUT_OF_MEMORY)
        ptr, self.next_ptr = self.next_ptr, self.next_ptr + size + 256
        self.memory[ptr] = np.zeros(size, dtype=np.uint8)
        self.used += size
        self.device_of[ptr] = self.current
        self.mallocs += 1
        if self.clocks is not None:
            self.blocks[ptr] = SimBlock(self.mallocs, size, None)
        return ptr

    def free(self, ptr: int) -> None:
        self.init()
        if any(ptr in ptrs for ptrs in self.in_flight.values()):
            self.violations.append(ptr)
        self.check_device("free", self.device_of.pop(ptr))
        self.used -= self.memory.pop(ptr).nbytes
        self.frees += 1
        if self.clocks is not None:
            self.clocks.synchronize()  # cudaFree synchronizes the device first
            self.blocks.pop(ptr, None)

    def mem_get_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of the device: less what this process holds, and less what
        another tenant holds, which changes at every call (``other_tenants``)."""
        self.init()
        self.info_calls += 1
        tenant = (self.info_calls % 8 + 1) * TENANT_STEP_BYTES if self.other_tenants else 0
        return max(self.total - self.used - tenant, 0), self.total

    def check_device(self, what: str, device: int) -> None:
        if device != self.current:
            self.wrong_device.append((what, device))

    def launch(self, out, *inputs) -> None:
        """A kernel on the current stream that writes ``out`` (an array, or None for a
        readback) and reads ``inputs``; aborts if the race check finds it unordered."""
        self.init()
        blocks = []
        pointers: dict[int, int] = {}  # block id -> cudaMalloc address, for the abort's line
        for array in (out, *inputs):
            ptr = getattr(array, "_ptr", None)
            block = self.blocks.get(ptr) if ptr is not None else None
            if ptr is not None:
                self.check_device("kernel", self.device_of[ptr])
                self.in_flight.setdefault(self.stream, set()).add(ptr)
                self.log.append(("kernel", self.stream.name, ptr))
            if block is not None:
                pointers[block.id] = ptr
            blocks.append(block)
        if self.clocks is None:
            return
        written, read = blocks[0], [block for block in blocks[1:] if block is not None]
        if written is None and not read:
            return
        message = self.clocks.launch_message(self.stream.clock, written, *read)
        if message is not None:
            self.abort(message, pointers)

    @staticmethod
    def abort(message: str, pointers: dict[int, int]) -> None:
        """The race check's fatal line as the fake's, naming the device pointer of the block
        it is about (``pointers``: block id -> ``cudaMalloc`` address, of the kernel's blocks)."""
        text = message.removeprefix("sim: ")
        for block_id, ptr in pointers.items():
            text = text.replace(f"block #{block_id} ", f"block #{block_id} (cudaMalloc 0x{ptr:x}) ")
        fatal(f"fake cuda: {text}; on a GPU this reads or writes the block unordered")

    def synchronize(self, stream=None) -> None:
        """Complete ``stream``'s kernels (default: the current stream's)."""
        self.init()
        stream = self.stream if stream is None else stream
        self.in_flight.pop(stream, None)
        if self.clocks is not None:
            self.clocks.synchronize_stream(stream.clock)

    def synchronize_device(self) -> None:
        """Complete every stream's kernels (``cudaDeviceSynchronize``)."""
        self.init()
        self.in_flight.clear()
        if self.clocks is not None:
            self.clocks.synchronize()


def install(
    total_bytes: int = 1 << 24,
    device_count: int = 1,
    latency: int = 0,
    nvrtc: bool = True,
    current: int = 0,
    race_check: bool = True,
    other_tenants: bool = True,
) -> FakeCuda:
    """Put a fake ``cupy`` in ``sys.modules`` and return its state. Call it in a child.

    Args:
        total_bytes: the memory of the (every) device.
        device_count: what ``getDeviceCount`` says (0: it raises ``cudaErrorNoDevice``).
        latency: event queries before a recorded event completes by itself.
        nvrtc: ``False`` makes kernels compiled at run time fail as without NVRTC.
        current: the device current at first.
        race_check: abort on a kernel or readback that another stream's access is not ordered
            before (the simulator's happens-before clocks; see the module docstring).
        other_tenants: ``memGetInfo`` moves at every call, as on a GPU other processes use.
    """
    fake = FakeCuda(total_bytes, device_count, latency, nvrtc, current, race_check, other_tenants)

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
            fake.launch(None, self)  # the copy to the host, on the current stream
            fake.synchronize()
            return np.array(self)

    class Event:
        def __init__(self, disable_timing: bool = False) -> None:
            assert disable_timing, "the backend must pool timing-free events"
            fake.init()
            fake.events_made += 1
            self.clock = SimEvent()
            self.device = fake.current
            self.stream = None
            self._pending: set[int] = set()
            self._queries = 0

        def record(self, stream=None) -> None:
            fake.init()
            fake.check_device("event.record", self.device)
            self.stream = fake.stream if stream is None else stream
            self._pending = set(fake.in_flight.get(self.stream, ()))
            self._queries = 0
            fake.log.append(("event.record", self.stream.name))
            if fake.clocks is not None:
                fake.clocks.record_event(self.stream.clock, self)

        @property
        def handle(self) -> SimEvent:  # what the simulator's clocks call an event's state
            return self.clock

        def _complete(self) -> None:
            fake.in_flight.get(self.stream, set()).difference_update(self._pending)
            self._pending = set()
            if fake.clocks is not None:  # the host knows that the work before it completed
                fake.clocks.synchronize_event(self)

        @property
        def done(self) -> bool:
            fake.init()
            fake.check_device("event.done", self.device)
            self._queries += 1
            if self._queries > fake.latency:
                self._complete()
            done = not (self._pending & fake.in_flight.get(self.stream, set()))
            if done and fake.clocks is not None:
                fake.clocks.synchronize_event(self)
            return done

        def synchronize(self) -> None:
            fake.init()
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
            fake.synchronize_device()

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

    def empty(shape, dtype=np.float32):  # CuPy's pool: host memory here, no device block
        return np.empty(shape, dtype=dtype).view(FakeArray)

    def set_device(device: int) -> None:
        fake.init()
        fake.current = device

    def get_device() -> int:
        fake.init()
        return fake.current

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
                self.name = "null"  # CuPy's Stream.null exists before any runtime call
            else:
                fake.init()
                Stream.made += 1
                self.name = f"stream{Stream.made}"
            self._previous: list = []
            # this stream on the race check's clocks: a stream of the simulator (its name, and
            # its clock as ``handle``), which is what the simulator's methods take
            self.clock = fake.clocks.new_stream(self.name) if fake.clocks is not None else None

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
            fake.init()
            done = not fake.in_flight.get(self)
            if fake.clocks is not None:
                # complete too when the host knows its kernels completed: another stream that
                # waited for them was synchronized (real CUDA's query says so then)
                done = done or fake.clocks.known_done(self.clock)
                if done:
                    fake.in_flight.pop(self, None)
                    fake.clocks.synchronize_stream(self.clock)
            return done

        def synchronize(self) -> None:
            fake.synchronize(self)

        def wait_event(self, event) -> None:
            fake.init()
            fake.log.append(("stream.wait_event", self.name, event.stream.name))
            if fake.clocks is not None:
                fake.clocks.wait_event(self.clock, event)

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
            fake.launch(out, *arrays)
            return func(*arrays, out=out, **kwargs)

        return kernel

    def copyto(dst, src) -> None:
        fake.launch(dst, src)
        np.copyto(dst, src)

    def total(array, dtype=None):
        fake.launch(None, array)
        fake.synchronize()  # a reduction read back by float(): synchronous
        return np.sum(np.asarray(array), dtype=dtype)

    def get_device_count() -> int:
        fake.init()
        if fake.device_count < 1:
            raise CUDARuntimeError(100)
        return fake.device_count

    runtime = types.SimpleNamespace(
        CUDARuntimeError=CUDARuntimeError,
        malloc=fake.malloc,
        free=fake.free,
        memGetInfo=fake.mem_get_info,
        getDeviceCount=get_device_count,
        getDevice=get_device,
        setDevice=set_device,
        getDeviceProperties=lambda device: {"name": b"Fake GPU (suites/allocator/_fake_cupy.py)"},
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
    module.__spec__ = importlib.machinery.ModuleSpec("cupy", None)  # find_spec("cupy") finds it
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
        empty=empty,
        ElementwiseKernel=ElementwiseKernel,
        _fake=fake,
    )
    sys.modules["cupy"] = module
    return fake
