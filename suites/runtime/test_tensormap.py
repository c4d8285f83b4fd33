"""The TensorMap: exact strided overlap, every producer, no silent fan-in cap
(``../shared/seeds/pto-ring-heap-and-tensormap.txt``, open problem 2).

Exactness is checked differentially, with hypothesis, against brute-force sets of byte
addresses; the seed's two defects (newest-only lookup, fan-in truncated at 16) are patched back
in as mutants and caught by the same checks.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runtime.tensormap import (
    FaninExceeded,
    Overlap,
    Producer,
    Region,
    TensorMap,
    _map,
    _strided,
    classify,
    gather_fanin,
    gather_spans,
)

from . import _ring_mutants

# -- strategies and the brute-force model ----------------------------------------------------


@st.composite
def regions(draw, buffers=("a",), max_dim=4, max_offset=40):
    ndim = draw(st.integers(1, 4))
    return Region(
        draw(st.sampled_from(buffers)),
        draw(st.integers(0, max_offset)),
        tuple(draw(st.integers(1, max_dim)) for _ in range(ndim)),
        tuple(draw(st.integers(1, 12)) for _ in range(ndim)),
        draw(st.sampled_from((1, 2, 4, 8))),
    )


def _settings(stress_scale: int, examples: int):
    """Hypothesis settings: ``examples`` in CI, up to 10x that under ``--stress-scale`` (the
    nightly run's 100 would take minutes for nothing a 10x run does not find)."""
    return settings(
        max_examples=examples * min(stress_scale, 10),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        derandomize=stress_scale == 1,  # CI is reproducible; nightly explores
    )


def brute_classify(entry: Region, lookup: Region) -> Overlap:
    if entry.buffer != lookup.buffer:
        return Overlap.NO_OVERLAP
    e, q = entry.byte_set(), lookup.byte_set()
    if not e & q:
        return Overlap.NO_OVERLAP
    return Overlap.COVERED if e <= q else Overlap.PARTIAL


class ModelMap:
    """The reference: a list of (region, producer), compared byte by byte."""

    def __init__(self) -> None:
        self.entries: list[tuple[Region, int]] = []

    def insert(self, region, producer):
        self.entries.append((region, producer))

    def lookup(self, region, inout=False):
        found: dict[int, Overlap] = {}
        keep = []
        for entry, producer in self.entries:
            overlap = brute_classify(entry, region)
            if overlap is not Overlap.NO_OVERLAP and found.get(producer) is not Overlap.PARTIAL:
                found[producer] = overlap
            if not (inout and overlap is Overlap.COVERED):
                keep.append((entry, producer))
        self.entries = keep
        return [Producer(p, found[p]) for p in sorted(found, reverse=True)]

    def retire_below(self, task):
        before = len(self.entries)
        self.entries = [(r, p) for r, p in self.entries if p >= task]
        return before - len(self.entries)


def k_tiles(k: int, tile: int = 8) -> tuple[TensorMap, Region]:
    """k producers each wrote one of k disjoint tiles of buffer "x"; the whole buffer."""
    tmap = TensorMap()
    for i in range(k):
        tmap.insert(Region.contiguous("x", i * tile, tile), producer=i)
    return tmap, Region.contiguous("x", 0, k * tile)


def check_fanin_of_k_tiles(k: int) -> None:
    """The suite's check: a whole-buffer read depends on all k tile producers."""
    tmap, whole = k_tiles(k)
    found = tmap.lookup(whole)
    assert [p.task for p in found] == list(range(k - 1, -1, -1)), (
        f"fan-in {len(found)} for {k} tile producers: {[p.task for p in found][:20]}"
    )
    assert {p.overlap for p in found} == {Overlap.COVERED}
    assert gather_fanin(tmap, k, inputs=[whole]) == tuple(range(k - 1, -1, -1))


# -- exactness against brute force -----------------------------------------------------------


def test_classify_matches_brute_force(stress_scale):
    @_settings(stress_scale, 400)
    @given(regions(), regions())
    def check(a, b):
        a_bytes, b_bytes = a.byte_set(), b.byte_set()
        assert a.intersects(b) == bool(a_bytes & b_bytes)
        assert a.covers(b) == (b_bytes <= a_bytes)
        assert classify(a, b) == brute_classify(a, b)

    check()


def test_classify_matches_brute_force_for_views_of_one_tensor(stress_scale):
    """Same-layout views (tiles of one row-major tensor) and views with different element
    sizes of one buffer: the reference's per-dimension case, and the byte-based one."""

    @_settings(stress_scale, 200)
    @given(st.data())
    def check(data):
        rows, cols = data.draw(st.integers(2, 12)), data.draw(st.integers(2, 12))

        def tile():
            r0, c0 = data.draw(st.integers(0, rows - 1)), data.draw(st.integers(0, cols - 1))
            h, w = data.draw(st.integers(1, rows - r0)), data.draw(st.integers(1, cols - c0))
            return Region("m", r0 * cols + c0, (h, w), (cols, 1), 4)

        a, b = tile(), tile()
        assert classify(a, b) == brute_classify(a, b)
        as_bytes = Region("m", data.draw(st.integers(0, 4 * rows * cols)), (7,), (1,), 1)
        assert classify(a, as_bytes) == brute_classify(a, as_bytes)
        assert classify(as_bytes, a) == brute_classify(as_bytes, a)

    check()


def test_tensormap_matches_a_brute_force_model(stress_scale):
    ops = st.lists(
        st.one_of(
            st.tuples(st.just("insert"), regions(("a", "b"), 3, 24), st.integers(0, 30)),
            st.tuples(st.just("lookup"), regions(("a", "b"), 3, 24), st.booleans()),
            st.tuples(st.just("retire"), st.integers(0, 30)),
        ),
        max_size=25,
    )

    @_settings(stress_scale, 150)
    @given(ops)
    def check(ops):
        tmap, model = TensorMap(), ModelMap()
        for op in ops:
            if op[0] == "insert":
                tmap.insert(op[1], op[2])
                model.insert(op[1], op[2])
            elif op[0] == "lookup":
                assert tmap.lookup(op[1], inout=op[2]) == model.lookup(op[1], op[2])
            else:
                assert tmap.retire_below(op[1]) == model.retire_below(op[1])
            assert len(tmap) == len(model.entries)

    check()


class ByteModel:
    """The reference of :func:`gather_fanin`: entries as sets of live bytes, byte by byte.

    A write entry's live bytes are those no later write overwrote; a read entry's, those no
    write overwrote since the read. A task's fan-in: the writers of the live bytes it reads
    or overwrites and the readers of the live bytes it overwrites."""

    def __init__(self) -> None:
        self.writes: list[list] = []  # [buffer, live bytes, producer]
        self.reads: list[list] = []

    @staticmethod
    def _meets(entries, region):
        q = region.byte_set()
        return [e for e in entries if e[0] == region.buffer and e[1] & q]

    def gather(self, task, inputs, inouts, writes, max_fanin):
        found = {e[2] for r in (*inputs, *inouts, *writes) for e in self._meets(self.writes, r)}
        found |= {e[2] for r in (*inouts, *writes) for e in self._meets(self.reads, r)}
        found.discard(task)
        if max_fanin is not None and len(found) > max_fanin:
            return None
        for r in (*inouts, *writes):
            q = r.byte_set()
            for entries in (self.writes, self.reads):
                for e in entries:
                    if e[0] == r.buffer:
                        e[1] = e[1] - q
                entries[:] = [e for e in entries if e[1]]
        for r in inputs:
            live = r.byte_set()
            for w in (*inouts, *writes):
                if w.buffer == r.buffer:
                    live = live - w.byte_set()
            if live:
                self.reads.append([r.buffer, live, task])
        return tuple(sorted(found, reverse=True))

    def insert(self, region, producer):
        self.writes.append([region.buffer, region.byte_set(), producer])

    def lookup(self, region, inout):
        q = region.byte_set()
        found: dict[int, Overlap] = {}
        for e in self._meets(self.writes, region):
            overlap = Overlap.COVERED if e[1] <= q else Overlap.PARTIAL
            if found.get(e[2]) is not Overlap.PARTIAL:
                found[e[2]] = overlap
        if inout:
            self.writes = [e for e in self.writes if not (e[0] == region.buffer and e[1] <= q)]
        return [Producer(p, found[p]) for p in sorted(found, reverse=True)]

    def retire_below(self, task):
        before = len(self.writes)
        self.writes = [e for e in self.writes if e[2] >= task]
        self.reads = [e for e in self.reads if e[2] >= task]
        return before - len(self.writes)


@pytest.mark.parametrize("max_pieces", [256, 2], ids=["runs", "blocks"])
def test_gather_fanin_matches_a_byte_level_model(stress_scale, monkeypatch, max_pieces):
    """Tasks that read, read-and-write and write random strided regions (1-4 dimensions,
    1- to 8-byte elements, two buffers), through the ring's protocol (:func:`gather_fanin`,
    then :meth:`TensorMap.insert` of the task's writes), with a fan-in cap now and then,
    lookups and retirements in between: every fan-in, lookup, count and refusal as the byte
    model's. Before: a producer whose bytes were all overwritten stayed in the fan-in, and no
    reader was ever in it. With ``MAX_PIECES`` 2, regions are indexed by blocks of runs.
    """
    monkeypatch.setattr(_map, "MAX_PIECES", max_pieces)
    region = regions(("a", "b"), 3, 24)
    ops = st.lists(
        st.one_of(
            st.tuples(
                st.just("task"),
                st.lists(region, max_size=2),
                st.lists(region, max_size=1),
                st.lists(region, max_size=2),
                st.one_of(st.none(), st.integers(1, 3)),
            ),
            st.tuples(st.just("lookup"), region, st.booleans()),
            st.tuples(st.just("retire"), st.integers(0, 12)),
        ),
        max_size=25,
    )

    @_settings(stress_scale, 100)
    @given(ops)
    def check(ops):
        tmap, model = TensorMap(), ByteModel()
        for task, op in enumerate(ops):
            if op[0] == "task":
                _, inputs, inouts, writes, cap = op
                expected = model.gather(task, inputs, inouts, writes, cap)
                if expected is None:
                    with pytest.raises(FaninExceeded, match=f"task {task} depends on"):
                        gather_fanin(
                            tmap, task, inputs=inputs, inouts=inouts, writes=writes, max_fanin=cap
                        )
                    continue
                got = gather_fanin(
                    tmap, task, inputs=inputs, inouts=inouts, writes=writes, max_fanin=cap
                )
                assert got == expected
                for r in (*inouts, *writes):
                    tmap.insert(r, task)
                    model.insert(r, task)
            elif op[0] == "lookup":
                assert tmap.lookup(op[1], inout=op[2]) == model.lookup(op[1], op[2])
            else:
                assert tmap.retire_below(op[1]) == model.retire_below(op[1])
            assert len(tmap) == len(model.writes)
            assert tmap.reader_count == len(model.reads)

    check()


@st.composite
def runs(draw, buffers=("a", "b"), max_offset=24):
    """Regions whose bytes are one run: 1-D, or row-major blocks that merge into one."""
    elem = draw(st.sampled_from((1, 2, 4)))
    n = draw(st.integers(1, 8))
    start = draw(st.integers(0, max_offset))
    if draw(st.booleans()):
        return Region.contiguous(draw(st.sampled_from(buffers)), start, n, elem)
    rows = draw(st.integers(1, 2))
    return Region(draw(st.sampled_from(buffers)), start, (rows, n), (n, 1), elem)


def _span(region: Region) -> tuple:
    return (region.buffer, *region.byte_range)


@pytest.mark.parametrize("max_pieces", [256, 2], ids=["runs", "blocks"])
def test_the_span_path_agrees_with_the_region_path(stress_scale, monkeypatch, max_pieces):
    """:func:`gather_spans` and :meth:`TensorMap.insert_span` (the ring's path for contiguous
    tensors) against :func:`gather_fanin` and :meth:`TensorMap.insert` on a second map (which
    the byte-level model checks above): random tasks of contiguous regions (through the span
    path whenever all of a task's regions are one run) mixed with strided ones (through the
    Region path, so the span path meets strided entries, whole or with live intervals),
    lookups, forgets and retirements. Every fan-in, refusal, lookup, count and forget as the
    Region path's."""
    monkeypatch.setattr(_map, "MAX_PIECES", max_pieces)
    region = st.one_of(runs(("a",), 12), runs(("a", "b"), 12), regions(("a", "b"), 3, 12))
    ops = st.lists(
        st.one_of(
            st.tuples(
                st.just("task"),
                st.lists(region, max_size=2),
                st.lists(region, max_size=2),
                st.lists(region, max_size=2),
                st.one_of(st.none(), st.integers(1, 3)),
            ),
            st.tuples(st.just("lookup"), region, st.booleans()),
            st.tuples(st.just("forget"), st.sampled_from(("a", "b")), st.integers(0, 40)),
            st.tuples(st.just("retire"), st.integers(0, 12)),
        ),
        max_size=25,
    )

    whole, middle = Region.contiguous("a", 0, 12, 1), Region.contiguous("a", 4, 4, 1)
    column = Region("a", 0, (3, 2), (4, 1), 1)  # bytes 0-1, 4-5, 8-9
    cut = [  # a read of the bytes a write took from the middle of an older one
        ("task", [], [], [whole], None),
        ("task", [], [], [middle], None),
        ("task", [middle], [], [], None),
        ("task", [Region.contiguous("a", 8, 4, 1)], [], [], None),
        ("task", [], [], [middle], None),
    ]
    strided = [  # spans against a strided entry, whole then cut
        ("task", [], [], [column], None),
        ("task", [middle], [], [], None),
        ("task", [], [Region.contiguous("a", 0, 1, 1)], [], None),
        ("task", [], [], [middle], None),
        ("task", [whole], [], [], 2),
    ]

    def one(lo: int, n: int = 4) -> Region:
        return Region.contiguous("a", lo, n, 1)

    tiled = [  # a bucket of whole spans, rewritten whole, then cut, forgotten, tiled again
        ("task", [], [], [one(0)], None),
        ("task", [one(0)], [one(4)], [], None),
        ("task", [], [one(0)], [], None),
        ("task", [one(0), one(4)], [], [], None),
        ("task", [one(8)], [], [one(0)], None),
        ("task", [], [], [one(2)], None),  # meets two spans partly: indexed from here
        ("lookup", one(0, 12), False),
        ("forget", "a", 0),
        ("task", [], [], [one(0)], None),
        ("task", [one(0)], [], [], 1),
    ]
    read_cut = [  # a read cut by a write is no whole span: its bucket must leave tiled mode
        ("task", [one(0)], [], [], None),
        ("task", [], [], [one(2, 2)], None),
        ("task", [], [], [one(2, 2)], None),  # follows task 1 only, not the read's task 0
    ]
    scanned = [  # more disjoint spans than a tiled bucket scans, then a read across two
        *[("task", [], [], [one(lo, 1)], None) for lo in range(0, 20, 2)],
        ("task", [one(3, 3)], [], [], None),
        ("task", [], [], [one(13, 1)], None),
        ("forget", "a", 10),
    ]

    @_settings(stress_scale, 150)
    @given(ops)
    @example(cut)
    @example(strided)
    @example(tiled)
    @example(read_cut)
    @example(scanned)
    def check(ops):
        fast, slow = TensorMap(), TensorMap()
        for task, op in enumerate(ops):
            if op[0] == "task":
                _, inputs, inouts, writes, cap = op
                flat = all(not r._bytes.dims for r in (*inputs, *inouts, *writes))
                try:
                    want = gather_fanin(
                        slow, task, inputs=inputs, inouts=inouts, writes=writes, max_fanin=cap
                    )
                except FaninExceeded as exc:
                    want = str(exc)
                try:
                    if flat:
                        got = gather_spans(
                            fast,
                            task,
                            inputs=[_span(r) for r in inputs],
                            inouts=[_span(r) for r in inouts],
                            writes=[_span(r) for r in writes],
                            max_fanin=cap,
                        )
                    else:
                        got = gather_fanin(
                            fast, task, inputs=inputs, inouts=inouts, writes=writes, max_fanin=cap
                        )
                except FaninExceeded as exc:
                    got = str(exc)
                assert got == want
                if not isinstance(want, str):
                    for r in (*inouts, *writes):
                        slow.insert(r, task)
                        if flat:
                            fast.insert_span(*_span(r), task)
                        else:
                            fast.insert(r, task)
            elif op[0] == "lookup":
                assert fast.lookup(op[1], inout=op[2]) == slow.lookup(op[1], inout=op[2])
            elif op[0] == "forget":
                _, buffer, lo = op
                assert fast.forget(buffer, lo, lo + 32) == slow.forget(buffer, lo, lo + 32)
            else:
                assert fast.retire_below(op[1]) == slow.retire_below(op[1])
            assert len(fast) == len(slow)
            assert fast.reader_count == slow.reader_count
            probe = Region.contiguous("a", 0, 64, 1)
            assert fast.lookup(probe) == slow.lookup(probe)

    check()


# -- the seed's cases ------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 16, 17, 100])
def test_k_disjoint_tiles_then_a_whole_read_has_fanin_k(k):
    check_fanin_of_k_tiles(k)


@pytest.mark.parametrize(
    ("mutant", "found"), [("newest_only_lookup", 1), ("fanin_truncated_at_16", 16)]
)
def test_teeth_the_seeds_lookups_are_caught(monkeypatch, mutant, found):
    _ring_mutants.apply(mutant, monkeypatch)
    with pytest.raises(AssertionError, match=f"fan-in {found} for 100 tile producers"):
        check_fanin_of_k_tiles(100)


def test_the_seeds_one_dimensional_test_falsely_overlaps_column_tiles():
    """Column tiles of a row-major 64x64 matrix: their 1-D byte ranges all intersect (the
    seed's ``lo < e.hi && e.lo < hi``), their bytes never do."""
    n, w = 64, 8
    cols = [Region("m", c * w, (n, w), (n, 1), 4) for c in range(n // w)]
    tmap = TensorMap()
    for producer, tile in enumerate(cols):
        tmap.insert(tile, producer)
    for i, a in enumerate(cols):
        assert [p.task for p in tmap.lookup(a)] == [i]
        for b in cols[i + 1 :]:
            (alo, ahi), (blo, bhi) = a.byte_range, b.byte_range
            assert alo < bhi and blo < ahi  # the seed's test says "overlap"
            assert not a.intersects(b) and not (a.byte_set() & b.byte_set())
    # a row band covers the first tile's top rows partially and no other tile entirely
    band = Region("m", 0, (4, n), (n, 1), 4)
    assert {p.overlap for p in tmap.lookup(band)} == {Overlap.PARTIAL}
    whole = Region.contiguous("m", 0, n * n)
    assert [p.overlap for p in tmap.lookup(whole)] == [Overlap.COVERED] * len(cols)


def test_views_with_different_element_sizes_compare_bytes():
    floats = Region.contiguous("buf", 4, 4, elem_size=4)  # bytes 16..31
    assert Region.contiguous("buf", 31, 1, elem_size=1).intersects(floats)
    assert not Region.contiguous("buf", 32, 8, elem_size=1).intersects(floats)
    halves = Region("buf", 8, (8,), (1,), 2)  # bytes 16..31, as 8 halves
    assert halves.covers(floats) and floats.covers(halves)
    assert classify(floats, halves) is Overlap.COVERED
    assert not Region.contiguous("other", 4, 4).intersects(floats)


def test_lookup_returns_every_producer_newest_first_deduplicated():
    tmap = TensorMap()
    tmap.insert(Region.contiguous("x", 0, 4), 3)
    tmap.insert(Region.contiguous("x", 8, 4), 3)  # a second entry of producer 3
    tmap.insert(Region.contiguous("x", 2, 4), 7)
    tmap.insert(Region.contiguous("x", 100, 4), 9)  # far away
    tmap.insert(Region.contiguous("y", 0, 64), 11)  # another buffer
    assert tmap.lookup(Region.contiguous("x", 0, 12)) == [
        Producer(7, Overlap.COVERED),
        Producer(3, Overlap.COVERED),
    ]
    # producer 3: one entry covered, one partly outside: PARTIAL
    assert tmap.lookup(Region.contiguous("x", 0, 10)) == [
        Producer(7, Overlap.COVERED),
        Producer(3, Overlap.PARTIAL),
    ]
    assert tmap.lookup(Region.contiguous("z", 0, 1000)) == []


def test_an_inout_writer_removes_the_entries_it_covers():
    tmap = TensorMap()
    tmap.insert(Region.contiguous("x", 0, 8), 1)
    tmap.insert(Region.contiguous("x", 4, 8), 2)  # partly outside [0, 8)
    found = tmap.lookup(Region.contiguous("x", 0, 8), inout=True)
    assert found == [Producer(2, Overlap.PARTIAL), Producer(1, Overlap.COVERED)]
    assert len(tmap) == 1  # the covered entry is gone, the partial one stays
    tmap.insert(Region.contiguous("x", 0, 8), 3)  # the INOUT writer's own entry
    assert [p.task for p in tmap.lookup(Region.contiguous("x", 0, 1))] == [3]
    assert [p.task for p in tmap.lookup(Region.contiguous("x", 0, 12))] == [3, 2]


def test_retire_below_drops_old_producers_only():
    tmap, whole = k_tiles(10)
    assert tmap.retire_below(4) == 4
    assert [p.task for p in tmap.lookup(whole)] == [9, 8, 7, 6, 5, 4]
    assert tmap.retire_below(4) == 0
    assert tmap.retire_below(100) == 6 and len(tmap) == 0


def test_lookup_never_looks_at_other_buffers(monkeypatch):
    tmap = TensorMap()
    for i in range(1000):
        tmap.insert(Region.contiguous(("other", i % 10), i, 4), i)
    tmap.insert(Region.contiguous("mine", 0, 4), 5000)
    looked = []
    real = _map.classify
    monkeypatch.setattr(_map, "classify", lambda e, q: looked.append(e) or real(e, q))
    assert [p.task for p in tmap.lookup(Region.contiguous("mine", 0, 64))] == [5000]
    assert len(looked) == 1


def test_lookup_examines_only_nearby_entries(monkeypatch):
    tmap, _ = k_tiles(10_000)
    looked = []
    real = _map.classify
    monkeypatch.setattr(_map, "classify", lambda e, q: looked.append(e) or real(e, q))
    assert [p.task for p in tmap.lookup(Region.contiguous("x", 8 * 5000 + 3, 2))] == [5000]
    assert len(looked) <= 2


@pytest.mark.parametrize(
    ("layout", "n"),
    [
        ("column tiles of a 4-row matrix", 10_000),
        ("16x16 tiles of a square matrix", 4_096),
        ("column tiles of a 200-row matrix", 500),
    ],
)
def test_a_strided_lookup_examines_only_the_entries_it_touches(monkeypatch, layout, n):
    """Before: entries were indexed by their bounding byte range, which for a column tile
    spans the matrix from its first row to its last, so every column tile was a candidate of
    every column lookup (1.6 s per lookup at 100,000 entries). Entries are indexed by the
    rows they touch: a lookup tests the tile it meets and, at most, a few of its neighbours'
    pieces."""
    if layout.startswith("column"):
        rows = int(layout.split("-")[0].split()[-1])
        tiles = [Region("m", c * 2, (rows, 2), (2 * n, 1), 4) for c in range(n)]
    else:
        side = int(n**0.5)  # side x side tiles of 16 x 16
        cols = 16 * side
        tiles = [
            Region("m", (r * cols + c) * 16, (16, 16), (cols, 1), 4)
            for r in range(side)
            for c in range(side)
        ]
    tmap = TensorMap()
    for i, tile in enumerate(tiles):
        tmap.insert(tile, producer=i)
    looked = []
    real = _map.classify
    monkeypatch.setattr(_map, "classify", lambda e, q: looked.append(e) or real(e, q))
    probe = n // 2 + 1
    assert tmap.lookup(tiles[probe]) == [Producer(probe, Overlap.COVERED)]
    assert len(looked) <= 3, len(looked)
    looked.clear()
    assert gather_fanin(tmap, n, writes=[tiles[probe]]) == (probe,)
    assert len(looked) <= 3, len(looked)


def test_a_region_of_many_runs_is_indexed_by_at_most_max_pieces_blocks():
    """A column of 1,000 rows is indexed by 250 blocks of 4 rows, not 1,000 runs; a lookup
    still finds exactly what it meets."""
    column = Region("m", 5, (1000,), (64,), 4)
    pieces = _map._pieces(column._bytes)
    assert _map.MAX_PIECES == 256 and len(pieces) == 250
    assert pieces[0] == (20, 20 + 3 * 256 + 4)
    tmap = TensorMap()
    tmap.insert(column, producer=1)
    tmap.insert(Region("m", 6, (1000,), (64,), 4), producer=2)
    assert tmap.lookup(Region("m", 64 * 500, (64,), (1,), 4)) == [
        Producer(2, Overlap.PARTIAL),
        Producer(1, Overlap.PARTIAL),
    ]
    assert tmap.lookup(Region("m", 64 * 500 + 7, (57,), (1,), 4)) == []


# -- fan-in ------------------------------------------------------------------------------------


def test_gather_fanin_dedups_across_arguments_and_prunes_inouts():
    tmap, whole = k_tiles(4)
    deps = gather_fanin(tmap, 9, inputs=[whole, Region.contiguous("x", 0, 8)])
    assert deps == (3, 2, 1, 0) and len(tmap) == 4
    deps = gather_fanin(tmap, 9, inouts=[Region.contiguous("x", 0, 16)])
    assert deps == (1, 0) and len(tmap) == 2  # tiles 0 and 1 superseded


def test_a_fanin_cap_that_is_exceeded_is_an_error_naming_the_task():
    tmap, whole = k_tiles(17)
    assert len(gather_fanin(tmap, 99, inputs=[whole], max_fanin=17)) == 17
    with pytest.raises(FaninExceeded, match=r"task 99 depends on 17 producers.*max_fanin=16"):
        gather_fanin(tmap, 99, inouts=[whole], max_fanin=16)
    assert len(tmap) == 17  # nothing half-done: the inout pruning did not happen


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"start_offset": -1}, ValueError, "start_offset must be >= 0"),
        ({"start_offset": 1.5}, TypeError, "start_offset must be an integer"),
        ({"shape": ()}, ValueError, r"^shape must have at least one dimension, got \(\)$"),
        ({"shape": (2, 0)}, ValueError, r"shape\[1\] must be >= 1"),
        ({"shape": 4}, TypeError, r"^shape must be a sequence of integers, got int$"),
        ({"strides": "ab"}, TypeError, r"^strides must be a sequence of integers, got str$"),
        ({"strides": (1, 0)}, ValueError, r"strides\[1\] must be >= 1"),
        ({"strides": (1,)}, ValueError, "differ in length"),
        ({"strides": (True, 1)}, TypeError, r"strides\[0\] must be an integer"),
        ({"elem_size": 0}, ValueError, "elem_size must be >= 1"),
        ({"buffer": ["x"]}, TypeError, r"^buffer must be hashable, got list$"),
    ],
)
def test_region_rejects_bad_input(kwargs, error, match):
    args = {"buffer": "x", "start_offset": 0, "shape": (2, 3), "strides": (3, 1), "elem_size": 4}
    with pytest.raises(error, match=match):
        Region(**{**args, **kwargs})


