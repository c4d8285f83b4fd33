"""Storages and buffers: who owns a device block, and the float32 views over it.

A :class:`Storage` owns one device block. A :class:`Buffer` is a float32 view (offset, element
count) of a storage; most buffers are the whole storage, and ``buf.view(offset, n)`` shares it.
CPython's reference counting is the finalizer: when the last buffer of a storage dies, so does
the storage, and its block is queued for the next public call of the allocator, which frees it
(to the reuse cache, or to the device on the CPU stub). The finalizer does nothing else: it may
run at any allocation, inside the allocator's own critical sections too (DESIGN 2.9).

A freed buffer keeps its Python object with ``size == 0`` and remembers who freed it; using it in
an op is a use-after-free, which the detector reports (see :mod:`allocator._detector`).

A storage's block belongs to the stream it was allocated on; ``record_stream(s)`` marks it as
used on another stream, so that its free waits for that stream's kernels before the block's own
stream may reuse it (PyTorch's ``Tensor.record_stream``; see :mod:`allocator._cache`).

Imports run one way: the arena registry (:mod:`allocator._arena`) imports this module, and this
module knows nothing of it. A storage reaches its registry only through the
:class:`StorageHome` protocol below (queue a block, drain, free, name the backend), and keeps
its arena epoch as an opaque object it never looks inside.
"""

from __future__ import annotations

import operator
from collections.abc import MutableSequence
from typing import TYPE_CHECKING, Protocol

from ._free_cause import FreeCause
from .device.stream import Stream, check_stream

if TYPE_CHECKING:
    from .device.base import Block

__all__ = ["Buffer", "Storage", "StorageHome", "element_count"]


class StorageHome(Protocol):
    """What a :class:`Storage` needs of the registry it belongs to (an
    :class:`~allocator._arena.ArenaRegistry`; a protocol, so that this module need not import
    the arena's).

    Attributes:
        backend: the backend's name, for reprs.
        pending: the blocks the finalizer queued, freed by the next :meth:`drain`.
    """

    backend: str
    pending: MutableSequence

    def drain(self) -> None:
        """Free the blocks queued in :attr:`pending`."""

    def free(self, st: Storage, cause: FreeCause) -> int:
        """Free ``st``'s block for ``cause``; the bytes freed (0 if it was freed already)."""


FLOAT32_BYTES = 4
MAX_ELEMENTS = ((1 << 63) - 1) // FLOAT32_BYTES
"""The largest element count whose byte size a 64-bit device can address."""


