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

from collections.abc import Iterable

import numpy as np

from ._program import HEAP, Plan
from ._sim import RunResult

__all__ = ["check_trace", "ground_truth_overwrites", "ground_truth_producers"]

_MAX_REPORTED = 20


def _elements(region) -> np.ndarray:
    index = np.array([region.start_offset], dtype=np.int64)
    for n, s in zip(region.shape, region.strides, strict=True):
        index = (index[:, None] + np.arange(n, dtype=np.int64)[None, :] * s).ravel()
    return index


def ground_truth_producers(plan: Plan) -> tuple[list[set[int]], list[set[int]]]:
    """Per task: the tasks it must wait for, and the heap slices it touches, by brute force.

    Returns:
        ``(producers, touches)``: ``producers[N]`` holds, for every element task N reads, the
        last earlier task that wrote it, plus the owners of the heap slices it touches;
        ``touches[N]`` holds those owners.
    """
    producers, touches, _ = _ground_truth(plan)
    return producers, touches


def ground_truth_overwrites(plan: Plan) -> list[set[int]]:
    """Per task: the earlier tasks whose writes it overwrites, by brute force.

    Returns:
        ``overwrites[N]``: for every element task N writes, the last earlier task that wrote
        it. Each of them must end before task N starts (write-after-write order).
    """
    return _ground_truth(plan)[2]


def _ground_truth(plan: Plan) -> tuple[list[set[int]], list[set[int]], list[set[int]]]:
    sizes = {name: n for name, n in plan.externals.items()}
    heap_elems = max((t.end for t in plan.tasks), default=0) // 4
    writer = {name: np.full(n, -1, dtype=np.int64) for name, n in sizes.items()}
    writer[HEAP] = np.full(heap_elems, -1, dtype=np.int64)
    owner = np.full(heap_elems, -1, dtype=np.int64)
    producers: list[set[int]] = []
    touches: list[set[int]] = []
    overwrites: list[set[int]] = []
    for task in plan.tasks:
        for region in task.outputs:
            owner[_elements(region)] = task.id
        found: set[int] = set()
        owners: set[int] = set()
        for region in (*task.reads, *task.writes):
            idx = _elements(region)
            if region.buffer == HEAP:
                owners.update(int(o) for o in np.unique(owner[idx]) if o != task.id)
        for region in task.reads:
            found.update(int(w) for w in np.unique(writer[region.buffer][_elements(region)]))
        found.discard(-1)
        found |= owners
        producers.append(found)
        touches.append(owners)
        older: set[int] = set()
        for region in task.writes:
            idx = _elements(region)
            older.update(int(w) for w in np.unique(writer[region.buffer][idx]))
            writer[region.buffer][idx] = task.id
        older -= {-1, task.id}
        overwrites.append(older)
    return producers, touches, overwrites


