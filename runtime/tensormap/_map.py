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
``_strided``. Entries are bucketed by buffer and, within a buffer, indexed by the pieces
they touch (their runs, so a column tile is its rows), grouped by the length class of each
piece and sorted by first byte, so a lookup never looks at another buffer's entries and,
within a buffer, takes the few pieces that can reach its bytes (see ``_Bucket``:
O(P C log n + k + d), flat in the number of entries, strided or not).

:func:`gather_fanin`, the ring's path, orders every data hazard per byte: the writers of the
live bytes a task reads or overwrites and the readers of the live bytes it overwrites; a write
supersedes the bytes it overwrites (an entry keeps its live bytes once a write takes part of
it). :func:`gather_spans` and :meth:`TensorMap.insert_span` do the same for accesses that are
contiguous bytes, given as ``(buffer, lo, hi)`` spans, without a :class:`Region` per access
(the ring plans its contiguous tensors so); both paths share the index, so a map may hold
entries of either, and the suites check that they agree.

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
import itertools
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from .._checks import integer
from ._strided import ByteSet, covers, intersects, values_in

__all__ = [
    "FaninExceeded",
    "Overlap",
    "Producer",
    "Region",
    "TensorMap",
    "classify",
    "gather_fanin",
    "gather_spans",
]


def _counts(values: object, name: str) -> tuple[int, ...]:
    """``values`` as a tuple of ints >= 1 (a shape or strides)."""
    if type(values) is tuple and all(type(v) is int and v >= 1 for v in values):
        return values  # the common case, without the generic checks
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
        start = self.start_offset
        if type(start) is not int or start < 0:
            start = integer(start, "start_offset", 0)
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
        elem = self.elem_size
        if type(elem) is not int or elem < 1:
            elem = integer(elem, "elem_size")
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


class _Entry:
    """One recorded access: task ``producer`` wrote (or, in the readers' index, read) bytes of
    ``buffer``. ``lo, hi``: the bounding byte range. ``live``: ``None`` while every byte of the
    access is live, else the live bytes as sorted disjoint ``[lo, hi)`` intervals (the bytes no
    later write has overwritten).

    An access is a :class:`Region` (``region`` given) or a span: the contiguous bytes
    ``[lo, hi)`` (``region`` ``None``; :func:`gather_spans`, the ring's path, records those
    without a Region, and :attr:`region` makes one of 1-byte elements when a strided test
    needs it). ``flat``: its bytes are the one run ``[lo, hi)``."""

    __slots__ = ("_bytes", "_region", "buffer", "flat", "hi", "live", "lo", "producer", "serial")

    def __init__(
        self,
        buffer: Hashable,
        lo: int,
        hi: int,
        region: Region | None,
        producer: int,
        live: list[tuple[int, int]] | None = None,
    ) -> None:
        self.buffer, self.lo, self.hi, self.producer, self.live = buffer, lo, hi, producer, live
        self._region = region
        self._bytes = None if region is None else region._bytes
        self.flat = self._bytes is None or not self._bytes.dims
        self.serial = next(_serials)

    @property
    def region(self) -> Region:
        """The access as a :class:`Region` (a span's: 1-byte elements ``[lo, hi)``)."""
        if self._region is None:
            self._region = Region(self.buffer, self.lo, (self.hi - self.lo,), (1,), 1)
        return self._region

    @property
    def bytes(self) -> ByteSet:
        """Its bytes (:class:`ByteSet`)."""
        if self._bytes is None:
            self._bytes = ByteSet(self.lo, self.hi - self.lo, ())
        return self._bytes

    def pieces(self) -> list[tuple[int, int]]:
        """What it is indexed by (:func:`_pieces`): a span is its one run."""
        return [(self.lo, self.hi)] if self.flat else _pieces(self._bytes)


def _span_entry(buffer: Hashable, lo: int, hi: int, producer: int) -> _Entry:
    """``_Entry(buffer, lo, hi, None, producer)``, made without the general constructor's
    tests (the span path's entries)."""
    entry = object.__new__(_Entry)
    entry.buffer, entry.lo, entry.hi, entry.producer = buffer, lo, hi, producer
    entry.live = entry._region = entry._bytes = None
    entry.flat = True
    entry.serial = next(_serials)
    return entry


_serials = itertools.count()
"""Entries' serial numbers: the index's sort key after the first byte (never a tie)."""
SERIAL_BITS = 48
"""An index key is ``first byte << SERIAL_BITS | serial`` (a plain int compares fastest)."""

TILED_SCAN = 8
"""The most spans a tiled bucket scans to look up or add a span that is not one of them."""
TILED_FORGET = 64
"""The most spans a tiled bucket scans to drop those within a range (:meth:`TensorMap.forget`)."""

SMALL_CLASS = 2048
"""The most keys a length class of a bucket keeps in a plain sorted list (beyond, a
``SortedList``)."""

