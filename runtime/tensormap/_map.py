"""The TensorMap: which earlier tasks produced the bytes a new task reads, exactly.

A task runtime that discovers dependencies from data (PyPTO's ``tensormap_and_ringbuffer``,
StarPU, OmpSs) records, for every region a task writes, the task that wrote it; a later task
that reads an overlapping region depends on it. ``../shared/seeds/pto-ring-heap-and-tensormap.txt``
describes a TensorMap that gets this wrong in two ways: it compares 1-D byte ranges only
(``lo < e.hi && e.lo < hi``) and returns only the newest overlapping producer, with fan-in
silently capped at 16. A consumer of a whole buffer written as k tiles by k producers then
depends on the last tile's producer only, and can run before the others finish.

This one returns **every** live producer whose region overlaps the lookup region, deduplicated,
newest first, each classified as :attr:`Overlap.COVERED` (every entry of it that meets the lookup
region lies inside that region; its entries elsewhere are not looked at) or
:attr:`Overlap.PARTIAL`. Overlap is decided exactly, in bytes, for any strided
regions (views of one buffer with different element sizes compare right); see
``_strided``. Entries are bucketed by buffer and, within a buffer, grouped by the
length class of their bounding byte range and sorted by first byte, so a lookup never looks at
another buffer's entries and, within a buffer, bisects to the few entries whose range can reach
its bytes (see ``_Bucket``: O(C log n + k + d), flat in the number of entries).

Example::

    tmap = TensorMap()
    whole = Region.contiguous("x", 0, 64)
    for k in range(4):  # four producers write four 16-element tiles
        tmap.insert(Region.contiguous("x", 16 * k, 16), producer=k)
    assert [p.task for p in tmap.lookup(whole)] == [3, 2, 1, 0]
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from .._checks import integer
from ._strided import ByteSet, covers, intersects

__all__ = [
    "FaninExceeded",
    "Overlap",
    "Producer",
    "Region",
    "TensorMap",
    "classify",
    "gather_fanin",
]


def _counts(values: object, name: str) -> tuple[int, ...]:
    """``values`` as a tuple of ints >= 1 (a shape or strides)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a sequence of integers, got {type(values).__name__}")
    return tuple(integer(v, f"{name}[{i}]") for i, v in enumerate(values))


@dataclass(frozen=True)
class Region:
    """A strided view of a buffer: the bytes a task reads or writes.

    Args:
        buffer: any hashable naming the buffer (storage); regions of different buffers never
            overlap.
        start_offset: the first element, in elements of ``elem_size`` bytes, >= 0.
        shape: elements per dimension, each >= 1 (1 to any number of dimensions).
        strides: elements between neighbours per dimension, each >= 1; default row-major
            contiguous for ``shape``.
        elem_size: bytes per element, >= 1 (default 4, float32).

    The region's bytes are ``(start_offset + sum(i[d] * strides[d])) * elem_size + b`` for
    ``0 <= i[d] < shape[d]`` and ``0 <= b < elem_size``. Regions compare by value.

    Raises:
        TypeError: an offset, size or stride is not an integer, or ``buffer`` is unhashable.
        ValueError: a value is out of range, ``shape`` is empty, or ``strides`` and ``shape``
            differ in length.
    """

    buffer: Hashable
    start_offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None = None
    elem_size: int = 4
    _bytes: ByteSet = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            hash(self.buffer)
        except TypeError:
            raise TypeError(f"buffer must be hashable, got {type(self.buffer).__name__}") from None
        start = integer(self.start_offset, "start_offset", 0)
        shape = _counts(self.shape, "shape")
        if not shape:
            raise ValueError("shape must have at least one dimension, got ()")
        if self.strides is None:
            strides, step = [], 1
            for n in reversed(shape):
                strides.append(step)
                step *= n
            strides = tuple(reversed(strides))
        else:
            strides = _counts(self.strides, "strides")
            if len(strides) != len(shape):
                raise ValueError(
                    f"strides {strides} and shape {shape} differ in length"
                    f" ({len(strides)} != {len(shape)})"
                )
        elem = integer(self.elem_size, "elem_size")
        for name, value in (("start_offset", start), ("shape", shape), ("strides", strides)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "elem_size", elem)
        dims = [(n, s * elem) for n, s in zip(shape, strides, strict=True)]
        object.__setattr__(self, "_bytes", ByteSet.of(start * elem, elem, dims))

    @classmethod
    def contiguous(cls, buffer: Hashable, start_offset: int, n: int, elem_size: int = 4) -> Region:
        """A 1-D run of ``n`` elements from ``start_offset``."""
        return cls(buffer, start_offset, (n,), elem_size=elem_size)

    @property
    def byte_range(self) -> tuple[int, int]:
        """``(first byte, one past the last byte)``: the bounding range."""
        return self._bytes.lo, self._bytes.hi

    @property
    def nelems(self) -> int:
        """Elements addressed (counted with repeats when strides make elements coincide)."""
        total = 1
        for n in self.shape:
            total *= n
        return total

    def byte_set(self) -> set[int]:
        """Every byte address, as a set (for tests and small regions: it enumerates)."""
        s = self._bytes
        return {start + b for start in s.run_starts() for b in range(s.run)}

    def intersects(self, other: Region) -> bool:
        """Whether the two regions share a byte (exact; False across buffers)."""
        return self.buffer == other.buffer and intersects(self._bytes, other._bytes)

    def covers(self, other: Region) -> bool:
        """Whether every byte of ``other`` lies in this region (exact; False across
        buffers)."""
        return self.buffer == other.buffer and covers(self._bytes, other._bytes)


