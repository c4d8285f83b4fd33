"""The simulated device: host memory that behaves like a GPU's.

What it adds over the CPU stub:

- a capacity: an allocation past ``capacity_bytes`` fails like ``cudaMalloc`` does;
- streams with one logical clock each, and completion events on them. The host clock ``now_us``
  advances only when the host waits (``wait``, a stream's or the device's ``synchronize``, a
  readback) or when a test calls :meth:`~SimDevice.advance`. A kernel launched on stream ``s``
  at host time t completes at ``max(t, s's last completion) + latency_us``; ``wait_stream``
  moves a stream's last completion up to the other's. With a latency of 0 every kernel is
  complete at once;
- fatal checks, each of which aborts the process naming the block:

  - freeing a block to the device while a kernel that used it is still in flight (how CI proves
    that the layers wait on completion events before they free);
  - the **race check**: a kernel on stream A that touches a block while a kernel of another
    stream B that used the block's previous life is still in flight, i.e. one that does not
    complete before A's kernel starts (how CI proves that ``record_stream`` and event waits are
    honoured: the reuse cache hands a block to its own stream at once, so a stream that used it
    without ``record_stream`` and without A waiting for it races with its next life)::

        sim: block #<id> reused on stream <A> while stream <B>'s kernel is in flight (until t=<us>)

- failure injection for tests: :meth:`~SimDevice.fail_next_mallocs`.

A block's kernel uses are kept per stream for its current life (``uses``) and, once it is freed,
for its previous lives while they may still be in flight (``prior``). Its lock is re-entrant and
its critical sections allocate nothing (see :mod:`allocator._locks`), so a finalizer or another
callback can neither run inside one nor deadlock on it.

Kernels run eagerly on NumPy arrays; only the timing is simulated.
"""

from __future__ import annotations

import itertools

from .. import _locks
from .base import Block, Device, DeviceAllocationError, Stream, fatal, host_array

__all__ = ["SimBlock", "SimDevice", "SimStream", "race_message"]


def race_message(block_id: int, stream: str, other: str, until_us: int) -> str:
    """The race check's fatal line (DESIGN 2.4)."""
    return (
        f"sim: block #{block_id} reused on stream {stream} while stream {other}'s kernel is in"
        f" flight (until t={until_us})"
    )


class SimStream:
    """A simulated stream's clock: ``tail_us`` is the completion time (logical microseconds)
    of the last kernel queued on it (0 when none)."""

    __slots__ = ("tail_us",)

    def __init__(self) -> None:
        self.tail_us = 0

    def __repr__(self) -> str:
        return f"<SimStream tail={self.tail_us}us>"


class SimBlock(Block):
    """A simulated device block.

    Attributes:
        busy_until: the completion time (logical microseconds) of the last kernel, of any
            stream, that used it.
        event: the time at which every event recorded at its last free completes (its own
            stream's and those of ``stream_uses``); ``use_events`` maps each stream of
            ``stream_uses`` to its event's time.
        uses: this life's kernel uses: stream -> completion time of its last kernel here
            (``None`` until a kernel with latency touched it).
        prior: the same for its previous lives, kept while they may be in flight (``None`` when
            there are none): what the race check compares a new kernel with.
    """

    __slots__ = ("busy_until", "prior", "uses")

    def __init__(self, block_id: int, nbytes: int, array) -> None:
        super().__init__(block_id, nbytes, array)
        self.busy_until = 0
        self.event = 0
        self.uses: dict[Stream, int] | None = None
        self.prior: dict[Stream, int] | None = None


