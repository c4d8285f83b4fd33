"""Review of issue 39 item 4: the span path's tiled mode against a byte-level model, across
many operations.

``test_tensormap.py``'s span/Region agreement test probes the span path's map with a Region
lookup after every operation, and a Region lookup leaves tiled mode: there, a bucket stays
tiled for one operation at most. Here only the span path touches the map until the end, as in
the ring (``gather_spans``, ``insert_spans`` / ``insert_span``, ``forget``, ``retire_below``),
so a bucket stays tiled across tasks: spans rewritten whole, read, superseded, forgotten (all
of them at once, some of them, more than the scan limits), then a partial overlap, a cut or a
range of several tiles arriving while it is tiled, and tiled again once emptied. The model
keeps each entry's bytes as a set; every fan-in, refusal, count and forget must be its.
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runtime.tensormap import FaninExceeded, Region, TensorMap, gather_spans

TILE = 4
TILES = 12


class SpanModel:
    """Entries as ``[buffer, lo, hi, live bytes, task]`` (``lo, hi``: the access's bounding
    range, which :meth:`TensorMap.forget` judges by); reads and writes as in
    :func:`gather_spans`'s contract."""

    def __init__(self) -> None:
        self.writes: list[list] = []
        self.reads: list[list] = []

    @staticmethod
    def _bytes(span) -> set[int]:
        return set(range(span[1], span[2]))

    def gather(self, task, inputs, inouts, writes, cap):
        written = (*inouts, *writes)
        found = set()
        for span in (*inputs, *written):
            q = self._bytes(span)
            found |= {e[4] for e in self.writes if e[0] == span[0] and e[3] & q}
        for span in written:
            q = self._bytes(span)
            found |= {e[4] for e in self.reads if e[0] == span[0] and e[3] & q}
        found.discard(task)
        if cap is not None and len(found) > cap:
            return None
        for span in written:
            q = self._bytes(span)
            for entries in (self.writes, self.reads):
                for e in entries:
                    if e[0] == span[0]:
                        e[3] = e[3] - q
                entries[:] = [e for e in entries if e[3]]
        for span in inputs:
            live = self._bytes(span)
            for w in written:
                if w[0] == span[0]:
                    live -= self._bytes(w)
            if live:
                self.reads.append([*span, live, task])
        return tuple(sorted(found, reverse=True))

    def insert(self, span, task) -> None:
        self.writes.append([*span, self._bytes(span), task])

    def forget(self, buffer, lo, hi) -> int:
        def inside(e):
            return e[0] == buffer and lo <= e[1] and e[2] <= hi

        before = len(self.writes)
        self.writes = [e for e in self.writes if not inside(e)]
        self.reads = [e for e in self.reads if not inside(e)]
        return before - len(self.writes)

    def retire_below(self, task) -> int:
        before = len(self.writes)
        self.writes = [e for e in self.writes if e[4] >= task]
        self.reads = [e for e in self.reads if e[4] >= task]
        return before - len(self.writes)


def _tile(k: int, n: int = 1, buffer: str = "a") -> tuple:
    return (buffer, k * TILE, (k + n) * TILE)


@st.composite
def spans(draw):
    """Mostly whole tiles (a tiled bucket's spans), sometimes several tiles or a partial
    span."""
    buffer = draw(st.sampled_from(("a", "a", "b")))
    kind = draw(st.integers(0, 11))
    if kind < 7:
        return _tile(draw(st.integers(0, TILES - 1)), 1, buffer)
    if kind < 9:
        return _tile(draw(st.integers(0, TILES - 1)), draw(st.integers(2, 4)), buffer)
    if kind < 11:  # within one tile
        lo = draw(st.integers(0, TILES - 1)) * TILE + draw(st.integers(0, TILE - 1))
        return (buffer, lo, draw(st.integers(lo + 1, lo - lo % TILE + TILE)))
    lo = draw(st.integers(0, TILES * TILE))
    return (buffer, lo, lo + draw(st.integers(1, 2 * TILE)))


OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("task"),
            st.lists(spans(), max_size=3),
            st.lists(spans(), max_size=1),
            st.lists(spans(), max_size=2),
            st.lists(spans(), max_size=1),  # outputs: written, not looked up (the heap's)
            st.one_of(st.none(), st.none(), st.integers(1, 3)),
            st.booleans(),  # insert_spans, else insert_span one by one
        ),
        st.tuples(
            st.just("forget"),
            st.sampled_from(("a", "b")),
            st.integers(0, TILES),
            st.integers(0, TILES + 2),
            st.integers(-1, 1),
        ),
        st.tuples(st.just("retire"), st.integers(0, 40)),
    ),
    max_size=40,
)


