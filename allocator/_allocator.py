"""The allocator: a device, the reuse cache over it, arenas, the detector and the counters.

An :class:`Allocator` composes one layer per capability, in the manner of RMM's resource
adaptors: the backend (:mod:`allocator.device`), the exact-size reuse cache with its byte cap
(:mod:`allocator._cache`), arena epochs (:mod:`allocator._arena`), the use-after-free detector
(:mod:`allocator._detector`) and the statistics (:mod:`allocator._stats`). The counters, the cache
and the arena registry share one re-entrant lock; device waits and frees happen outside it.

Order of operations:

- allocate: take a ready cached block of the exact size, else ``malloc`` from the device (on
  failure flush the cache, waiting on each block's event, and retry once, then raise
  :class:`DeviceOutOfMemory`); only then count the allocation and register it with the open
  arena. A failed allocation changes no live count.
- free (release, ``resize_(0)``, finalization, arena exit): count the buffer as freed first,
  then return the block to the cache, which records its completion event; a block the cap
  refuses is freed after waiting on that event.

Fork safety: before a fork every allocator's lock is taken (so no counter is half-updated),
released again in the parent, and replaced by a fresh lock in the child, so a child can allocate
even if another thread held the lock when the process forked.
"""

from __future__ import annotations

import numbers
import os
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ._arena import ArenaScope, Epoch, keep_storages, run_scoped
from ._buffer import FLOAT32_BYTES, Buffer, Storage, element_count
from ._cache import ReuseCache
from ._config import AllocatorConfig, default_config
from ._detector import Detector
from ._errors import ArenaError, DeviceOutOfMemory
from ._stats import AllocatorStats, EpochStats
from .device import Device, DeviceAllocationError, make_device

__all__ = ["Allocator"]

