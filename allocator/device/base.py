"""What a backend is: the raw device under the allocator.

A :class:`Device` allocates and frees blocks, makes streams (:mod:`allocator.device.stream`),
records and queries each block's completion events, and exposes an array module (``xp``: NumPy
or CuPy) whose element-wise operations are the kernels, each run on a stream. It keeps no cache
and no statistics: those are the allocator's layers above it.

Order of operations, the contract every backend keeps:

1. ``malloc`` either returns a block or raises :class:`DeviceAllocationError`; it never returns a
   partly made block. The device layer then sets ``block.stream``, the stream it was allocated
   on (a block belongs to that stream for good, as in PyTorch's caching allocator).
2. ``launch(stream, out, *inputs)`` is called before a kernel on ``stream`` that writes block
   ``out`` (``None`` for a readback) and reads blocks ``inputs`` runs; then the kernel method
   runs with the same stream (``fill(stream, out, value)``).
3. ``record(block)`` is called when a block is freed by its storage: it records an event on the
   block's own stream and one on each stream of ``block.stream_uses`` (the streams
   ``record_stream`` named), each after every kernel queued on that stream so far
   (PyTorch: ``insert_events``).
4. ``ready(block)`` says whether the events on the *other* streams (``stream_uses``) have
   completed, without waiting: then the block may be reused on its own stream, whose order makes
   the rest safe. ``wait(block)`` blocks the host until every event recorded on it completed.
5. ``free(block)`` hands the block back. The layers call it only after ``wait(block)``. It is
   ``cudaFree``, which synchronizes the whole device first; the simulator does the same.

The race check (the simulator's, and the ``cuda`` backend's stream check) is fed from exactly
these calls, plus the streams' and events' (``wait_stream``, ``record_event``, ``wait_event``,
a query that returned true, a synchronize) and the readbacks (``download``, ``sum``: the host
waits for their stream); its rules are :mod:`allocator.device._happens_before`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
from types import ModuleType

import numpy as np

from .stream import Event, Stream

__all__ = [
    "Block",
    "Device",
    "DeviceAllocationError",
    "Stream",
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
        event: the completion event recorded on the block's own stream when it was last freed
            (backend-specific; ``None`` until then).
        id: a number unique per device, used in diagnostics (``block #7``).
        stream: the :class:`Stream` it was allocated on, which it belongs to (set by the device
            layer; ``None`` for a block made by the device directly, and while the reuse
            cache holds the block, so that a cached block keeps no stream alive).
        stream_id: that stream's id (0 until the device layer sets it), kept while cached.
        stream_uses: the other streams ``record_stream`` recorded on it during its current life
            (a set), or ``None`` when there are none (PyTorch: ``Block::stream_uses``).
        use_events: the events recorded on those streams when it was last freed
            (backend-specific; ``None`` when there were none).
    """

    __slots__ = (
        "array",
        "event",
        "id",
        "nbytes",
        "stream",
        "stream_id",
        "stream_uses",
        "use_events",
    )

    def __init__(self, block_id: int, nbytes: int, array) -> None:
        self.id = block_id
        self.nbytes = nbytes
        self.array = array
        self.event = None
        self.stream: Stream | None = None
        self.stream_id = 0
        self.stream_uses: set[Stream] | None = None
        self.use_events = None

    @property
    def address(self) -> int:
        """The block's address in its device's memory (here: the host address of its NumPy
        array), as memory histories and snapshots report it. Valid until the block is freed."""
        return self.array.__array_interface__["data"][0]

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

    def __init__(self) -> None:
        self._stream_ids = itertools.count(1)

    def malloc(self, nbytes: int) -> Block:
        """Allocate a block of ``nbytes`` bytes; raise :class:`DeviceAllocationError` if none."""
        raise NotImplementedError

    def free(self, block: Block) -> None:
        """Hand ``block`` back to the device."""
        raise NotImplementedError

    # -- streams -----------------------------------------------------------------------------

    def new_stream(self, name: str | None = None, *, default: bool = False) -> Stream:
        """A new stream of this device: the default one (id 0, named ``"default"``) when
        ``default`` is true (the allocator makes exactly one), else the next id, named ``name``
        or ``"#<id>"``. The caller has validated ``name``."""
        stream_id = 0 if default else next(self._stream_ids)
        if default:
            name = "default"
        elif name is None:
            name = f"#{stream_id}"
        return Stream(self, stream_id, name, self._stream_handle(default))

    def _stream_handle(self, default: bool) -> object:
        """The backend's own object for a new stream (none on the stub)."""
        return None

    def stream_scope(self, stream: Stream) -> contextlib.AbstractContextManager | None:
        """A context manager under which third-party kernels (CuPy's) run on ``stream`` too,
        or ``None`` where there is nothing to do (everywhere but ``cuda``)."""
        return None

    def wait_stream(self, stream: Stream, other: Stream) -> None:
        """Make kernels queued on ``stream`` from now on wait for those queued on ``other``."""

    def synchronize_stream(self, stream: Stream) -> None:
        """Block the host until every kernel queued on ``stream`` has completed."""

    def new_event_handle(self) -> object:
        """The backend's own object for a new :class:`~allocator.device.stream.Event` (none
        on the stub)."""
        return None

    def record_event(self, stream: Stream, event: Event) -> None:
        """Record ``event`` on ``stream``, after every kernel queued there so far."""

    def wait_event(self, stream: Stream, event: Event) -> None:
        """Make kernels queued on ``stream`` from now on wait for the recorded ``event``."""

    def event_done(self, event: Event) -> bool:
        """Whether the recorded ``event`` completed. Never waits."""
        return True

    def synchronize_event(self, event: Event) -> None:
        """Block the host until the recorded ``event`` completed."""

    def stream_done(self, stream: Stream) -> bool:
        """Whether every kernel queued on ``stream`` has completed. Never waits."""
        return True

    logical_clock = False
    """Whether :meth:`clock_us` is a logical clock that moves only when the host waits (the
    simulator's): then a free to the device that moved it synchronized the device, which the
    memory history records (``device_synchronize``)."""

    tracks_launches = False
    """Whether :meth:`launch` does anything; where it does not, the allocator skips the call
    (it is on the path of every op)."""

    def launch(self, stream: Stream, out: Block | None = None, *inputs: Block) -> None:
        """A kernel on ``stream`` that writes ``out`` (``None``: a readback, which writes no
        block) and reads ``inputs`` is about to run (bookkeeping only)."""

    # -- events ------------------------------------------------------------------------------

    def record(self, block: Block) -> None:
        """At a free: record ``block.event`` on ``block.stream`` and one event on each stream
        of ``block.stream_uses`` (``block.use_events``), after every kernel queued there."""

    def ready(self, block: Block) -> bool:
        """Whether the events recorded on ``block.stream_uses`` have completed, so that the
        block may be reused on its own stream. Never waits."""
        return True

    def take_ready(self, block: Block) -> bool:
        """:meth:`ready`, asked by the reuse cache before it reuses ``block`` on its own stream
        (the event query whose true answer orders the host after the events; a snapshot's or
        a history's look at a block uses :meth:`ready`, which orders nothing). Never waits."""
        return self.ready(block)

    def pending_streams(self, block: Block) -> tuple[Stream, ...]:
        """The streams of ``block.stream_uses`` whose events recorded at its last free have not
        completed: what the block waits on before its own stream may reuse it. Never waits."""
        return ()

    def wait(self, block: Block) -> None:
        """Block the host until every event recorded on ``block`` has completed."""

    def synchronize(self) -> None:
        """Block the host until every kernel launched so far, on every stream, has completed."""

    def memory_info(self) -> tuple[int, int]:
        """``(free_bytes, total_bytes)`` of the device; ``(0, 0)`` where it has no such notion."""
        return 0, 0

    def clock_us(self) -> int:
        """The time memory-history events are stamped with, in microseconds: the host clock
        (since the Unix epoch, as PyTorch's ``time_us``); the simulator's logical clock on
        ``sim``."""
        return time.time_ns() // 1000

    # Kernels: element-wise operations of ``xp`` on ``stream`` writing into a fresh output
    # array (the stub and the simulator run them eagerly; ``stream`` matters on ``cuda``).

    def fill(self, stream: Stream, out, value: float) -> None:
        """Set every element of ``out`` to ``value``."""
        out.fill(value)

    def add(self, stream: Stream, out, a, b) -> None:
        """``out = a + b`` element-wise."""
        self.xp.add(a, b, out=out)

    def mul(self, stream: Stream, out, a, b) -> None:
        """``out = a * b`` element-wise."""
        self.xp.multiply(a, b, out=out)

    def fma(self, stream: Stream, out, a, b, c) -> None:
        """``out = a * b + c`` element-wise (``out`` never aliases ``c``)."""
        self.xp.multiply(a, b, out=out)
        self.xp.add(out, c, out=out)

    def copy(self, stream: Stream, out, a) -> None:
        """``out = a``."""
        self.xp.copyto(out, a)

    def upload(self, stream: Stream, dst, host: np.ndarray) -> None:
        """Copy the host array ``host`` into the device array ``dst`` (same length)."""
        dst[...] = host

    def download(self, stream: Stream, src) -> np.ndarray:
        """Copy the device array ``src`` to a new host float32 array (synchronous: the host
        waits for ``stream``)."""
        return np.array(src, dtype=np.float32, copy=True)

    def sum(self, stream: Stream, src) -> float:
        """The sum of the device array ``src`` as a Python float, accumulated in float64
        (a readback: the host waits for ``stream``)."""
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