def test_region_fields_are_plain_ints():
    """NumPy integers are accepted and stored as ``int`` (so regions hash and print plainly)."""
    region = Region("x", np.int64(2), (np.int64(3),), (np.int64(1),), np.int64(2))
    fields = (region.start_offset, *region.shape, *region.strides, region.elem_size)
    assert fields == (2, 3, 1, 2) and {type(f) for f in fields} == {int}
    assert region == Region.contiguous("x", 2, 3, elem_size=2) and region.byte_range == (4, 10)


def test_region_defaults_to_row_major_strides():
    region = Region("x", 5, [2, 3, 4])
    assert region.strides == (12, 4, 1) and region.shape == (2, 3, 4)
    assert region.byte_range == (20, 20 + 24 * 4) and region.nelems == 24


def test_tensormap_rejects_bad_input():
    tmap = TensorMap()
    with pytest.raises(TypeError, match=r"^region must be a Region, got tuple$"):
        tmap.insert((0, 4), 1)
    with pytest.raises(ValueError, match="producer must be >= 0"):
        tmap.insert(Region.contiguous("x", 0, 4), -1)
    with pytest.raises(TypeError, match=r"^region must be a Region, got str$"):
        tmap.lookup("x")
    with pytest.raises(ValueError, match="task_id must be >= 0"):
        tmap.retire_below(-1)
    with pytest.raises(ValueError, match="max_fanin must be >= 1"):
        gather_fanin(tmap, 0, max_fanin=0)


