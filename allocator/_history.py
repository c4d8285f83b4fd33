"""The memory history: a recorder, and the two layers that feed it while recording is on.

What it adds: a ring of the allocator's events in PyTorch's trace vocabulary, each with a
timestamp (:meth:`Device.clock_us <allocator.device.Device.clock_us>`: the host clock, the
logical clock on ``sim``), the stream, the address and size, and (if asked) the Python stack of
the call that caused it; and the frames each live block and each segment was allocated with,
which snapshots report (:mod:`allocator._snapshot`). Source: the DeepSpeed seed's advice to
"capture a torch memory history, which records exactly when (by recording the call stack) each
storage is finally released" (``../shared/seeds/deepspeed-zero3-release-lifetime.txt``).

Recording is one more pair of layers (RMM's logging adaptor), inserted into the stack only while
it is on, so that recording off costs nothing at all: the layers' code paths are exactly those
of an allocator that never recorded::

    ArenaRegistry -> HistoryLayer -> Statistics -> [CachingLayer]
                  -> DeviceHistoryLayer -> DeviceLayer

Events, and where each is recorded (an allocation once its upstream succeeded, a free as it is
requested, its completion and a device free once they happened):

- :class:`HistoryLayer` (over the statistics layer): ``alloc`` when a block is handed to a
  storage; ``free_requested`` when a storage's block is freed (``release``, ``resize_(0)``, an
  arena exit, the finalizer's queue being drained); ``free_completed`` once the freed block is
  reusable, i.e. not :func:`awaiting_free` (at once when the cache takes it ready; otherwise at
  the first allocation that finds it ready, as PyTorch's caching allocator processes its events
  at malloc, or when it is waited on and freed to the device). Annotations: ``release`` (with
  the reason: ``release()``, ``resize_``'s reason such as ``release_param``), ``arena_exit``
  (depth, reclaimed count and bytes).
- :class:`DeviceHistoryLayer` (over the device layer): ``segment_alloc`` after a device malloc,
  ``segment_free`` after a device free (so after the event wait); annotations ``cap_evict`` and
  ``device_synchronize`` (``from_us``, ``to_us``: the host waited in a device free, for the
  block's events and then for the whole device, as ``cudaFree`` synchronizes it; recorded only
  where the clock moved on a device whose clock moves only when the host waits: ``sim``).
- The front end records ``oom`` when it raises :class:`~allocator.DeviceOutOfMemory`.

Stacks: a block freed by the finalizer is recorded when the next public call drains the queue,
with that call's stack under a marker frame (:data:`allocator._stacks.FINALIZED`); a finalizer
itself never records anything. When the allocator is dropped, the layers are taken out before
its own teardown runs (a weak-reference callback that only rebinds attributes), so the
teardown's frees are not recorded either.

Streams: a block is reported on its stream's id (the default stream is 0, as in PyTorch's
format; ``alloc.new_stream()`` numbers the others from 1). :func:`block_stream` and
:func:`awaiting_free` are the one place that reads a block's stream and whether a freed block
still waits on other streams' events.

The recorder's lock (rank ``HISTORY`` in :mod:`allocator._locks`) guards the ring and its maps;
under it only a backend's ``ready`` and clock are called. Stacks and addresses are read before
it is taken.
"""

from __future__ import annotations

import collections
import gc
import weakref
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from . import _locks, _stacks
from ._buffer import Storage
from ._free_cause import FreeCause

if TYPE_CHECKING:
    from ._arena import ArenaRegistry
    from ._cache import CachingLayer
    from ._device_layer import DeviceLayer
    from ._statistics import EpochCounter, Statistics
    from .device.base import Block, Device
    from .device.stream import Stream

__all__ = [
    "ACTIONS",
    "ANNOTATIONS",
    "DEFAULT_MAX_ENTRIES",
    "FREED",
    "DeviceHistoryLayer",
    "HistoryLayer",
    "Recorder",
    "awaiting_free",
    "block_stream",
    "expanded",
    "held",
    "storages",
]

ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom")
"""The events, in PyTorch's trace vocabulary (``device_traces`` of a snapshot)."""

