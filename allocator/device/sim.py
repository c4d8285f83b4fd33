"""The simulated device: host memory that behaves like a GPU's.

What it adds over the CPU stub:

- a capacity: an allocation past ``capacity_bytes`` fails like ``cudaMalloc`` does;
- streams with one logical clock each, and completion events on them. The host clock ``now_us``
  advances only when the host waits (``wait``, a stream's or the device's ``synchronize``, a
  readback, a free to the device), by :data:`QUERY_COST_US` per :meth:`Stream.query
  <allocator.device.stream.Stream.query>`, or when a test calls :meth:`~SimDevice.advance`. A
  kernel launched on stream ``s`` at host time t completes at ``max(t, s's last completion) +
  latency_us``; ``wait_stream`` moves a stream's last completion up to the other's. With a
  latency of 0 every kernel is complete at once and nothing is checked;
- a free to the device is ``cudaFree``, which synchronizes the whole device first: the host
  clock moves to the last completion of every stream (the memory history says so, a
  ``device_synchronize`` annotation);
- the **race check**, CUDA's rules decided from a happens-before relation, not from timing (a
  vector clock per stream and one for the host, as ThreadSanitizer keeps them; the rules are
  :mod:`allocator.device._happens_before`, which the ``cuda`` backend's opt-in check shares:
  the simulator is that checker plus its logical clock). A kernel is
  ordered after another if they run on the same stream, or if a chain of ``wait_stream`` (and
  events) and host waits connects them: the host learns that a stream's kernels completed when
  it waits for the stream, for the device or for an event recorded after them, or when a query
  of one of those returns true; every kernel launched afterwards, on any stream, is ordered
  after them. Letting time pass (:meth:`~SimDevice.advance`) orders nothing. Per block the
  simulator keeps the last write and the last read of each stream; a kernel that reads a block
  whose last write is not ordered before it, or writes one whose last write or any read is not,
  aborts the process::

      sim: stream <S> reads block #<n> while stream <W>'s write (until t=<T>) is not waited for
      sim: stream <S> writes block #<n> while stream <R>'s read (until t=<T>) is not waited for

  where ``T`` is the completion time of the other kernel. The block's previous lives count too
  (the reuse cache hands a block to its own stream at once, so a stream that used it without
  ``record_stream`` and without its owner waiting for it races with its next life); then the
  line is::

      sim: block #<id> reused on stream <A> while stream <B>'s kernel is in flight (until t=<us>)

- failure injection for tests: :meth:`~SimDevice.fail_next_mallocs`.

Its lock is re-entrant and its critical sections call nothing outside this module (see
:mod:`allocator._locks`; the vector clocks are small dicts, so they may allocate, which is safe
because a finalizer never takes a lock), so a finalizer or another callback can neither run
allocator logic inside one nor deadlock on it. The process aborts, when it does, once the lock
is released.

Kernels run eagerly on NumPy arrays; only the timing and the ordering are simulated.
"""

from __future__ import annotations

import itertools

from .. import _locks
from ._happens_before import HappensBefore, StreamClock, StreamRaceError
from ._happens_before import join as _join
from .base import Block, Device, DeviceAllocationError, Stream, fatal, host_array

__all__ = [
    "QUERY_COST_US",
    "SimBlock",
    "SimDevice",
    "SimEvent",
    "SimStream",
    "access_message",
    "race_message",
]

QUERY_COST_US = 1
"""Logical microseconds a query (:meth:`Stream.query <allocator.device.stream.Stream.query>`)
takes on the host, so that a loop polling a stream sees it complete after at most
``latency_us / QUERY_COST_US`` polls per kernel queued (a query that does not move the clock
would never turn true: the host clock moves only when the host waits). The reuse cache's own
polls of its blocks' events cost nothing."""


def race_message(block_id: int, stream: str, other: str, until_us: int) -> str:
    """The race check's fatal line for a block's next life (DESIGN 2.4)."""
    return (
        f"sim: block #{block_id} reused on stream {stream} while stream {other}'s kernel is in"
        f" flight (until t={until_us})"
    )


def access_message(
    block_id: int, stream: str, writes: bool, other: str, other_writes: bool, until_us: int
) -> str:
    """The race check's fatal line within one life of a block (DESIGN 2.4): ``stream`` reads
    (``writes`` false) or writes the block while ``other``'s read or write, which completes at
    ``until_us``, is not ordered before it."""
    verb = "writes" if writes else "reads"
    theirs = "write" if other_writes else "read"
    return (
        f"sim: stream {stream} {verb} block #{block_id} while stream {other}'s {theirs}"
        f" (until t={until_us}) is not waited for"
    )