# -- lookups that stay flat, and the awkward cases -----------------------------------------------


def _recording(seen: list):
    def getattribute(self, name):
        if not seen or seen[-1] is not self:
            seen.append(self)
        return object.__getattribute__(self, name)

    return getattribute


def test_a_whole_buffer_entry_does_not_widen_the_lookups_of_tiles(monkeypatch):
    """Before: ``max_len`` only grew, so one whole-buffer entry made every later lookup walk
    every entry that starts before it (about 5,000 here), even after the entry was superseded.
    Every entry of the map counts the reads of its fields: a lookup reads only the entries that
    meet it."""
    touched = []

    class CountingEntry(_map._Entry):
        def __getattribute__(self, name):
            touched.append(name)
            return super().__getattribute__(name)

    monkeypatch.setattr(_map, "_Entry", CountingEntry)
    tmap, whole = k_tiles(10_000)
    tmap.insert(whole, producer=10_000)
    tile = Region.contiguous("x", 8 * 5000 + 3, 2)
    touched.clear()
    assert [p.task for p in tmap.lookup(tile)] == [10_000, 5000]
    assert len(touched) <= 20, len(touched)
    # by entry: the whole-buffer entry, the tile, and the tile before it (whose 32 bytes could
    # reach the lookup by its length class): nothing else
    seen = []
    monkeypatch.setattr(CountingEntry, "__getattribute__", _recording(seen))
    tmap.lookup(tile)
    monkeypatch.undo()  # before reading ``seen``: reading the entries would record them again
    examined = {e.producer for e in seen}
    assert {10_000, 5000} <= examined <= {10_000, 5000, 4999}, sorted(examined)
    monkeypatch.setattr(_map, "_Entry", CountingEntry)
    tmap.lookup(whole, inout=True)  # a whole-buffer writer supersedes every entry
    tmap.insert(Region.contiguous("x", 8 * 5000, 8), producer=10_001)
    touched.clear()
    assert [p.task for p in tmap.lookup(tile)] == [10_001]
    assert len(touched) <= 10, len(touched)