MAX_PIECES = 256
"""The most pieces a region is indexed (and looked up) by: its runs, or, for a region of more
runs, blocks of its smallest dimensions (see :func:`_pieces`)."""


def _pieces(s: ByteSet) -> list[tuple[int, int]]:
    """:func:`_pieces_of` ``s``, kept on ``s`` (a region is indexed, looked up and removed by
    the same pieces)."""
    cached = s.__dict__.get("_pieces")
    if cached is None or cached[0] != MAX_PIECES:
        cached = (MAX_PIECES, _pieces_of(s))
        object.__setattr__(s, "_pieces", cached)
    return cached[1]


def _pieces_of(s: ByteSet) -> list[tuple[int, int]]:
    """The bounding byte ranges ``[lo, hi)`` a region is indexed (and looked up) by: one per
    run when it has at most :data:`MAX_PIECES` runs, else one per block of runs, a block
    being its smallest dimensions whole and a slice of consecutive indices of the next one,
    as few dimensions and as long slices as bring the count to :data:`MAX_PIECES` or below.
    A column tile of a row-major matrix is its rows, not the span from its first row to its
    last, so it is never a candidate of the other columns' lookups. O(pieces)."""
    dims = s.dims
    level, count = len(dims), 1
    while level and count * dims[level - 1][0] <= MAX_PIECES:
        level -= 1
        count *= dims[level][0]
    starts = [s.base]
    for n, stride in dims[level:]:
        starts = [x + k * stride for x in starts for k in range(n)]
    if not level:  # runs may coincide (strides that revisit bytes): each piece once
        return [(x, x + s.run) for x in sorted(set(starts))]
    inner = s.run + sum((n - 1) * stride for n, stride in dims[: level - 1])
    n, stride = dims[level - 1]  # split into slices of ``chunk`` consecutive indices
    chunk = -(-n // (MAX_PIECES // count))
    blocks = [(k * stride, (min(chunk, n - k) - 1) * stride + inner) for k in range(0, n, chunk)]
    ends: dict[int, int] = {}  # blocks may start at one byte (strides that revisit bytes)
    for x in starts:
        for off, span in blocks:
            ends[x + off] = max(ends.get(x + off, 0), x + off + span)
    return sorted(ends.items())


def _runs(s: ByteSet) -> list[tuple[int, int]]:
    """Every byte of ``s`` as sorted disjoint ``[lo, hi)`` intervals. O(runs log runs)."""
    out: list[tuple[int, int]] = []
    for x in sorted(set(s.run_starts())):
        if out and x <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], x + s.run))
        else:
            out.append((x, x + s.run))
    return out


def _subtract(entry: _Entry, w: ByteSet) -> bool:
    """Remove the bytes of ``w`` from ``entry``'s live bytes; whether any remain.

    Cost: O(1) exact tests when ``w`` covers the entry, else the entry's runs once (its live
    bytes are then kept as intervals) plus ``w``'s runs inside the live intervals it meets."""
    if entry.live is None:
        if covers(w, entry.bytes):
            return False
        if not intersects(w, entry.bytes):
            return True
        entry.live = _runs(entry.bytes)
    live = entry.live
    i = bisect.bisect_right(live, (w.lo, w.lo))
    if i and live[i - 1][1] > w.lo:
        i -= 1
    j = bisect.bisect_left(live, (w.hi, w.hi), i)
    kept = []
    for a, b in live[i:j]:
        cursor = a
        for x in sorted(set(values_in(w.base, w.dims, a - w.run + 1, b - 1))):
            if x > cursor:
                kept.append((cursor, x))
            cursor = max(cursor, x + w.run)
            if cursor >= b:
                break
        if cursor < b:
            kept.append((cursor, b))
    live[i:j] = kept
    return bool(live)


def _classify_live(entry: _Entry, region: Region) -> Overlap:
    """How ``entry``'s live bytes relate to ``region`` (exact). O(1) exact tests while the
    whole entry is live, else one per live interval within ``region``'s bounding range."""
    if entry.live is None:
        return classify(entry.region, region)
    q, live = region._bytes, entry.live
    inside = live[0][0] >= q.lo and live[-1][1] <= q.hi
    i = bisect.bisect_right(live, (q.lo, q.lo))
    if i and live[i - 1][1] > q.lo:
        i -= 1
    met = False
    for a, b in live[i : bisect.bisect_left(live, (q.hi, q.hi), i)]:
        piece = ByteSet(a, b - a, ())
        if not met and intersects(piece, q):
            met = True
            if not inside:
                break
        if inside and not covers(q, piece):
            inside = False
            if met:
                break
    if not met:
        return Overlap.NO_OVERLAP
    return Overlap.COVERED if inside else Overlap.PARTIAL


