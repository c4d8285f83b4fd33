"""Every data hazard of the heap-ring runtime against an independent byte-level model
(``../shared/seeds/pto-ring-heap-and-tensormap.txt``; issue 39, items 2 and 3).

The model keeps, per byte, its last writer and the tasks that read it since. A task that reads
a byte follows its last writer (read-after-write); a task that overwrites it follows its last
writer (write-after-write) and every reader since (write-after-read). The planned dependencies
must be exactly that (plus the owners of the heap slices a task touches), a fan-in cap must
stop the plan at the first task whose model fan-in exceeds it, and ``check_trace`` must agree
with the model, run on the trace, in both directions: nothing on honest runs, and, on runs of
a runtime that tracks no readers, exactly the writers that started before a reader of their
bytes ended. Programs are random: views of external buffers (strided, overlapping), heap
programs with nested scopes, bursts of 100+ producers and consumers submitted late.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime import ring
from runtime.ring import HEAP, RingConfig

from . import _ring_mutants, _ring_programs

# -- the byte-level model ---------------------------------------------------------------------


def byte_model(plan: ring.Plan) -> tuple[list[set[int]], list[set[int]], list[dict]]:
    """Per task: its fan-in by the model, its owners (heap slices touched, not its own), and
    the readers it must follow per task (``{reader: bytes}``, for the trace check).

    Bytes are ``(buffer, address)`` pairs; every region is enumerated byte by byte."""
    last_writer: dict[tuple, int] = {}
    readers: dict[tuple, set[int]] = {}
    owner: dict[int, int] = {}
    fanins, owners, war = [], [], []
    for task in plan.tasks:
        for region in task.outputs:
            for b in region.byte_set():
                owner[b] = task.id
        read = {(r.buffer, b) for r in task.reads for b in r.byte_set()}
        written = {(r.buffer, b) for r in task.writes for b in r.byte_set()}
        fanin = {last_writer[b] for b in read | written if b in last_writer}
        follows: dict[int, set] = {}
        for b in written:
            for r in readers.get(b, ()):
                follows.setdefault(r, set()).add(b)
        fanin |= set(follows)
        fanin.discard(task.id)
        touched = {owner[b] for buf, b in read | written if buf == HEAP} - {task.id}
        fanins.append(fanin)
        owners.append(touched)
        war.append(follows)
        for b in read - written:
            readers.setdefault(b, set()).add(task.id)
        for b in written:
            last_writer[b] = task.id
            readers.pop(b, None)
    return fanins, owners, war


def model_war_violations(result: ring.RunResult, war: list[dict]) -> set[tuple[int, int]]:
    """``(writer, reader)`` pairs where the writer started (an alloc task: completed) before
    a reader of the bytes it overwrites had ended, by the trace's event order."""
    first: dict[tuple[str, int], int] = {}
    for i, (_, _, kind, task) in enumerate(result.trace):
        first.setdefault((kind, task), i)
    pairs = set()
    for task in result.plan.tasks:
        when = first.get(("start" if task.kind == "kernel" else "end", task.id))
        if when is None:
            continue
        for r in war[task.id]:
            if first.get(("end", r), len(result.trace)) > when:
                pairs.add((task.id, r))
    return pairs


WAR_MESSAGE = re.compile(r"task (\d+) \(\w+\) overwrote bytes that task (\d+) \(\w+\)")


def checker_war(problems: list[str]) -> set[tuple[int, int]]:
    return {(int(w), int(r)) for w, r in WAR_MESSAGE.findall("\n".join(problems))}


# -- random programs on external buffers ------------------------------------------------------

X_ELEMS = 128
VIEWS = st.tuples(
    st.integers(0, 31),
    st.sampled_from(
        [
            ((1,), None),
            ((4,), None),
            ((16,), None),
            ((64,), None),
            ((8,), (2,)),
            ((2, 4), (16, 1)),  # two rows of a 16-column matrix
            ((4, 2), (16, 1)),
            ((6, 1), (16, 1)),  # a column
            ((4, 3), (16, 5)),
            ((3, 2, 2), (32, 4, 1)),
        ]
    ),
)
ACCESS = st.tuples(
    st.sampled_from(["x", "y"]),
    VIEWS,
)
TASKS = st.tuples(
    st.just("task"),
    st.lists(ACCESS, max_size=2),  # inputs
    st.lists(ACCESS, max_size=1),  # inouts
    st.lists(ACCESS, max_size=2),  # writes
    st.sampled_from([10, 1000, 50_000]),  # cost_ns: a slow reader invites a fast writer
)
BURST = st.tuples(st.just("burst"), st.integers(100, 120), st.integers(0, 2))
"""100+ producers write tiles of x, ``late`` unrelated tasks follow, one task reads x whole
(slowly), then one task overwrites it: it must follow the reader."""
EXTERNAL_PROGRAMS = st.lists(st.one_of(TASKS, TASKS, TASKS, BURST), min_size=1, max_size=25)


