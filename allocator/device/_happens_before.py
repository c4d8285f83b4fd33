"""The stream race check: CUDA's ordering rules as a happens-before relation, one implementation.

Both checkers are this module: the simulator (:class:`~allocator.device.sim.SimDevice`, which
adds a logical clock to it) and the opt-in check of the ``cuda`` backend
(:class:`StreamCheck`, ``DEVMEM_STREAM_CHECK``). Nothing here looks at time: a verdict depends
only on the order of the calls a program makes, so the same program gets the same verdict on
every run and on every GPU.

The rules (a vector clock per stream and one for the host, as ThreadSanitizer keeps them):

- a kernel is ordered after every earlier kernel of its own stream;
- ``wait_stream(s, t)`` and ``s.wait_event(e)`` order every kernel queued on ``s`` afterwards
  after the kernels ``t`` had queued (``e``'s stream had queued before its last record);
- the host learns that kernels completed when it waits for their stream, for the device, for a
  block's events or for an event recorded after them, or when a query of one of those returns
  true (a readback waits for its stream); every kernel launched afterwards, on any stream, is
  ordered after what the host learned. Nothing else orders: letting time pass does not;
- per block, the last write and the last read of each stream since it are kept, across the
  block's lives (a free to the reuse cache starts its next life): a kernel that reads a block
  whose last write is not ordered before it, or writes one whose last write or any read is not,
  races. An access of an earlier life that races is a reuse race (a stream used the block
  without ``record_stream`` and without its owner waiting for it).

What the caller supplies, per access: the stream's :class:`StreamClock`, the stream's name, and
``until``, an opaque value the fatal line says of that access (the simulator's completion time,
the ``cuda`` check's op and kernel number). Per block, the attributes ``writer``, ``readers``,
``life``, ``own_clock`` and ``use_clock`` (:data:`BLOCK_FIELDS`); an access is the tuple
``(stream key, epoch, until, life, stream name)``.

Locking: a subclass owns ``_lock``, a re-entrant backend lock (:mod:`allocator._locks`, rank
``BACKEND``); the methods named ``_...`` run with it held and call nothing outside this module
(the vector clocks are small dicts that may allocate: safe, since a finalizer takes no lock).
"""

from __future__ import annotations

import itertools
import sys

from .. import _locks

__all__ = [
    "BLOCK_FIELDS",
    "STREAM_CHECK_PREFIX",
    "HappensBefore",
    "StreamCheck",
    "StreamClock",
    "StreamRaceError",
    "caller_op",
    "join",
]

BLOCK_FIELDS = ("life", "own_clock", "readers", "use_clock", "writer")
"""The attributes a checked block carries (see :meth:`HappensBefore.reset_block`)."""

STREAM_CHECK_PREFIX = "devmem cuda: stream check:"
"""How the ``cuda`` check's fatal line starts."""


class StreamRaceError(RuntimeError):
    """An unordered conflicting pair of accesses to a block, found by the stream check in
    ``raise`` mode (``DEVMEM_STREAM_CHECK=raise``); the message is the line the ``abort`` mode
    prints."""


def join(into: dict[int, int], other: dict[int, int]) -> bool:
    """``into = max(into, other)`` per stream key; whether ``into`` changed."""
    changed = False
    for key, epoch in other.items():
        if into.get(key, 0) < epoch:
            into[key] = epoch
            changed = True
    return changed


class StreamClock:
    """A stream's vector clock.

    Attributes:
        key: the stream's number in the vector clocks (unique per checker).
        vc: stream key -> how many of that stream's kernels the next kernel queued here is
            ordered after (its own entry counts its own kernels).
        host_seen: the version of the host's vector clock last joined into ``vc``.
    """

    __slots__ = ("host_seen", "key", "vc")

    def __init__(self, key: int) -> None:
        self.key = key
        self.vc = {key: 0}
        self.host_seen = -1

    def __repr__(self) -> str:
        return f"<StreamClock #{self.key} {self.vc}>"