class SimDevice(Device):
    """The simulated device backend (``DEVMEM_BACKEND=sim``).

    Args:
        capacity_bytes: the device's size in bytes (accounting only; blocks are host memory).
        latency_us: logical microseconds from a kernel's start to its completion; >= 0.

    Attributes:
        now_us: the host clock, in logical microseconds.
        tail_us: the latest completion time of the kernels queued so far, on any stream.
        used_bytes: the bytes of the blocks allocated now.

    Raises:
        ValueError: ``capacity_bytes`` < 1 or ``latency_us`` < 0.
    """

    name = "sim"
    has_cache = True

    def __init__(self, capacity_bytes: int, latency_us: int = 0) -> None:
        if capacity_bytes < 1:
            raise ValueError(f"capacity_bytes must be >= 1, got {capacity_bytes}")
        if latency_us < 0:
            raise ValueError(f"latency_us must be >= 0, got {latency_us}")
        super().__init__()
        self.capacity_bytes = capacity_bytes
        self.latency_us = latency_us
        self.tracks_launches = latency_us > 0  # with no latency every kernel is done at once
        self.used_bytes = 0
        self.now_us = 0
        self.tail_us = 0
        self._fail_next = 0
        self._ids = itertools.count(1)
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
        """Free ``block``; abort the process if a kernel using it is still in flight."""
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
        return SimStream()

    def wait_stream(self, stream: Stream, other: Stream) -> None:
        with self._lock:
            tail = other.handle.tail_us
            if tail > stream.handle.tail_us:
                stream.handle.tail_us = tail

    def synchronize_stream(self, stream: Stream) -> None:
        with self._lock:
            tail = stream.handle.tail_us
            if tail > self.now_us:
                self.now_us = tail

    def stream_done(self, stream: Stream) -> bool:
        return stream.handle.tail_us <= self.now_us

    def launch(self, stream: Stream, *blocks: SimBlock) -> None:
        """Queue a kernel on ``stream``'s clock and mark ``blocks`` used by it until it
        completes; abort (the race check) if another stream's kernel on a block's previous life
        is still in flight when this one starts."""
        latency = self.latency_us
        if not latency:
            return
        clock = stream.handle
        with self._lock:
            now = self.now_us
            start = now if now > clock.tail_us else clock.tail_us
            done = start + latency
            clock.tail_us = done
            if done > self.tail_us:
                self.tail_us = done
        for block in blocks:
            prior = block.prior
            if prior:
                for other, until in prior.items():
                    if until > start and other is not stream:
                        fatal(race_message(block.id, stream.name, other.name, until))
            if done > block.busy_until:
                block.busy_until = done
            uses = block.uses
            if uses is None:
                block.uses = {stream: done}
            else:
                uses[stream] = done

    # -- events ------------------------------------------------------------------------------

    def record(self, block: SimBlock) -> None:
        """Record the block's events at a free: each completes when its stream's kernels queued
        so far have; then this life's kernel uses join ``prior`` for the race check."""
        if not self.latency_us:
            return  # every kernel, and so every event, is complete at once
        event = block.stream.handle.tail_us
        streams = block.stream_uses
        if streams:
            events = {other: other.handle.tail_us for other in streams}
            block.use_events = events
            latest = max(events.values())
            if latest > event:
                event = latest
        else:
            block.use_events = None
        block.event = event
        uses = block.uses
        if uses:
            now = self.now_us
            prior = block.prior
            keep = {other: t for other, t in prior.items() if t > now} if prior else {}
            for other, t in uses.items():
                if t > now and t > keep.get(other, 0):
                    keep[other] = t
            block.prior = keep or None
            block.uses = None

    def ready(self, block: SimBlock) -> bool:
        events = block.use_events
        if not events:
            return True
        now = self.now_us
        return all(t <= now for t in events.values())

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

    def synchronize(self) -> None:
        with self._lock:
            if self.tail_us > self.now_us:
                self.now_us = self.tail_us

    def download(self, stream: Stream, src):
        self.synchronize_stream(stream)
        return super().download(stream, src)

    def sum(self, stream: Stream, src) -> float:
        self.synchronize_stream(stream)
        return super().sum(stream, src)

    def clock_us(self) -> int:
        """The logical host clock ``now_us`` (it advances only on waits and :meth:`advance`)."""
        return self.now_us

    def advance(self, microseconds: int) -> None:
        """Let ``microseconds`` of host time pass (so in-flight kernels may complete).

        Raises:
            ValueError: ``microseconds`` is negative.
        """
        if microseconds < 0:
            raise ValueError(f"microseconds must be >= 0, got {microseconds}")
        with self._lock:
            self.now_us += microseconds