def test_one_byte_elements_find_an_entry_ending_one_byte_into_the_lookup(monkeypatch):
    tmap = TensorMap()
    tmap.insert(Region("b", 0, (5,), (1,), 1), producer=1)  # bytes 0..4
    tmap.insert(Region("b", 6, (2,), (1,), 1), producer=2)  # bytes 6..7
    probe = Region("b", 4, (2,), (1,), 1)  # bytes 4..5: one byte of producer 1's entry
    assert tmap.lookup(probe) == [Producer(1, Overlap.PARTIAL)]
    assert tmap.lookup(Region("b", 5, (1,), (1,), 1)) == []
    _ring_mutants.apply("candidates_skip_one_byte_overlaps", monkeypatch)
    assert tmap.lookup(probe) == []  # the mutant misses it: this test is what catches it


@pytest.mark.parametrize("k", [100, 101, 250])
def test_fanin_is_never_truncated_at_or_beyond_100_producers(k, monkeypatch):
    check_fanin_of_k_tiles(k)
    _ring_mutants.apply("fanin_truncated_at_100", monkeypatch)
    if k > 100:
        with pytest.raises(AssertionError):
            check_fanin_of_k_tiles(k)


def test_covered_is_judged_on_the_entries_that_meet_the_lookup():
    """The documented meaning of COVERED: every entry of the producer that meets the lookup
    region lies inside it; its entries elsewhere in the buffer are not looked at."""
    tmap = TensorMap()
    tmap.insert(Region.contiguous("x", 0, 4), producer=3)
    tmap.insert(Region.contiguous("x", 100, 4), producer=3)
    assert tmap.lookup(Region.contiguous("x", 0, 12)) == [Producer(3, Overlap.COVERED)]
    assert tmap.lookup(Region.contiguous("x", 2, 100)) == [Producer(3, Overlap.PARTIAL)]