def _index_events(trace: Iterable[tuple[int, int, str, int]]) -> dict[str, dict[int, list[int]]]:
    events: dict[str, dict[int, list[int]]] = {}
    for i, (_, _, kind, task) in enumerate(trace):
        events.setdefault(kind, {}).setdefault(task, []).append(i)
    return events


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
    """
    plan, trace = result.plan, result.trace
    events = _index_events(trace)
    starts, ends = events.get("start", {}), events.get("end", {})
    claims, allocs = events.get("claim", {}), events.get("alloc", {})
    problems: list[str] = []
    for task in plan.tasks:
        n_end = len(ends.get(task.id, ()))
        if n_end > 1:
            problems.append(f"task {task.id} ended {n_end} times")
        if task.kind != "kernel" or task.id not in ends:
            continue
        if len(starts.get(task.id, ())) != 1:
            problems.append(f"task {task.id} ended but started {len(starts.get(task.id, ()))}x")
            continue
        start, claim = starts[task.id][0], claims.get(task.id, [None])[0]
        if claim is None or trace[claim][1] != trace[start][1]:
            problems.append(f"task {task.id} ran on a core that did not claim it")
    if sum(len(v) for v in ends.values()) != result.completed:
        problems.append(
            f"the run reports {result.completed} tasks completed, the trace ends"
            f" {sum(len(v) for v in ends.values())}"
        )
    producers, touches, overwrites = _ground_truth(plan)
    for task in plan.tasks:
        when = starts.get(task.id) if task.kind == "kernel" else ends.get(task.id)
        if not when:
            continue
        for p in sorted(producers[task.id]):
            if p not in ends or ends[p][0] > when[0]:
                problems.append(
                    f"task {task.id} ({task.name}) ran before its producer task {p}"
                    f" ({plan.tasks[p].name}) ended: its input was incomplete"
                )
        for w in sorted(overwrites[task.id]):
            if w not in ends or ends[w][0] > when[0]:
                problems.append(
                    f"task {task.id} ({task.name}) wrote bytes that task {w}"
                    f" ({plan.tasks[w].name}) was still writing: overlapping writers ran"
                    " concurrently (write-after-write not ordered)"
                )
    problems += _write_after_read(plan, starts, ends, len(trace))
    problems += _heap_reuse(result, touches, starts, ends, allocs)
    if len(problems) > _MAX_REPORTED:
        problems = [*problems[:_MAX_REPORTED], f"... and {len(problems) - _MAX_REPORTED} more"]
    return problems


def _write_after_read(plan: Plan, starts, ends, n_events: int) -> list[str]:
    """Writers that started before a reader of the bytes they overwrite had ended.

    Per element, in program order: the latest end (an event index; a reader that never ended
    counts as ending after everything) among the tasks that read it since its last write, and
    which task that is. A writer that starts before that end overwrote bytes a reader still
    needed; then the element's readers are cleared. A task's own reads do not count against
    its own writes (it reads, then writes)."""
    never = n_events + 1
    sizes = {name: n for name, n in plan.externals.items()}
    sizes[HEAP] = max((t.end for t in plan.tasks), default=0) // 4
    latest = {name: np.full(n, -1, dtype=np.int64) for name, n in sizes.items()}
    reader = {name: np.full(n, -1, dtype=np.int64) for name, n in sizes.items()}
    problems = []
    for task in plan.tasks:
        when = starts.get(task.id) if task.kind == "kernel" else ends.get(task.id)
        written = [(r.buffer, _elements(r)) for r in task.writes]
        if when:
            late: set[int] = set()
            for buffer, idx in written:
                hit = latest[buffer][idx] > when[0]
                late.update(int(r) for r in np.unique(reader[buffer][idx][hit]))
            problems += [
                f"task {task.id} ({task.name}) overwrote bytes that task {r}"
                f" ({plan.tasks[r].name}) was still reading: a writer ran before an earlier"
                " reader ended (write-after-read not ordered)"
                for r in sorted(late)
            ]
        end = ends[task.id][0] if task.id in ends else never
        for region in task.reads:
            idx = _elements(region)
            mine = latest[region.buffer][idx] < end
            latest[region.buffer][idx[mine]] = end
            reader[region.buffer][idx[mine]] = task.id
        for buffer, idx in written:
            latest[buffer][idx] = -1
            reader[buffer][idx] = -1
    return problems


def _heap_reuse(result: RunResult, touches, starts, ends, allocs) -> list[str]:
    plan, ring = result.plan, result.config.ring_bytes
    slices = [(t.outputs[0].byte_range[0], t.end, t.id) for t in plan.tasks if t.outputs]
    users: dict[int, list[int]] = {t_id: [t_id] for _, _, t_id in slices}
    for task in plan.tasks:
        for p in touches[task.id]:
            users[p].append(task.id)
    align = plan.limits.align
    occupant = np.full(ring // align, -1, dtype=np.int64)  # last slice on each aligned block
    problems = []
    for lo, hi, q in slices:
        if q not in allocs:  # never granted (the run ended first): it reused nothing
            continue
        blocks = slice((lo % ring) // align, (lo % ring + hi - lo) // align)
        previous = [int(p) for p in np.unique(occupant[blocks]) if p >= 0]
        occupant[blocks] = q
        granted = allocs[q][0]
        for p in previous:
            for user in users[p]:
                last = max(ends.get(user, []) + starts.get(user, []), default=-1)
                if last > granted:
                    problems.append(
                        f"task {q}'s heap slice reused ring bytes of task {p}'s slice while"
                        f" task {user} ({plan.tasks[user].name}) still needed them"
                    )
    return problems