def element_count(value: object, name: str, *, minimum: int = 1) -> int:
    """Validate an element count (or offset) argument and return it as an ``int``.

    Args:
        value: the caller's argument; any integer type (``int``, NumPy integers), not ``bool``.
        name: the argument's name, used in the error message.
        minimum: the smallest value allowed (1 for sizes, 0 for offsets).

    Raises:
        TypeError: ``value`` is not an integer (``3.0`` and ``True`` included).
        ValueError: ``value`` is below ``minimum`` or its byte size does not fit in 63 bits.
    """
    if type(value) is not int:
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TypeError(
                f"{name} must be an integer element count, got {type(value).__name__} {value!r}"
            )
        value = operator.index(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if value > MAX_ELEMENTS:
        raise ValueError(
            f"{name}={value} elements is {value * FLOAT32_BYTES} bytes, more than a device can"
            f" address (at most {MAX_ELEMENTS} float32 elements)"
        )
    return value


class Storage:
    """The owner of one device block of ``nbytes`` bytes.

    The block sits in a one-element list, so that taking it is one atomic ``list.pop()``:
    whichever of ``release``, ``resize_``, an arena exit or the finalizer pops it frees it, and
    the others find the list empty. No lock is needed to decide who frees a block.

    Attributes:
        nbytes: the block's size in bytes (4 per float32 element); it stays the same after the
            block is freed.
        cause: ``None`` while the block is live; afterwards the :class:`FreeCause` saying why it
            was freed (``release``, ``arena_exit`` with its depth, or ``resize_``'s reason).
        epoch: the arena epoch tracking this storage (an :class:`~allocator._arena.Epoch`), or
            ``None`` when untracked.
    """

    __slots__ = ("__weakref__", "_cell", "_home", "cause", "epoch", "nbytes")

    def __init__(self, home: StorageHome, block: Block | None, nbytes: int) -> None:
        self._home = home
        self._cell = [block] if nbytes else []
        self.nbytes = nbytes
        self.cause: FreeCause | None = None
        self.epoch: object | None = None  # an allocator._arena.Epoch, opaque here

    def __del__(self) -> None:
        # Run by reference counting or by the cyclic collector at any allocation, also inside
        # the allocator's own critical sections: take the block (atomic) and queue it for the
        # next public call to free. Nothing else: no lock, no allocator logic.
        cell = self._cell
        if cell:
            try:
                self._home.pending.append(cell.pop())
            except IndexError:  # another thread freed it in between
                pass

    @property
    def block(self) -> Block | None:
        """The device block, or ``None`` once it is freed."""
        cell = self._cell
        return cell[0] if cell else None

    @property
    def freed(self) -> bool:
        """Whether the block was freed (by ``release``, ``resize_(0)`` or ``arena_exit``)."""
        return self.cause is not None

    @property
    def freed_reason(self) -> str | None:
        """How the block was freed, in the detector's words (``reclaimed by arena_exit at depth
        0``, ``released by release()``), or ``None`` while it is live."""
        cause = self.cause
        return None if cause is None else cause.describe()

    @property
    def size(self) -> int:
        """Elements in the block; 0 once it is freed."""
        return self.nbytes // FLOAT32_BYTES if self._cell else 0

    @property
    def stream(self) -> Stream | None:
        """The stream the block was allocated on and belongs to; ``None`` once it is freed."""
        cell = self._cell
        return cell[0].stream if cell else None

    @property
    def stream_uses(self) -> frozenset[Stream]:
        """The other streams :meth:`record_stream` recorded on the block (empty once freed)."""
        cell = self._cell
        uses = cell[0].stream_uses if cell else None
        return frozenset(uses or ())

    def record_stream(self, stream: Stream) -> None:
        """Mark the block as used by kernels queued on ``stream`` (PyTorch's
        ``Tensor.record_stream``).

        When the block is freed, an event is recorded on ``stream``, and the block's own stream
        reuses it only once that event has completed (no other stream ever reuses it). Call it
        before the free, from the stream that used it last, e.g. ``buf.record_stream(
        alloc.current_stream())``. Recording the block's own stream does nothing.
        Source: DeepSpeed's ``free_param`` and its ``release_param`` fix
        (``../shared/seeds/deepspeed-zero3-release-lifetime.txt``).

        Raises:
            TypeError: ``stream`` is not a Stream.
            ValueError: ``stream`` belongs to another allocator, or the block was already freed
                (recording after the free would be too late to protect anything).
        """
        if not isinstance(stream, Stream):
            raise TypeError(f"stream must be a Stream, got {type(stream).__name__}")
        try:
            block = self._cell[0]
        except IndexError:
            if self.cause is None:  # the size-0 result of an op on freed operands
                raise ValueError(
                    f"record_stream({stream.name!r}) on an empty buffer: it has no block"
                ) from None
            raise ValueError(
                f"record_stream({stream.name!r}) on a buffer whose block is gone (it was"
                f" {self.freed_reason}): record the stream before the free"
            ) from None
        own = block.stream
        if stream is own:
            return
        if own is not None:
            check_stream(own.device, stream)
        uses = block.stream_uses
        if uses is None:
            block.stream_uses = {stream}
        else:
            uses.add(stream)

    def resize_(self, size: int, reason: str) -> int:
        """Free the block now, even while views of it are alive (what ZeRO-3's fix does).

        Every buffer of this storage then reports ``size == 0`` and remembers ``reason``; using
        one is reported as ``use-after-release: <op> <role> was released by <reason>``. The
        cause is of kind ``release`` whatever the reason says (``resize_(0, "arena_exit")`` is
        a release, not an arena exit).
        Source: DeepSpeed's release of the gathered parameter storage
        (``../shared/seeds/deepspeed-zero3-release-lifetime.txt``).

        Args:
            size: must be the integer 0; growing or shrinking to another size is not supported.
            reason: who frees it, for the detector's message (e.g. ``"zero3.release_param"``).

        Returns:
            1 if the block was freed now, 0 if it was already freed.

        Raises:
            TypeError: ``size`` is not an integer (``0.0`` included), or ``reason`` is not a
                ``str``.
            ValueError: ``size`` is not 0 (``False`` included), or ``reason`` is empty.
        """
        if not isinstance(size, bool) and not hasattr(type(size), "__index__"):
            raise TypeError(f"size must be the integer 0, got {type(size).__name__} {size!r}")
        if size != 0 or isinstance(size, bool):
            raise ValueError(f"resize_ supports only size 0 (free the block), got {size!r}")
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {type(reason).__name__}")
        if not reason:
            raise ValueError("reason must say who frees the block, got an empty string")
        home = self._home
        home.drain()
        return home.free(self, FreeCause("release", reason))

    def __repr__(self) -> str:
        state = self.freed_reason or "live"
        return f"<Storage {self.nbytes} bytes on {self._home.backend}, {state}>"


class Buffer:
    """A float32 view of ``size`` elements of a :class:`Storage`, starting at ``offset``.

    Buffers come from the allocator (``full``, ``zeros``, ``empty``, ``from_numpy``, the ops) and
    from :meth:`view`. A buffer whose block was freed keeps its Python object with ``size == 0``.
    """

    __slots__ = ("_n", "_off", "_st")

    def __init__(self, storage: Storage, offset: int, n: int) -> None:
        self._st = storage
        self._off = offset
        self._n = n

    @property
    def size(self) -> int:
        """Elements in the view; 0 once the storage's block is freed."""
        return self._n if self._st._cell else 0

    @property
    def nbytes(self) -> int:
        """Bytes in the view (4 per element); 0 once freed."""
        return self.size * FLOAT32_BYTES

    @property
    def offset(self) -> int:
        """The view's first element within its storage."""
        return self._off

    @property
    def storage(self) -> Storage:
        """The storage this buffer views (shared by all of its views)."""
        return self._st

    @property
    def stream(self) -> Stream | None:
        """The stream its storage's block belongs to (see :attr:`Storage.stream`)."""
        return self._st.stream

    def record_stream(self, stream: Stream) -> None:
        """Mark the storage's block as used on ``stream``; see :meth:`Storage.record_stream`,
        which raises the same errors."""
        self._st.record_stream(stream)

    @property
    def freed(self) -> bool:
        """Whether the storage's block was freed."""
        return self._st.cause is not None

    @property
    def freed_reason(self) -> str | None:
        """How the block was freed (see :attr:`Storage.freed_reason`), or ``None`` if live."""
        return self._st.freed_reason

    def view(self, offset: int, n: int) -> Buffer:
        """A buffer of ``n`` elements of this one, starting at ``offset``; it shares the block.

        Args:
            offset: the first element, 0 <= offset.
            n: the element count, n >= 1 and offset + n <= size.

        Raises:
            TypeError: ``offset`` or ``n`` is not an integer.
            ValueError: the range falls outside this buffer, or the buffer was freed.
        """
        offset = element_count(offset, "offset", minimum=0)
        n = element_count(n, "n")
        if self._st.cause is not None:
            raise ValueError(f"cannot view a freed buffer (it was {self._st.freed_reason})")
        if offset + n > self.size:
            raise ValueError(
                f"view(offset={offset}, n={n}) ends at {offset + n}, past the buffer's"
                f" {self.size} elements"
            )
        return Buffer(self._st, self._off + offset, n)

    def _array(self):
        """The device array of this view (the caller has checked that the block is live)."""
        array = self._st._cell[0].array
        if self._off == 0 and self._n == len(array):
            return array
        return array[self._off : self._off + self._n]

    def __repr__(self) -> str:
        st = self._st
        if st.cause is not None:
            return f"<Buffer freed ({st.freed_reason})>"
        if not st._cell:
            return "<Buffer empty>"
        whole = self._off == 0 and self._n * FLOAT32_BYTES == st.nbytes
        where = "" if whole else f" view [{self._off}:{self._off + self._n}] of {st.size}"
        return f"<Buffer {self._n} x float32{where} on {st._home.backend}>"
