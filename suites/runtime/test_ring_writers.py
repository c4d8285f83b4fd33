"""Write-after-write order in the heap-ring runtime
(``../shared/seeds/pto-ring-heap-and-tensormap.txt``).

A ``writes=`` task depends on the live producers it overlaps, as a reader does, and supersedes
the entries it covers; the trace checker flags overlapping writers that ran concurrently.
"""

from __future__ import annotations

import dataclasses

from runtime import ring
from runtime.ring import RingConfig

from . import _ring_mutants


def overwrites(rt, n: int = 17, slow_ns: int = 100_000) -> None:
    """A slow writer of x, then ``n - 1`` fast writers of x, then a reader of x."""
    x = rt.external("x", 64)
    rt.submit("slow", writes=[x], cost_ns=slow_ns)
    for _ in range(n - 1):
        rt.submit("fast", writes=[x], cost_ns=10)
    rt.submit("read", inputs=[x], cost_ns=10)


def test_each_writer_waits_for_the_previous_one_and_fanin_stays_flat(make_alloc):
    """17 overwrites and a read: the reader depends on the last writer only, so a fan-in cap of
    16 holds (before: 17 producers, a fatal), and every writer waits for the one before it (before:
    none did, and on several cores the slow first write landed last)."""
    for cores in (1, 2, 4):
        result = ring.run(overwrites, RingConfig(cores=cores, max_fanin=16), make_alloc())
        assert result.fatal is None and result.completed == 18
        assert ring.check_trace(result) == []
        deps = [t.deps for t in result.plan.tasks]
        assert deps == [(), *[(k,) for k in range(16)], (16,)]


def test_teeth_unordered_writers_are_flagged_by_the_trace_checker(make_alloc, monkeypatch):
    """Mutant probe: the TensorMap lookup without the writes (the code before the fix). On two
    cores a fast writer ends before the slow one it should follow: check_trace says so."""
    _ring_mutants.apply("fanin_without_writes", monkeypatch)
    result = ring.run(overwrites, RingConfig(cores=2), make_alloc(), n=3)
    problems = ring.check_trace(result)
    assert any(
        "wrote bytes that task 0 (slow) was still writing: overlapping writers ran concurrently"
        in p
        for p in problems
    ), problems


def test_check_trace_flags_a_forged_order_of_writers(make_alloc):
    result = ring.run(overwrites, RingConfig(cores=1), make_alloc(), n=2)
    assert ring.check_trace(result) == []
    trace = list(result.trace)
    start = next(i for i, e in enumerate(trace) if e[2] == "start" and e[3] == 1)
    trace.insert(0, trace.pop(start))  # writer 1 now starts before writer 0 ended
    forged = dataclasses.replace(result, trace=tuple(trace))
    assert any(
        "task 1 (fast) wrote bytes that task 0 (slow)" in p for p in ring.check_trace(forged)
    )


def test_ground_truth_overwrites_are_the_previous_writer_per_element():
    def program(rt):
        x = rt.external("x", 8)
        rt.submit("a", writes=[x.view(0, (4,))])
        rt.submit("b", writes=[x.view(4, (4,))])
        rt.submit("c", writes=[x.view(2, (4,))])  # over a's [2, 4) and b's [4, 6)
        rt.submit("d", inouts=[x])

    plan = ring.plan(program, ring.PlanLimits(ring_bytes=1024))
    assert ring.ground_truth_overwrites(plan) == [set(), set(), {0, 1}, {0, 1, 2}]
    assert [t.deps for t in plan.tasks] == [(), (), (1, 0), (2, 1, 0)]


# -- write-after-read (issue 39, item 2) -------------------------------------------------------


def read_then_overwrite(rt, read_ns: int = 100_000) -> None:
    """The review's repro: P writes x; R reads x for 100 us; W overwrites x."""
    x = rt.external("x", 64)
    rt.submit("P", writes=[x], cost_ns=1000)
    rt.submit("R", inputs=[x], cost_ns=read_ns)
    rt.submit("W", writes=[x], cost_ns=1000)


def _span(result, task: int) -> tuple[int, int]:
    times = {kind: t for t, _, kind, n in result.trace if n == task and kind in ("start", "end")}
    return times["start"], times["end"]


