"""The trace checker: was every task's input complete when it ran, and was no live heap byte
reused, in one simulated run?

It trusts nothing the runtime computed: producers are found again by brute force, per float32
element (the last task to write each element before the reader, in program order, plus the task
whose heap slice holds it), and so are the readers a writer must follow (the tasks that read an
element it overwrites since that element's last write); heap reuse is checked on physical ring
addresses against the order of events in the trace (events are in causal order: an event's
index orders it).

It streams: the plan is walked once in program order while the trace is read once in time
order, each task's events gathered only until the walk takes the task (a task's events end at
its first ``end``), and the per-element state is kept in pages dropped after the last task that
touches them. Its memory follows what is live at each point of the run, not the run's length.
A trace with events after a task's first end (a forged one: an honest run has none) is checked
again with every task's events gathered first (:class:`_Indexed`), with the same verdict.
"""

from __future__ import annotations

import heapq
from collections import Counter

import numpy as np

from ._program import HEAP, Plan, Tensor, gc_paused
from ._sim import RunResult

__all__ = ["check_trace", "ground_truth_overwrites", "ground_truth_producers"]

_MAX_REPORTED = 20
PAGE_BITS = 12
"""The checker keeps its per-element state in pages of ``2**PAGE_BITS`` elements, each made on
first touch and dropped after the last task that touches it (program order): its memory follows
the program's live data, not its length (the virtual heap grows with every task). Read when a
check starts."""
_WRITER, _WEND, _LATEST, _READER, _OWNER, _OEND, _UNOWNER = range(7)
"""Rows of a page: each element's last writer and that writer's end (its first end event's
index), the latest end among the tasks that read it since its last write and that reader, and
its heap owner and the owner's end (a write sets the first four rows at once, a read the
middle two, an allocation the last three: the owner, its end, and minus the owner, so that
one maximum per row tells whether a block has one owner)."""
_ROWS = 7

# a task's events: first claim (index, core), first alloc, first start (index, core), first
# end, how many starts and ends, its last start or end
_CLAIM, _CLAIM_CORE, _ALLOC, _START, _START_CORE, _END, _NSTART, _NEND, _LAST = range(9)
_NONE = (-1, -1, -1, -1, -1, -1, 0, 0, -1)
_KINDS = {"claim": _CLAIM, "alloc": _ALLOC, "start": _START, "end": _END}


_greatest = np.maximum.reduce
"""``ndarray.max`` without its Python wrapper (a block's rows are never empty)."""


def _elements(region) -> np.ndarray:
    index = np.array([region.start_offset], dtype=np.int64)
    for n, s in zip(region.shape, region.strides, strict=True):
        index = (index[:, None] + np.arange(n, dtype=np.int64)[None, :] * s).ravel()
    return index


def _values(values: np.ndarray) -> set[int]:
    """The distinct values of a small array (most often one)."""
    if len(values) and (values == values[0]).all():
        return {int(values[0])}
    return {int(v) for v in np.unique(values)}