ANNOTATIONS = ("arena_exit", "release", "cap_evict", "device_synchronize")
"""Our own annotations (``snapshot["devmem"]["annotations"]``, where PyTorch's readers never
look)."""

DEFAULT_MAX_ENTRIES = 100_000

_NO_FRAMES: tuple = ()

FREED = "free_requested+free_completed"
"""The action of a ring entry that stands for a ``free_requested``, its ``release``
annotation when its ``extra`` is the release's :class:`FreeCause`, and a ``free_completed`` at
the same time (a block no other stream used): one entry where there would be three, which is
most of what recording costs per free. :meth:`Recorder.entries` expands it."""


def block_stream(block: Block) -> int:
    """The id of the stream ``block`` was allocated on, PyTorch's ``stream`` field (0 is the
    default stream; a block not yet handed out counts as the default stream's)."""
    return block.stream_id


def held(
    registry: ArenaRegistry, cache: CachingLayer | None, device: Device
) -> tuple[list[tuple[Storage, Block]], dict[Block, str]]:
    """What the allocator holds now: ``(storage, block)`` for every live storage (one walk of
    the collector's objects), and every block held, live or cached, with its snapshot state
    (``active_allocated``, ``active_pending_free`` or ``inactive``)."""
    live = []
    for storage in storages(registry):
        block = storage.block
        if block is not None:
            live.append((storage, block))
    states = {block: "active_allocated" for _, block in live}
    for block in [] if cache is None else cache.blocks():
        if block not in states:
            states[block] = "active_pending_free" if awaiting_free(device, block) else "inactive"
    return live, states


def storages(registry: ArenaRegistry) -> list[Storage]:
    """The storages of ``registry`` that still hold a block (a walk of the collector's
    objects: the allocator keeps no list of them, which is what keeps recording off free)."""
    return [
        obj
        for obj in gc.get_objects()
        if type(obj) is Storage and obj._home is registry and obj._cell
    ]


def awaiting_free(device: Device, block: Block) -> bool:
    """Whether the freed ``block`` still waits on the events of other streams that used it
    (``buf.record_stream``) before it can be reused (a snapshot's ``active_awaiting_free``;
    ``free_completed`` is recorded once this turns false). A block used on its own stream only
    is reusable at once: stream order makes that safe. Never waits.
    """
    return not device.ready(block)