class _Bucket:
    """One buffer's entries, indexed by the pieces they touch (:func:`_pieces`), grouped by
    length class and sorted by first byte within a class.

    Class ``c`` holds the pieces ``[lo, hi)`` that are ``2**(c-1)`` to ``2**c - 1`` bytes long,
    so a piece of class ``c`` that reaches byte ``lo`` starts after ``lo - 2**c``: a lookup
    takes each class's window for each of its own pieces and reads only the pieces in it.
    Each class keeps its keys ``lo << SERIAL_BITS | serial`` sorted: a plain list while it
    holds at most :data:`SMALL_CLASS` of them (a C-level insertion or deletion, cheaper than
    any tree at that size; a task's live map is usually a few entries per buffer), a
    ``sortedcontainers.SortedList`` beyond, O(log n) to add or remove a piece wherever it
    falls (a plain sorted list moved every later piece: minutes to index 2,000 column tiles
    of a 200-row matrix). Cost of a lookup: O(P C log n + k + d) for P pieces of the lookup
    (at most :data:`MAX_PIECES`), C classes (at most 64; one or two in practice), n pieces in
    the bucket, k entries that meet the lookup, and d pieces of one class stacked over a
    single byte just before a lookup piece (the map's overlap depth there; writers supersede
    the bytes they overwrite, so it stays small). A strided entry is indexed by its rows (its
    runs), not by the bounding range from its first row to its last: column tiles of one
    matrix are not each other's candidates (their bounding ranges all overlap: 1.6 s per
    lookup at 100,000 entries).

    Entries added with :meth:`add_later` (reads) are indexed when the bucket is next looked at:
    the reads of a buffer that nothing overwrites (a kernel's weights, its inputs) are never
    indexed at all. ``multi`` counts the indexed entries with more than one piece: while it
    is 0, a lookup of one piece meets every entry at most once (no deduplication). ``lo, hi``
    bound the bytes of every entry added since the bucket was last emptied (they never
    shrink otherwise): a lookup outside them meets nothing, at once.

    Tiled mode, before the index: while every entry of the bucket is a whole span (contiguous
    bytes, all live) and any two spans are the same or disjoint (a ring's tensors, read and
    written whole), ``tiles`` holds the entries by span, ``(lo, hi) -> entries`` (a span whose
    entries were all superseded stays, empty), and the
    span path's lookup of one of them is a dictionary look-up (no other span can meet it); a
    lookup of another span scans the spans while there are at most :data:`TILED_SCAN`.
    Anything else (a span that overlaps one partly, a cut, a strided entry, the Region path,
    a scan of more spans) indexes the entries first (``tiles`` is then ``None``) until the
    bucket is emptied. ``bottom, top``: bounds of the spans since it was last emptied."""

    __slots__ = ("bottom", "classes", "count", "hi", "lo", "multi", "pending", "tiles", "top")

    def __init__(self) -> None:
        # class -> (sorted keys ``lo << SERIAL_BITS | serial``, key -> (hi, entry)); the keys
        # a list up to SMALL_CLASS of them, else a SortedList
        self.classes: dict[int, tuple[list | SortedList, dict[int, tuple[int, _Entry]]]] = {}
        self.count = 0
        self.multi = 0
        self.lo, self.hi = math.inf, -1
        self.pending: list[_Entry] = []  # added, not yet indexed
        self.tiles: dict[tuple[int, int], list[_Entry]] | None = {}
        self.bottom, self.top = math.inf, -1

    def leave_tiles(self) -> None:
        """Leave tiled mode (an entry was cut: it is no longer a whole span)."""
        if self.pending:
            self._flush()
        if self.tiles is not None:
            self._untile()

    def _untile(self) -> None:
        """Leave tiled mode: index every entry."""
        tiles, self.tiles = self.tiles, None
        for entries in tiles.values():
            for entry in entries:
                self._index(entry)

    def _place(self, entry: _Entry) -> None:
        """File ``entry`` (already counted): among the tiles while it keeps them tiles, else
        in the index."""
        tiles = self.tiles
        if tiles is not None:
            if entry.flat and entry.live is None:
                lo, hi = entry.lo, entry.hi
                same = tiles.get((lo, hi))
                if same is not None:
                    same.append(entry)
                    return
                if (
                    lo >= self.top
                    or hi <= self.bottom
                    or (len(tiles) <= TILED_SCAN and all(b <= lo or hi <= a for a, b in tiles))
                ):
                    tiles[lo, hi] = [entry]
                    if hi > self.top:
                        self.top = hi
                    if lo < self.bottom:
                        self.bottom = lo
                    return
            self._untile()
        self._index(entry)

    def add_span(self, entry: _Entry) -> None:
        """:meth:`add` for a whole span's entry (the span path's): among the tiles while it
        keeps them tiles."""
        self._place(entry)
        self.count += 1
        if entry.lo < self.lo:
            self.lo = entry.lo
        if entry.hi > self.hi:
            self.hi = entry.hi

    def add(self, entry: _Entry) -> None:
        if self.tiles is not None:
            self._untile()
        lo, hi = entry.lo, entry.hi
        if entry.flat:  # one piece, its bytes: indexed here (the ring's common case)
            c = (hi - lo).bit_length()
            key = lo << SERIAL_BITS | entry.serial
            cls = self.classes.get(c)
            if cls is None:
                self.classes[c] = ([key], {key: (hi, entry)})
            else:
                keys, pieces = cls
                if type(keys) is not list:
                    keys.add(key)
                elif key > keys[-1]:
                    keys.append(key)  # a later address, or a newer entry
                else:
                    bisect.insort(keys, key)
                    if len(keys) > SMALL_CLASS:
                        self.classes[c] = (SortedList(keys), pieces)
                pieces[key] = (hi, entry)
        else:
            self._index(entry)
        self.count += 1
        if lo < self.lo:
            self.lo = lo
        if hi > self.hi:
            self.hi = hi

    def add_later(self, entry: _Entry) -> None:
        """:meth:`add`, the indexing left to the next look at the bucket."""
        self.pending.append(entry)
        self.count += 1
        if entry.lo < self.lo:
            self.lo = entry.lo
        if entry.hi > self.hi:
            self.hi = entry.hi

    def _flush(self) -> None:
        pending, self.pending = self.pending, []
        for entry in pending:
            self._place(entry)

    def _index(self, entry: _Entry) -> None:
        serial, classes = entry.serial, self.classes
        if entry.flat:
            pieces_of = ((entry.lo, entry.hi),)
        else:
            pieces_of = entry.pieces()
            if len(pieces_of) > 1:
                self.multi += 1
        for lo, hi in pieces_of:
            c = (hi - lo).bit_length()
            key = lo << SERIAL_BITS | serial
            cls = classes.get(c)
            if cls is None:
                classes[c] = ([key], {key: (hi, entry)})
                continue
            keys, pieces = cls
            if type(keys) is list:
                if key > keys[-1]:
                    keys.append(key)  # the common case: a later address, or a newer entry
                else:
                    bisect.insort(keys, key)
                if len(keys) > SMALL_CLASS:
                    classes[c] = (SortedList(keys), pieces)
            else:
                keys.add(key)
            pieces[key] = (hi, entry)

    def candidates(self, lo: int, hi: int) -> list[_Entry]:
        """The entries with a piece ``[p.lo, p.hi)`` that meets ``[lo, hi)`` (repeats
        possible).

        For a large class it reads the ``SortedList``'s sublists and their maxima (``_lists``,
        ``_maxes``, the layout of sortedcontainers 2.x) and bisects them itself: ``irange``
        builds two generators per call, which was most of a lookup's time."""
        if hi <= self.lo or self.hi <= lo:  # outside every entry's bytes
            return []
        if self.pending:
            self._flush()
        if self.tiles is not None:
            self._untile()
        found = []
        stop = hi << SERIAL_BITS
        bisect_left = bisect.bisect_left
        for c, (keys, pieces) in self.classes.items():
            first = (lo - (1 << c) + 1) << SERIAL_BITS
            if type(keys) is list:
                i = bisect_left(keys, first)
                for key in keys[i : bisect_left(keys, stop, i)]:
                    end, entry = pieces[key]
                    if end > lo:
                        found.append(entry)
                continue
            maxes, lists = keys._maxes, keys._lists
            at = bisect_left(maxes, first)
            while at < len(lists):
                sub = lists[at]
                i = bisect_left(sub, first) if sub[0] < first else 0
                j = bisect_left(sub, stop, i)
                for key in sub[i:j]:
                    end, entry = pieces[key]
                    if end > lo:
                        found.append(entry)
                if j < len(sub):
                    break
                at += 1
        return found

    def meeting(self, lo: int, hi: int) -> list[_Entry]:
        """The entries whose live bytes meet ``[lo, hi)``, each once (the span path's
        lookup)."""
        if hi <= self.lo or self.hi <= lo:  # outside every entry's bytes
            return []
        if self.pending:
            self._flush()
        tiles = self.tiles
        if tiles is not None:  # whole spans, any two the same or disjoint
            same = tiles.get((lo, hi))
            if same is not None:  # one of the spans: no other can meet it
                return same[:]
            if len(tiles) <= TILED_SCAN:
                return [e for (a, b), same in tiles.items() if a < hi and lo < b for e in same]
            self._untile()
        found = []
        stop = hi << SERIAL_BITS
        for c, (keys, pieces) in self.classes.items():  # candidates(), inline for small classes
            if type(keys) is not list:
                found = [
                    e
                    for e in self.candidates(lo, hi)
                    if (e.flat and e.live is None) or _span_meets(e, lo, hi)
                ]
                break
            i = bisect.bisect_left(keys, (lo - (1 << c) + 1) << SERIAL_BITS)
            for key in keys[i : bisect.bisect_left(keys, stop, i)]:
                end, entry = pieces[key]
                # a whole span meets at once (its one piece is its bytes): no call for it
                if end > lo and ((entry.flat and entry.live is None) or _span_meets(entry, lo, hi)):
                    found.append(entry)
        if self.multi and len(found) > 1:
            found = list({id(e): e for e in found}.values())
        return found

    def lookup(self, s: ByteSet) -> list[_Entry]:
        """The entries with a piece that meets one of ``s``'s pieces, each once."""
        pieces = _pieces(s)
        if len(pieces) == 1:
            found = self.candidates(*pieces[0])
            return found if len(found) < 2 else list({id(e): e for e in found}.values())
        unique: dict[int, _Entry] = {}
        for lo, hi in pieces:
            for e in self.candidates(lo, hi):
                unique[id(e)] = e
        return list(unique.values())

    def remove(self, entry: _Entry) -> None:
        if self.pending:
            self._flush()
        tiles = self.tiles
        if tiles is not None:
            # by identity; the span stays a tile (a task that overwrites a span writes it
            # next: its entry joins the tile at once)
            tiles[entry.lo, entry.hi].remove(entry)
            self.count -= 1
            return
        serial, classes = entry.serial, self.classes
        pieces_of = ((entry.lo, entry.hi),) if entry.flat else entry.pieces()
        if len(pieces_of) > 1:
            self.multi -= 1
        for lo, hi in pieces_of:
            c = (hi - lo).bit_length()
            keys, pieces = classes[c]
            key = lo << SERIAL_BITS | serial
            del pieces[key]
            if not pieces:
                del classes[c]
            elif type(keys) is list:
                del keys[bisect.bisect_left(keys, key)]
            else:
                keys.remove(key)
        self.count -= 1

    def take_inside(self, lo: int, hi: int) -> int:
        """Drop the entries that lie within bytes ``[lo, hi)``; how many. The reads not yet
        indexed are filtered as they are, not indexed first."""
        pending = self.pending
        if pending:
            kept = [e for e in pending if e.lo < lo or e.hi > hi]
            dropped = len(pending) - len(kept)
            self.pending = kept
            self.count -= dropped
        else:
            dropped = 0
        tiles = self.tiles
        if tiles is not None and lo <= self.bottom and self.top <= hi and not self.pending:
            taken = self.count  # every span lies within the range: all of them
            self._clear()
            return dropped + taken
        if tiles is not None and len(tiles) <= TILED_FORGET:
            inside, taken = [], 0
            for key, same in tiles.items():
                if lo <= key[0] and key[1] <= hi:
                    inside.append(key)
                    taken += len(same)
            if taken == self.count:  # all of them
                self._clear()
            else:
                for key in inside:
                    del tiles[key]
                self.count -= taken
            return dropped + taken
        found = {id(e): e for e in self.candidates(lo, hi) if e.lo >= lo and e.hi <= hi}
        if len(found) == self.count:  # all of them: the index goes whole
            self._clear()
        else:
            for entry in found.values():
                self.remove(entry)
        return dropped + len(found)

    def _clear(self) -> None:
        """Drop every entry (none is pending): the bucket starts again, tiled."""
        self.classes.clear()
        self.count = self.multi = 0
        self.lo, self.hi = math.inf, -1
        self.tiles = {}
        self.bottom, self.top = math.inf, -1

    def keep_only(self, keep) -> int:
        """Drop the entries for which ``keep(entry)`` is false; returns how many."""
        if self.pending:
            self._flush()
        if self.tiles is not None:
            self._untile()
        dropped: set[int] = set()
        multi: set[int] = set()
        for c in list(self.classes):
            pieces = self.classes[c][1]
            kept = {}
            for key, (hi, entry) in pieces.items():
                if keep(entry):
                    kept[key] = (hi, entry)
                    if not entry.flat and len(entry.pieces()) > 1:
                        multi.add(entry.serial)
                else:
                    dropped.add(entry.serial)
            if kept:
                keys = sorted(kept)
                self.classes[c] = (keys if len(keys) <= SMALL_CLASS else SortedList(keys), kept)
            else:
                del self.classes[c]
        self.count -= len(dropped)
        self.multi = len(multi)
        return len(dropped)


