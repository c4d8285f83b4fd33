"""The caching layer: a reuse cache of device blocks per stream, a byte cap, flush-and-retry.

What it adds over its upstream (the :class:`~allocator._device_layer.DeviceLayer`): a block
freed by a storage is kept for the next allocation of exactly the same byte size *on the same
stream* instead of going back to the device, up to a byte cap; a failed device allocation
collects garbage, flushes the cache and retries once; and its own counters (hits, misses,
evictions, flushes). Sources: TorchLean's ``take_cached_block``/``return_cached_block`` and its
cache cap (``../shared/seeds/torchlean-cuda-arena-and-cache-cap.txt``); the stream rules are
PyTorch's caching allocator's (``c10/cuda/CUDACachingAllocator.cpp``). The ``cpu`` stub has no
caching layer: the statistics layer sits on the device layer directly.

The stream rule (DESIGN 2.4). A block belongs to the stream it was allocated on (PyTorch:
``Block::stream``; its free lists are per stream, ``get_free_block`` looks only at the
requesting stream's). Freed, it may be reused **at once** by a later allocation on that stream:
the stream runs its kernels in order, so the next life's kernels start after the last life's.
No other stream ever gets it. If ``record_stream`` marked it as used on other streams
(``block.stream_uses``), its free records an event on each of them (``insert_events``) and the
block waits, cached but not reusable, until they have all completed; every allocation first
moves the blocks whose events are done back to their stream's free list (``process_events``).

Order of operations:

- ``allocate(nbytes, stream)``: move the awaiting blocks whose events completed to their free
  lists; take a cached block of that size from ``stream``'s free list (never waiting) and count
  a hit; else allocate from the device and count a miss once it succeeded. On a device failure:
  call ``on_oom`` (the allocator collects cyclic garbage and frees the blocks the collection
  queued, as CuPy's pool does), count a flush, flush the whole cache (each block waited on,
  then freed) and retry once; a second failure propagates.
- ``deallocate(block, cause)``: record the block's events (on its stream and on each stream of
  ``stream_uses``), then decide. With a cap, a block larger than the cap is not cached: it is
  freed to the device (``cap_evictions``, cause ``cap_evict``). A block that would grow the
  cache past the cap (``cache_bytes > cap - nbytes``) makes room instead: the **oldest** cached
  blocks (in the order they were cached, awaiting ones included) leave the cache and are freed
  to the device, as many as it takes (each counted in ``cap_evictions``), so a block that
  nobody reuses cannot hold the cap for good. Then the block joins its stream's free list, or,
  with ``stream_uses``, the blocks awaiting their events.
- a stream dropped (no reference to it left but the cache's blocks, which hold none: a cached
  block's ``stream`` is ``None``, its ``stream_id`` stays) can never allocate again: a weak
  reference's callback only queues its id (a finalizer takes no lock), and the next
  ``allocate``, ``deallocate`` or ``flush`` frees that stream's cached blocks to the device
  (cause ``stream_dropped``), as PyTorch frees a stream's blocks when nothing can reuse them.
- ``flush(cause)``: empty the cache (free lists and awaiting blocks), then free every block it
  held (waiting on each).

The free lists are a dict per stream id of lists keyed by byte size; the awaiting blocks a list;
``_age`` every cached block in the order it was cached (a dict used as an ordered set).
The lock guards them and the counters; the device is called with it released, except
``take_ready``, ``pending_streams`` and ``record`` (which only read or set the block's
events).
``cache_bytes`` (awaiting blocks included: they are cached, not live) is the running total the
cap decision reads (up on push, down on reuse, zero on flush). Dropping the layer (its
allocator) flushes it (cause ``teardown``), except during interpreter shutdown.
"""

from __future__ import annotations

import collections
import sys
import weakref
from collections.abc import Callable, Iterable

from . import _locks
from ._device_layer import DeviceLayer
from ._free_cause import CAP_EVICT, EMPTY_CACHE, OOM_FLUSH, STREAM_DROPPED, TEARDOWN, FreeCause
from .device.base import Block, DeviceAllocationError, Stream

__all__ = ["CachingLayer"]