class HappensBefore:
    """The rules, over a subclass's ``_lock`` and its wording of a race (:meth:`_conflict`).

    Call :meth:`_init_rules` in ``__init__``. The ``_...`` methods expect the lock held.
    """

    _lock: object

    def _init_rules(self) -> None:
        self._keys = itertools.count(1)
        self._host: dict[int, int] = {}  # the host's vector clock: what it knows completed
        self._host_version = 0
        self._launched: dict[int, int] = {}  # each stream's kernel count: a device sync's join
        self._launches = 0
        self._synced_launches = 0

    @staticmethod
    def reset_block(block) -> None:
        """Give a new block the race check's fields: no access yet, life 0."""
        block.life = 0
        block.writer = None
        block.readers = None
        block.own_clock = None  # its own stream's vc at its last free
        block.use_clock = None  # the join of the vcs of the streams record_stream named

    # -- the host ----------------------------------------------------------------------------

    def _observe(self, vc: dict[int, int]) -> None:
        """The host learned that the kernels ``vc`` counts completed."""
        if join(self._host, vc):
            self._host_version += 1

    def _observe_all(self) -> None:
        """The host waited for the whole device: every kernel launched so far completed."""
        if self._launches != self._synced_launches:
            self._synced_launches = self._launches
            self._observe(self._launched)

    def _knows(self, vc: dict[int, int] | None) -> bool:
        """Whether the host already learned that the kernels ``vc`` counts completed."""
        host = self._host
        return not vc or all(host.get(key, 0) >= epoch for key, epoch in vc.items())

    def _known_done(self, clock: StreamClock) -> bool:
        """Whether the host learned that every kernel queued on ``clock``'s stream completed."""
        return self._host.get(clock.key, 0) >= self._launched.get(clock.key, 0)

    # -- kernels -----------------------------------------------------------------------------

    def _access(self, clock: StreamClock, name: str, out, inputs, until) -> str | None:
        """A kernel on ``clock``'s stream (named ``name``) writes ``out`` (``None``: none) and
        reads ``inputs``: order it after its stream and what the host learned, check each
        access and record it. Returns the first race's line (the accesses after it are not
        recorded), or ``None``."""
        vc = clock.vc
        if clock.host_seen != self._host_version:
            join(vc, self._host)
            clock.host_seen = self._host_version
        key = clock.key
        epoch = vc[key] + 1
        vc[key] = epoch
        self._launched[key] = epoch
        self._launches += 1
        if out is not None:
            message = self._write(out, name, key, epoch, until, vc)
            if message is not None:
                return message
        for block in inputs:
            message = self._read(block, name, key, epoch, until, vc)
            if message is not None:
                return message
        return None

    def _conflict(self, block, name: str, writes: bool, access: tuple, other_writes: bool) -> str:
        """The line for ``name``'s access (a write if ``writes``) of ``block`` racing with
        ``access`` (a write if ``other_writes``)."""
        raise NotImplementedError

    def _write(self, block, name, key, epoch, until, vc) -> str | None:
        """Check and record a write of ``block``; the line, if it races."""
        writer = block.writer
        if writer is not None and vc.get(writer[0], 0) < writer[1]:
            return self._conflict(block, name, True, writer, True)
        readers = block.readers
        if readers is not None:
            for read in readers.values():
                if vc.get(read[0], 0) < read[1]:
                    return self._conflict(block, name, True, read, False)
            block.readers = None
        block.writer = (key, epoch, until, block.life, name)
        return None

    def _read(self, block, name, key, epoch, until, vc) -> str | None:
        """Check and record a read of ``block``; the line, if it races."""
        writer = block.writer
        if writer is not None and vc.get(writer[0], 0) < writer[1]:
            return self._conflict(block, name, False, writer, True)
        read = (key, epoch, until, block.life, name)
        if block.readers is None:
            block.readers = {key: read}
        else:
            block.readers[key] = read
        return None

    # -- a block's lives ---------------------------------------------------------------------

    def _record_block(self, block, own: StreamClock, uses) -> None:
        """A free of ``block`` to the reuse cache: its next life starts; keep the vector clocks
        of the events recorded on its own stream (``own``) and on the streams of ``uses`` (the
        clocks of the streams ``record_stream`` named, or empty). Its accesses stay, for the
        check against its next life."""
        block.life += 1
        block.own_clock = dict(own.vc)
        if uses:
            joined: dict[int, int] = {}
            for clock in uses:
                join(joined, clock.vc)
            block.use_clock = joined
        else:
            block.use_clock = None

    def _observe_block(self, block) -> None:
        """The host waited for every event recorded at ``block``'s last free."""
        for clock in (block.own_clock, block.use_clock):
            if clock:
                self._observe(clock)