Span = tuple[Hashable, int, int]
"""``(buffer, lo, hi)``: the contiguous bytes ``[lo, hi)`` of a buffer, ``lo < hi``."""


class TensorMap:
    """Live producers' regions, bucketed by buffer; exact multi-producer lookup.

    It also keeps the regions tasks read (recorded by :func:`gather_fanin`), so that a writer
    is ordered after the readers of the bytes it overwrites (write-after-read). A write
    through :func:`gather_fanin` (or ``lookup(..., inout=True)``) supersedes: the bytes it
    overwrites are no longer any older entry's, and an entry left with none is dropped.

    Not thread-safe: the orchestration that owns it is single-threaded (every simulated core
    replays the same orchestration, so each would hold an identical map).
    """

    def __init__(self) -> None:
        self._buckets: dict[Hashable, _Bucket] = {}
        self._readers: dict[Hashable, _Bucket] = {}
        self._count = 0

    def __len__(self) -> int:
        """Live write entries, over all buffers (the readers kept are :attr:`reader_count`)."""
        return self._count

    @property
    def reader_count(self) -> int:
        """Live read entries, over all buffers: the reads no later write has overwritten."""
        return sum(b.count for b in self._readers.values())

    def insert(self, region: Region, producer: int) -> None:
        """Record that task ``producer`` wrote ``region``. O(P log n) for the region's P
        pieces (:data:`MAX_PIECES` at most) among n.

        It does not supersede older entries: :func:`gather_fanin` (called first, for the same
        task) does.

        Raises:
            TypeError: ``region`` is not a :class:`Region`, or ``producer`` is not an integer.
            ValueError: ``producer`` < 0.
        """
        if not isinstance(region, Region):
            raise TypeError(f"region must be a Region, got {type(region).__name__}")
        producer = integer(producer, "producer", 0)
        lo, hi = region.byte_range
        self._buckets.setdefault(region.buffer, _Bucket()).add(
            _Entry(region.buffer, lo, hi, region, producer)
        )
        self._count += 1

    def insert_span(self, buffer: Hashable, lo: int, hi: int, producer: int) -> None:
        """:meth:`insert` for the contiguous bytes ``[lo, hi)`` of ``buffer`` (``lo < hi``),
        without a :class:`Region` (the ring's path; its arguments are not checked)."""
        bucket = self._buckets.get(buffer)
        if bucket is None:
            bucket = self._buckets[buffer] = _Bucket()
        bucket.add_span(_span_entry(buffer, lo, hi, producer))
        self._count += 1

    def insert_spans(self, spans: Iterable[Span], producer: int) -> None:
        """:meth:`insert_span` for each ``(buffer, lo, hi)`` of ``spans``: byte ranges
        ``[lo, hi)`` with ``lo < hi``, in order, all written by ``producer`` (a task id). Its
        arguments are not checked (the ring's path, issue 39 item 4); the map ends as after
        one :meth:`insert_span` per span."""
        buckets, new, serials = self._buckets, object.__new__, _serials
        for buffer, lo, hi in spans:
            bucket = buckets.get(buffer)
            if bucket is None:
                bucket = buckets[buffer] = _Bucket()
            entry = new(_Entry)  # _span_entry(buffer, lo, hi, producer), inline
            entry.buffer, entry.lo, entry.hi, entry.producer = buffer, lo, hi, producer
            entry.live = entry._region = entry._bytes = None
            entry.flat = True
            entry.serial = next(serials)
            tiles = bucket.tiles  # bucket.add_span(entry), inline for its common cases
            same = None if tiles is None else tiles.get((lo, hi))
            if same is not None:  # a span rewritten whole
                same.append(entry)
            elif tiles is not None and lo >= bucket.top:  # a span past every other
                tiles[lo, hi] = [entry]
                bucket.top = hi
                if lo < bucket.bottom:
                    bucket.bottom = lo
            else:
                bucket._place(entry)
            bucket.count += 1
            if lo < bucket.lo:
                bucket.lo = lo
            if hi > bucket.hi:
                bucket.hi = hi
            self._count += 1

    def _matches(self, region: Region, readers: bool = False) -> list[tuple[_Entry, Overlap]]:
        if not isinstance(region, Region):
            raise TypeError(f"region must be a Region, got {type(region).__name__}")
        bucket = (self._readers if readers else self._buckets).get(region.buffer)
        if bucket is None:
            return []
        found = []
        for entry in bucket.lookup(region._bytes):
            overlap = _classify_live(entry, region)
            if overlap is not Overlap.NO_OVERLAP:
                found.append((entry, overlap))
        return found

    def lookup(self, region: Region, *, inout: bool = False) -> list[Producer]:
        """Every live producer whose live bytes overlap ``region``: deduplicated, newest
        (highest task id) first, none of them :attr:`Overlap.NO_OVERLAP`. O(P C log n + k)
        (see ``_Bucket``).

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

    def _remove(self, entries: Sequence[_Entry], readers: bool = False) -> None:
        buckets = self._readers if readers else self._buckets
        for entry in entries:
            buckets[entry.buffer].remove(entry)
        if not readers:
            self._count -= len(entries)

    def _supersede(self, region: Region) -> None:
        """``region`` is overwritten: its bytes leave every older write and read entry."""
        for readers in (False, True):
            dead = [
                entry
                for entry, _ in self._matches(region, readers)
                if not _subtract(entry, region._bytes)
            ]
            self._remove(dead, readers)

    def _record_read(self, region: Region, reader: int, written: Sequence[Region]) -> None:
        """Task ``reader`` read ``region`` (less the bytes it writes itself)."""
        lo, hi = region.byte_range
        entry = _Entry(region.buffer, lo, hi, region, reader)
        for w in written:
            if w.buffer == region.buffer and not _subtract(entry, w._bytes):
                return
        self._readers.setdefault(region.buffer, _Bucket()).add_later(entry)

    def _record_read_span(self, span: Span, reader: int, written: Sequence[Span]) -> None:
        """:meth:`_record_read` for a span (read, less the bytes it writes itself)."""
        buffer, lo, hi = span
        entry = object.__new__(_Entry)  # _span_entry(buffer, lo, hi, reader), inline
        entry.buffer, entry.lo, entry.hi, entry.producer = buffer, lo, hi, reader
        entry.live = entry._region = entry._bytes = None
        entry.flat = True
        entry.serial = next(_serials)
        for wbuffer, wlo, whi in written:
            if wbuffer == buffer and wlo < hi and lo < whi and not _cut(entry, wlo, whi):
                return
        bucket = self._readers.get(buffer)
        if bucket is None:
            bucket = self._readers[buffer] = _Bucket()
        bucket.pending.append(entry)  # bucket.add_later(entry), inline
        bucket.count += 1
        lo, hi = entry.lo, entry.hi  # its bounding range (a cut keeps it)
        if lo < bucket.lo:
            bucket.lo = lo
        if hi > bucket.hi:
            bucket.hi = hi

    def forget(self, buffer: Hashable, lo: int, hi: int) -> int:
        """Drop every entry, written or read, of ``buffer`` that lies within bytes ``[lo, hi)``:
        no later task can touch them (the ring calls it for the slices of a closed scope).
        O(k log n) for the k entries dropped.

        Returns:
            The number of write entries dropped.
        """
        dropped = 0
        for buckets in (self._buckets, self._readers):
            bucket = buckets.get(buffer)
            if bucket is None:
                continue
            taken = bucket.take_inside(lo, hi)
            if not bucket.count:
                del buckets[buffer]
            if buckets is self._buckets:
                dropped = taken
        self._count -= dropped
        return dropped

    def retire_below(self, task_id: int) -> int:
        """Drop every entry (written or read) whose task's id is below ``task_id`` (retired
        tasks).

        Returns:
            The number of write entries dropped.
        """
        task_id = integer(task_id, "task_id", 0)
        removed = 0
        for buckets in (self._buckets, self._readers):
            for buffer in list(buckets):
                bucket = buckets[buffer]
                dropped = bucket.keep_only(lambda e: e.producer >= task_id)
                if buckets is self._buckets:
                    removed += dropped
                if not bucket.count:
                    del buckets[buffer]
        self._count -= removed
        return removed


def _newest_first(tasks: set[int]) -> tuple[int, ...]:
    """A fan-in's tasks, newest (highest id) first: both gather paths order theirs here."""
    return tuple(sorted(tasks, reverse=True))


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
    """A task's fan-in: every task it must follow, by the bytes it reads and overwrites,
    newest first, deduplicated; then the task's accesses are recorded.

    Per byte, as a byte-level model would: a byte the task reads depends on its last writer
    (read-after-write); a byte it overwrites depends on its last writer (write-after-write: a
    slow old write must not land after the new one) and on every task that read it since
    (write-after-read: a reader must not see the new bytes). Only live bytes count: a producer
    whose bytes the reader touches were all overwritten since is not in the fan-in (the
    overwriters are, and they follow it). Then the bytes the task overwrites leave every older
    entry (an entry left with none is dropped), and its ``inputs`` are recorded as reads. It
    does not insert the task's own writes: call :meth:`TensorMap.insert` for those afterwards.

    Args:
        tmap: the map.
        task: the consumer's id (for the error message, and the reads it records).
        inputs: regions it reads. inouts: regions it reads then writes. writes: regions it
            writes without reading.
        max_fanin: the most tasks allowed in the fan-in (producers and, for a writer, earlier
            readers), >= 1; ``None`` (default) for no cap.

    Cost: each region a lookup (see :meth:`TensorMap.lookup`), plus, for a write that leaves
    part of an older entry, that entry's runs.

    Raises:
        FaninExceeded: more than ``max_fanin`` distinct tasks; the map is left unchanged.
        TypeError, ValueError: a bad region or ``max_fanin``.
    """
    if max_fanin is not None:
        max_fanin = integer(max_fanin, "max_fanin")
    inputs, written = list(inputs), [*inouts, *writes]
    found = [match for region in (*inputs, *inouts) for match in tmap._matches(region)]
    for region in written:
        found += tmap._matches(region)
        found += tmap._matches(region, readers=True)
    producers = _newest_first({entry.producer for entry, _ in found} - {task})
    if max_fanin is not None and len(producers) > max_fanin:
        raise FaninExceeded(
            f"task {task} depends on {len(producers)} producers, more than"
            f" max_fanin={max_fanin} (the seed's runtime silently kept 16)"
        )
    for region in written:
        tmap._supersede(region)
    for region in inputs:
        tmap._record_read(region, task, written)
    return producers


