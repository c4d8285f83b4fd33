"""The allocator's front end: the public API over a stack of layers, in the manner of RMM.

What it adds over the arena registry (:mod:`allocator._arena`): argument validation, the ops and
readbacks (every operand through the use-after-free detector, :mod:`allocator._detector`), the
streams (each thread's current one, :mod:`allocator._current_stream`, on which every allocation
and op runs), the translation of a device failure into :class:`DeviceOutOfMemory`, and the
drain of the finalizers' queue at the start of every public call. The stack, each layer over
its upstream and testable alone::

    Allocator (this module)   validation, ops through the detector, drains, DeviceOutOfMemory
    ArenaRegistry  (_arena)   storages, the one free path, the finalizers' queue, epochs
    Statistics (_statistics)  live/peak bytes, counts, epoch counters (push/pop)
    CachingLayer   (_cache)   reuse cache per stream, byte cap, flush-and-retry (none on cpu)
    DeviceLayer (_device_layer) allocate/deallocate over the backend, waits before frees
    Device         (device/)  cpu, sim or cuda

Each layer has its own lock; :mod:`allocator._locks` gives their order and what fork does.

Order of operations:

- every public call first frees the blocks that finalizers queued since the last one, with no
  lock held (a finalizer itself never runs allocator logic, DESIGN 2.9);
- allocate, on the thread's current stream: down the stack (a cached block of the exact size
  and the same stream, else the device; on failure the cache collects garbage, flushes and
  retries once), counted on the way back up, tracked by the open arena; a failure raises
  :class:`DeviceOutOfMemory` and changes no live count;
- an op: its output allocated, then ``device.launch(stream, out, *inputs)`` (``out`` written,
  ``inputs`` read; a readback passes ``None`` for ``out``) where the backend tracks launches
  (the simulator with a latency: its clock and race check), then the kernel on
  that stream;
- free (release, ``resize_(0)``, finalization, arena exit): one path, in the registry; the
  block is counted as freed first, then its events are recorded (its stream's and those of the
  streams ``record_stream`` named) and it is cached, or freed after waiting on them if the cap
  refuses it. Why it was freed (a :class:`~allocator._free_cause.FreeCause`) travels down with
  it.

Memory history (:mod:`allocator._history`): while it records, two more layers sit in the stack,
one over the statistics layer and one over the device layer; off, the stack is exactly the one
above. The front end records ``oom`` itself, and builds snapshots (:mod:`allocator._snapshot`).

Dropping the last reference to an allocator frees its cached blocks at once: no layer refers
back to the front end, so there is no reference cycle to wait for the collector on.
"""

from __future__ import annotations

import contextlib
import gc
import numbers
import os
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from . import _snapshot
from ._arena import ArenaRegistry, Epoch
from ._buffer import FLOAT32_BYTES, Buffer, Storage, element_count
from ._cache import CachingLayer
from ._config import AllocatorConfig, default_config
from ._current_stream import CurrentStream, StreamScope
from ._detector import Detector
from ._device_layer import DeviceLayer
from ._errors import DeviceOutOfMemory
from ._free_cause import RELEASE
from ._history import DEFAULT_MAX_ENTRIES, Recorder
from ._scope import ArenaScope, run_scoped
from ._snapshot import LiveBlock
from ._statistics import Statistics
from ._stats import AllocatorStats, EpochStats
from .device import Device, DeviceAllocationError, make_device
from .device.stream import Event, Stream, check_stream

__all__ = ["Allocator"]


def _reclaimer(home: weakref.ref) -> Callable[[], None]:
    """The caching layer's ``on_oom``: collect cyclic garbage once, then free what the
    collection queued, so that the flush after it can hand those blocks back too. It holds the
    registry weakly: the cache must not keep its own upstream's owner alive."""

    def reclaim() -> None:
        gc.collect()
        registry = home()
        if registry is not None:
            registry.drain()

    return reclaim