class StreamCheck(HappensBefore):
    """The ``cuda`` backend's stream check (``DEVMEM_STREAM_CHECK``): the rules of
    :class:`HappensBefore` over the calls the backend gets, with a line of its own::

        devmem cuda: stream check: stream <S> reads block #<n> (<op>) while stream <W>'s write
        (<op>, its kernel <k>) is not waited for
        devmem cuda: stream check: block #<n> reused on stream <S>, which writes it (<op>),
        while stream <W>'s read (<op>, its kernel <k>) of its previous life is not waited for

    (each one line), where ``<op>`` is the allocator's method that launched the kernel
    (``full``, ``add``, ``to_numpy`` ...) and ``<k>`` counts ``W``'s kernels from 1. With
    ``stacks``, the Python stack of both accesses follows the line, innermost frame first.

    Args:
        mode: ``"abort"`` (write the line to stderr and abort the process) or ``"raise"``
            (raise :class:`StreamRaceError`).
        stacks: whether each access keeps its Python stack, for the report.

    Raises:
        ValueError: ``mode`` is neither.
    """

    def __init__(self, mode: str = "abort", stacks: bool = False) -> None:
        if mode not in ("abort", "raise"):
            raise ValueError(f"mode={mode!r}: expected abort or raise")
        self.mode = mode
        self.stacks = stacks
        self._lock = _locks.new_lock(self, _locks.BACKEND)
        self._init_rules()
        self._what: tuple | None = None  # the access being checked (lock held)
        self._partner: tuple | None = None  # the stream, access and frames it raced with

    def new_clock(self) -> StreamClock:
        """A new stream's clock."""
        with self._lock:
            return StreamClock(next(self._keys))

    def launch(self, clock: StreamClock, name: str, out, inputs, op: str, frames=()) -> str | None:
        """A kernel launched by the allocator's method ``op`` on stream ``name`` (whose clock
        is ``clock``) writes ``out`` and reads ``inputs``: check and record it.

        Returns:
            The race's report (its line, then the stacks if any), or ``None``.
        """
        with self._lock:
            what = (op, clock.vc[clock.key] + 1, frames)
            self._what = what
            line = self._access(clock, name, out, inputs, what)
            partner = self._partner
        if line is None or not (frames or partner[2]):
            return line
        # the stacks are resolved once the lock is released
        return (
            line
            + _stack_lines(f"stream {name}'s {partner[0]}", frames)
            + _stack_lines(partner[1], partner[2])
        )

    def _conflict(self, block, name, writes, access, other_writes) -> str:
        other_name, (other_op, kernel, other_frames), life = access[4], access[2], access[3]
        op = self._what[0]
        verb = "writes" if writes else "reads"
        theirs = "write" if other_writes else "read"
        if life < block.life:
            line = (
                f"{STREAM_CHECK_PREFIX} block #{block.id} reused on stream {name}, which {verb}"
                f" it ({op}), while stream {other_name}'s {theirs} ({other_op}, its kernel"
                f" {kernel}) of its previous life is not waited for"
            )
        else:
            line = (
                f"{STREAM_CHECK_PREFIX} stream {name} {verb} block #{block.id} ({op}) while"
                f" stream {other_name}'s {theirs} ({other_op}, its kernel {kernel}) is not"
                " waited for"
            )
        self._partner = (verb[:-1], f"stream {other_name}'s {theirs}", other_frames)
        return line

    def wait_stream(self, mine: StreamClock, theirs: StreamClock) -> None:
        """``mine``'s later kernels wait for ``theirs``'s kernels queued so far."""
        with self._lock:
            join(mine.vc, theirs.vc)

    def mark(self, clock: StreamClock) -> dict[int, int]:
        """An event recorded on ``clock``'s stream now: the vector clock it completes at."""
        with self._lock:
            return dict(clock.vc)

    def wait_mark(self, clock: StreamClock, vc: dict[int, int] | None) -> None:
        """``clock``'s later kernels wait for an event recorded at ``vc``."""
        if vc:
            with self._lock:
                join(clock.vc, vc)

    def observe(self, vc: dict[int, int] | None) -> None:
        """The host learned that the kernels ``vc`` counts completed (a synchronize, or a
        query that returned true, of a stream or an event)."""
        if vc:
            with self._lock:
                self._observe(vc)

    def synchronize(self) -> None:
        """The host waited for the whole device (``cudaDeviceSynchronize``, ``cudaFree``)."""
        with self._lock:
            self._observe_all()

    def record(self, block, own: StreamClock, uses) -> None:
        """:meth:`HappensBefore._record_block`, locked."""
        with self._lock:
            self._record_block(block, own, uses)

    def wait(self, block) -> None:
        """The host waited for every event recorded at ``block``'s last free."""
        with self._lock:
            self._observe_block(block)

    def take_ready(self, block) -> bool:
        """Whether the reuse cache may reuse ``block``, which waits for other streams' events:
        only once the host has learned (by the program's own waits and queries) that the
        kernels before them completed, so that no answer of the cache's own event polls, which
        depends on timing, decides a verdict. A true answer forgets those events."""
        with self._lock:
            if not self._knows(block.use_clock):
                return False
            block.use_clock = None
            return True


def _stack_lines(title: str, frames: tuple) -> str:
    """``frames`` (``(code, lasti, ...)``, innermost first) as indented lines under ``title``."""
    if not frames:
        return f"\n  {title}: no stack recorded"
    from .._stacks import FrameCache, frames_of  # imported only for a report

    lines = [f"\n  {title}:"]
    for filename, line, name in frames_of(frames, FrameCache()):
        lines.append(f"\n    {filename}:{line} in {name}")
    return "".join(lines)


def caller_op(depth: int = 2) -> str:
    """The name of the allocator method that launched a kernel: the function ``depth`` frames
    up (``_run``'s caller when that is ``Allocator._run``)."""
    frame = sys._getframe(depth)
    name = frame.f_code.co_name
    if name == "_run" and frame.f_back is not None:
        name = frame.f_back.f_code.co_name
    return name