@pytest.mark.parametrize(
    ("inner", "outer", "expected"),
    [
        # a 256x128 tile with column stride 2 inside a 256x256 dense tile of a 512-column matrix
        (((0,), (256, 128), (512, 2)), ((0,), (256, 256), (512, 1)), Overlap.COVERED),
        # the same strided tile shifted one row down: its last row is outside
        (((512,), (256, 128), (512, 2)), ((0,), (256, 256), (512, 1)), Overlap.PARTIAL),
        # shifted right by 2 columns: its last column (256) is outside
        (((2,), (256, 128), (512, 2)), ((0,), (256, 256), (512, 1)), Overlap.PARTIAL),
        # inside a tile of every other row: its odd rows are in the gaps
        (((0,), (4, 8), (512, 2)), ((0,), (2, 64), (1024, 1)), Overlap.PARTIAL),
        (((0,), (2, 8), (1024, 2)), ((0,), (2, 64), (1024, 1)), Overlap.COVERED),
    ],
)
def test_strided_tiles_inside_dense_tiles_are_classified_exactly(inner, outer, expected):
    """A strided tile's smallest dimensions are taken as one run before the shortcut (before:
    a check per run, 238 ms for the first case); the verdicts agree with brute force."""
    (ioff,), ishape, istrides = inner
    (ooff,), oshape, ostrides = outer
    a = Region("m", ioff, ishape, istrides, 4)
    b = Region("m", ooff, oshape, ostrides, 4)
    assert classify(a, b) is expected
    truth = Overlap.COVERED if a.byte_set() <= b.byte_set() else Overlap.PARTIAL
    assert truth is expected