class Allocator:
    """A compact device allocator over one backend.

    Most code uses the module-level functions (``allocator.full`` ...), which act on the
    process-wide default allocator configured from the environment. Build an instance directly
    to test another configuration in-process::

        alloc = Allocator(AllocatorConfig(backend="sim", cache_cap_bytes=1 << 20))

    Args:
        config: every knob; default the process-wide :func:`~allocator.default_config`, read
            from ``DEVMEM_*`` variables once per process.

    Raises:
        TypeError: ``config`` is not an :class:`~allocator.AllocatorConfig`.
        BackendUnavailable: ``config.backend`` cannot run here (``cuda`` without a GPU).

    Attributes:
        config: the configuration it was built with.
        device: the backend (e.g. a :class:`~allocator.device.SimDevice`, whose
            ``fail_next_mallocs`` and ``advance`` tests use).
        backend: the backend's name.
        default_stream: the :class:`Stream` every thread runs on until it enters
            :meth:`use_stream` (id 0, named ``"default"``; CuPy's null stream on ``cuda``).
    """

    def __init__(self, config: AllocatorConfig | None = None) -> None:
        if config is not None and not isinstance(config, AllocatorConfig):
            raise TypeError(f"config must be an AllocatorConfig, got {type(config).__name__}")
        self.config = default_config() if config is None else config
        self.device: Device = make_device(self.config)
        self.backend = self.device.name
        self._device_layer = DeviceLayer(self.device)
        self._cache: CachingLayer | None = None
        upstream: DeviceLayer | CachingLayer = self._device_layer
        if self.device.has_cache:
            upstream = self._cache = CachingLayer(upstream, self.config.cache_cap_bytes)
        self._stats = Statistics(upstream)
        self._arenas = ArenaRegistry(self._stats, self.backend)
        if self._cache is not None:
            self._cache.on_oom = _reclaimer(weakref.ref(self._arenas))
        self._pending = self._arenas.pending
        self._detector = Detector(self._arenas, self.config.arena_debug)
        self._launch = self.device.launch if self.device.tracks_launches else None
        self.default_stream = self.device.new_stream(default=True)
        self._current = CurrentStream(self.default_stream)
        self._history = Recorder(self.device)
        if self.config.history != "off":
            self.record_history(True, stacks=self.config.history == "stacks")

    def __repr__(self) -> str:
        return f"<Allocator {self.stats().format()}>"

    def _layers(self) -> tuple:
        """The layers from the top down to the device layer (each with its ``_lock``)."""
        layers = (self._arenas, self._stats, self._cache, self._device_layer)
        return tuple(layer for layer in layers if layer is not None)

    # -- allocation ---------------------------------------------------------------------------

    def _alloc(self, n: int) -> Buffer:
        """A new whole-storage buffer of ``n`` (validated, >= 1) elements."""
        if self._pending:
            self._arenas.drain()
        nbytes = n * FLOAT32_BYTES
        try:
            st = self._arenas.allocate(nbytes, self._current.stream)
        except DeviceAllocationError as exc:
            if self._history.recording:
                self._history.oom(nbytes, self.device.memory_info()[0])
            raise DeviceOutOfMemory(nbytes, self.stats(), str(exc)) from None
        return Buffer(st, 0, n)

    def empty(self, n: int) -> Buffer:
        """A buffer of ``n`` float32 elements with unspecified contents, allocated on the
        calling thread's current stream (:meth:`current_stream`), which its block then belongs
        to. Every other allocation and op runs on that stream too.

        Args:
            n: element count, >= 1.

        Returns:
            A new whole-storage :class:`Buffer`.

        Raises:
            TypeError: ``n`` is not an integer.
            ValueError: ``n`` < 1 or too large to address.
            DeviceOutOfMemory: the device has no room even after flushing the reuse cache.
        """
        return self._alloc(element_count(n, "n"))

    def full(self, n: int, value: float) -> Buffer:
        """A buffer of ``n`` float32 elements, each ``value``.

        Args:
            n: element count, >= 1.
            value: a real number, stored as float32.

        Raises:
            TypeError: ``n`` is not an integer or ``value`` is not a real number.
            ValueError: ``n`` < 1 or too large to address.
            DeviceOutOfMemory: as :meth:`empty`.
        """
        n = element_count(n, "n")
        if not isinstance(value, numbers.Real):
            raise TypeError(f"value must be a real number, got {type(value).__name__} {value!r}")
        out = self._alloc(n)
        return self._run(out, (), self.device.fill, float(value))

    def zeros(self, n: int) -> Buffer:
        """A buffer of ``n`` float32 zeros. Raises as :meth:`full`."""
        return self.full(n, 0.0)

    def from_numpy(self, a: np.ndarray) -> Buffer:
        """A buffer holding a copy of the host array ``a``.

        Args:
            a: a 1-D, non-empty NumPy array of dtype float32.

        Raises:
            TypeError: ``a`` is not a NumPy array, or its dtype is not float32.
            ValueError: ``a`` is not 1-D or is empty.
            DeviceOutOfMemory: as :meth:`empty`.
        """
        if not isinstance(a, np.ndarray):
            raise TypeError(f"a must be a numpy.ndarray, got {type(a).__name__}")
        if a.dtype != np.float32:
            raise TypeError(f"a must have dtype float32, got {a.dtype}")
        if a.ndim != 1:
            raise ValueError(f"a must be 1-D, got shape {a.shape}")
        if a.size == 0:
            raise ValueError("a must hold at least one element, got an empty array")
        out = self._alloc(a.size)
        return self._run(out, (), self.device.upload, a)

    # -- ops: every operand goes through the detector's choke point ----------------------------

    def _run(self, out: Buffer, inputs: tuple, kernel: Callable, *args) -> Buffer:
        """Launch ``kernel(stream, out_array, *input_arrays, *args)`` on the current stream;
        free ``out`` if it fails."""
        stream = self._current.stream
        launch = self._launch
        try:
            if launch is not None:
                launch(stream, out._st._cell[0], *[buf._st._cell[0] for buf in inputs])
            kernel(stream, out._array(), *[buf._array() for buf in inputs], *args)
        except BaseException:
            self._arenas.free(out._st, RELEASE)
            raise
        return out

    def _nothing(self) -> Buffer:
        """The result of an op on freed operands with the detector off: a buffer of size 0
        over no block (the silent slip of the original)."""
        return Buffer(Storage(self._arenas, None, 0), 0, 0)

    def add(self, a: Buffer, b: Buffer) -> Buffer:
        """Element-wise ``a + b`` into a new buffer (op ``buffer_add``, roles ``lhs``/``rhs``).

        Returns:
            A new buffer; one of size 0 when both operands were freed and the detector is off
            (the silent slip of the original).

        Raises:
            TypeError: an operand is not a Buffer.
            ValueError: an operand belongs to another allocator.
            UseAfterFreeError: an operand was freed and ``arena_debug`` is ``"raise"``; in
                ``"abort"`` mode the process aborts with the same line on stderr instead.
            SizeMismatchError: the operands' sizes differ.
            DeviceOutOfMemory: as :meth:`empty`.
        """
        n = self._detector.require_same_size2("buffer_add", a, b)
        if not n:
            return self._nothing()
        return self._run(self._alloc(n), (a, b), self.device.add)

    def mul(self, a: Buffer, b: Buffer) -> Buffer:
        """Element-wise ``a * b`` (op ``buffer_mul``). Returns and raises as :meth:`add`."""
        n = self._detector.require_same_size2("buffer_mul", a, b)
        if not n:
            return self._nothing()
        return self._run(self._alloc(n), (a, b), self.device.mul)

    def fma(self, a: Buffer, b: Buffer, c: Buffer) -> Buffer:
        """Element-wise ``a * b + c`` (op ``buffer_fma``, roles ``arg0``/``arg1``/``arg2``).
        Returns and raises as :meth:`add`."""
        n = self._detector.require_same_size3("buffer_fma", a, b, c)
        if not n:
            return self._nothing()
        return self._run(self._alloc(n), (a, b, c), self.device.fma)

    def copy(self, a: Buffer) -> Buffer:
        """A new buffer with the elements of ``a`` (op ``buffer_copy``, role ``arg``).
        Returns and raises as :meth:`add`."""
        n = self._detector.require_live("buffer_copy", a)
        if not n:
            return self._nothing()
        return self._run(self._alloc(n), (a,), self.device.copy)

    def sum(self, a: Buffer) -> float:
        """The sum of ``a``'s elements, accumulated in float64 (op ``buffer_sum``, role ``arg``).

        A readback on the current stream: the host waits for that stream's kernels. Returns 0.0
        for a freed buffer when the detector is off. Raises as :meth:`add` (but never
        ``SizeMismatchError``).
        """
        if self._pending:
            self._arenas.drain()
        n = self._detector.require_live("buffer_sum", a)
        if not n:
            return 0.0
        stream = self._current.stream
        if self._launch is not None:
            self._launch(stream, None, a._st._cell[0])  # a read
        return self.device.sum(stream, a._array())

    def to_numpy(self, a: Buffer) -> np.ndarray:
        """A host copy of ``a`` as a 1-D float32 NumPy array (op ``buffer_read``, role ``arg``).

        A readback on the current stream: the host waits for that stream's kernels. Returns an
        empty array for a freed buffer when the detector is off. Raises as :meth:`sum`.
        """
        if self._pending:
            self._arenas.drain()
        n = self._detector.require_live("buffer_read", a)
        if not n:
            return np.empty(0, dtype=np.float32)
        stream = self._current.stream
        if self._launch is not None:
            self._launch(stream, None, a._st._cell[0])  # a read
        return self.device.download(stream, a._array())

    # -- freeing ---------------------------------------------------------------------------------

    def release(self, buf: Buffer) -> int:
        """Free ``buf``'s storage now, for every view of it, instead of at finalization.

        Later use of any of its views is reported as ``use-after-release: <op> <role> was
        released by release()``.

        Returns:
            1 if the block was freed now, 0 if it was already freed.

        Raises:
            TypeError: ``buf`` is not a Buffer.
            ValueError: ``buf`` belongs to another allocator.
        """
        if self._pending:
            self._arenas.drain()
        if not isinstance(buf, Buffer):
            raise TypeError(f"buf must be a Buffer, got {type(buf).__name__}")
        st = buf._st
        if st._home is not self._arenas:
            raise ValueError("buf belongs to another allocator")
        return self._arenas.free(st, RELEASE)

    def empty_cache(self) -> int:
        """Free every cached block to the device, waiting on each block's completion event.

        Returns:
            The bytes handed back to the device (0 on ``cpu``, which keeps no cache).
        """
        self._arenas.drain()
        cache = self._cache
        return 0 if cache is None else cache.flush()

    # -- streams ---------------------------------------------------------------------------------

    def new_stream(self, name: str | None = None) -> Stream:
        """A new stream of this allocator's device (PyTorch's ``torch.cuda.Stream()``).

        Its kernels run in order, independently of other streams' until a
        :meth:`Stream.wait_stream` orders them. Make it current with :meth:`use_stream`. Once
        nothing refers to it any more (the blocks cached for it hold no reference), no
        allocation can reuse what the cache keeps for it: the next allocation or free hands
        those blocks back to the device.

        Args:
            name: a label for messages (the simulator's race check names streams by it);
                default ``"#<id>"``.

        Raises:
            TypeError: ``name`` is not a ``str``.
            ValueError: ``name`` is empty.
        """
        if name is not None:
            if not isinstance(name, str):
                raise TypeError(f"name must be a str, got {type(name).__name__}")
            if not name:
                raise ValueError("name must be a non-empty string (or None for '#<id>')")
        stream = self.device.new_stream(name)
        if self._cache is not None:
            self._cache.watch(stream)  # once dropped, its cached blocks go back to the device
        return stream

    def new_event(self) -> Event:
        """A new event of this allocator's device (PyTorch's ``torch.cuda.Event()``), not yet
        recorded: record it with ``stream.record_event(e)``, make a stream wait for it with
        ``stream.wait_event(e)``, and ask ``e.query()`` or wait with ``e.synchronize()`` (see
        :class:`~allocator.device.stream.Event`). On ``cuda`` a timing-free
        ``cupy.cuda.Event``."""
        return Event(self.device)

    def current_stream(self) -> Stream:
        """The calling thread's current stream: the one of its innermost :meth:`use_stream`
        block, else :attr:`default_stream`."""
        return self._current.stream

    def use_stream(self, stream: Stream) -> StreamScope:
        """A context manager that makes ``stream`` the calling thread's current stream::

            side = alloc.new_stream("side")
            with alloc.use_stream(side):
                y = alloc.add(x, x)  # allocated on, and computed on, side

        Other threads keep theirs. Blocks nest; leaving one restores the stream current
        before it, also after an exception. On ``cuda`` the stream's ``cupy.cuda.Stream`` (on
        the allocator's device) is current in the block too.

        Raises:
            TypeError: ``stream`` is not a Stream.
            ValueError: ``stream`` belongs to another allocator.
        """
        return StreamScope(self._current, check_stream(self.device, stream), self.device)

    # -- arenas ----------------------------------------------------------------------------------

    def arena_enter(self) -> int:
        """Open an arena epoch; every storage allocated until the matching exit is tracked.

        Arenas are process-wide, like the native registry: open and close them from one thread.

        Returns:
            The new epoch's depth (0 for the outermost).
        """
        return self._open_epoch().depth

    def arena_exit(self, keep: Iterable[Buffer] = ()) -> EpochStats:
        """Close the innermost epoch: free every tracked storage still alive except ``keep``'s.

        Kept storages move to the parent epoch (at depth 0 they become untracked). Freed
        buffers keep their objects with size 0; using one is reported as
        ``use-after-arena-free: <op> <role> was reclaimed by arena_exit at depth <d>``.

        Args:
            keep: buffers to promote (a list or tuple; a view keeps its whole storage).
                Buffers not tracked by this epoch are left alone.

        Returns:
            The closed epoch's :class:`EpochStats`.

        Raises:
            ArenaError: no arena is open.
            TypeError: ``keep`` is not an iterable of Buffers (a bare Buffer included).
            ValueError: an item of ``keep`` was already freed or belongs to another allocator.
                Nothing is freed and the epoch stays open.
        """
        return self._close_epoch(keep, expected=None)

    def arena(self) -> ArenaScope:
        """A context manager for one epoch; call ``scope.keep(buf)`` for what must survive::

            with alloc.arena() as scope:
                y = alloc.add(x, x)
                scope.keep(y)

        After an exception the epoch exits keeping nothing and the exception propagates.
        ``scope.stats`` holds the :class:`EpochStats` afterwards.
        """
        return ArenaScope(self)

    def run_in_arena(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``fn(*args, **kwargs)`` in a fresh epoch, keeping the buffers it returns.

        The buffers kept are the result itself if it is a Buffer, else those found in its
        tuples, lists and dict values. Returns ``fn``'s result. If ``fn`` raises, the epoch
        exits keeping nothing and the exception propagates.
        """
        return run_scoped(self, fn, args, kwargs)

    def _open_epoch(self) -> Epoch:
        if self._pending:
            self._arenas.drain()
        return self._arenas.open()

    def _close_epoch(self, keep: Iterable[Buffer], expected: Epoch | None) -> EpochStats:
        if self._pending:
            self._arenas.drain()
        return self._arenas.close(keep, expected)

    # -- telemetry -------------------------------------------------------------------------------

    def stats(self) -> AllocatorStats:
        """A snapshot of every counter; see :class:`AllocatorStats` for the fields.

        It first frees the blocks that finalizers queued, and hands the blocks cached for
        dropped streams back to the device. Each layer's counters are read
        together, under that layer's lock; with other threads allocating meanwhile, two layers'
        figures may be a few operations apart.
        """
        self._arenas.drain()
        if self._cache is not None and self._cache.dropped:
            self._cache.reap()
        device_free, device_total = self.device.memory_info()
        live, peak, buffers, allocs, frees = self._stats.counters()
        cache = self._cache
        cached, cap, hits, misses, evictions, flushes = (
            (0, 0, 0, 0, 0, 0) if cache is None else cache.counters()
        )
        mallocs, device_frees = self._device_layer.counters()
        depth, reclaimed_buffers, reclaimed_bytes = self._arenas.counters()
        return AllocatorStats(
            backend=self.backend,
            live_bytes=live,
            peak_bytes=peak,
            live_buffers=buffers,
            alloc_count=allocs,
            free_count=frees,
            cache_bytes=cached,
            cache_cap_bytes=cap,
            cache_hits=hits,
            cache_misses=misses,
            cap_evictions=evictions,
            device_mallocs=mallocs,
            device_frees=device_frees,
            oom_flushes=flushes,
            device_free_bytes=device_free,
            device_total_bytes=device_total,
            arena_depth=depth,
            arena_reclaimed_buffers=reclaimed_buffers,
            arena_reclaimed_bytes=reclaimed_bytes,
        )

    # -- memory history --------------------------------------------------------------------------

    def record_history(
        self, enabled: bool = True, *, max_entries: int = DEFAULT_MAX_ENTRIES, stacks: bool = True
    ) -> None:
        """Start or stop recording this allocator's memory history (PyTorch's
        ``torch.cuda.memory._record_memory_history``).

        Every allocation, free request, free completion, device malloc and free, and OOM is
        recorded with a timestamp in microseconds (the simulated clock on ``sim``, the host
        clock elsewhere), its stream, address and size, and, with ``stacks``, the Python stack
        of the call that caused it; arena exits, releases and cap evictions are annotated.
        :meth:`snapshot` returns it in PyTorch's format. Recording off costs nothing: its
        layers are then out of the allocator's stack.

        Starting a recording that is off begins a fresh history; calling it while recording
        only changes ``max_entries`` (keeping the newest) and ``stacks``. Stopping keeps the
        history for :meth:`snapshot` (one walk of the collector's objects, to keep the state
        the trace ends in): a snapshot taken later appends, marked ``<devmem history off>``,
        the frees and allocations made since, so that its trace always ends at its segments.
        A block's frames belong to the storage it was recorded for: one handed to another
        storage while off has none. A free done by the finalizer (the last reference to a
        buffer died) is recorded when the next call of this allocator drains the finalizers'
        queue, with that call's stack under a ``<devmem finalizer>`` frame.
        ``DEVMEM_HISTORY=1`` (or ``stacks``) starts it when the allocator is built.

        Args:
            enabled: start (``True``) or stop (``False``).
            max_entries: the most entries kept, events and annotations together; the oldest
                are dropped first (a ring).
            stacks: record the Python stack of each event (costs a walk of the stack per
                event; see ``bench/alloc.py``).

        Raises:
            TypeError: ``enabled`` or ``stacks`` is not a bool, or ``max_entries`` is not an
                integer.
            ValueError: ``max_entries`` < 1.
        """
        for name, value in (("enabled", enabled), ("stacks", stacks)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
        if isinstance(max_entries, bool) or not isinstance(max_entries, numbers.Integral):
            raise TypeError(
                f"max_entries must be an integer, got {type(max_entries).__name__} {max_entries!r}"
            )
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        if self._pending:
            self._arenas.drain()
        if not enabled:
            self._history.stop(self._arenas, self._cache)
            return
        self._history.start(
            self,
            self._arenas,
            self._stats,
            self._cache,
            self._device_layer,
            max_entries=int(max_entries),
            stacks=stacks,
        )

    @contextlib.contextmanager
    def history(
        self, *, max_entries: int = DEFAULT_MAX_ENTRIES, stacks: bool = True
    ) -> Iterator[Allocator]:
        """Record the memory history inside a ``with`` block::

            with alloc.history():
                workload(alloc)
            alloc.dump_snapshot("snapshot.pickle")

        A recording that was off starts fresh and stops at the end (its history is kept for
        :meth:`snapshot`); one that was already on stays on, with its own settings back.
        Arguments and errors as :meth:`record_history`. Yields the allocator.
        """
        recorder = self._history
        was = (recorder.recording, recorder.ring.maxlen, recorder.stacks)
        self.record_history(True, max_entries=max_entries, stacks=stacks)
        try:
            yield self
        finally:
            recording, maxlen, had_stacks = was
            self.record_history(recording, max_entries=maxlen, stacks=had_stacks)

    def snapshot(self) -> dict:
        """The allocator's memory in the format of ``torch.cuda.memory._snapshot()``.

        ``segments`` lists every device block the allocator holds (live, or cached in the reuse
        cache, ``inactive``, or freed but waiting on other streams' events,
        ``active_pending_free``); ``device_traces[0]`` the recorded events;
        ``snapshot["devmem"]`` our own annotations and statistics, where PyTorch's readers never
        look. See :mod:`allocator._snapshot` for
        every field. PyTorch's tools read it: ``python -m torch.cuda._memory_viz trace
        snapshot.pickle``, or drop the file on https://pytorch.org/memory_viz.

        It first frees the blocks that finalizers queued, and walks the collector's objects
        to find the live storages (milliseconds in a large process).
        """
        return _snapshot.build(self._arenas, self._cache, self._history, self.stats())

    def dump_snapshot(self, path: str | os.PathLike) -> None:
        """Pickle :meth:`snapshot` to ``path`` (protocol 4, which the memory_viz page reads).

        Raises:
            TypeError: ``path`` is not a str or path-like.
            OSError: the file cannot be written.
        """
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        _snapshot.dump(self.snapshot(), path)

    def live_blocks(self) -> list[LiveBlock]:
        """Every block a storage of this allocator still holds, by address: its address, size,
        stream and the frames it was allocated from (empty if history was off then).

        It first frees the blocks that finalizers queued. A leak report lists these (the
        project's ``memory_history`` fixture does).
        """
        self._arenas.drain()
        return _snapshot.live_blocks(self._arenas, self._history)
