"""Write-after-write order in the heap-ring runtime
(``../shared/seeds/pto-ring-heap-and-tensormap.txt``).

A ``writes=`` task depends on the live producers it overlaps, as a reader does, and supersedes
the entries it covers; the trace checker flags overlapping writers that ran concurrently.
"""

from __future__ import annotations

import dataclasses

from runtime import ring, tensormap
from runtime.ring import RingConfig, _program


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
    real = tensormap.gather_fanin

    def without_writes(tmap, task, *, inputs=(), inouts=(), writes=(), max_fanin=None):
        return real(tmap, task, inputs=inputs, inouts=inouts, max_fanin=max_fanin)

    monkeypatch.setattr(_program, "gather_fanin", without_writes)
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