def _task(*, inputs=(), inouts=(), writes=(), outs=(), cap=None, spans=True):
    return ("task", list(inputs), list(inouts), list(writes), list(outs), cap, spans)


_REWRITTEN = [  # one span rewritten whole, read, rewritten: a dictionary look-up each time
    _task(writes=[_tile(0)]),
    _task(inputs=[_tile(0)], outs=[_tile(1)]),
    _task(writes=[_tile(0)]),
    _task(inputs=[_tile(0), _tile(1)], writes=[_tile(2)]),
    _task(inouts=[_tile(1)]),
    _task(inputs=[_tile(0, 3)], cap=2),
    _task(inputs=[_tile(0, 3)]),
]
_SCANNED = [  # more tiles than a scan reads, then a lookup of two; a forget of some, then all
    *[_task(writes=[_tile(k)]) for k in range(10)],
    _task(inputs=[_tile(3, 2)]),
    ("forget", "a", 2, 3, 0),
    _task(inputs=[_tile(0, 6)]),
    ("forget", "a", 0, TILES, 0),
    _task(writes=[_tile(1)]),
    _task(inputs=[_tile(0, 4)]),
]
_PARTIAL = [  # a partial overlap and a cut arrive while the bucket is tiled; emptied; tiled
    _task(writes=[_tile(0)], outs=[_tile(1)]),
    _task(inputs=[_tile(1)]),
    _task(writes=[("a", 2, 6)]),
    _task(inputs=[_tile(0, 2)]),
    _task(writes=[_tile(1)]),
    ("forget", "a", 0, TILES, 0),
    _task(writes=[_tile(3)], spans=False),
    _task(writes=[_tile(3)]),
    _task(inputs=[_tile(3)], writes=[_tile(4)]),
    _task(writes=[_tile(3)]),
]
_READ_CUT = [  # a read cut by a write is no whole span: the next write of the cut bytes
    _task(inputs=[_tile(0)]),  # follows the cutting writer only, not the reader
    _task(writes=[("a", 1, 3)]),
    _task(writes=[("a", 1, 3)]),
    _task(writes=[_tile(0)]),
]
_FORGET_READS = [  # reads not yet indexed, forgotten with or without their writers
    _task(writes=[_tile(0), _tile(1)]),
    _task(inputs=[_tile(0)]),
    _task(inputs=[_tile(1)]),
    ("forget", "a", 0, 1, 0),
    _task(writes=[_tile(0, 2)]),
    _task(inputs=[_tile(1)]),
    ("forget", "a", 1, 2, 1),
    _task(writes=[_tile(1)]),
]


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(OPS)
@example(_REWRITTEN)
@example(_SCANNED)
@example(_PARTIAL)
@example(_READ_CUT)
@example(_FORGET_READS)
def test_the_span_path_kept_tiled_agrees_with_a_byte_model(ops):
    tmap, model = TensorMap(), SpanModel()
    insert_spans = getattr(tmap, "insert_spans", None)
    for task, op in enumerate(ops, start=1):
        if op[0] == "task":
            _, inputs, inouts, writes, outs, cap, together = op
            want = model.gather(task, inputs, inouts, writes, cap)
            try:
                got = gather_spans(
                    tmap, task, inputs=inputs, inouts=inouts, writes=writes, max_fanin=cap
                )
            except FaninExceeded:
                got = None
            assert got == want, (task, op)
            if got is not None:
                new = [*inouts, *writes, *outs]
                for span in new:
                    model.insert(span, task)
                if together and insert_spans is not None:
                    insert_spans(new, task)
                else:
                    for span in new:
                        tmap.insert_span(*span, task)
        elif op[0] == "forget":
            _, buffer, k, stop, nudge = op
            lo, hi = max(0, k * TILE + nudge), max(k + 1, stop) * TILE
            assert tmap.forget(buffer, lo, hi) == model.forget(buffer, lo, hi), op
        else:
            assert tmap.retire_below(op[1]) == model.retire_below(op[1]), op
        assert len(tmap) == len(model.writes)
        assert tmap.reader_count == len(model.reads)
    # at the end, what the span path and the Region path see of every byte
    last = len(ops) + 1
    for buffer in ("a", "b"):
        for b in range(TILES * TILE + 2 * TILE):
            q = {b}
            writers = {e[4] for e in model.writes if e[0] == buffer and e[3] & q}
            region = Region.contiguous(buffer, b, 1, 1)
            assert {p.task for p in tmap.lookup(region)} == writers, (buffer, b)
    for buffer in ("a", "b"):
        for k in range(TILES):
            span = _tile(k, 1, buffer)
            want = model.gather(last, [], [span], [], None)
            assert gather_spans(tmap, last, inouts=[span]) == want, span