def test_contiguous_regions_default_to_float32():
    assert Region.contiguous("x", 2, 3).byte_range == (8, 20)
    assert Region.contiguous("x", 2, 3).strides == (1,)


@pytest.mark.parametrize("before", [1, 2, 3])
def test_entries_with_the_same_first_byte_are_removed_one_by_one(before):
    """Entries of one length class starting at the same byte: superseding the newest removes
    exactly it, however many precede it."""
    tmap = TensorMap()
    for p in range(before):
        tmap.insert(Region.contiguous("x", 0, 6), producer=p)  # 24 bytes, not covered below
    tmap.insert(Region.contiguous("x", 0, 5), producer=before)  # 20 bytes: same class
    assert gather_fanin(tmap, 9, inouts=[Region.contiguous("x", 0, 5)]) == tuple(
        range(before, -1, -1)
    )
    assert len(tmap) == before  # the older entries keep their last 4 bytes, the newest none
    assert tmap.lookup(Region.contiguous("x", 0, 5)) == []
    assert [p.task for p in tmap.lookup(Region.contiguous("x", 5, 1))] == list(
        range(before - 1, -1, -1)
    )


def test_every_inout_region_supersedes_the_entries_it_covers():
    tmap, _ = k_tiles(4)
    deps = gather_fanin(
        tmap, 9, inouts=[Region.contiguous("x", 0, 8), Region.contiguous("x", 16, 8)]
    )
    assert deps == (2, 0) and len(tmap) == 2
    assert [p.task for p in tmap.lookup(Region.contiguous("x", 0, 32))] == [3, 1]
    tmap.retire_below(4)
    assert len(tmap) == 0 and tmap.lookup(Region.contiguous("x", 0, 32)) == []


@pytest.mark.parametrize("partial_first", [True, False])
def test_a_producer_partly_overlapped_by_one_entry_is_partial(partial_first):
    """A producer's overlap is PARTIAL when any of its entries is partly covered, whatever
    the order its entries are found in (one entry COVERED, the other PARTIAL)."""
    tmap = TensorMap()
    big, small = Region.contiguous("x", 0, 8), Region.contiguous("x", 8, 1)
    for region in (big, small) if partial_first else (small, big):
        tmap.insert(region, producer=7)
    assert tmap.lookup(Region.contiguous("x", 4, 5)) == [Producer(7, Overlap.PARTIAL)]
    assert tmap.lookup(Region.contiguous("x", 0, 9)) == [Producer(7, Overlap.COVERED)]