class SimStream(StreamClock):
    """A simulated stream's clock: its vector clock (a
    :class:`~allocator.device._happens_before.StreamClock`: ``key``, ``vc``, ``host_seen``)
    and its logical time.

    Attributes:
        tail_us: the completion time (logical microseconds) of the last kernel queued on it
            (0 when none).
    """

    __slots__ = ("tail_us",)

    def __init__(self, key: int) -> None:
        super().__init__(key)
        self.tail_us = 0

    def __repr__(self) -> str:
        return f"<SimStream tail={self.tail_us}us>"


class SimEvent:
    """A simulated event: the completion time and the vector clock of its stream when it was
    last recorded (``time_us`` 0 and an empty clock before)."""

    __slots__ = ("time_us", "vc")

    def __init__(self) -> None:
        self.time_us = 0
        self.vc: dict[int, int] = {}

    def __repr__(self) -> str:
        return f"<SimEvent at t={self.time_us}us>"


class SimBlock(Block):
    """A simulated device block.

    Attributes:
        busy_until: the completion time (logical microseconds) of the last kernel, of any
            stream, that used it.
        event: the time at which every event recorded at its last free completes (its own
            stream's and those of ``stream_uses``); ``use_events`` maps each stream of
            ``stream_uses`` to its event's time.
        life: how many times it was freed by a storage (its lives are numbered from 0).
        writer: its last write ``(stream key, epoch, completion time, life, stream name)``,
            or ``None``.
        readers: the last read of each stream since that write, by stream key (same tuples),
            or ``None``.
    """

    __slots__ = ("busy_until", "life", "own_clock", "readers", "use_clock", "writer")

    def __init__(self, block_id: int, nbytes: int, array) -> None:
        super().__init__(block_id, nbytes, array)
        self.busy_until = 0
        self.event = 0
        self.life = 0
        self.writer: tuple | None = None
        self.readers: dict[int, tuple] | None = None
        self.own_clock: dict[int, int] | None = None  # its own stream's vc at its last free
        self.use_clock: dict[int, int] | None = None  # the join of the recorded streams' vcs
        # (the race check's fields, allocator.device._happens_before.BLOCK_FIELDS)


