"""Random heap-ring programs for the property tests, and a brute-force oracle of their verdict.

A program is a list of abstract operations (hypothesis draws them); :func:`workload` turns it
into a workload function for :func:`runtime.ring.run`. Indices into the usable tensors are taken
modulo their number at replay time, so every drawn list is a valid program. No pytest import.
"""

from __future__ import annotations

from hypothesis import strategies as st

from runtime.ring import HEAP, Plan, ground_truth_producers

SIZES = st.sampled_from([1, 3, 16, 64, 200, 256, 272])
"""Output sizes in float32 elements: 4-byte to over-a-kilobyte slices, aligned or not."""

OPS = st.one_of(
    st.just(("open",)),
    st.just(("close",)),
    st.just(("close",)),
    st.tuples(st.just("alloc"), st.lists(SIZES, min_size=1, max_size=2)),
    st.tuples(
        st.just("kernel"),
        st.lists(st.integers(0, 63), max_size=3),  # inputs
        st.lists(st.integers(0, 63), max_size=1),  # writes
        st.lists(SIZES, max_size=2),  # new outputs
        st.integers(0, 5000),  # cost_ns
    ),
)
BURST = st.tuples(st.just("burst"), st.integers(100, 130), st.integers(0, 3))
"""Over 100 producers each write one tile of a fresh external buffer, ``late`` unrelated tasks
follow (the reader is submitted after its producers are done), then one task reads it all."""
PROGRAMS = st.lists(
    st.one_of(OPS, st.tuples(st.just("root"), st.lists(SIZES, min_size=1, max_size=1)), BURST),
    min_size=1,
    max_size=14,
)
"""Programs of up to 14 operations. Heap outputs submitted with no scope open go into a new
scope, so most slices can die; ``("root", ...)`` allocates in the root scope (which never
closes) when no scope is open."""

TWO_SCOPES = [("open",), ("alloc", [256]), ("close",), ("alloc", [256, 16])]
"""A 1024-byte tensor in one scope, then a 1088-byte one in the next: with a 2048-byte ring the
second skips to the ring's start (it would straddle the end)."""


def workload(ops):
    """A workload function that replays ``ops`` on the orchestrator."""

    def program(rt) -> None:
        scopes = []  # open scope context managers, innermost last
        usable = [[]]  # tensors per open scope (the root scope first)

        def open_scope() -> None:
            scope = rt.scope()
            scope.__enter__()
            scopes.append(scope)
            usable.append([])

        for i, op in enumerate(ops):
            tensors = [t for level in usable for t in level]
            if op[0] == "open":
                open_scope()
            elif op[0] == "close" and scopes:
                scopes.pop().__exit__(None, None, None)
                usable.pop()
            elif op[0] == "root":  # the root scope when none is open, else the innermost
                usable[-1].append(rt.alloc_tensors(*op[1]).get_ref(0))
            elif op[0] == "alloc":
                if not scopes:
                    open_scope()
                refs = rt.alloc_tensors(*op[1])
                usable[-1].extend(refs.get_ref(i) for i in range(len(op[1])))
            elif op[0] == "burst":
                _, k, late = op
                x = rt.external(f"burst{i}", 4 * k)
                for j in range(k):
                    rt.submit("tile", writes=[x.view(4 * j, (4,))], cost_ns=100 + j % 7)
                for _ in range(late):
                    rt.submit("other", cost_ns=5000)
                rt.submit("reduce", inputs=[x], cost_ns=10)
            elif op[0] == "kernel":
                _, reads, writes, outputs, cost = op
                if not tensors and not outputs:
                    continue
                if outputs and not scopes:
                    open_scope()
                inputs = [tensors[i % len(tensors)] for i in reads] if tensors else []
                written = [tensors[i % len(tensors)] for i in writes] if tensors else []
                refs = rt.submit("k", inputs=inputs, writes=written, outputs=outputs, cost_ns=cost)
                usable[-1].extend(refs.get_ref(i) for i in range(len(outputs)))
        while scopes:
            scopes.pop().__exit__(None, None, None)

    program.__name__ = "random_program"
    return program


def one_core_verdict(plan: Plan) -> int | None:
    """Exact reclaim on one core, by brute force over physical ring bytes: the task whose slice
    would land on ring bytes still occupied, or ``None`` when every slice fits.

    One core runs tasks in program order, so when it reaches task N every earlier task is done
    and no later one has run: an earlier slice is live at N exactly when a task at or after N
    touches it (found again by :func:`~runtime.ring.ground_truth_producers`) or its scope closes
    after N. The ring is a FIFO: the occupied bytes run from the oldest live slice's first
    output byte up to N's base (dead slices and padding in between cannot be reused before the
    oldest live one dies); N fits when none of its bytes, taken modulo the ring's size, is
    occupied. A planning fatal ends the run where the plan says.
    """
    ring = plan.limits.ring_bytes
    _, touches = ground_truth_producers(plan)
    last_use: dict[int, int] = {}
    for task in plan.tasks:
        for p in touches[task.id]:
            last_use[p] = task.id
    slices = []  # (first output byte, owner) of every earlier heap slice
    for task in plan.tasks:
        if not task.outputs:
            continue
        assert all(r.buffer == HEAP for r in task.outputs)
        base = task.outputs[0].byte_range[0]
        live = [
            lo for lo, p in slices if last_use.get(p, -1) >= task.id or plan.close_pos[p] > task.id
        ]
        occupied = {b % ring for b in range(min(live), base)} if live else set()
        if any(b % ring in occupied for b in range(base, task.end)):
            return task.id
        slices.append((base, task.id))
    return plan.fatal[0] if plan.fatal else None