def _span_meets(entry: _Entry, lo: int, hi: int) -> bool:
    """Whether the live bytes of ``entry``, a candidate of ``[lo, hi)`` (one of its pieces
    meets it), meet ``[lo, hi)``: at once for a whole span (its piece is its bytes), by the
    exact test for a strided entry, by bisection among live intervals."""
    live = entry.live
    if live is None:
        return entry.flat or intersects(entry._bytes, ByteSet(lo, hi - lo, ()))
    i = bisect.bisect_right(live, (lo, lo))
    if i and live[i - 1][1] > lo:
        return True
    return i < len(live) and live[i][0] < hi


def _cut(entry: _Entry, lo: int, hi: int) -> bool:
    """:func:`_subtract` for the bytes ``[lo, hi)``, which meet ``entry``'s live bytes:
    interval arithmetic. Whether any live bytes remain."""
    live = entry.live
    if live is None:
        if lo <= entry.lo and entry.hi <= hi:
            return False  # covered (a strided entry's bytes lie within its bounding range)
        if not entry.flat:
            return _subtract(entry, ByteSet(lo, hi - lo, ()))
        live = entry.live = [(entry.lo, entry.hi)]
    i = bisect.bisect_right(live, (lo, lo))
    if i and live[i - 1][1] > lo:
        i -= 1
    j = bisect.bisect_left(live, (hi, hi), i)
    kept = []
    for a, b in live[i:j]:
        if a < lo:
            kept.append((a, lo))
        if b > hi:
            kept.append((hi, b))
    live[i:j] = kept
    return bool(live)