class CachingLayer:
    """The reuse cache over ``upstream``, with a byte cap and flush-and-retry.

    Args:
        upstream: the device layer it allocates from and frees to.
        cap_bytes: the cache's byte cap; 0 means unbounded.
        on_oom: called with no lock held when a device allocation fails, before the flush; the
            allocator passes a function that collects cyclic garbage and frees what the
            collection queued.

    Attributes:
        cache_bytes: bytes held by the cache now.
        cap_bytes: the cap; 0 means unbounded.
        hits: allocations served from the cache.
        misses: allocations served by the device (a failed one is neither).
        evictions: blocks the cap sent to the device: a freed block larger than the cap, or
            the oldest cached blocks, evicted to make room for a freed one.
        oom_flushes: whole-cache flushes done because a device allocation failed.
        on_oom: see above; may be set after construction.
    """

    __slots__ = (
        "__weakref__",
        "_age",
        "_awaiting",
        "_device",
        "_dropped",
        "_free",
        "_lock",
        "_upstream",
        "cache_bytes",
        "cap_bytes",
        "evictions",
        "hits",
        "misses",
        "on_oom",
        "oom_flushes",
    )

    def __init__(
        self,
        upstream: DeviceLayer,
        cap_bytes: int = 0,
        on_oom: Callable[[], None] | None = None,
    ) -> None:
        self._upstream = upstream
        self._device = upstream.device
        self._free: dict[int, dict[int, list[Block]]] = {}
        self._awaiting: list[Block] = []
        self._age: dict[Block, None] = {}  # every cached block, oldest first
        self._dropped: collections.deque[int] = collections.deque()  # ids of dropped streams
        self._lock = _locks.new_lock(self, _locks.CACHE)
        self.cache_bytes = 0
        self.cap_bytes = cap_bytes
        self.evictions = 0
        self.hits = 0
        self.misses = 0
        self.oom_flushes = 0
        self.on_oom = on_oom

    def allocate(self, nbytes: int, stream: Stream) -> Block:
        """A block of ``nbytes`` bytes for ``stream``: a cached one of that stream (never
        waiting), else a new one from the device.

        Raises:
            DeviceAllocationError: the device had no room even after the flush.
        """
        if self._dropped:
            self.reap()
        lock = self._lock
        lock.acquire()
        try:
            if self._awaiting:
                self._process_events()
            sizes = self._free.get(stream.id)
            if sizes:
                blocks = sizes.get(nbytes)
                if blocks:
                    block = blocks.pop()
                    del self._age[block]
                    block.stream = stream
                    self.cache_bytes -= nbytes
                    self.hits += 1
                    return block
        finally:
            lock.release()
        block = self._from_device(nbytes, stream)
        with lock:
            self.misses += 1
        return block

    def _from_device(self, nbytes: int, stream: Stream) -> Block:
        upstream = self._upstream
        try:
            return upstream.allocate(nbytes, stream)
        except DeviceAllocationError:
            pass
        on_oom = self.on_oom
        if on_oom is not None:
            on_oom()
        with self._lock:
            self.oom_flushes += 1
        self.flush(OOM_FLUSH)
        return upstream.allocate(nbytes, stream)

    def _process_events(self) -> None:
        """Move the awaiting blocks whose other streams' events completed to their stream's
        free list (lock held; PyTorch: ``process_events``)."""
        ready = self._device.take_ready
        waiting = []
        for block in self._awaiting:
            if ready(block):
                block.stream_uses = None
                self._push(block)
            else:
                waiting.append(block)
        self._awaiting = waiting

    @property
    def dropped(self) -> bool:
        """Whether streams were dropped whose cached blocks :meth:`reap` has not freed yet."""
        return bool(self._dropped)

    def watch(self, stream: Stream) -> None:
        """Free ``stream``'s cached blocks once it is dropped (called for every stream but the
        default one). The weak reference's callback only queues the stream's id."""
        weakref.finalize(stream, self._dropped.append, stream.id).atexit = False

    def reap(self) -> None:
        """Free the cached blocks of the streams dropped since the last call, to the device
        (cause ``stream_dropped``; no lock held on entry, the device called with none)."""
        dropped = set()
        while self._dropped:
            dropped.add(self._dropped.popleft())
        with self._lock:
            blocks = []
            for stream_id in dropped:
                for listed in self._free.pop(stream_id, {}).values():
                    blocks += listed
            if self._awaiting:
                blocks += [b for b in self._awaiting if b.stream_id in dropped]
                self._awaiting = [b for b in self._awaiting if b.stream_id not in dropped]
            for block in blocks:
                del self._age[block]
                self.cache_bytes -= block.nbytes
        if blocks:
            self._upstream.deallocate_many(blocks, STREAM_DROPPED)

    def _push(self, block: Block) -> None:
        """Put ``block`` on its stream's free list (lock held)."""
        sizes = self._free.get(block.stream_id)
        if sizes is None:
            self._free[block.stream_id] = {block.nbytes: [block]}
            return
        blocks = sizes.get(block.nbytes)
        if blocks is None:
            sizes[block.nbytes] = [block]
        else:
            blocks.append(block)

    def _put(self, block: Block, evicted: list[Block]) -> None:
        """Record ``block``'s events and cache it, making room under the cap by evicting the
        oldest cached blocks; a block larger than the cap is not cached. What leaves the cache
        is appended to ``evicted`` (lock held)."""
        self._device.record(block)
        nbytes = block.nbytes
        cap = self.cap_bytes
        if cap:
            if nbytes > cap:
                self.evictions += 1
                evicted.append(block)
                return
            if self.cache_bytes > cap - nbytes:
                self._evict_oldest(self.cache_bytes - (cap - nbytes), evicted)
        if block.stream_uses:
            self._awaiting.append(block)
        else:
            self._push(block)
        block.stream = None  # the cache keeps no stream alive (its id stays)
        self._age[block] = None
        self.cache_bytes += nbytes

    def _evict_oldest(self, need: int, evicted: list[Block]) -> None:
        """Take the oldest cached blocks out of the cache until ``need`` bytes left it, onto
        ``evicted`` (lock held)."""
        victims, freed = [], 0
        for old in self._age:
            if freed >= need:
                break
            victims.append(old)
            freed += old.nbytes
        awaiting = False
        for old in victims:
            del self._age[old]
            sizes = self._free.get(old.stream_id)
            listed = sizes.get(old.nbytes) if sizes else None
            if listed and old in listed:
                listed.remove(old)
            else:
                awaiting = True
        if awaiting:
            self._awaiting = [b for b in self._awaiting if b in self._age]
        self.cache_bytes -= freed
        self.evictions += len(victims)
        evicted += victims

    def deallocate(self, block: Block, cause: FreeCause) -> None:
        """Cache ``block``; free to the device (cause ``cap_evict``) what the cap evicted."""
        if self._dropped:
            self.reap()
        evicted: list[Block] = []
        lock = self._lock
        lock.acquire()
        try:
            self._put(block, evicted)
        finally:
            lock.release()
        if evicted:
            self._upstream.deallocate_many(evicted, CAP_EVICT)

    def deallocate_many(self, blocks: Iterable[Block], cause: FreeCause) -> None:
        """:meth:`deallocate` each of ``blocks`` under one acquisition of the lock."""
        if self._dropped:
            self.reap()
        evicted: list[Block] = []
        put = self._put
        with self._lock:
            for block in blocks:
                put(block, evicted)
        if evicted:
            self._upstream.deallocate_many(evicted, CAP_EVICT)

    def flush(self, cause: FreeCause = EMPTY_CACHE) -> int:
        """Free every cached block to the device, waiting on each one's completion event.

        Args:
            cause: why (``empty_cache``, ``oom_flush`` or ``teardown``).

        Returns:
            The bytes handed back.
        """
        self._dropped.clear()  # the flush frees their blocks too
        with self._lock:
            blocks = self._cached()
            self._free = {}
            self._awaiting = []
            self._age = {}
            self.cache_bytes = 0
        self._upstream.deallocate_many(blocks, cause)
        return sum(block.nbytes for block in blocks)

    def counters(self) -> tuple[int, int, int, int, int, int]:
        """``(cache_bytes, cap_bytes, hits, misses, evictions, oom_flushes)``, read together."""
        with self._lock:
            return (
                self.cache_bytes,
                self.cap_bytes,
                self.hits,
                self.misses,
                self.evictions,
                self.oom_flushes,
            )

    def _cached(self) -> list[Block]:
        """The cached blocks (lock held): those on the streams' free lists, then those awaiting
        other streams' events."""
        listed = [
            block for sizes in self._free.values() for blocks in sizes.values() for block in blocks
        ]
        return listed + self._awaiting

    def blocks(self) -> list[Block]:
        """The cached blocks, a copy taken under the lock (for snapshots), in
        :meth:`_cached`'s order."""
        with self._lock:
            return self._cached()

    def awaiting(self) -> tuple[tuple[Block, tuple[Stream, ...]], ...]:
        """The cached blocks not yet reusable, each with the streams whose events it still
        waits on (a block whose events completed is listed with none until the next
        allocation moves it to its free list). Snapshots call such a block
        ``active_pending_free`` (PyTorch's docstring: ``active_awaiting_free``)."""
        pending = self._device.pending_streams
        with self._lock:
            return tuple((block, pending(block)) for block in self._awaiting)

    def __len__(self) -> int:
        """The number of blocks cached (awaiting blocks included)."""
        with self._lock:
            return len(self._cached())

    def __del__(self) -> None:
        # The allocator was dropped: hand the cached blocks back to the device. Nothing can hold
        # this layer's lock now (a thread inside one of its methods would hold a reference), and
        # during interpreter shutdown the device may be gone (CuPy skips its frees then too).
        if not sys.is_finalizing():
            self.flush(TEARDOWN)
