"""The trace checker: was every task's input complete when it ran, and was no live heap byte
reused, in one simulated run?

It trusts nothing the runtime computed: producers are found again by brute force, per float32
element (the last task to write each element before the reader, in program order, plus the task
whose heap slice holds it), and so are the readers a writer must follow (the tasks that read an
element it overwrites since that element's last write); heap reuse is checked on physical ring
addresses against the order of events in the trace (events are in causal order: an event's
index orders it).
"""

from __future__ import annotations

import numpy as np

from ._program import HEAP, Plan
from ._sim import RunResult

__all__ = ["check_trace", "ground_truth_overwrites", "ground_truth_producers"]

_MAX_REPORTED = 20
PAGE_BITS = 12
"""The checker keeps its per-element state in pages of ``2**PAGE_BITS`` elements, each made on
first touch and dropped after the last task that touches it (program order): its memory follows
the program's live data, not its length (the virtual heap grows with every task). Read when a
check starts."""
_WRITER, _OWNER, _LATEST, _READER = range(4)
"""Rows of a page: each element's last writer, heap owner, the latest end (event index) among
the tasks that read it since its last write, and that reader."""


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

    A region is located once (:meth:`locate`) as ``(page, selection)`` pairs, a selection
    being a slice of the page when the region's elements are contiguous there (most are), else
    an index array; :meth:`get` and :meth:`put` then read and write its elements' state."""

    def __init__(self, plan: Plan) -> None:
        self.bits = bits = PAGE_BITS
        self.size = 1 << bits
        last: dict[tuple, int] = {}
        for task in plan.tasks:
            for region in (*task.outputs, *task.reads, *task.writes):
                lo, hi = region.byte_range
                for page in range(lo // 4 >> bits, ((hi - 1) // 4 >> bits) + 1):
                    last[region.buffer, page] = task.id
        self.drop: dict[int, list[tuple]] = {}
        for key, task in last.items():
            self.drop.setdefault(task, []).append(key)
        self.pages: dict[tuple, np.ndarray] = {}

    def locate(self, region) -> list[tuple[int, slice | np.ndarray]]:
        """``region``'s elements as ``(page, selection)`` pairs."""
        s, bits, mask = region._bytes, self.bits, self.size - 1
        if not s.dims and region.elem_size == 4:  # contiguous float32 elements [a, b)
            a, b = s.lo // 4, s.hi // 4
            out = []
            while a < b:
                page = a >> bits
                stop = min(b, (page + 1) << bits)
                out.append((page, slice(a & mask, stop - (page << bits))))
                a = stop
            return out
        idx = _elements(region)
        pages = idx >> bits
        return [(int(p), idx[pages == p] & mask) for p in np.unique(pages)]

    def _page(self, buffer, page: int) -> np.ndarray:
        rows = self.pages.get((buffer, page))
        if rows is None:
            rows = self.pages[buffer, page] = np.full((4, self.size), -1, dtype=np.int64)
        return rows

    def get(self, buffer, where, row: int) -> np.ndarray:
        parts = [self._page(buffer, page)[row, sel] for page, sel in where]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def put(self, buffer, where, row: int, value: int) -> None:
        for page, sel in where:
            self._page(buffer, page)[row, sel] = value

    def put_where(self, buffer, where, row: int, mask: np.ndarray, value: int) -> None:
        """Set ``value`` where ``mask`` (over the region's elements, in :meth:`get`'s order)."""
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

    def done(self, task: int) -> None:
        """Task ``task`` was the last to touch some pages: drop them."""
        for key in self.drop.pop(task, ()):
            self.pages.pop(key, None)


def _walk(plan: Plan, ends: np.ndarray | None = None, whens: np.ndarray | None = None):
    """Each task's ground truth, in program order, by brute force per element: yields
    ``(task, producers, touches, overwrites, late readers)``.

    ``producers``: for every element it reads, the last earlier task that wrote it, plus the
    owners of the heap slices it touches (``touches``); ``overwrites``: for every element it
    writes, the last earlier task that wrote it; ``late readers`` (only with ``ends``, each
    task's first end event index, ``never`` for none, and ``whens``, when each task started):
    the tasks that read an element it writes since that element's last write and ended after
    it started (for each element, the one that ended last). A task's own reads do not count
    against its own writes (it reads, then writes)."""
    pages = _Pages(plan)
    locate = pages.locate
    for task in plan.tasks:
        for region in task.outputs:
            pages.put(region.buffer, locate(region), _OWNER, task.id)
        owners: set[int] = set()
        found: set[int] = set()
        reads = [(r.buffer, locate(r)) for r in task.reads]
        for buffer, where in reads:
            found |= _values(pages.get(buffer, where, _WRITER))
            if buffer == HEAP:
                owners |= _values(pages.get(HEAP, where, _OWNER))
        written = [(r.buffer, locate(r)) for r in task.writes]
        older: set[int] = set()
        late: set[int] = set()
        when = whens[task.id] if whens is not None else -1
        for buffer, where in written:
            older |= _values(pages.get(buffer, where, _WRITER))
            if buffer == HEAP:
                owners |= _values(pages.get(HEAP, where, _OWNER))
            if when >= 0:
                hit = pages.get(buffer, where, _LATEST) > when
                if hit.any():
                    late |= _values(pages.get(buffer, where, _READER)[hit])
        owners -= {-1, task.id}
        found.discard(-1)
        older -= {-1, task.id}
        if ends is not None:
            end = int(ends[task.id])
            for buffer, where in reads:
                mine = pages.get(buffer, where, _LATEST) < end
                if mine.all():
                    pages.put(buffer, where, _LATEST, end)
                    pages.put(buffer, where, _READER, task.id)
                elif mine.any():
                    pages.put_where(buffer, where, _LATEST, mine, end)
                    pages.put_where(buffer, where, _READER, mine, task.id)
        for buffer, where in written:
            pages.put(buffer, where, _WRITER, task.id)
            if ends is not None:
                pages.put(buffer, where, _LATEST, -1)
                pages.put(buffer, where, _READER, -1)
        yield task, found | owners, owners, older, late
        pages.done(task.id)


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


class _Events:
    """The trace indexed by task, in arrays: each task's first claim, alloc, start and end
    event (-1: none), the core of its first claim and start, and its start and end counts."""

    def __init__(self, trace, n: int) -> None:
        first = {
            kind: np.full(n, -1, dtype=np.int64) for kind in ("claim", "alloc", "start", "end")
        }
        self.count = {kind: np.zeros(n, dtype=np.int64) for kind in ("start", "end")}
        self.core = {kind: np.full(n, -1, dtype=np.int64) for kind in ("claim", "start")}
        self.last_use = np.full(n, -1, dtype=np.int64)  # the last start or end event
        for i, (_, core, kind, task) in enumerate(trace):
            if task >= n or kind == "fatal":
                continue
            if first[kind][task] < 0:
                first[kind][task] = i
                if kind in self.core:
                    self.core[kind][task] = core
            if kind in self.count:
                self.count[kind][task] += 1
                self.last_use[task] = i
        self.claim, self.alloc = first["claim"], first["alloc"]
        self.start, self.end = first["start"], first["end"]


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

    Cost: one pass over the trace and one over the plan, each task's elements once; memory:
    arrays of a few integers per task, plus pages of per-element state for the data live at
    each point of the program (:data:`PAGE_BITS`), not for every byte the run ever used.
    """
    plan, trace = result.plan, result.trace
    n = len(plan.tasks)
    ev = _Events(trace, n)
    problems: list[str] = []
    for task in plan.tasks:
        t = task.id
        if ev.count["end"][t] > 1:
            problems.append(f"task {t} ended {ev.count['end'][t]} times")
        if task.kind != "kernel" or ev.end[t] < 0:
            continue
        if ev.count["start"][t] != 1:
            problems.append(f"task {t} ended but started {ev.count['start'][t]}x")
            continue
        if ev.claim[t] < 0 or ev.core["claim"][t] != ev.core["start"][t]:
            problems.append(f"task {t} ran on a core that did not claim it")
    ended = int(ev.count["end"].sum())
    if ended != result.completed:
        problems.append(
            f"the run reports {result.completed} tasks completed, the trace ends {ended}"
        )
    kernel = np.fromiter((t.kind == "kernel" for t in plan.tasks), dtype=bool, count=n)
    whens = np.where(kernel, ev.start, ev.end)
    never = len(trace) + 1
    ends = np.where(ev.end >= 0, ev.end, never)
    last_use = ev.last_use.copy()  # per slice: the last event of any task that touches it
    last_user = np.arange(n, dtype=np.int64)
    for task, producers, touches, overwrites, late in _walk(plan, ends, whens):
        t = task.id
        for p in touches:
            if ev.last_use[t] > last_use[p]:
                last_use[p], last_user[p] = ev.last_use[t], t
        when = whens[t]
        if when < 0:
            continue
        for p in sorted(producers):
            if ends[p] > when:
                problems.append(
                    f"task {t} ({task.name}) ran before its producer task {p}"
                    f" ({plan.tasks[p].name}) ended: its input was incomplete"
                )
        for w in sorted(overwrites):
            if ends[w] > when:
                problems.append(
                    f"task {t} ({task.name}) wrote bytes that task {w}"
                    f" ({plan.tasks[w].name}) was still writing: overlapping writers ran"
                    " concurrently (write-after-write not ordered)"
                )
        problems += [
            f"task {t} ({task.name}) overwrote bytes that task {r}"
            f" ({plan.tasks[r].name}) was still reading: a writer ran before an earlier"
            " reader ended (write-after-read not ordered)"
            for r in sorted(late)
        ]
    problems += _heap_reuse(result, ev, last_use, last_user)
    if len(problems) > _MAX_REPORTED:
        problems = [*problems[:_MAX_REPORTED], f"... and {len(problems) - _MAX_REPORTED} more"]
    return problems


def _heap_reuse(result: RunResult, ev: _Events, last_use, last_user) -> list[str]:
    """Slices granted on ring bytes whose previous slice was still needed: ``last_use[p]`` is
    the last start or end event of any task touching slice ``p`` (``last_user[p]`` that task),
    the slice's own task included."""
    plan, ring = result.plan, result.config.ring_bytes
    align = plan.limits.align
    occupant = np.full(ring // align, -1, dtype=np.int64)  # last slice on each aligned block
    problems = []
    for task in plan.tasks:
        if not task.outputs:
            continue
        q, lo, hi = task.id, task.outputs[0].byte_range[0], task.end
        if ev.alloc[q] < 0:  # never granted (the run ended first): it reused nothing
            continue
        blocks = slice((lo % ring) // align, (lo % ring + hi - lo) // align)
        previous = [int(p) for p in np.unique(occupant[blocks]) if p >= 0]
        occupant[blocks] = q
        for p in previous:
            if last_use[p] > ev.alloc[q]:
                user = int(last_user[p])
                problems.append(
                    f"task {q}'s heap slice reused ring bytes of task {p}'s slice while"
                    f" task {user} ({plan.tasks[user].name}) still needed them"
                )
    return problems