class Recorder:
    """The memory history of one allocator.

    Args:
        device: the allocator's backend (for its clock and its blocks' events).

    Attributes:
        device: the backend.
        recording: whether the history layers are in the stack.
        stacks: whether events carry the Python stack.
        ring: the events, oldest first, at most ``ring.maxlen`` entries: tuples ``(action,
            address, size, stream, time_us, frames, extra)``; ``extra`` is ``None``, a dict of
            an annotation's or an ``oom``'s own fields, or a release's :class:`FreeCause`. A
            :data:`FREED` entry stands for up to three of them; read it through
            :meth:`entries`, which expands it and keeps the newest ``ring.maxlen``.
        alloc_frames: the frames each live block recorded while on was allocated with. They
            belong to the storage that allocation made, not to the block (a cached block is
            handed to another storage later): exact while recording (a free takes them off);
            once stopped, ``owners`` says which storage they belong to.
        at_stop: set by :meth:`stop` (``None`` until then, and while recording): per address
            held when recording stopped, ``(size, state, stream, storage)``, the state the
            trace ends in; ``storage`` is a weak reference to the storage of a live block
            (else ``None``). A snapshot taken later adds what changed since to its trace.
        owners: set by :meth:`stop`: the storage (a weak reference) that holds each block of
            ``alloc_frames`` at the stop. A block that another storage holds by now was freed
            and allocated again while history was off: its frames are not this storage's.
        segment_frames: the frames each device block recorded while on was malloc'd with.
        pending: freed blocks whose ``free_completed`` is not recorded yet: ``(address, size,
            stream, frames, alloc_frames)``, the fields of their ``free_requested`` and the
            frames they were allocated with.
    """

    __slots__ = (
        "__weakref__",
        "_lock",
        "_unhook",
        "addresses",
        "alloc_frames",
        "at_stop",
        "device",
        "owners",
        "pending",
        "recording",
        "ring",
        "segment_frames",
        "stacks",
    )

    def __init__(self, device: Device) -> None:
        self.device = device
        self._lock = _locks.new_lock(self, _locks.HISTORY)
        self._unhook: weakref.finalize | None = None
        self.recording = False
        self.stacks = True
        self.ring: collections.deque = collections.deque(maxlen=DEFAULT_MAX_ENTRIES)
        self.addresses: dict[Block, int] = {}
        self.alloc_frames: dict[Block, tuple] = {}
        self.owners: dict[Block, weakref.ref] = {}
        self.at_stop: dict[int, tuple] | None = None
        self.segment_frames: dict[Block, tuple] = {}
        self.pending: dict[Block, tuple] = {}

    # -- switching it on and off ---------------------------------------------------------------

    def start(
        self,
        owner: object,
        registry: ArenaRegistry,
        stats: Statistics,
        cache: CachingLayer | None,
        device_layer: DeviceLayer,
        *,
        max_entries: int,
        stacks: bool,
    ) -> None:
        """Start recording: a fresh ring of ``max_entries``, and the two history layers put in
        the stack. If it is already recording, only ``max_entries`` (keeping the newest) and
        ``stacks`` change. When ``owner`` (the allocator) is dropped, the layers are taken out.
        """
        with self._lock:
            self.stacks = stacks
            if self.recording:
                if max_entries != self.ring.maxlen:
                    self.ring = collections.deque(self.ring, maxlen=max_entries)
                return
            self.ring = collections.deque(maxlen=max_entries)
            self.pending.clear()
            self.addresses.clear()
            # the frames of blocks freed (and perhaps allocated again) while off are stale
            owners, frames_of = self.owners, self.alloc_frames
            for block in list(frames_of):
                ref = owners.get(block)
                storage = None if ref is None else ref()
                if storage is None or storage.block is not block:
                    del frames_of[block]
            owners.clear()
            self.at_stop = None
            self.recording = True
        lower = stats if cache is None else cache
        lower._upstream = DeviceHistoryLayer(device_layer, self)
        registry._upstream = HistoryLayer(stats, self)
        if self._unhook is None:
            self._unhook = weakref.finalize(owner, _unhook, registry, stats, lower, device_layer)
            self._unhook.atexit = False

    def stop(self, registry: ArenaRegistry, cache: CachingLayer | None) -> None:
        """Stop recording: the history layers leave the stack; the ring is kept for snapshots.
        Freed blocks found reusable by now get their ``free_completed`` first. Then the state
        the trace ends in is kept (:attr:`at_stop`, one walk of the collector's objects), and
        each block of :attr:`alloc_frames` is tied to the storage that holds it
        (:attr:`owners`). Stopping a recording that is off changes nothing.
        """
        info = None if self._unhook is None else self._unhook.peek()
        if info is not None:  # the callback stays armed for the next start
            _unhook(*info[2])
        with self._lock:
            was = self.recording
            if was:
                self._complete_ready(self.device.clock_us())
            self.recording = False
        if not was:
            return
        live, states = held(registry, cache, self.device)
        owner = {block: weakref.ref(storage) for storage, block in live}
        at_stop = {}
        for block, state in states.items():
            ref = owner.get(block)
            at_stop[block.address] = (block.nbytes, state, block_stream(block), ref)
        with self._lock:
            frames_of = self.alloc_frames
            for block in [block for block in frames_of if block not in owner]:
                del frames_of[block]
            self.owners = {block: owner[block] for block in frames_of}
            self.at_stop = at_stop

    def storage_frames(self, block: Block, storage: Storage) -> tuple | None:
        """The captured stack ``storage``'s allocation of ``block`` was recorded with (empty
        without stacks), or ``None`` if it was not recorded (made while history was off)."""
        frames = self.alloc_frames.get(block)
        if frames is None or self.recording:
            return frames
        ref = self.owners.get(block)
        return frames if ref is not None and ref() is storage else None

    # -- events (called by the layers and the front end) -----------------------------------------

    def _frames(self) -> tuple:
        return _stacks.capture(3) if self.stacks else _NO_FRAMES

    def _address(self, block: Block) -> int:
        """``block.address``, read once per block (a NumPy array's address costs a dict)."""
        address = self.addresses.get(block)
        if address is None:
            address = self.addresses[block] = block.address
        return address

    def _complete_ready(self, now: int, blocks: Sequence[Block] | None = None) -> None:
        """Record ``free_completed`` for every pending block (of ``blocks``, if given) that is
        reusable now (lock held)."""
        pending = self.pending
        if not pending:
            return
        device = self.device
        append = self.ring.append
        candidates = pending if blocks is None else [b for b in blocks if b in pending]
        for block in [block for block in candidates if not awaiting_free(device, block)]:
            address, size, stream, frames, _ = pending.pop(block)
            append(("free_completed", address, size, stream, now, frames, None))

    def poll(self) -> None:
        """Record ``free_completed`` for the pending blocks that are reusable now."""
        with self._lock:
            self._complete_ready(self.device.clock_us())

    def allocated(self, block: Block) -> None:
        """``alloc`` of ``block`` (handed to a storage), after the frees found completed."""
        frames = _stacks.capture(2) if self.stacks else _NO_FRAMES
        address = self.addresses.get(block)
        if address is None:
            address = self._address(block)
        stream = block.stream_id  # block_stream(block), without the call
        lock = self._lock
        lock.acquire()
        try:
            now = self.device.clock_us()
            pending = self.pending
            if pending:
                self._complete_ready(now)
                freed = pending.pop(block, None)
                if freed is not None:  # taken from the cache before a poll saw it ready
                    self.ring.append(("free_completed", *freed[:3], now, freed[3], None))
            self.ring.append(("alloc", address, block.nbytes, stream, now, frames, None))
            if frames:  # without stacks a block has none to remember
                self.alloc_frames[block] = frames
        finally:
            lock.release()

    def freed(self, block: Block, cause: FreeCause) -> bool:
        """:meth:`free_requested` of one block (a storage's ``release``, ``resize_(0)`` or
        finalization; an arena exit goes through :meth:`free_requested`), the common case
        without building lists. A block no other stream used (no ``stream_uses``) is reusable
        as soon as its layer takes it back, so its ``free_completed`` is recorded here too,
        before the block is handed upstream (where no other call can take it yet): returns
        whether it was (else :meth:`returned_one` checks once upstream has it)."""
        kind = cause.kind
        if kind == "arena_exit":
            self.free_requested((block,), cause)
            return False
        frames = _stacks.capture(2) if self.stacks else _NO_FRAMES
        if kind == "finalize":
            frames = (*_stacks.FINALIZED_MARK, *frames)
        address = self.addresses.get(block)
        if address is None:
            address = self._address(block)
        size, stream = block.nbytes, block.stream_id
        lock = self._lock
        lock.acquire()
        try:
            now = self.device.clock_us()
            frames_of = self.alloc_frames
            alloc_frames = frames_of.pop(block, _NO_FRAMES) if frames_of else _NO_FRAMES
            release = cause if kind == "release" else None
            if block.stream_uses:
                append = self.ring.append
                append(("free_requested", address, size, stream, now, frames, None))
                if release is not None:
                    append(("release", address, size, stream, now, frames, release))
                self.pending[block] = (address, size, stream, frames, alloc_frames)
                return False
            # the request, its release annotation and its completion, as one entry
            self.ring.append((FREED, address, size, stream, now, frames, release))
            return True
        finally:
            lock.release()

    def returned_one(self, block: Block) -> None:
        """:meth:`returned` of one block: ``free_completed`` if it is reusable now."""
        lock = self._lock
        lock.acquire()
        try:
            freed = self.pending.get(block)
            if freed is not None and self.device.ready(block):
                del self.pending[block]
                now = self.device.clock_us()
                self.ring.append(("free_completed", *freed[:3], now, freed[3], None))
        finally:
            lock.release()

    def free_requested(self, blocks: Sequence[Block], cause: FreeCause) -> None:
        """``free_requested`` of each of ``blocks`` (freed by a storage because of ``cause``),
        with the ``release`` or ``arena_exit`` annotation the cause calls for (a ``release``
        keeps its cause in the ring; a snapshot writes its reason)."""
        frames = self._frames()
        kind = cause.kind
        if kind == "finalize":
            frames = (*_stacks.FINALIZED_MARK, *frames)
        address = self._address
        fields = [(block, address(block), block.nbytes) for block in blocks]
        release = cause if kind == "release" else None
        with self._lock:
            now = self.device.clock_us()
            append = self.ring.append
            if kind == "arena_exit":
                nbytes = sum(field[2] for field in fields)
                extra = {"depth": cause.depth, "reclaimed": len(fields), "bytes": nbytes}
                append(("arena_exit", None, nbytes, 0, now, frames, extra))
            pop_frames, pending = self.alloc_frames.pop, self.pending
            for block, address, size in fields:
                stream = block_stream(block)
                append(("free_requested", address, size, stream, now, frames, None))
                if release is not None:
                    append(("release", address, size, stream, now, frames, release))
                pending[block] = (address, size, stream, frames, pop_frames(block, _NO_FRAMES))

    def returned(self, blocks: Sequence[Block]) -> None:
        """``free_completed`` of those of ``blocks`` that are reusable now that their layer took
        them back (the others stay pending)."""
        with self._lock:
            if self.pending:
                self._complete_ready(self.device.clock_us(), blocks)

    def segment_allocated(self, block: Block) -> None:
        """``segment_alloc`` of ``block`` (a device malloc)."""
        frames = self._frames()
        address, stream = self._address(block), block_stream(block)
        with self._lock:
            now = self.device.clock_us()
            self.ring.append(("segment_alloc", address, block.nbytes, stream, now, frames, None))
            self.segment_frames[block] = frames

    def segment_freeing(self, blocks: Sequence[Block]) -> list[tuple]:
        """Before ``blocks`` are freed to the device: their fields, and whether each was still
        pending (taken off the pending map, so no poll reads a block being freed)."""
        address = self._address
        fields = [(block, address(block), block.nbytes, block_stream(block)) for block in blocks]
        with self._lock:
            pop = self.pending.pop
            return [(*field, pop(field[0], None)) for field in fields]

    def segment_freed(self, fields: list[tuple], cause: FreeCause, before_us: int) -> None:
        """After the device freed them (so after the event wait): the ``device_synchronize``
        annotation if the clock moved since ``before_us`` (the host waited in the frees), then
        for each block the ``free_completed`` it still owed, the ``cap_evict`` annotation, and
        ``segment_free``."""
        frames = self._frames()
        with self._lock:
            now = self.device.clock_us()
            append = self.ring.append
            if now > before_us and self.device.logical_clock:
                extra = {"from_us": before_us, "to_us": now}
                append(("device_synchronize", None, 0, 0, before_us, frames, extra))
            pop_frames, pop_address = self.segment_frames.pop, self.addresses.pop
            for block, address, size, stream, freed in fields:
                if freed is not None:
                    append(("free_completed", address, size, stream, now, freed[3], None))
                if cause.kind == "cap_evict":
                    append(("cap_evict", address, size, stream, now, frames, None))
                append(("segment_free", address, size, stream, now, frames, None))
                pop_frames(block, None)
                pop_address(block, None)

    def oom(self, nbytes: int, device_free: int) -> None:
        """``oom``: an allocation of ``nbytes`` failed with ``device_free`` bytes free."""
        frames = self._frames()
        with self._lock:
            now = self.device.clock_us()
            self.ring.append(("oom", None, nbytes, 0, now, frames, {"device_free": device_free}))

    def entries(self) -> list[tuple]:
        """The ring's events and annotations, oldest first (after the frees found completed by
        now), as :func:`expanded` gives them."""
        with self._lock:  # a copy under the lock, expanded outside it: allocations wait less
            if self.recording:
                self._complete_ready(self.device.clock_us())
            ring, maxlen = list(self.ring), self.ring.maxlen
        return expanded(ring, maxlen)