class _Pages:
    """Per-element state of every buffer, paged (see :data:`PAGE_BITS`).

    A tensor is located once (:meth:`locate`) as ``(page, selection)`` pairs, a selection
    being a slice of the page when its elements are contiguous there (most are), else an index
    array; :meth:`get` and :meth:`put` then read and write its elements' state. A page is
    dropped after the last task that touches it: one integer per page of every buffer says
    which task that is."""

    def __init__(self, plan: Plan, rows: int) -> None:
        self.bits = bits = PAGE_BITS
        self.size = 1 << bits
        self.rows = rows
        cols = plan.columns
        ends = [len(range(0, n, self.size)) for n in plan.externals.values()]
        heap = (max(cols.end, default=0) // 4 >> bits) + 1
        self.last: dict = {b: [-1] * n for b, n in zip(plan.externals, ends, strict=True)}
        self.last[HEAP] = [-1] * heap
        for t, (reads, writes) in enumerate(zip(cols.reads, cols.writes, strict=True)):
            for tensor in (*reads, *writes):  # writes hold the outputs
                last = self.last.get(tensor.buffer)
                if last is None:  # a buffer the plan does not declare (a hand-made plan)
                    last = self.last[tensor.buffer] = []
                first, stop = tensor.lo // 4 >> bits, ((tensor.hi - 1) // 4 >> bits) + 1
                if stop > len(last):
                    last.extend([-1] * (stop - len(last)))
                if stop - first == 1:
                    last[first] = t
                else:
                    last[first:stop] = [t] * (stop - first)
        self.pages: dict[tuple, np.ndarray] = {}

    def locate(self, tensor: Tensor) -> list[tuple[int, slice | np.ndarray]]:
        """``tensor``'s elements as ``(page, selection)`` pairs."""
        bits, mask = self.bits, self.size - 1
        if tensor.flat and (tensor._region is None or tensor._region.elem_size == 4):
            a, b = tensor.lo // 4, tensor.hi // 4  # contiguous float32 elements [a, b)
            page = a >> bits
            if (b - 1) >> bits == page:
                return [(page, slice(a & mask, b - (page << bits)))]
            out = []
            while a < b:
                page = a >> bits
                stop = min(b, (page + 1) << bits)
                out.append((page, slice(a & mask, stop - (page << bits))))
                a = stop
            return out
        idx = _elements(tensor.region)
        pages = idx >> bits
        return [(int(p), idx[pages == p] & mask) for p in np.unique(pages)]

    def _page(self, buffer, page: int) -> np.ndarray:
        rows = self.pages.get((buffer, page))
        if rows is None:
            rows = self.pages[buffer, page] = np.full((self.rows, self.size), -1, dtype=np.int64)
            rows[_UNOWNER] = 1  # minus the owner -1 (none yet)
        return rows

    def get(self, buffer, where, row: int) -> np.ndarray:
        if len(where) == 1:
            page, sel = where[0]
            return self._page(buffer, page)[row, sel]
        return np.concatenate([self._page(buffer, page)[row, sel] for page, sel in where])

    def located(self, tensor: Tensor) -> tuple[list, np.ndarray | None]:
        """``(where, block)``: :meth:`locate` and :meth:`block` of ``tensor`` at once."""
        where = self.locate(tensor)
        if len(where) == 1:
            page, sel = where[0]
            if type(sel) is slice:
                return where, self._page(tensor.buffer, page)[:, sel]
        return where, None

    def block(self, buffer, where) -> np.ndarray | None:
        """Every row of the elements at ``where`` as one view, when they are one slice of one
        page (most tensors); else ``None``."""
        if len(where) == 1:
            page, sel = where[0]
            if type(sel) is slice:
                return self._page(buffer, page)[:, sel]
        return None

    def put(self, buffer, where, row: int, value: int) -> None:
        for page, sel in where:
            self._page(buffer, page)[row, sel] = value

    def put_where(self, buffer, where, row: int, mask: np.ndarray, value: int) -> None:
        """Set ``value`` where ``mask`` (over the tensor's elements, in :meth:`get`'s order)."""
        at = 0
        for page, sel in where:
            rows = self._page(buffer, page)
            n = len(range(self.size)[sel]) if isinstance(sel, slice) else len(sel)
            part = mask[at : at + n]
            at += n
            if isinstance(sel, slice):
                rows[row, sel][part] = value
            else:
                rows[row, sel[part]] = value

    def done(self, task: int, tensors) -> None:
        """Task ``task`` (which touched ``tensors``) is walked: drop the pages it was the last
        to touch (those in its tensors' bounding ranges, as :attr:`last` counts them)."""
        bits = self.bits
        for tensor in tensors:
            last = self.last[tensor.buffer]
            for page in range(tensor.lo // 4 >> bits, ((tensor.hi - 1) // 4 >> bits) + 1):
                if last[page] == task:
                    self.pages.pop((tensor.buffer, page), None)


def _walk(plan: Plan):
    """Each task's ground truth, in program order, by brute force per element: yields
    ``(task, producers, touches, overwrites)``: for every element it reads, the last earlier
    task that wrote it, plus the owners of the heap slices it touches (``touches``); for every
    element it writes, the last earlier task that wrote it."""
    pages = _Pages(plan, _ROWS)
    locate, get = pages.locate, pages.get
    cols = plan.columns
    for t in range(len(cols.kind)):
        for tensor in cols.outputs[t]:
            pages.put(HEAP, locate(tensor), _OWNER, t)
        reads = [(x.buffer, locate(x)) for x in cols.reads[t]]
        written = [(x.buffer, locate(x)) for x in cols.writes[t]]
        owners: set[int] = set()
        found: set[int] = set()
        older: set[int] = set()
        for buffer, where in reads:
            found |= _values(get(buffer, where, _WRITER))
            if buffer == HEAP:
                owners |= _values(get(HEAP, where, _OWNER))
        for buffer, where in written:
            older |= _values(get(buffer, where, _WRITER))
            if buffer == HEAP:
                owners |= _values(get(HEAP, where, _OWNER))
        owners -= {-1, t}
        found.discard(-1)
        older -= {-1, t}
        for buffer, where in written:
            pages.put(buffer, where, _WRITER, t)
        yield t, found | owners, owners, older
        pages.done(t, cols.writes[t])
        pages.done(t, cols.reads[t])


def ground_truth_producers(plan: Plan) -> tuple[list[set[int]], list[set[int]]]:
    """Per task: the tasks it must wait for, and the heap slices it touches, by brute force.

    Returns:
        ``(producers, touches)``: ``producers[N]`` holds, for every element task N reads, the
        last earlier task that wrote it, plus the owners of the heap slices it touches;
        ``touches[N]`` holds those owners.
    """
    walked = list(_walk(plan))
    return [w[1] for w in walked], [w[2] for w in walked]


def ground_truth_overwrites(plan: Plan) -> list[set[int]]:
    """Per task: the earlier tasks whose writes it overwrites, by brute force.

    Returns:
        ``overwrites[N]``: for every element task N writes, the last earlier task that wrote
        it. Each of them must end before task N starts (write-after-write order).
    """
    return [w[3] for w in _walk(plan)]


def _block_owners(block: np.ndarray, hi: list[int], when: int, early: set[int]) -> set[int]:
    """The heap owners in ``block`` (rows of elements; ``hi``: each row's maximum); those
    that had not ended by ``when`` join ``early``."""
    top = hi[_OWNER]
    if top == -hi[_UNOWNER]:  # one owner (its least is its greatest): it joins early when
        if when >= 0 and hi[_OEND] > when:
            early.add(top)  # one element's owner end does
        return {top}
    owner = block[_OWNER]
    owners = _values(owner)
    if when >= 0 and hi[_OEND] > when:
        early |= _values(owner[block[_OEND] > when])
    return owners


class _Late(Exception):
    """The trace has an event of a task after the walk took it (after its first end)."""


def _note(events: dict, i: int, core: int, kind: str, task: int) -> None:
    """Add event ``i`` to ``task``'s events (see ``_NONE``)."""
    e = events.get(task)
    if e is None:
        e = events[task] = list(_NONE)
    at = _KINDS.get(kind)
    if at is None:
        return
    if e[at] < 0:
        e[at] = i
        if at == _CLAIM:
            e[_CLAIM_CORE] = core
        elif at == _START:
            e[_START_CORE] = core
    if at in (_START, _END):
        e[_NSTART if at == _START else _NEND] += 1
        e[_LAST] = i


class _Streamed:
    """Each task's events, read from the trace as the walk needs them: to take task t, the
    trace is read on until t's first end (or its end). Raises :class:`_Late` on an event of a
    task already taken."""

    def __init__(self, trace, n: int) -> None:
        self.trace, self.n, self.i = trace, n, 0
        self.events: dict[int, list] = {}
        self.ended = 0
        self.floor = 0  # tasks below it were taken

    def _read(self, stop) -> None:
        trace, n, events = self.trace, self.n, self.events
        i = self.i
        while i < len(trace):
            _, core, kind, task = trace[i]
            i += 1
            if task >= n or kind == "fatal":
                continue
            if task < self.floor:
                raise _Late
            if kind == "end":
                self.ended += 1
            _note(events, i - 1, core, kind, task)
            if task == stop and kind == "end":
                break
        self.i = i

    def take(self, t: int):
        self.floor = t
        e = self.events.get(t)
        if e is None or e[_END] < 0:
            self._read(t)
        self.floor = t + 1
        return self.events.pop(t, _NONE)

    def finish(self) -> int:
        """Read the rest (every task was taken: any event of a task is late); the end events."""
        self.floor = self.n
        self._read(None)
        return self.ended


class _Indexed:
    """Each task's events, gathered from the whole trace first (memory per task)."""

    def __init__(self, trace, n: int) -> None:
        self.events: dict[int, list] = {}
        self.ended = 0
        for i, (_, core, kind, task) in enumerate(trace):
            if task >= n or kind == "fatal":
                continue
            if kind == "end":
                self.ended += 1
            _note(self.events, i, core, kind, task)

    def take(self, t: int):
        return self.events.pop(t, _NONE)

    def finish(self) -> int:
        return self.ended


class _Capped:
    """The first :data:`_MAX_REPORTED` problems of one kind, and how many there were."""

    def __init__(self) -> None:
        self.kept: list[str] = []
        self.count = 0

    def add(self, problem: str) -> None:
        self.count += 1
        if len(self.kept) < _MAX_REPORTED:
            self.kept.append(problem)


def check_trace(result: RunResult) -> list[str]:
    """Check a run's trace; returns the violations found (empty when the run was sound).

    Checks:
        - every kernel task that ended started once and ended once, on the core that claimed
          it; every ``alloc_tensors`` task completed at most once;
        - inputs complete: every task started (or, for ``alloc_tensors``, completed) only
          after every producer of every element it reads had ended (brute force, see
          :func:`ground_truth_producers`);
        - writes ordered: a task that overwrites elements started only after the previous
          writer of each had ended (concurrent overlapping writers leave whichever finishes
          last; see :func:`ground_truth_overwrites`);
        - reads not overwritten: a task that overwrites elements started only after every
          task that read them since their previous write had ended (write-after-read: else
          the reader may see the new bytes; brute force, per element, in program order);
        - heap safety: a task's heap slice was granted (its ``alloc`` event) only after every
          task that touches an older slice on the same ring bytes had finished with it;
        - the run's ``completed`` count equals the tasks that ended.

    At most 20 violations are listed, then how many more there were.

    Cost: one pass over the plan and one over the trace, each task's elements once. Memory: the
    events of the tasks between the walk and the trace's reading point, pages of per-element
    state for the data live at each point of the program (:data:`PAGE_BITS`), the live heap
    slices, and one integer per page of every buffer: it follows the run's live state, not
    its length.
    """
    with gc_paused():
        n = len(result.plan.columns.kind)
        try:
            return _Check(result, _Streamed(result.trace, n)).run()
        except _Late:
            return _Check(result, _Indexed(result.trace, n)).run()


class _Check:
    """One check of a run (see :func:`check_trace`), its tasks' events from ``events``."""

    def __init__(self, result: RunResult, events) -> None:
        self.result, self.plan, self.events = result, result.plan, events
        # streamed: a slice is closed (its last use final) once the walk passes its scope's
        # end; else (a hand-made plan may touch a slice after that) only at the end
        self.streamed = isinstance(events, _Streamed)
        self.never = len(result.trace) + 1
        self.runs, self.hazards = _Capped(), _Capped()
        ring, align = result.config.ring_bytes, self.plan.limits.align
        self.ring, self.align = ring, align
        self.occupant = [-1] * (ring // align)  # the last slice on each aligned ring block
        self.slices: dict[int, list[int]] = {}  # open slice -> [last use, its last user]
        self.closing: list[tuple[int, int]] = []  # (close position, slice), a heap
        self.waiting: dict[int, list[tuple[int, int]]] = {}  # open slice -> [(reuser, alloc)]
        self.final: dict[int, tuple[int, int]] = {}  # closed slice on the ring -> (use, user)
        self.held: dict[int, int] = {}  # slice -> ring blocks it is the last occupant of
        self.reuse: list[tuple[int, int, str]] = []  # (-task, -slice, problem), a heap
        self.reuse_count = 0

    def run(self) -> list[str]:
        plan, cols = self.plan, self.plan.columns
        n = len(cols.kind)
        pages = _Pages(plan, _ROWS)
        get, put, located = pages.get, pages.put, pages.located
        take, never, close_pos = self.events.take, self.never, plan.close_pos
        # column vectors a write, a read and an allocation set their rows of a block to
        wrote = np.full((_READER + 1, 1), -1, dtype=np.int64)
        read = np.empty((2, 1), dtype=np.int64)
        owned = np.empty((3, 1), dtype=np.int64)
        for t in range(n):
            ev = take(t)
            kernel = cols.kind[t] == "kernel"
            self._runs(t, ev, kernel)
            end = ev[_END] if ev[_END] >= 0 else never
            when = ev[_START] if kernel else ev[_END]
            outs = cols.outputs[t]
            if outs:
                owned[0, 0], owned[1, 0], owned[2, 0] = t, end, -t
                for tensor in outs:
                    where, rows = located(tensor)
                    if rows is not None:
                        rows[_OWNER:] = owned
                    else:
                        put(HEAP, where, _OWNER, t)
                        put(HEAP, where, _OEND, end)
                        put(HEAP, where, _UNOWNER, -t)
            # an inout is one Tensor in both lists: located once, its block checked once for
            # what reading and writing share (its owners; its maxima, before any update)
            seen, reads, written = {}, [], []
            for x in cols.reads[t]:
                item = seen[id(x)] = (x.buffer, *located(x))
                reads.append(item)
            for x in cols.writes[t]:
                item = seen.get(id(x))
                written.append((x.buffer, *located(x)) if item is None else item)
            maxima = {}  # id of a read's rows -> each row's maximum before the task's updates
            owners: set[int] = set()
            late: set[int] = set()  # readers of overwritten elements that had not ended
            early: set[int] = set()  # producers (writers and owners) that had not ended
            unordered: set[int] = set()  # writers of overwritten elements that had not ended
            for buffer, where, rows in reads:
                if rows is not None:  # one slice of one page: every row at once
                    hi = maxima[id(rows)] = _greatest(rows, 1).tolist()
                    if when >= 0 and hi[_WEND] > when:
                        early |= _values(rows[_WRITER][rows[_WEND] > when])
                    if buffer == HEAP:
                        owners |= _block_owners(rows, hi, when, early)
                    continue
                if when >= 0:
                    bad = get(buffer, where, _WEND) > when
                    if bad.any():
                        early |= _values(get(buffer, where, _WRITER)[bad])
                if buffer == HEAP:
                    owners |= self._owners(get, where, when, early)
            for buffer, where, rows in written:
                if rows is not None:
                    hi = maxima.get(id(rows))
                    if hi is None:  # not read too (then its owners are in already)
                        hi = _greatest(rows, 1).tolist()
                        if buffer == HEAP:
                            owners |= _block_owners(rows, hi, when, early)
                    if when >= 0:
                        if hi[_WEND] > when:
                            unordered |= _values(rows[_WRITER][rows[_WEND] > when])
                        if hi[_LATEST] > when:
                            late |= _values(rows[_READER][rows[_LATEST] > when])
                    continue
                if buffer == HEAP:
                    owners |= self._owners(get, where, when, early)
                if when >= 0:
                    bad = get(buffer, where, _WEND) > when
                    if bad.any():
                        unordered |= _values(get(buffer, where, _WRITER)[bad])
                    bad = get(buffer, where, _LATEST) > when
                    if bad.any():
                        late |= _values(get(buffer, where, _READER)[bad])
            owners -= {-1, t}
            early -= {-1, t}
            unordered -= {-1, t}
            read[0, 0], read[1, 0] = end, t
            for buffer, where, rows in reads:
                if rows is not None:
                    # the maximum before this task's updates: an earlier read of the task that
                    # overlaps these elements set them to (end, t), which either branch keeps
                    if maxima[id(rows)][_LATEST] < end:
                        rows[_LATEST : _READER + 1] = read
                    else:
                        latest = rows[_LATEST]
                        mine = latest < end
                        latest[mine] = end
                        rows[_READER][mine] = t
                    continue
                mine = get(buffer, where, _LATEST) < end
                if mine.all():
                    put(buffer, where, _LATEST, end)
                    put(buffer, where, _READER, t)
                elif mine.any():
                    pages.put_where(buffer, where, _LATEST, mine, end)
                    pages.put_where(buffer, where, _READER, mine, t)
            wrote[0, 0], wrote[1, 0] = t, end
            for buffer, where, rows in written:
                if rows is not None:
                    rows[_WRITER : _READER + 1] = wrote  # t, end, -1, -1
                    continue
                put(buffer, where, _WRITER, t)
                put(buffer, where, _WEND, end)
                put(buffer, where, _LATEST, -1)
                put(buffer, where, _READER, -1)
            self._touch(t, ev[_LAST], owners)
            if when >= 0 and (early or unordered or late):
                self._hazards(t, early, unordered, late)
            if outs:
                self._slice(t, outs[0].lo, cols.end[t], ev[_ALLOC], ev[_LAST], close_pos[t])
            while self.streamed and self.closing and self.closing[0][0] <= t + 1:
                self._closed(heapq.heappop(self.closing)[1])
            pages.done(t, cols.writes[t])
            pages.done(t, cols.reads[t])
        ended = self.events.finish()
        while self.closing:
            self._closed(heapq.heappop(self.closing)[1])
        problems = list(self.runs.kept)
        total = self.runs.count + self.hazards.count + self.reuse_count
        if ended != self.result.completed:
            total += 1
            problems.append(
                f"the run reports {self.result.completed} tasks completed, the trace ends {ended}"
            )
        problems += self.hazards.kept
        problems += [problem for _, _, problem in sorted((-q, -p, m) for q, p, m in self.reuse)]
        if total > _MAX_REPORTED:
            problems = [*problems[:_MAX_REPORTED], f"... and {total - _MAX_REPORTED} more"]
        return problems

    def _owners(self, get, where, when: int, early: set[int]) -> set[int]:
        """The heap owners of the elements at ``where``; those that had not ended by ``when``
        join ``early``."""
        owners = _values(get(HEAP, where, _OWNER))
        if when >= 0:
            bad = get(HEAP, where, _OEND) > when
            if bad.any():
                early |= _values(get(HEAP, where, _OWNER)[bad])
        return owners

    def _runs(self, t: int, ev, kernel: bool) -> None:
        """Task ``t`` ran once, on the core that claimed it."""
        runs = self.runs
        if ev[_NEND] > 1:
            runs.add(f"task {t} ended {ev[_NEND]} times")
        if not kernel or ev[_END] < 0:
            return
        if ev[_NSTART] != 1:
            runs.add(f"task {t} ended but started {ev[_NSTART]}x")
            return
        if ev[_CLAIM] < 0 or ev[_CLAIM_CORE] != ev[_START_CORE]:
            runs.add(f"task {t} ran on a core that did not claim it")

    def _hazards(self, t: int, early: set[int], unordered: set[int], late: set[int]) -> None:
        names, hazards = self.plan.columns.name, self.hazards
        name = names[t]
        for p in sorted(early):
            hazards.add(
                f"task {t} ({name}) ran before its producer task {p}"
                f" ({names[p]}) ended: its input was incomplete"
            )
        for w in sorted(unordered):
            hazards.add(
                f"task {t} ({name}) wrote bytes that task {w}"
                f" ({names[w]}) was still writing: overlapping writers ran"
                " concurrently (write-after-write not ordered)"
            )
        for r in sorted(late):
            hazards.add(
                f"task {t} ({name}) overwrote bytes that task {r}"
                f" ({names[r]}) was still reading: a writer ran before an earlier"
                " reader ended (write-after-read not ordered)"
            )

    # -- heap reuse: a slice's last use is known once every task that may touch it is walked

    def _touch(self, t: int, last: int, owners: set[int]) -> None:
        """Task ``t`` (last event ``last``) touched the slices of ``owners``."""
        slices = self.slices
        for p in owners:
            state = slices.get(p)
            if state is None:  # a slice closed before: check again, closing at the end
                raise _Late
            if last > state[0]:
                state[0], state[1] = last, t

    def _slice(self, q: int, lo: int, hi: int, alloc: int, last: int, close: int) -> None:
        """Task ``q``'s slice ``[lo, hi)`` (virtual): open until the walk passes its scope's
        close; it takes the ring blocks of older slices, each checked once it is closed."""
        self.slices[q] = [last, q]
        heapq.heappush(self.closing, (close, q))
        if alloc < 0:  # never granted (the run ended first): it reused nothing
            return
        ring, align = self.ring, self.align
        first, stop = (lo % ring) // align, (lo % ring + hi - lo) // align
        taken = self.occupant[first:stop]
        if taken and taken.count(taken[0]) == len(taken):  # one older slice (or none)
            previous = {taken[0]: len(taken)}
        else:
            previous = Counter(taken)  # older slice -> its blocks taken
        self.occupant[first:stop] = [q] * (stop - first)
        self.held[q] = stop - first
        for p in sorted(previous):
            if p < 0:
                continue
            if p in self.slices:
                self.waiting.setdefault(p, []).append((q, alloc))
            else:
                self._report(p, q, alloc, *self.final[p])
            self.held[p] -= previous[p]
            if not self.held[p]:
                del self.held[p]
                self.final.pop(p, None)

    def _closed(self, p: int) -> None:
        """Slice ``p``'s scope closed: no later task touches it; check its reusers."""
        last, user = self.slices.pop(p)
        for q, alloc in self.waiting.pop(p, ()):
            self._report(p, q, alloc, last, user)
        if p in self.held:
            self.final[p] = (last, user)

    def _report(self, p: int, q: int, alloc: int, last: int, user: int) -> None:
        """Slice ``q`` was granted (event ``alloc``) on ring bytes of slice ``p``, whose last
        use was event ``last``, by task ``user``."""
        if last <= alloc:
            return
        name = self.plan.columns.name[user]
        problem = (
            f"task {q}'s heap slice reused ring bytes of task {p}'s slice while"
            f" task {user} ({name}) still needed them"
        )
        self.reuse_count += 1
        heapq.heappush(self.reuse, (-q, -p, problem))
        if len(self.reuse) > _MAX_REPORTED:
            heapq.heappop(self.reuse)