def test_a_writer_waits_for_the_readers_of_the_bytes_it_overwrites(make_alloc):
    """Before: W depended on P only, ran at 3 us inside R's 2-102 us, and check_trace said
    nothing. Now W follows R (and P, whose bytes it overwrites), on any number of cores."""
    for cores in (1, 2, 4):
        result = ring.run(read_then_overwrite, RingConfig(cores=cores), make_alloc())
        assert result.fatal is None and result.completed == 3
        assert [t.deps for t in result.plan.tasks] == [(), (0,), (1, 0)]
        assert _span(result, 2)[0] >= _span(result, 1)[1]
        assert ring.check_trace(result) == []


def test_teeth_a_writer_inside_a_read_is_flagged_by_the_trace_checker(make_alloc, monkeypatch):
    """Mutant probe: a TensorMap that records no readers (the code before the fix). On two
    cores W runs while R still reads: check_trace names both."""
    _ring_mutants.apply("no_readers_recorded", monkeypatch)
    result = ring.run(read_then_overwrite, RingConfig(cores=2), make_alloc())
    assert result.plan.tasks[2].deps == (0,)
    r_start, r_end = _span(result, 1)
    assert r_start < _span(result, 2)[0] < r_end
    assert ring.check_trace(result) == [
        "task 2 (W) overwrote bytes that task 1 (R) was still reading: a writer ran before an"
        " earlier reader ended (write-after-read not ordered)"
    ]


def test_check_trace_flags_a_forged_write_inside_a_read(make_alloc):
    """The checker reads the trace, not the plan: W's start moved before R's end is found."""
    result = ring.run(read_then_overwrite, RingConfig(cores=1), make_alloc())
    trace = list(result.trace)
    start = next(i for i, e in enumerate(trace) if e[2] == "start" and e[3] == 2)
    r_end = next(i for i, e in enumerate(trace) if e[2] == "end" and e[3] == 1)
    trace.insert(r_end, trace.pop(start))  # W now starts before R ended (and after P ended)
    forged = dataclasses.replace(result, trace=tuple(trace))
    assert ring.check_trace(forged) == [
        "task 2 (W) overwrote bytes that task 1 (R) was still reading: a writer ran before an"
        " earlier reader ended (write-after-read not ordered)"
    ]


def test_a_task_that_reads_and_writes_its_bytes_is_not_its_own_hazard(make_alloc):
    def program(rt):
        x = rt.external("x", 8)
        rt.submit("r", inputs=[x], writes=[x.view(0, (4,))], cost_ns=5000)
        rt.submit("a", inouts=[x], cost_ns=10)
        rt.submit("w", writes=[x.view(4, (4,))], cost_ns=10)

    result = ring.run(program, RingConfig(cores=2), make_alloc())
    # a reads what r wrote (x[0:4]) and overwrites what r read; w follows a's read and write
    assert [t.deps for t in result.plan.tasks] == [(), (0,), (1,)]
    assert ring.check_trace(result) == []


# -- fan-in after coverage (issue 39, item 3) ---------------------------------------------------


def covered_writer(rt) -> None:
    """W1 writes x[0:8]; W2 x[0:4] and W3 x[4:8] overwrite all of it; R reads x."""
    x = rt.external("x", 8)
    rt.submit("W1", writes=[x], cost_ns=10)
    rt.submit("W2", writes=[x.view(0, (4,))], cost_ns=10)
    rt.submit("W3", writes=[x.view(4, (4,))], cost_ns=10)
    rt.submit("R", inputs=[x], cost_ns=10)


def test_fanin_counts_the_writers_of_the_bytes_read_not_writers_overwritten(make_alloc):
    """Before: "task 3 depends on 3 producers, more than max_fanin=2", though R's bytes have
    two writers. W1 reaches R through W2 and W3, which follow it."""
    result = ring.run(covered_writer, RingConfig(cores=2, max_fanin=2), make_alloc())
    assert result.fatal is None and result.completed == 4
    assert [t.deps for t in result.plan.tasks] == [(), (0,), (0,), (2, 1)]
    assert ring.check_trace(result) == []
    result = ring.run(covered_writer, RingConfig(cores=2, max_fanin=1), make_alloc())
    assert result.fatal == (
        "task 3 depends on 2 producers, more than max_fanin=1 (the seed's runtime silently kept 16)"
    )