def expanded(ring: Iterable[tuple], maxlen: int) -> list[tuple]:
    """The events and annotations of ``ring`` (the entries of a :attr:`Recorder.ring`, oldest
    first): each :data:`FREED` entry expanded into the ``free_requested``, ``release`` (if it
    has a cause) and ``free_completed`` it stands for, then the newest ``maxlen`` kept (the
    ring's ``maxlen``), so that ``max_entries`` counts events and annotations
    however the ring stores them."""
    out: list[tuple] = []
    append = out.append
    for entry in ring:
        if entry[0] is not FREED:
            append(entry)
            continue
        _, address, size, stream, now, frames, release = entry
        append(("free_requested", address, size, stream, now, frames, None))
        if release is not None:
            append(("release", address, size, stream, now, frames, release))
        append(("free_completed", address, size, stream, now, frames, None))
    return out[max(len(out) - maxlen, 0) :]  # not out[-maxlen:], which keeps all for 0


def _unhook(
    registry: ArenaRegistry,
    stats: Statistics,
    lower: Statistics | CachingLayer,
    device_layer: DeviceLayer,
) -> None:
    # Take the history layers out of the stack. Also run by a weak-reference callback when the
    # allocator is dropped, before its layers tear down: it only rebinds attributes (no lock,
    # no allocator logic), so that the teardown's frees run without recording anything.
    registry._upstream = stats
    lower._upstream = device_layer