def test_retire_counts_the_entries_of_every_length_class():
    tmap, _ = k_tiles(4)  # four 8-element tiles (producers 0..3), one length class
    tmap.insert(Region.contiguous("x", 0, 16), producer=4)  # a longer class
    tmap.insert(Region.contiguous("x", 0, 1, elem_size=1), producer=5)  # a 1-byte class
    assert tmap.retire_below(5) == 5 and len(tmap) == 1
    assert tmap.lookup(Region.contiguous("x", 0, 16)) == [Producer(5, Overlap.COVERED)]


def test_runs_covered_by_overlapping_and_abutting_runs_agree_with_brute_force():
    """Every contiguous byte range (1-byte elements) against outer layouts of two interleaved
    dimensions, whose runs overlap, abut or leave 1-byte gaps: the edge cases of covering a run
    by the runs that start up to ``run - 1`` bytes before it and up to its last byte."""
    checked = 0
    for run in range(1, 5):
        for s1 in range(run + 1, run + 5):
            for s2 in range(s1 + 1, s1 + 6):
                outer = Region("m", 0, (2, 2, run), (s2, s1, 1), 1)
                outer_bytes = outer.byte_set()
                hi = max(outer_bytes) + 2
                for x in range(hi):
                    for length in range(1, hi - x + 1):
                        inner = Region("m", x, (length,), (1,), 1)
                        truth = set(range(x, x + length)) <= outer_bytes
                        assert outer.covers(inner) == truth, (run, s1, s2, x, length)
                        checked += truth
    assert checked > 1000  # the layouts do cover many ranges, not only refuse them


@pytest.mark.parametrize(("lo", "hi", "expected"), [(5, 5, [5]), (6, 6, []), (4, 10, [5, 10])])
def test_values_in_includes_both_ends_of_the_interval(lo, hi, expected):
    """``values_in`` enumerates ``c + k * s`` in the closed interval ``[lo, hi]``: an interval
    of one value finds it (the strided geometry's primitive; 1-byte runs reach it)."""
    assert sorted(_strided.values_in(0, [(3, 5)], lo, hi)) == expected


def test_strided_blocks_covered_by_interleaved_layouts_agree_with_brute_force(stress_scale):
    """Inner layouts of one or two dimensions (1-byte elements) against outer layouts whose runs
    overlap, abut or leave gaps: a block is covered only if every one of its runs is, whatever
    its first and last bytes say (the block-by-block split of ``covers``, at every level)."""

    @_settings(stress_scale, 300)
    @given(st.data())
    def check(data):
        small = st.integers(1, 4)
        run = data.draw(small)
        s1 = data.draw(st.integers(run + 1, run + 4))
        outer = Region("m", 0, (2, 2, run), (data.draw(st.integers(s1 + 1, s1 + 5)), s1, 1), 1)
        ndim = data.draw(st.integers(1, 2))
        inner_run = data.draw(st.integers(1, 3))
        strides = sorted(
            data.draw(
                st.lists(st.integers(inner_run + 1, 9), min_size=ndim, max_size=ndim, unique=True)
            ),
            reverse=True,
        )
        shape = tuple(data.draw(st.integers(2, 3)) for _ in strides)
        inner = Region("m", data.draw(st.integers(0, 16)), (*shape, inner_run), (*strides, 1), 1)
        truth = inner.byte_set() <= outer.byte_set()
        assert outer.covers(inner) == truth, (outer, inner)

    check()


# -- the strided geometry's canonical form and its documented cost ---------------------------


@pytest.mark.parametrize(
    ("base", "run", "dims", "canonical"),
    [
        # a count-1 dimension is no dimension
        (0, 4, [(1, 100), (3, 8)], _strided.ByteSet(0, 4, ((3, 8),))),
        # adjacent runs (stride == run) and overlapping ones (stride < run) are one run
        (0, 4, [(3, 4)], _strided.ByteSet(0, 12, ())),
        (8, 4, [(3, 2)], _strided.ByteSet(8, 8, ())),
        # a dimension continuing the one below's progression (6 == 3 * 2) merges with it
        (0, 1, [(2, 6), (3, 2)], _strided.ByteSet(0, 1, ((6, 2),))),
        (0, 1, [(2, 7), (3, 2)], _strided.ByteSet(0, 1, ((3, 2), (2, 7)))),
    ],
)
def test_byte_sets_take_their_canonical_form(base, run, dims, canonical):
    """``ByteSet.of`` drops count-1 dimensions, merges dimensions whose stride is at most the
    run into the run, and merges a dimension that continues the progression of the one below
    (the canonical form the shortcut and ``==`` rely on)."""
    got = _strided.ByteSet.of(base, run, dims)
    assert (got.base, got.run, got.dims) == (canonical.base, canonical.run, canonical.dims)
    assert got.hi == canonical.hi


def search_nodes(fn) -> tuple[object, int]:
    """``fn()`` and the nodes its strided searches visited (calls of ``_search``'s ``visit``,
    the branch-and-bound's unit of work), counted with a profile hook."""
    nodes = 0

    def profile(frame, event, arg):
        nonlocal nodes
        code = frame.f_code
        if event == "call" and code.co_name == "visit" and code.co_filename.endswith("_strided.py"):
            nodes += 1

    sys.setprofile(profile)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
    return result, nodes


def _m(offset, shape, strides, elem_size=4) -> Region:
    return Region("m", offset, shape, strides, elem_size)