def gather_spans(
    tmap: TensorMap,
    task: int,
    *,
    inputs: Sequence[Span] = (),
    inouts: Sequence[Span] = (),
    writes: Sequence[Span] = (),
    max_fanin: int | None = None,
) -> tuple[int, ...]:
    """:func:`gather_fanin` for accesses that are contiguous bytes, given as ``(buffer, lo,
    hi)`` spans: the same fan-in and the same changes to the map, without a :class:`Region`
    per access (the ring's path: its tensors are spans of float32 elements). The map may hold
    strided entries too: they are tested exactly. Record the task's writes afterwards with
    :meth:`TensorMap.insert_span` (or :meth:`TensorMap.insert`).

    Raises:
        FaninExceeded: more than ``max_fanin`` distinct tasks; the map is left unchanged.
    """
    if max_fanin is not None:
        max_fanin = integer(max_fanin, "max_fanin")
    writers = tmap._buckets
    tasks: set[int] = set()
    for buffer, lo, hi in inputs:
        bucket = writers.get(buffer)
        # (a span outside the bucket's bounds meets nothing: tested here, without a call)
        if bucket is not None and lo < bucket.hi and bucket.lo < hi:
            for e in bucket.meeting(lo, hi):
                tasks.add(e.producer)
    written = (*inouts, *writes)
    if written:
        readers = tmap._readers
        met = []  # per written span: the write and read entries its bytes meet
        for buffer, lo, hi in written:  # an inout's writers are its reads' and writes' alike
            bucket = writers.get(buffer)
            if bucket is not None and lo < bucket.hi and bucket.lo < hi:
                wrote = bucket.meeting(lo, hi)
                for e in wrote:
                    tasks.add(e.producer)
            else:
                wrote = ()
            bucket = readers.get(buffer)
            if bucket is not None and lo < bucket.hi and bucket.lo < hi:
                read = bucket.meeting(lo, hi)
                for e in read:
                    tasks.add(e.producer)
            else:
                read = ()
            met.append((wrote, read))
    tasks.discard(task)
    producers = _newest_first(tasks) if tasks else ()
    if max_fanin is not None and len(producers) > max_fanin:
        raise FaninExceeded(
            f"task {task} depends on {len(producers)} producers, more than"
            f" max_fanin={max_fanin} (the seed's runtime silently kept 16)"
        )
    for k, (buffer, lo, hi) in enumerate(written):  # supersede: the bytes leave older entries
        # the entries met above, unless an earlier written span of the task overlaps this one
        # (its cuts may have changed them); a disjoint one cannot change what meets this one
        again = k and any(b == buffer and x < hi and lo < y for b, x, y in written[:k])
        wrote, read = met[k]
        if again:
            bucket = writers.get(buffer)
            wrote = () if bucket is None else bucket.meeting(lo, hi)
            bucket = readers.get(buffer)
            read = () if bucket is None else bucket.meeting(lo, hi)
        # an entry wholly inside the span dies at once (a whole span, or a strided entry
        # within its bounding range); others are cut
        # (an entry left with part of its bytes is no whole span: its bucket leaves tiled mode)
        for entries, reads, buckets in ((wrote, False, writers), (read, True, readers)):
            if not entries:
                continue
            dead = [
                e
                for e in entries
                if (e.live is None and lo <= e.lo and e.hi <= hi) or not _cut(e, lo, hi)
            ]
            if dead:
                tmap._remove(dead, reads)
            if len(dead) < len(entries):
                buckets[buffer].leave_tiles()
    for span in inputs:
        tmap._record_read_span(span, task, written)
    return producers