def external_workload(ops):
    def program(rt) -> None:
        buffers = {"x": rt.external("x", X_ELEMS), "y": rt.external("y", X_ELEMS)}

        def view(access):
            name, (offset, (shape, strides)) = access
            return buffers[name].view(offset, shape, strides)

        for op in ops:
            if op[0] == "burst":
                _, k, late = op
                x = buffers["x"]
                tile = X_ELEMS // 4
                for j in range(k):  # each writes a quarter: the later ones supersede
                    rt.submit("tile", writes=[x.view(tile * (j % 4), (tile,))], cost_ns=7 + j)
                for _ in range(late):
                    rt.submit("other", cost_ns=5000)
                rt.submit("reduce", inputs=[x], cost_ns=20_000)
                rt.submit("clear", writes=[x], cost_ns=10)
            else:
                _, inputs, inouts, writes, cost = op
                rt.submit(
                    "k",
                    inputs=[view(a) for a in inputs],
                    inouts=[view(a) for a in inouts],
                    writes=[view(a) for a in writes],
                    cost_ns=cost,
                )

    program.__name__ = "external_program"
    return program


def _settings(stress_scale: int, examples: int):
    return settings(
        max_examples=examples * min(stress_scale, 10),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        derandomize=stress_scale == 1,
    )


RUNS = st.tuples(st.integers(1, 4), st.integers(0, 2**16))
"""Cores and seed."""


def check_against_the_model(result: ring.RunResult, mutant: bool) -> list[str]:
    """Assert the plan and ``check_trace`` agree with the model; returns the problems."""
    fanins, owners, war = byte_model(result.plan)
    plan = result.plan
    if not mutant:
        for task in plan.tasks:
            expected = tuple(sorted(fanins[task.id] | owners[task.id], reverse=True))
            assert task.deps == expected, (task.id, task.deps, expected)
    problems = ring.check_trace(result)
    truth = model_war_violations(result, war)
    if not mutant:
        assert problems == [] and truth == set(), (problems, truth)
        return problems
    # the mutant drops only the readers: every other hazard stays ordered
    assert all(WAR_MESSAGE.search(p) or p.startswith("...") for p in problems), problems
    found = checker_war(problems)
    assert found <= truth, (found, truth)  # it names, per byte, the reader that ended last
    if len(problems) < 20:  # not truncated: every late writer is reported
        assert {w for w, _ in found} == {w for w, _ in truth}, (found, truth)
    return problems


@pytest.mark.parametrize(
    ("mutant", "page_bits"),
    [(False, 12), (True, 12), (False, 3), (True, 3)],
    ids=["honest", "no-readers", "honest-8-element-pages", "no-readers-8-element-pages"],
)
def test_external_programs_agree_with_the_byte_model(
    make_alloc, stress_scale, mutant, page_bits, monkeypatch
):
    """With 8-element pages, the checker's state is split and dropped across pages inside
    every region."""
    monkeypatch.setattr("runtime.ring._trace.PAGE_BITS", page_bits)
    if mutant:
        _ring_mutants.apply("no_readers_recorded", monkeypatch)
    flagged = []

    @_settings(stress_scale, 20)
    @given(ops=EXTERNAL_PROGRAMS, run=RUNS)
    def check(ops, run):
        cores, seed = run
        result = ring.run(external_workload(ops), RingConfig(cores=cores, seed=seed), make_alloc())
        assert result.fatal is None
        flagged.append(bool(check_against_the_model(result, mutant)))

    check()
    if mutant:  # the probe has teeth: some random runs do overwrite a read in progress
        assert sum(flagged) >= 3, flagged


def test_heap_programs_agree_with_the_byte_model(make_alloc, stress_scale):
    """The suites' random heap programs (nested scopes, 4-byte to 1 KiB outputs, bursts of
    100+ producers, late consumers): dependencies as the model's, traces clean."""

    @_settings(stress_scale, 40)
    @given(ops=_ring_programs.PROGRAMS, run=RUNS)
    def check(ops, run):
        cores, seed = run
        config = RingConfig(cores=cores, seed=seed, ring_bytes=1 << 16)
        result = ring.run(_ring_programs.workload(ops), config, make_alloc())
        if result.fatal is None:
            check_against_the_model(result, mutant=False)

    check()


def test_a_fanin_cap_stops_at_the_first_task_over_it_by_the_model(stress_scale):
    """Fan-in counts the tasks a task follows by its live bytes (after coverage). Planning
    only: no allocator."""

    @_settings(stress_scale, 30)
    @given(ops=EXTERNAL_PROGRAMS, cap=st.integers(1, 4))
    def check(ops, cap):
        uncapped = ring.plan(external_workload(ops), ring.PlanLimits(ring_bytes=1 << 20))
        fanins, _, _ = byte_model(uncapped)
        over = next((t for t, f in enumerate(fanins) if len(f) > cap), None)
        limits = ring.PlanLimits(ring_bytes=1 << 20, max_fanin=cap)
        capped = ring.plan(external_workload(ops), limits)
        if over is None:
            assert capped.fatal is None
        else:
            assert capped.fatal == (
                over,
                f"task {over} depends on {len(fanins[over])} producers, more than"
                f" max_fanin={cap} (the seed's runtime silently kept 16)",
            )

    check()