@pytest.mark.parametrize(
    ("question", "expected", "max_nodes"),
    [
        # column blocks of one row-major matrix: byte ranges overlap, no byte is shared
        (lambda: _m(0, (64, 64), (1024, 1)).intersects(_m(64, (64, 64), (1024, 1))), False, 2),
        # even and odd columns (gcd 8 bytes, and gcd 2 with 1-byte elements): the gcd prunes
        (lambda: _m(0, (64, 64), (256, 2)).intersects(_m(1, (64, 64), (256, 2))), False, 1),
        (lambda: _m(0, (64, 64), (256, 2), 1).intersects(_m(1, (64, 64), (256, 2), 1)), False, 1),
        (
            lambda: _m(0, (16, 16, 16), (4096, 64, 2)).intersects(
                _m(1, (16, 16, 16), (4096, 64, 2))
            ),
            False,
            1,
        ),
        # one term per dimension, largest stride first: two values of each k at most
        (lambda: _strided.hits(5, [(1000, 1), (1000, 1000)], 10**6, 10**6 + 2), True, 3),
        (lambda: _strided.hits(0, [(999, 1), (1000, 1000)], 999, 999), False, 1),
        # terms that contribute nothing (count 1, stride 0) cost nothing
        (lambda: _strided.hits(0, [(1, 5), (4, 0), (3, 7)], 14, 14), True, 2),
        # every value below the interval (negative strides): refused at the root
        (lambda: _strided.hits(-1, [(3, -5), (3, -3)], 0, 0), False, 1),
        # a range whose first byte lies one byte before a run of the outer layout (in a gap)
        # is refused at once, though its last byte is covered
        (lambda: _m(0, (64, 32), (64, 1), 1).covers(_m(63, (10,), (1,), 1)), False, 1),
    ],
    ids=[
        "column-blocks",
        "even-odd",
        "even-odd-bytes",
        "3d",
        "hit",
        "miss",
        "no-op-terms",
        "below",
        "gap-first-byte",
    ],
)
def test_nested_layouts_cost_o_dims(question, expected, max_nodes):
    """The documented cost of the strided geometry: for nested layouts at most two values of
    each ``k`` survive, so a test visits O(dims) search nodes (a search without its bounds, its
    gcd pruning or its largest-stride-first order visits hundreds to thousands here)."""
    result, nodes = search_nodes(question)
    assert result is expected
    assert nodes <= max_nodes, nodes


@pytest.mark.parametrize(
    "question",
    [
        # a tile inside a tile of one matrix, at an offset, inside an outer tile at an offset
        lambda: _m(1032, (512, 512), (1024, 1)).covers(_m(4 * 1024 + 13, (100, 200), (1024, 1))),
        # at the outer tile's first byte, as wide as it
        lambda: _m(1032, (512, 512), (1024, 1)).covers(_m(1032, (100, 512), (1024, 1))),
        # a strided tile (every other column) inside a dense tile: its rows taken as runs
        lambda: _m(0, (256, 256), (512, 1)).covers(_m(0, (256, 128), (512, 2))),
        # a 3-d tile inside a 3-d tile: the inner base has a digit in each outer dimension
        lambda: _m(0, (8, 8, 8), (4096, 64, 1)).covers(
            _m(3 * 4096 + 2 * 64 + 1, (2, 2, 4), (4096, 64, 1))
        ),
    ],
    ids=["offset", "origin", "strided", "3d"],
)
def test_a_tile_inside_a_tile_of_the_same_tensor_is_covered_without_a_search(question):
    """``covers``'s O(dims**2) case: a tile that shares the outer tile's strides (once its
    smallest dimensions are taken as one run) is decided by digits alone, no search."""
    assert search_nodes(question) == (True, 0)


@pytest.mark.parametrize("rows", [32, 128])
def test_a_strided_tile_inside_a_dense_tile_costs_one_check_per_row(rows):
    """Every third column of every other row: no outer stride matches (no shortcut), so
    ``covers`` goes block by block; each row's whole span lies in the dense tile, so a row
    needs one check, never one per run (a span one column too wide splits every row: ~20x
    the nodes)."""
    outer = _m(0, (2 * rows, 2 * rows), (4 * rows, 1))
    inner = _m(0, (rows, 2 * rows // 3), (8 * rows, 3))
    assert inner.byte_set() <= outer.byte_set()
    result, nodes = search_nodes(lambda: outer.covers(inner))
    assert result is True
    assert nodes <= 8 * rows, nodes


@pytest.mark.parametrize("terms", [[], [(1, 5), (4, 0)]], ids=["none", "no-op"])
def test_without_terms_only_the_constant_itself_is_a_value(terms):
    """``hits`` and ``values_in`` with no term that contributes (none, or count 1 or stride
    0 only): the one value is ``c``, inside the interval or not."""
    assert _strided.hits(14, terms, 14, 14) and _strided.values_in(14, terms, 10, 20) == [14]
    assert not _strided.hits(0, terms, 14, 14) and _strided.values_in(0, terms, 14, 20) == []
    assert not _strided.hits(21, terms, 14, 20) and _strided.values_in(21, terms, 14, 20) == []


def test_byte_ranges_that_only_abut_are_refused_without_a_search():
    a = _m(0, (64, 64), (128, 1))
    b = _m(63 * 128 + 64, (64, 64), (128, 1))
    assert a.byte_range[1] == b.byte_range[0]
    assert search_nodes(lambda: a.intersects(b)) == (False, 0)
    assert search_nodes(lambda: b.intersects(a)) == (False, 0)


def test_forget_drops_the_entries_inside_a_byte_range_only():
    """The ring forgets a closed scope's slices: their writers and readers leave the map
    (before: every heap read of a run stayed in the map to the end)."""
    tmap = TensorMap()
    for i in range(4):
        tmap.insert(Region.contiguous("x", 8 * i, 8), producer=i)  # bytes [32i, 32i + 32)
    gather_fanin(tmap, 4, inputs=[Region.contiguous("x", 8, 8), Region.contiguous("x", 0, 32)])
    assert len(tmap) == 4 and tmap.reader_count == 2
    assert tmap.forget("x", 32, 64) == 1  # tile 1 and the read of it; not the whole read
    assert len(tmap) == 3 and tmap.reader_count == 1
    assert [p.task for p in tmap.lookup(Region.contiguous("x", 0, 32))] == [3, 2, 0]
    assert gather_fanin(tmap, 5, writes=[Region.contiguous("x", 8, 8)]) == (4,)  # the reader
    assert tmap.forget("y", 0, 100) == 0 and tmap.forget("x", 0, 1 << 20) == 3
    assert len(tmap) == 0 and tmap.reader_count == 0
