"""Streams: ordered queues of device work, and events on them, as CUDA and PyTorch have them.

A :class:`Stream` runs its kernels in order, one after another; kernels of different streams may
run at the same time. A stream belongs to one device (one allocator): its default stream (id 0,
named ``default``), or one made by ``alloc.new_stream()``. What a stream is on each backend lives
in its :attr:`~Stream.handle`: nothing on ``cpu`` (accounting only), a logical clock on ``sim``
(:class:`~allocator.device.sim.SimStream`), a ``cupy.cuda.Stream`` on ``cuda`` (the null stream
for the default one, a non-blocking stream for the others, as PyTorch's stream pool makes them).

An :class:`Event` marks a point in a stream's queue (PyTorch's ``torch.cuda.Event``): recorded
on a stream, it completes once every kernel queued there before the record has; another stream
can wait for it (ordering its later kernels after that point, not after everything the first
stream queued later), and the host can query it or wait for it. Its handle is ``None`` on
``cpu``, a :class:`~allocator.device.sim.SimEvent` on ``sim``, a timing-free
``cupy.cuda.Event`` on ``cuda``.

A stream refers to its device; no device or layer refers to a stream except through the blocks
allocated on it, so streams make no reference cycle.

Imports run one way: :mod:`allocator.device.base` imports this module (a device makes streams),
and this module knows nothing of it. What a stream and an event need of their device is the
:class:`StreamDevice` protocol below, which every :class:`~allocator.device.base.Device`
satisfies; the layering test (``suites/allocator/test_layering.py``) fails on an import back.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Event", "Stream", "StreamDevice", "check_event", "check_stream"]


class StreamDevice(Protocol):
    """What streams and events call on their device: the part of
    :class:`~allocator.device.base.Device` this module uses (a protocol, so that this module
    need not import the device's)."""

    name: str

    def wait_stream(self, stream: Stream, other: Stream) -> None: ...
    def synchronize_stream(self, stream: Stream) -> None: ...
    def stream_done(self, stream: Stream) -> bool: ...
    def new_event_handle(self) -> object: ...
    def record_event(self, stream: Stream, event: Event) -> None: ...
    def wait_event(self, stream: Stream, event: Event) -> None: ...
    def event_done(self, event: Event) -> bool: ...
    def synchronize_event(self, event: Event) -> None: ...


def check_stream(device: StreamDevice, stream: object, name: str = "stream") -> Stream:
    """Validate that ``stream`` is a stream of ``device``; return it.

    Raises:
        TypeError: ``stream`` is not a Stream.
        ValueError: it belongs to another allocator.
    """
    if not isinstance(stream, Stream):
        raise TypeError(f"{name} must be a Stream, got {type(stream).__name__}")
    if stream.device is not device:
        raise ValueError(f"{name} ({stream.name!r}) belongs to another allocator")
    return stream


class Stream:
    """An ordered queue of kernels on one device (PyTorch's ``torch.cuda.Stream``).

    Made by the allocator (``alloc.new_stream(name)``, ``alloc.default_stream``), never
    directly. Make one current for the calling thread with ``with alloc.use_stream(s):``;
    allocations and ops then run on it.

    Attributes:
        id: 0 for the default stream, then 1, 2, ... in order of creation, per device.
        name: ``"default"``, the name given to ``new_stream``, or ``"#<id>"``.
        device: the backend it belongs to.
        handle: the backend's own stream (``None`` on ``cpu``, a
            :class:`~allocator.device.sim.SimStream` on ``sim``, a ``cupy.cuda.Stream`` on
            ``cuda``).
        clock: the ``cuda`` stream check's vector clock of this stream
            (:class:`~allocator.device._happens_before.StreamClock`), or ``None`` where that
            check is off (the simulator's clock is its ``handle``).
    """

    __slots__ = ("__weakref__", "clock", "device", "handle", "id", "name")

    def __init__(self, device: StreamDevice, stream_id: int, name: str, handle: object) -> None:
        self.device = device
        self.id = stream_id
        self.name = name
        self.handle = handle
        self.clock = None

    def wait_stream(self, other: Stream) -> None:
        """Make every kernel queued on this stream from now on wait for the kernels queued on
        ``other`` so far (PyTorch's ``Stream.wait_stream``: an event recorded on ``other``,
        waited on by this stream). The host does not wait.

        Raises:
            TypeError: ``other`` is not a Stream.
            ValueError: ``other`` belongs to another allocator.
        """
        other = check_stream(self.device, other, "other")
        if other is not self:
            self.device.wait_stream(self, other)

    def synchronize(self) -> None:
        """Block the host until every kernel queued on this stream so far has completed."""
        self.device.synchronize_stream(self)

    def query(self) -> bool:
        """Whether every kernel queued on this stream so far has completed (never waits; on
        ``sim`` each query takes :data:`~allocator.device.sim.QUERY_COST_US` of host time)."""
        return self.device.stream_done(self)

    def record_event(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new one if ``None``) on this stream, after every kernel queued
        on it so far (PyTorch's ``Stream.record_event``). Recording an event again moves it.

        Returns:
            The event.

        Raises:
            TypeError: ``event`` is not an Event.
            ValueError: it belongs to another allocator.
        """
        event = Event(self.device) if event is None else check_event(self.device, event)
        self.device.record_event(self, event)
        event.recorded = True
        return event

    def wait_event(self, event: Event) -> None:
        """Make every kernel queued on this stream from now on wait for ``event`` (the
        kernels queued on its stream before it was recorded). The host does not wait. An
        event never recorded is complete: nothing to wait for.

        Raises:
            TypeError: ``event`` is not an Event.
            ValueError: it belongs to another allocator.
        """
        event = check_event(self.device, event)
        if event.recorded:
            self.device.wait_event(self, event)

    def __repr__(self) -> str:
        return f"<Stream {self.name!r} (#{self.id}) on {self.device.name}>"


def check_event(device: StreamDevice, event: object, name: str = "event") -> Event:
    """Validate that ``event`` is an event of ``device``; return it.

    Raises:
        TypeError: ``event`` is not an Event.
        ValueError: it belongs to another allocator.
    """
    if not isinstance(event, Event):
        raise TypeError(f"{name} must be an Event, got {type(event).__name__}")
    if event.device is not device:
        raise ValueError(f"{name} belongs to another allocator")
    return event


class Event:
    """A point in a stream's queue (PyTorch's ``torch.cuda.Event``).

    Made by ``alloc.new_event()`` or ``stream.record_event()``; record it with
    ``stream.record_event(e)``, make another stream wait for it with ``stream.wait_event(e)``.

    Attributes:
        device: the backend it belongs to.
        handle: the backend's own event (``None`` on ``cpu``).
        recorded: whether it was ever recorded (an event never recorded is complete).
        clock: for the ``cuda`` stream check, the vector clock of its stream at its last
            record (``None`` where that check is off or before a record).
    """

    __slots__ = ("clock", "device", "handle", "recorded")

    def __init__(self, device: StreamDevice) -> None:
        self.device = device
        self.handle = device.new_event_handle()
        self.recorded = False
        self.clock = None

    def query(self) -> bool:
        """Whether the kernels queued before its record completed (never waits; ``True`` if
        never recorded). On ``sim`` a query takes
        :data:`~allocator.device.sim.QUERY_COST_US` of host time, and a true answer orders the
        host after those kernels."""
        return not self.recorded or self.device.event_done(self)

    def synchronize(self) -> None:
        """Block the host until the kernels queued before its record completed (at once if
        never recorded)."""
        if self.recorded:
            self.device.synchronize_event(self)

    def __repr__(self) -> str:
        state = "recorded" if self.recorded else "never recorded"
        return f"<Event {state} on {self.device.name}>"