class Overlap(enum.Enum):
    """How an entry's region relates to a lookup region."""

    NO_OVERLAP = "none"
    """No byte in common (never returned by :meth:`TensorMap.lookup`)."""
    COVERED = "covered"
    """Every byte of the entry lies inside the lookup region."""
    PARTIAL = "partial"
    """Some bytes in common, some of the entry's outside the lookup region."""


def classify(entry: Region, lookup: Region) -> Overlap:
    """How ``entry`` (a producer's region) relates to ``lookup`` (a consumer's), exactly."""
    if not entry.intersects(lookup):
        return Overlap.NO_OVERLAP
    return Overlap.COVERED if lookup.covers(entry) else Overlap.PARTIAL


@dataclass(frozen=True)
class Producer:
    """One producer found by a lookup.

    Attributes:
        task: the producer's task id.
        overlap: :attr:`Overlap.COVERED` when every one of its overlapping entries lies inside
            the lookup region, else :attr:`Overlap.PARTIAL`.
    """

    task: int
    overlap: Overlap


@dataclass(eq=False)
class _Entry:
    lo: int
    hi: int
    region: Region
    producer: int


class _Bucket:
    """One buffer's entries, grouped by length class and sorted by first byte within a class.

    Class ``c`` holds the entries whose bounding range ``[lo, hi)`` is ``2**(c-1)`` to
    ``2**c - 1`` bytes long, so an entry of class ``c`` that reaches byte ``lo`` starts after
    ``lo - 2**c``: a lookup bisects each class's window and reads only the entries in it. Cost:
    O(C log n + k + d) for C classes (at most 64; one or two in practice), k entries that meet
    the lookup, and d entries of one class stacked over a single byte just before it (the
    map's overlap depth there; writers supersede the entries they cover, so it stays small).
    One long entry widens only its own class's window, and only while it is live (the
    ``max_len`` of one sorted list it replaces grew for good: 11 ms per lookup at 100,000
    tiles)."""

    __slots__ = ("classes",)

    def __init__(self) -> None:
        # class -> (first bytes, entries), both sorted by first byte
        self.classes: dict[int, tuple[list[int], list[_Entry]]] = {}

    def add(self, entry: _Entry) -> None:
        los, entries = self.classes.setdefault((entry.hi - entry.lo).bit_length(), ([], []))
        i = bisect.bisect_right(los, entry.lo)
        los.insert(i, entry.lo)
        entries.insert(i, entry)

    def candidates(self, lo: int, hi: int) -> list[_Entry]:
        """The entries whose bounding range ``[e.lo, e.hi)`` meets ``[lo, hi)``."""
        found = []
        for c, (los, entries) in self.classes.items():
            first = bisect.bisect_left(los, lo - (1 << c) + 1)
            last = bisect.bisect_left(los, hi, first)
            found += [e for e in entries[first:last] if e.hi > lo]
        return found

    def remove(self, entry: _Entry) -> None:
        c = (entry.hi - entry.lo).bit_length()
        los, entries = self.classes[c]
        i = bisect.bisect_left(los, entry.lo)
        while entries[i] is not entry:  # entries with the same first byte: find this one
            i += 1
        del los[i], entries[i]
        if not los:
            del self.classes[c]

    def keep_only(self, keep) -> int:
        removed = 0
        for c in list(self.classes):
            entries = self.classes[c][1]
            kept = [e for e in entries if keep(e)]
            removed += len(entries) - len(kept)
            if kept:
                self.classes[c] = ([e.lo for e in kept], kept)
            else:
                del self.classes[c]
        return removed