class HistoryLayer:
    """Records ``alloc``, ``free_requested`` and ``free_completed`` over the statistics layer.

    Args:
        upstream: the statistics layer.
        recorder: where the events go.
    """

    __slots__ = ("_recorder", "_upstream")

    def __init__(self, upstream: Statistics, recorder: Recorder) -> None:
        self._upstream = upstream
        self._recorder = recorder

    def allocate(self, nbytes: int, stream: Stream) -> Block:
        """A block from upstream on ``stream``, recorded once it exists (a failure records
        nothing here). Frees found completed are recorded first, as PyTorch's malloc processes
        its events."""
        recorder = self._recorder
        if recorder.pending:
            recorder.poll()
        block = self._upstream.allocate(nbytes, stream)
        recorder.allocated(block)
        return block

    def deallocate(self, block: Block, cause: FreeCause) -> None:
        """Record the request, hand ``block`` upstream, record its completion if it is
        reusable now."""
        recorder = self._recorder
        if recorder.freed(block, cause):
            self._upstream.deallocate(block, cause)
        else:
            self._upstream.deallocate(block, cause)
            recorder.returned_one(block)

    def deallocate_many(self, blocks: Sequence[Block], cause: FreeCause) -> None:
        """:meth:`deallocate` for every one of ``blocks`` (an arena exit)."""
        recorder = self._recorder
        recorder.free_requested(blocks, cause)
        self._upstream.deallocate_many(blocks, cause)
        recorder.returned(blocks)

    def push(self) -> None:
        """Open a statistics epoch (forwarded)."""
        self._upstream.push()

    def pop(self) -> EpochCounter:
        """Close a statistics epoch (forwarded)."""
        return self._upstream.pop()