class SimDevice(HappensBefore, Device):
    """The simulated device backend (``DEVMEM_BACKEND=sim``): the race check's rules
    (:class:`~allocator.device._happens_before.HappensBefore`) plus a logical clock.

    Args:
        capacity_bytes: the device's size in bytes (accounting only; blocks are host memory).
        latency_us: logical microseconds from a kernel's start to its completion; >= 0.
        raises: whether a race raises
            :class:`~allocator.device._happens_before.StreamRaceError` with the fatal line
            instead of aborting (``DEVMEM_STREAM_CHECK=raise``).

    Attributes:
        now_us: the host clock, in logical microseconds.
        tail_us: the latest completion time of the kernels queued so far, on any stream.
        used_bytes: the bytes of the blocks allocated now.

    Raises:
        ValueError: ``capacity_bytes`` < 1 or ``latency_us`` < 0.
    """

    name = "sim"
    has_cache = True
    logical_clock = True

    def __init__(self, capacity_bytes: int, latency_us: int = 0, raises: bool = False) -> None:
        if capacity_bytes < 1:
            raise ValueError(f"capacity_bytes must be >= 1, got {capacity_bytes}")
        if latency_us < 0:
            raise ValueError(f"latency_us must be >= 0, got {latency_us}")
        super().__init__()
        self.capacity_bytes = capacity_bytes
        self.latency_us = latency_us
        self.raises = raises
        self.tracks_launches = latency_us > 0  # with no latency every kernel is done at once
        self.used_bytes = 0
        self.now_us = 0
        self.tail_us = 0
        self._fail_next = 0
        self._ids = itertools.count(1)
        self._init_rules()
        self._lock = _locks.new_lock(self, _locks.BACKEND)

    # -- allocation --------------------------------------------------------------------------

    def fail_next_mallocs(self, count: int = 1) -> None:
        """Make the next ``count`` allocations fail as if the device were full.

        Raises:
            ValueError: ``count`` is negative.
        """
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        with self._lock:
            self._fail_next = count

    def malloc(self, nbytes: int) -> SimBlock:
        """Allocate a block, or raise :class:`DeviceAllocationError` when the capacity (or an
        injected failure) says no."""
        with self._lock:  # allocates nothing: the error is built once the lock is released
            injected = self._fail_next > 0
            if injected:
                self._fail_next -= 1
            free = self.capacity_bytes - self.used_bytes
            fits = not injected and nbytes <= free
            if fits:
                self.used_bytes += nbytes
                block_id = next(self._ids)
        if injected:
            raise DeviceAllocationError("sim: injected allocation failure")
        if not fits:
            raise DeviceAllocationError(
                f"sim: {nbytes} bytes requested, {free} of {self.capacity_bytes} free"
            )
        try:
            array = host_array(nbytes)
        except DeviceAllocationError:
            with self._lock:
                self.used_bytes -= nbytes
            raise
        return SimBlock(block_id, nbytes, array)

    def free(self, block: SimBlock) -> None:
        """Free ``block``: ``cudaFree``, which synchronizes the device first (the host clock
        moves to every stream's last completion). A block still in flight after that is a bug
        of the simulator itself, and aborts."""
        self.synchronize()
        self._release(block)

    def _release(self, block: SimBlock) -> None:
        """Give ``block``'s bytes back to the device, aborting if a kernel still uses it (the
        check a free made before it synchronized; the mutant probes call this alone)."""
        if block.busy_until > self.now_us:
            fatal(
                f"devmem sim: fatal: free of block #{block.id} ({block.nbytes} bytes) while a"
                f" kernel using it is still in flight (completes at t={block.busy_until}us,"
                f" now t={self.now_us}us)"
            )
        with self._lock:
            self.used_bytes -= block.nbytes
        block.array = None

    def memory_info(self) -> tuple[int, int]:
        return self.capacity_bytes - self.used_bytes, self.capacity_bytes

    # -- streams: one logical clock each --------------------------------------------------------

    def _stream_handle(self, default: bool) -> SimStream:
        return SimStream(next(self._keys))

    def wait_stream(self, stream: Stream, other: Stream) -> None:
        with self._lock:
            mine, theirs = stream.handle, other.handle
            if theirs.tail_us > mine.tail_us:
                mine.tail_us = theirs.tail_us
            _join(mine.vc, theirs.vc)

    def synchronize_stream(self, stream: Stream) -> None:
        with self._lock:
            clock = stream.handle
            if clock.tail_us > self.now_us:
                self.now_us = clock.tail_us
            self._observe(clock.vc)

    def _query(self, time_us: int, vc: dict) -> bool:
        """Whether work completing at ``time_us`` (vector clock ``vc``) is done; the query
        itself takes :data:`QUERY_COST_US` of host time, and a true answer orders the host
        after that work."""
        with self._lock:
            self.now_us += QUERY_COST_US
            done = time_us <= self.now_us
            if done:
                self._observe(vc)
        return done

    def stream_done(self, stream: Stream) -> bool:
        """Whether ``stream``'s kernels completed (:meth:`_query`: it costs host time)."""
        clock = stream.handle
        return self._query(clock.tail_us, clock.vc)

    def known_done(self, stream: Stream) -> bool:
        """Whether the host has learned (by a wait, a query that returned true or a device
        synchronization, directly or through another stream that waited for this one) that
        every kernel queued on ``stream`` so far completed. Only a look: it costs no host time
        and orders nothing."""
        with self._lock:
            return self._known_done(stream.handle)

    def new_event_handle(self) -> SimEvent:
        return SimEvent()

    def record_event(self, stream: Stream, event) -> None:
        with self._lock:
            clock, handle = stream.handle, event.handle
            handle.time_us = clock.tail_us
            handle.vc = dict(clock.vc)

    def wait_event(self, stream: Stream, event) -> None:
        with self._lock:
            clock, handle = stream.handle, event.handle
            if handle.time_us > clock.tail_us:
                clock.tail_us = handle.time_us
            _join(clock.vc, handle.vc)

    def event_done(self, event) -> bool:
        """Whether ``event`` completed (:meth:`_query`: it costs host time)."""
        handle = event.handle
        return self._query(handle.time_us, handle.vc)

    def synchronize_event(self, event) -> None:
        with self._lock:
            handle = event.handle
            if handle.time_us > self.now_us:
                self.now_us = handle.time_us
            self._observe(handle.vc)

    def launch(self, stream: Stream, out: SimBlock | None = None, *inputs: SimBlock) -> None:
        """Queue a kernel on ``stream``'s clock that writes ``out`` (``None`` for a readback)
        and reads ``inputs``; abort (the race check) if another stream's access to one of them
        is not ordered before it."""
        message = self.launch_message(stream, out, *inputs)
        if message is not None:
            if self.raises:
                raise StreamRaceError(message)
            fatal(message)

    def launch_message(
        self, stream: Stream, out: SimBlock | None = None, *inputs: SimBlock
    ) -> str | None:
        """:meth:`launch` without the abort: queue the kernel and return the race check's fatal
        line, or ``None`` when it is ordered after every conflicting access. (The fake CuPy of
        the suites backs its streams with these clocks and words the line as its own.)"""
        latency = self.latency_us
        if not latency:
            return None
        clock = stream.handle
        message = None
        with self._lock:
            now = self.now_us
            start = now if now > clock.tail_us else clock.tail_us
            done = start + latency
            clock.tail_us = done
            if done > self.tail_us:
                self.tail_us = done
            message = self._access(clock, stream.name, out, inputs, done)
            if message is None:
                if out is not None and done > out.busy_until:
                    out.busy_until = done
                for block in inputs:
                    if done > block.busy_until:
                        block.busy_until = done
        return message

    @staticmethod
    def _conflict(
        block: SimBlock, name: str, writes: bool, access: tuple, other_writes: bool
    ) -> str:
        other_name, until, life = access[4], access[2], access[3]
        if life < block.life:
            return race_message(block.id, name, other_name, until)
        return access_message(block.id, name, writes, other_name, other_writes, until)

    # -- events ------------------------------------------------------------------------------

    def record(self, block: SimBlock) -> None:
        """Record the block's events at a free: each completes when its stream's kernels queued
        so far have. Its accesses stay for the race check against its next life."""
        if not self.latency_us:
            return  # every kernel, and so every event, is complete at once
        with self._lock:
            own = block.stream.handle
            event = own.tail_us
            streams = block.stream_uses
            self._record_block(block, own, [other.handle for other in streams or ()])
            if streams:
                events = {other: other.handle.tail_us for other in streams}
                block.use_events = events
                latest = max(events.values())
                if latest > event:
                    event = latest
            else:
                block.use_events = None
            block.event = event

    def ready(self, block: SimBlock) -> bool:
        """Whether the events on the block's other streams completed. Only a look: the reuse
        cache's query, which orders the host after them, is :meth:`take_ready`."""
        events = block.use_events
        if not events:
            return True
        now = self.now_us
        return all(t <= now for t in events.values())

    def take_ready(self, block: SimBlock) -> bool:
        """:meth:`ready`, queried by the reuse cache before it reuses the block: a true answer
        orders the host (and so the block's next life) after those events, which the block
        then forgets (so that it keeps no other stream alive while it is cached)."""
        if not self.ready(block):
            return False
        if block.use_clock:
            with self._lock:
                self._observe(block.use_clock)
        block.use_events = block.use_clock = None
        return True

    def pending_streams(self, block: SimBlock) -> tuple[Stream, ...]:
        events = block.use_events
        if not events:
            return ()
        now = self.now_us
        return tuple(other for other, t in events.items() if t > now)

    def wait(self, block: SimBlock) -> None:
        with self._lock:
            if block.event > self.now_us:
                self.now_us = block.event
            self._observe_block(block)

    def synchronize(self) -> None:
        with self._lock:
            if self.tail_us > self.now_us:
                self.now_us = self.tail_us
            self._observe_all()

    def download(self, stream: Stream, src):
        self.synchronize_stream(stream)
        return super().download(stream, src)

    def sum(self, stream: Stream, src) -> float:
        self.synchronize_stream(stream)
        return super().sum(stream, src)

    def clock_us(self) -> int:
        """The logical host clock ``now_us`` (it advances only on waits, queries and
        :meth:`advance`)."""
        return self.now_us

    def advance(self, microseconds: int) -> None:
        """Let ``microseconds`` of host time pass (so in-flight kernels may complete; this
        orders nothing: the host learns of a completion only by waiting or querying).

        Raises:
            ValueError: ``microseconds`` is negative.
        """
        if microseconds < 0:
            raise ValueError(f"microseconds must be >= 0, got {microseconds}")
        with self._lock:
            self.now_us += microseconds