class TensorMap:
    """Live producers' regions, bucketed by buffer; exact multi-producer lookup.

    Not thread-safe: the orchestration that owns it is single-threaded (every simulated core
    replays the same orchestration, so each would hold an identical map).
    """

    def __init__(self) -> None:
        self._buckets: dict[Hashable, _Bucket] = {}
        self._count = 0

    def __len__(self) -> int:
        """Live entries, over all buffers."""
        return self._count

    def insert(self, region: Region, producer: int) -> None:
        """Record that task ``producer`` wrote ``region``.

        Raises:
            TypeError: ``region`` is not a :class:`Region`, or ``producer`` is not an integer.
            ValueError: ``producer`` < 0.
        """
        if not isinstance(region, Region):
            raise TypeError(f"region must be a Region, got {type(region).__name__}")
        producer = integer(producer, "producer", 0)
        lo, hi = region.byte_range
        self._buckets.setdefault(region.buffer, _Bucket()).add(_Entry(lo, hi, region, producer))
        self._count += 1

    def _matches(self, region: Region) -> list[tuple[_Entry, Overlap]]:
        if not isinstance(region, Region):
            raise TypeError(f"region must be a Region, got {type(region).__name__}")
        bucket = self._buckets.get(region.buffer)
        if bucket is None:
            return []
        lo, hi = region.byte_range
        found = []
        for entry in bucket.candidates(lo, hi):
            overlap = classify(entry.region, region)
            if overlap is not Overlap.NO_OVERLAP:
                found.append((entry, overlap))
        return found

    def lookup(self, region: Region, *, inout: bool = False) -> list[Producer]:
        """Every live producer whose region overlaps ``region``: deduplicated, newest (highest
        task id) first, none of them :attr:`Overlap.NO_OVERLAP`.

        Args:
            region: the consumer's region.
            inout: the consumer also writes ``region`` (an INOUT argument): entries it covers
                are superseded and removed, as the reference runtime does; the consumer, which
                depends on them, will :meth:`insert` its own entry.

        Raises:
            TypeError: ``region`` is not a :class:`Region`.
        """
        found = self._matches(region)
        if inout:
            self._remove([entry for entry, overlap in found if overlap is Overlap.COVERED])
        return _by_producer(found)

    def _remove(self, entries: Sequence[_Entry]) -> None:
        for entry in entries:
            self._buckets[entry.region.buffer].remove(entry)
        self._count -= len(entries)

    def retire_below(self, task_id: int) -> int:
        """Drop every entry whose producer's id is below ``task_id`` (retired tasks).

        Returns:
            The number of entries dropped.
        """
        task_id = integer(task_id, "task_id", 0)
        removed = 0
        for buffer in list(self._buckets):
            bucket = self._buckets[buffer]
            removed += bucket.keep_only(lambda e: e.producer >= task_id)
            if not bucket.classes:
                del self._buckets[buffer]
        self._count -= removed
        return removed


def _by_producer(found: Iterable[tuple[_Entry, Overlap]]) -> list[Producer]:
    overlaps: dict[int, Overlap] = {}
    for entry, overlap in found:
        if overlaps.get(entry.producer) is not Overlap.PARTIAL:
            overlaps[entry.producer] = overlap
    return [Producer(task, overlaps[task]) for task in sorted(overlaps, reverse=True)]


class FaninExceeded(RuntimeError):
    """A task depends on more producers than the configured fan-in cap allows.

    The seed's runtime truncated fan-in at 16 silently; here exceeding a cap is an error that
    names the task, and nothing is changed in the map.
    """


def gather_fanin(
    tmap: TensorMap,
    task: int,
    *,
    inputs: Iterable[Region] = (),
    inouts: Iterable[Region] = (),
    writes: Iterable[Region] = (),
    max_fanin: int | None = None,
) -> tuple[int, ...]:
    """A task's fan-in: every producer of the bytes it reads or overwrites, newest first,
    deduplicated.

    Looks up ``inputs`` (read only), ``inouts`` (read then written) and ``writes`` (written
    without being read). A write depends on the live producers it overlaps, as a read does
    (write-after-write: the older write must land first, or a slow old writer would leave stale
    bytes behind the new one), and supersedes the entries it covers: they are removed, see
    :meth:`TensorMap.lookup`, so fan-in does not grow with every past writer. It does not insert
    the task's own writes: call :meth:`TensorMap.insert` for those afterwards.

    Args:
        tmap: the map.
        task: the consumer's id (for the error message).
        inputs, inouts, writes: the consumer's regions.
        max_fanin: the most producers allowed, >= 1; ``None`` (default) for no cap.

    Raises:
        FaninExceeded: more than ``max_fanin`` distinct producers; the map is left unchanged.
        TypeError, ValueError: a bad region or ``max_fanin``.
    """
    if max_fanin is not None:
        max_fanin = integer(max_fanin, "max_fanin")
    written = [*inouts, *writes]
    found = [match for region in inputs for match in tmap._matches(region)]
    covered = []
    for region in written:
        matches = tmap._matches(region)
        found += matches
        covered += [entry for entry, overlap in matches if overlap is Overlap.COVERED]
    producers = tuple(p.task for p in _by_producer(found))
    if max_fanin is not None and len(producers) > max_fanin:
        raise FaninExceeded(
            f"task {task} depends on {len(producers)} producers, more than"
            f" max_fanin={max_fanin} (the seed's runtime silently kept 16)"
        )
    tmap._remove(list({id(e): e for e in covered}.values()))
    return producers