_instances: weakref.WeakSet[Allocator] = weakref.WeakSet()
_FORK_LOCK_TIMEOUT_S = 1.0


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
    """

    def __init__(self, config: AllocatorConfig | None = None) -> None:
        if config is not None and not isinstance(config, AllocatorConfig):
            raise TypeError(f"config must be an AllocatorConfig, got {type(config).__name__}")
        self.config = default_config() if config is None else config
        self.device: Device = make_device(self.config)
        self.backend = self.device.name
        self._cache = (
            ReuseCache(self.device, self.config.cache_cap_bytes) if self.device.has_cache else None
        )
        self._detector = Detector(self, self.config.arena_debug)
        self._lock = threading.RLock()
        self._fork_held = False
        self._epochs: list[Epoch] = []
        self._empty = Storage(self, None, 0)
        self._live_bytes = 0
        self._peak_bytes = 0
        self._live_buffers = 0
        self._alloc_count = 0
        self._free_count = 0
        self._cache_hits = 0
        self._cache_misses = 0
        self._device_mallocs = 0
        self._device_frees = 0
        self._oom_flushes = 0
        self._reclaimed_buffers = 0
        self._reclaimed_bytes = 0
        _instances.add(self)

    def __repr__(self) -> str:
        return f"<Allocator {self.stats().format()}>"

    # -- allocation ---------------------------------------------------------------------------

    def _alloc(self, n: int) -> Buffer:
        """A new whole-storage buffer of ``n`` (validated, >= 1) elements."""
        nbytes = n * FLOAT32_BYTES
        cache = self._cache
        with self._lock:
            if cache is not None:
                block = cache.take(nbytes)
                if block is not None:
                    self._cache_hits += 1
                    return Buffer(self._track(block, nbytes), 0, n)
                self._cache_misses += 1
        block = self._malloc(nbytes)
        with self._lock:
            self._device_mallocs += 1
            return Buffer(self._track(block, nbytes), 0, n)

    def _track(self, block, nbytes: int) -> Storage:
        """Count a new storage and register it with the innermost arena (lock held)."""
        st = Storage(self, block, nbytes)
        live = self._live_bytes + nbytes
        self._live_bytes = live
        if live > self._peak_bytes:
            self._peak_bytes = live
        self._live_buffers += 1
        self._alloc_count += 1
        epochs = self._epochs
        if epochs:
            epoch = epochs[-1]
            epoch.refs.append(weakref.ref(st))
            st.epoch = epoch
            epoch.allocs += 1
            live = epoch.live_bytes + nbytes
            epoch.live_bytes = live
            if live > epoch.peak_bytes:
                epoch.peak_bytes = live
        return st

    def _malloc(self, nbytes: int):
        """A device block; flush the cache and retry once on failure, then raise."""
        device = self.device
        try:
            return device.malloc(nbytes)
        except DeviceAllocationError as exc:
            reason = str(exc)
        if self._cache is not None:
            with self._lock:
                self._oom_flushes += 1
            self.empty_cache()
            try:
                return device.malloc(nbytes)
            except DeviceAllocationError as exc:
                reason = str(exc)
        raise DeviceOutOfMemory(nbytes, self.stats(), reason)

    def _free_storage(self, st: Storage, reason: str) -> int:
        """Free ``st``'s block (count first, then cache or free it); 1 if freed now, else 0."""
        cache = self._cache
        with self._lock:
            block = st.block
            if block is None:
                return 0
            st.block = None
            st.freed_by = reason
            nbytes = st.nbytes
            self._live_bytes -= nbytes
            self._live_buffers -= 1
            self._free_count += 1
            epoch = st.epoch
            if epoch is not None:
                epoch.live_bytes -= nbytes
                st.epoch = None
            evicted = block if cache is None else cache.put(block)
            if evicted is not None:
                self._device_frees += 1
        if evicted is not None:
            self.device.wait(evicted)
            self.device.free(evicted)
        return 1

    def empty(self, n: int) -> Buffer:
        """A buffer of ``n`` float32 elements with unspecified contents.

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
        """Launch ``kernel(out_array, *input_arrays, *args)``; release ``out`` if it fails."""
        try:
            blocks = [buf._st.block for buf in inputs]
            self.device.launch(out._st.block, *blocks)
            kernel(out._array(), *[buf._array() for buf in inputs], *args)
        except BaseException:
            self.release(out)
            raise
        return out

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
            return Buffer(self._empty, 0, 0)
        return self._run(self._alloc(n), (a, b), self.device.add)

    def mul(self, a: Buffer, b: Buffer) -> Buffer:
        """Element-wise ``a * b`` (op ``buffer_mul``). Returns and raises as :meth:`add`."""
        n = self._detector.require_same_size2("buffer_mul", a, b)
        if not n:
            return Buffer(self._empty, 0, 0)
        return self._run(self._alloc(n), (a, b), self.device.mul)

    def fma(self, a: Buffer, b: Buffer, c: Buffer) -> Buffer:
        """Element-wise ``a * b + c`` (op ``buffer_fma``, roles ``arg0``/``arg1``/``arg2``).
        Returns and raises as :meth:`add`."""
        n = self._detector.require_same_size3("buffer_fma", a, b, c)
        if not n:
            return Buffer(self._empty, 0, 0)
        return self._run(self._alloc(n), (a, b, c), self.device.fma)

    def copy(self, a: Buffer) -> Buffer:
        """A new buffer with the elements of ``a`` (op ``buffer_copy``, role ``arg``).
        Returns and raises as :meth:`add`."""
        n = self._detector.require_live("buffer_copy", a)
        if not n:
            return Buffer(self._empty, 0, 0)
        return self._run(self._alloc(n), (a,), self.device.copy)

    def sum(self, a: Buffer) -> float:
        """The sum of ``a``'s elements, accumulated in float64 (op ``buffer_sum``, role ``arg``).

        A readback: it waits for the kernels before it. Returns 0.0 for a freed buffer when the
        detector is off. Raises as :meth:`add` (but never ``SizeMismatchError``).
        """
        n = self._detector.require_live("buffer_sum", a)
        if not n:
            return 0.0
        self.device.launch(a._st.block)
        return self.device.sum(a._array())

    def to_numpy(self, a: Buffer) -> np.ndarray:
        """A host copy of ``a`` as a 1-D float32 NumPy array (op ``buffer_read``, role ``arg``).

        A readback: it waits for the kernels before it. Returns an empty array for a freed
        buffer when the detector is off. Raises as :meth:`sum`.
        """
        n = self._detector.require_live("buffer_read", a)
        if not n:
            return np.empty(0, dtype=np.float32)
        self.device.launch(a._st.block)
        return self.device.download(a._array())

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
        if not isinstance(buf, Buffer):
            raise TypeError(f"buf must be a Buffer, got {type(buf).__name__}")
        st = buf._st
        if st._alloc is not self:
            raise ValueError("buf belongs to another allocator")
        return self._free_storage(st, "release()")

    def empty_cache(self) -> int:
        """Free every cached block to the device, waiting on each block's completion event.

        Returns:
            The bytes handed back to the device (0 on ``cpu``, which keeps no cache).
        """
        cache = self._cache
        if cache is None:
            return 0
        with self._lock:
            blocks = cache.drain()
            self._device_frees += len(blocks)
        device = self.device
        for block in blocks:
            device.wait(block)
            device.free(block)
        return sum(block.nbytes for block in blocks)

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
        with self._lock:
            epoch = Epoch(len(self._epochs))
            self._epochs.append(epoch)
            return epoch

    def _close_epoch(self, keep: Iterable[Buffer], expected: Epoch | None) -> EpochStats:
        keep_ids = keep_storages(self, keep)  # validate before touching anything
        cache = self._cache
        put = None if cache is None else cache.put
        to_free = []
        kept = []
        with self._lock:
            epochs = self._epochs
            if not epochs:
                raise ArenaError("arena_exit() called with no open arena; call arena_enter() first")
            epoch = epochs[-1]
            if expected is not None and epoch is not expected:
                raise ArenaError(
                    f"the arena scope at depth {expected.depth} exited while the epoch at depth"
                    f" {epoch.depth} is still open; scopes must close innermost first"
                )
            epochs.pop()
            depth = epoch.depth
            count = 0
            nbytes = 0
            for ref in epoch.refs:
                st = ref()
                if st is None or st.epoch is not epoch:
                    continue  # finalized mid-scope, or freed already
                if keep_ids and id(st) in keep_ids:
                    kept.append(st)
                    continue
                block = st.block
                st.block = None
                st.freed_by = "arena_exit"
                st.freed_depth = depth
                st.epoch = None
                count += 1
                nbytes += block.nbytes
                if put is None:
                    to_free.append(block)
                else:
                    evicted = put(block)
                    if evicted is not None:
                        to_free.append(evicted)
            st = None
            epoch.refs = []
            epoch.live_bytes -= nbytes
            kept_bytes = 0
            parent = epochs[-1] if epochs else None
            if parent is not None:
                live = parent.live_bytes
                parent.peak_bytes = max(parent.peak_bytes, live + epoch.peak_bytes)
            for st in kept:
                kept_bytes += st.nbytes
                st.epoch = parent
                if parent is not None:
                    parent.refs.append(weakref.ref(st))
            if parent is not None:
                parent.live_bytes += kept_bytes
            self._live_bytes -= nbytes
            self._live_buffers -= count
            self._free_count += count
            self._reclaimed_buffers += count
            self._reclaimed_bytes += nbytes
            self._device_frees += len(to_free)
            stats = epoch.closed(count, nbytes, len(kept), kept_bytes)
        device = self.device
        for block in to_free:
            device.wait(block)
            device.free(block)
        return stats

    # -- telemetry -------------------------------------------------------------------------------

    def stats(self) -> AllocatorStats:
        """A consistent snapshot of every counter; see :class:`AllocatorStats` for the fields."""
        device_free, device_total = self.device.memory_info()
        cache = self._cache
        with self._lock:
            return AllocatorStats(
                backend=self.backend,
                live_bytes=self._live_bytes,
                peak_bytes=self._peak_bytes,
                live_buffers=self._live_buffers,
                alloc_count=self._alloc_count,
                free_count=self._free_count,
                cache_bytes=0 if cache is None else cache.bytes,
                cache_cap_bytes=0 if cache is None else cache.cap_bytes,
                cache_hits=self._cache_hits,
                cache_misses=self._cache_misses,
                cap_evictions=0 if cache is None else cache.evictions,
                device_mallocs=self._device_mallocs,
                device_frees=self._device_frees,
                oom_flushes=self._oom_flushes,
                device_free_bytes=device_free,
                device_total_bytes=device_total,
                arena_depth=len(self._epochs),
                arena_reclaimed_buffers=self._reclaimed_buffers,
                arena_reclaimed_bytes=self._reclaimed_bytes,
            )

    # -- fork safety -------------------------------------------------------------------------

    def _before_fork(self) -> None:
        self._fork_held = self._lock.acquire(timeout=_FORK_LOCK_TIMEOUT_S)

    def _after_fork_in_parent(self) -> None:
        if self._fork_held:
            self._fork_held = False
            self._lock.release()

    def _after_fork_in_child(self) -> None:
        self._fork_held = False
        self._lock = threading.RLock()
        self.device.after_fork_in_child()


def _for_each_instance(method: str) -> Callable[[], None]:
    def hook() -> None:
        for alloc in list(_instances):
            getattr(alloc, method)()

    return hook


os.register_at_fork(
    before=_for_each_instance("_before_fork"),
    after_in_parent=_for_each_instance("_after_fork_in_parent"),
    after_in_child=_for_each_instance("_after_fork_in_child"),
)