class DeviceHistoryLayer:
    """Records ``segment_alloc`` and ``segment_free`` over the device layer.

    Args:
        upstream: the device layer.
        recorder: where the events go.
    """

    __slots__ = ("_recorder", "_upstream", "device")

    def __init__(self, upstream: DeviceLayer, recorder: Recorder) -> None:
        self._upstream = upstream
        self._recorder = recorder
        self.device = upstream.device

    def allocate(self, nbytes: int, stream: Stream) -> Block:
        """A device block for ``stream``, recorded once the device returned it.

        Raises:
            DeviceAllocationError: from the device; nothing is recorded.
        """
        block = self._upstream.allocate(nbytes, stream)
        self._recorder.segment_allocated(block)
        return block

    def deallocate(self, block: Block, cause: FreeCause) -> None:
        """Free ``block`` to the device (after its event wait), then record it."""
        fields = self._recorder.segment_freeing((block,))
        before = self.device.clock_us()
        self._upstream.deallocate(block, cause)
        self._recorder.segment_freed(fields, cause, before)

    def deallocate_many(self, blocks: Sequence[Block], cause: FreeCause) -> None:
        """:meth:`deallocate` every one of ``blocks``, in order."""
        blocks = list(blocks)
        fields = self._recorder.segment_freeing(blocks)
        before = self.device.clock_us()
        self._upstream.deallocate_many(blocks, cause)
        self._recorder.segment_freed(fields, cause, before)
