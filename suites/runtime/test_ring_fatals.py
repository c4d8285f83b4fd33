"""A "heap ring too small" only when it is true
(``../shared/seeds/pto-ring-heap-and-tensormap.txt``).

Exact reclaim's boundary is the oldest live slice's first output byte (its alignment padding is
not live), and its fatal is the stall detector's: no core can make progress. Window mode keeps
the seed's rule (every predecessor done), which is exact there. Every fatal ends the run.

The oracle is a brute force over physical ring bytes on one core
(:func:`~suites.runtime._ring_programs.one_core_verdict`); with more cores a run must complete
whenever one core completes.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from runtime import ring
from runtime.ring import RingConfig

from . import _ring_mutants, _ring_programs, _ring_targets


def checked(workload, config, alloc, **params) -> ring.RunResult:
    result = ring.run(workload, config, alloc, **params)
    violations = ring.check_trace(result)
    assert violations == [], "\n".join(violations)
    return result


def two_scopes(rt) -> None:
    """A 1024-byte tensor in one scope, then a 1088-byte tensor in the next."""
    with rt.scope():
        a = rt.alloc_tensors(256)
        rt.submit("use", inputs=[a.get_ref(0)])
    with rt.scope():
        b = rt.alloc_tensors(256, 16)
        rt.submit("use", inputs=[b.get_ref(0), b.get_ref(1)])


def read_then_alloc(rt) -> None:
    """Alloc P, read P, alloc N, use N, in one scope: P dies only when the scope closes, after
    N's allocation in program order, but a second core replays past the scope's end."""
    with rt.scope():
        p = rt.submit("make_p", outputs=[256]).get_ref(0)
        rt.submit("read_p", inputs=[p])
        n = rt.submit("make_n", outputs=[256]).get_ref(0)
        rt.submit("use_n", inputs=[n])


def test_the_boundary_is_the_oldest_live_slice_s_first_output_byte(make_alloc):
    """The 1088-byte slice skips to virtual 2048 (it would straddle the ring's end); the
    padding it skipped [1024, 2048) is not live. Before the fix: "task 2 needs a live window of
    2112 bytes" with the ring empty."""
    result = checked(two_scopes, RingConfig(cores=1, ring_bytes=2048), make_alloc())
    assert result.fatal is None and result.completed == result.tasks == 4
    assert result.max_live_window_bytes == 1088
    assert [t.start for t in result.plan.tasks] == [0, 1024, 1024, 3136]


@pytest.mark.parametrize(
    ("workload", "ring_bytes", "window"),
    [(read_then_alloc, 1024, 1024), (_ring_targets.nested_scopes, 2048, 1088)],
    ids=["scope-end", "late-reader"],
)
def test_a_slice_freed_by_later_tasks_is_waited_for_not_fatal(
    make_alloc, workload, ring_bytes, window
):
    """Two cores: the non-owner replays past the allocation and frees the slice that holds the
    ring (its scope closes, or its last reader runs). Before the fix: fatal at once, because
    every predecessor was done."""
    for seed in range(5):
        config = RingConfig(cores=2, ring_bytes=ring_bytes, seed=seed)
        result = checked(workload, config, make_alloc())
        assert result.fatal is None and result.completed == result.tasks
        assert result.waits >= 1 and result.max_live_window_bytes == window


def test_one_core_cannot_progress_so_the_same_program_is_fatal_naming_the_holder(make_alloc):
    result = checked(read_then_alloc, RingConfig(cores=1, ring_bytes=1024), make_alloc())
    assert result.fatal == (
        "heap ring too small: task 2 needs a live window of 2048 bytes, more than the ring's"
        " 1024, and no core can make progress (frontier F=1): the ring is held by task 0's"
        " slice [0, 1024), waiting for its scope to close (after task 3)"
    )
    assert result.fatal_task == 2 and result.completed == 2
    assert result.trace[-1][2] == "fatal"


def test_a_fatal_on_an_alloc_task_keeps_its_materialized_outputs(make_alloc):
    result = checked(
        _ring_targets.nested_scopes, RingConfig(cores=1, ring_bytes=2048), make_alloc()
    )
    assert result.fatal == (
        "heap ring too small: task 1 needs a live window of 3136 bytes, more than the ring's"
        " 2048, and no core can make progress (frontier F=0): the ring is held by task 0's"
        " slice [0, 1024), waiting for its reader (task 3) and its scope to close (after"
        " task 3)"
    )
    assert result.fatal_task == 1 and result.completed == 1
    outputs = result.fatal_outputs
    assert outputs.task == 1 and [b.size for b in outputs.outputs] == [256, 16]
    assert all(b.storage is result.ring.storage for b in outputs.outputs)
    # the 1088-byte slice would straddle the ring's end at 2048: it starts at virtual 2048,
    # physical byte 0, so its outputs are the ring's floats 0.. and 256..
    assert [b.offset for b in outputs.outputs] == [0, 256]
    assert outputs.get_ref(1) is outputs.outputs[1]


def root_then_scoped(rt) -> None:
    """A 1024-byte tensor in the root scope (never reclaimed), then a scoped 64-byte one."""
    rt.alloc_tensors(256)
    with rt.scope():
        rt.alloc_tensors(16)


def test_a_ring_held_by_the_root_scope_says_it_never_closes(make_alloc):
    """The holder of a root-scope slice waits for no task: the message says its scope never
    closes (before: "its scope to close (after task 2)", a task the program does not have)."""
    result = checked(root_then_scoped, RingConfig(cores=1, ring_bytes=1024), make_alloc())
    assert result.fatal == (
        "heap ring too small: task 1 needs a live window of 1088 bytes, more than the ring's"
        " 1024, and no core can make progress (frontier F=0): the ring is held by task 0's"
        " slice [0, 1024), waiting for the root scope to close, which it never does"
    )
    assert result.fatal_task == 1 == _ring_programs.one_core_verdict(result.plan)


def readers_after(rt, k: int) -> None:
    """In one scope: a 1024-byte tensor, a 64-byte one, then ``k`` readers of the first."""
    with rt.scope():
        p = rt.alloc_tensors(256).get_ref(0)
        rt.alloc_tensors(16)
        for _ in range(k):
            rt.submit("read", inputs=[p], cost_ns=10)


@pytest.mark.parametrize(
    ("k", "readers"),
    [
        (2, "its readers (task 2, 3)"),
        (8, "its readers (task 2, 3, 4, 5, 6, 7, 8, 9)"),
        (9, "its readers (task 2, 3, 4, 5, 6, 7, 8, 9, ...)"),
    ],
    ids=["2", "8", "9"],
)
def test_the_holder_message_lists_at_most_eight_pending_readers(make_alloc, k, readers):
    """One core stalls on the second allocation with every reader of the first still to come:
    the message names the pending readers, the first eight of them, then "..."."""
    result = checked(readers_after, RingConfig(cores=1, ring_bytes=1024), make_alloc(), k=k)
    assert result.fatal == (
        "heap ring too small: task 1 needs a live window of 1088 bytes, more than the ring's"
        " 1024, and no core can make progress (frontier F=0): the ring is held by task 0's"
        f" slice [0, 1024), waiting for {readers} and its scope to close (after task {k + 1})"
    )


def three_root_slices(rt, kind: str) -> None:
    """Three 1024-byte slices in the root scope (never reclaimed), as allocations or as
    kernel outputs."""
    for _ in range(3):
        if kind == "alloc":
            rt.alloc_tensors(256)
        else:
            rt.submit("make", outputs=[256], cost_ns=10)


@pytest.mark.parametrize("kind", ["alloc", "kernel"])
def test_a_stall_with_every_core_blocked_reports_the_oldest_blocked_task(make_alloc, kind):
    """Two cores, a 1024-byte ring: one core blocks on task 1, the one that lost its claim
    goes on and blocks on task 2. The stall is reported once, on task 1 (the oldest blocked
    task), whichever core blocked first."""
    for seed in range(4):
        config = RingConfig(cores=2, ring_bytes=1024, seed=seed)
        result = checked(three_root_slices, config, make_alloc(), kind=kind)
        assert result.fatal == (
            "heap ring too small: task 1 needs a live window of 2048 bytes, more than the"
            " ring's 1024, and no core can make progress (frontier F=0): the ring is held by"
            " task 0's slice [0, 1024), waiting for the root scope to close, which it never"
            " does"
        )
        assert result.fatal_task == 1 and result.completed == 1 and result.waits == 2
        assert sorted(task for _, _, event, task in result.trace if event == "claim") == [0, 1, 2]
        if kind == "alloc":
            assert result.fatal_outputs.task == 1
        else:
            assert result.fatal_outputs is None


def overwrite_and_grow(rt) -> None:
    """In one scope: an 832-byte tensor, then a kernel that writes it and outputs 256 bytes
    (which skip to the ring's next lap): the slice it needs waits for the kernel itself."""
    with rt.scope():
        p = rt.alloc_tensors(200).get_ref(0)
        rt.submit("grow", writes=[p], outputs=[64], cost_ns=10)


@pytest.mark.parametrize(
    ("cores", "waits"),
    [(1, "its reader (task 1) and its scope to close (after task 1)"), (2, "its reader (task 1)")],
)
def test_the_holder_message_drops_a_scope_another_core_replayed_past(make_alloc, cores, waits):
    """One core stalls before the scope's end; with two, the core that lost the claim replays
    past it, so the holder waits only for its reader (a true fatal: that reader is the
    blocked task itself)."""
    for seed in range(3):
        config = RingConfig(cores=cores, ring_bytes=1024, seed=seed)
        result = checked(overwrite_and_grow, config, make_alloc())
        assert result.fatal == (
            "heap ring too small: task 1 needs a live window of 1280 bytes, more than the"
            " ring's 1024, and no core can make progress (frontier F=0): the ring is held by"
            f" task 0's slice [0, 832), waiting for {waits}"
        )


def slow_then_two_slices(rt) -> None:
    """A slow kernel with no heap slice, then two 64-byte slices in one scope (no get_ref)."""
    rt.submit("slow", cost_ns=1_000_000)
    with rt.scope():
        rt.alloc_tensors(16)
        rt.alloc_tensors(16)


def test_the_pre_fix_path_wraps_in_exact_mode_too(make_alloc):
    """The pre-fix path keeps the seed's rule in both modes, false fatals included: the core
    that ran the slow kernel replays the first alloc after every slice died, so its window is
    vend[1] minus the newest slice's end, which wraps (64 - 128, as uint64_t)."""
    config = RingConfig(cores=2, ring_bytes=1024, alloc_election=False)
    result = ring.run(slow_then_two_slices, config, make_alloc())
    assert result.fatal == (
        f"heap ring too small: task 1 needs a live window of {2**64 - 64} bytes, more than the"
        " ring's 1024 (frontier F=2)"
    )
    assert result.completed == 3 and result.fatal_task == 1
    # the core that completed each alloc task logged its passed check (no owner is elected)
    allocs = {task: core for _, core, kind, task in result.trace if kind == "alloc"}
    ends = {task: core for _, core, kind, task in result.trace if kind == "end"}
    assert allocs == {1: ends[1], 2: ends[2]}
    with_election = ring.run(
        slow_then_two_slices, RingConfig(cores=2, ring_bytes=1024), make_alloc()
    )
    assert with_election.fatal is None and with_election.completed == 3


def slow_reader_then_alloc(rt) -> None:
    """A 1024-byte tensor read by a slow kernel, an independent 20 us kernel, then (after the
    scope) a 1024-byte allocation, which must wait for the slow reader."""
    with rt.scope():
        p = rt.alloc_tensors(256).get_ref(0)
        rt.submit("slow", inputs=[p], cost_ns=1_000_500)
        rt.submit("fast", cost_ns=20_000)
    rt.alloc_tensors(256)


def test_the_pre_fix_path_waits_and_logs_like_the_fix(make_alloc):
    """Pre-fix path, three cores, no wrap: the two cores that replay the last allocation
    while the slow reader runs wait (once each, though the fast kernel's end wakes them in
    between), resume the moment the reader ends, and only the core that completes an alloc
    task logs its passed check (every core checks; the others find the task done)."""
    config = RingConfig(cores=3, ring_bytes=1024, jitter=0.0, alloc_election=False)
    result = checked(slow_reader_then_alloc, config, make_alloc())
    assert result.fatal is None and result.completed == 4
    assert result.waits == 2 and sum(result.claims) == 4  # each task has one owner
    events = [(kind, task, core) for _, core, kind, task in result.trace]
    allocs = [(task, core) for kind, task, core in events if kind == "alloc"]
    ends = [(task, core) for kind, task, core in events if kind == "end" and task in (0, 3)]
    claims = [(task, core) for kind, task, core in events if kind == "claim" and task in (0, 3)]
    assert allocs == ends == claims and [task for task, _ in allocs] == [0, 3]
    times = {(kind, task): time for time, _, kind, task in result.trace}
    assert times["end", 1] == 1_002_500 == times["alloc", 3]


def kernel_fatal(rt) -> None:
    """A kernel with a heap output that cannot fit (window mode), then independent work."""
    big = rt.submit("big", outputs=[200]).get_ref(0)
    rt.submit("bigger", inputs=[big], outputs=[200])
    for _ in range(6):
        rt.submit("other", outputs=[1], cost_ns=10)


def test_a_fatal_on_a_kernel_task_ends_the_run(make_alloc):
    """Before the fix the kernel path read the fatal as "wait": with 2 cores, 6 more tasks ran
    after it."""
    config = RingConfig(cores=2, ring_bytes=1024, reclaim="window", h=4)
    result = checked(kernel_fatal, config, make_alloc())
    assert result.fatal.startswith("heap ring too small: task 1 needs a live window of 1856")
    assert result.fatal_task == 1
    fatal_at = next(i for i, e in enumerate(result.trace) if e[2] == "fatal")
    assert fatal_at == len(result.trace) - 1, result.trace[fatal_at:]
    assert result.completed == 1
    # the claims per core count the tasks each core claimed, none of those never claimed
    claimed = [core for _, core, kind, _ in result.trace if kind == "claim"]
    assert result.claims == (claimed.count(0), claimed.count(1)) and len(claimed) < 8


@pytest.mark.backends("cpu")
def test_one_core_agrees_with_the_brute_force_oracle(make_alloc, stress_scale):
    """Exact reclaim, one core, random programs (1-byte to 1 KiB outputs, nested scopes,
    rings of 256 B to 4 KiB): the simulator's verdict is the physical-bytes oracle's, task for
    task, in both directions."""
    alloc = make_alloc()

    @settings(max_examples=200 * min(stress_scale, 5), deadline=None)
    @given(_ring_programs.PROGRAMS, st.sampled_from([256, 512, 1024, 2048, 4096]))
    @example(_ring_programs.TWO_SCOPES, 2048)
    def check(ops, ring_bytes):
        config = RingConfig(cores=1, ring_bytes=ring_bytes)
        result = checked(_ring_programs.workload(ops), config, alloc)
        expected = _ring_programs.one_core_verdict(result.plan)
        assert result.fatal_task == expected, (result.fatal, expected)
        if expected is None:
            assert result.completed == result.tasks

    check()


@pytest.mark.backends("cpu")
def test_more_cores_complete_whatever_one_core_completes(make_alloc, stress_scale):
    """A program one core runs to the end is never fatal on more cores (any seed, any lag),
    and every exact-mode "heap ring too small" is a stall: no core could make progress."""
    alloc = make_alloc()

    @settings(max_examples=100 * min(stress_scale, 5), deadline=None)
    @given(
        _ring_programs.PROGRAMS,
        st.sampled_from([256, 512, 1024, 2048]),
        st.integers(2, 5),
        st.integers(0, 1000),
        st.sampled_from([(), ((1, 16.0),)]),
    )
    def check(ops, ring_bytes, cores, seed, lag):
        program = _ring_programs.workload(ops)
        config = RingConfig(cores=cores, ring_bytes=ring_bytes, seed=seed, lag=lag)
        result = checked(program, config, alloc)
        if result.fatal and result.fatal.startswith("heap ring too small"):
            assert "no core can make progress" in result.fatal
        if _ring_programs.one_core_verdict(result.plan) is None:
            assert result.fatal is None and result.completed == result.tasks

    check()


def test_teeth_the_oracle_catches_the_padded_boundary(make_alloc, monkeypatch):
    """Mutant probe: the pre-fix boundary (the slice's ``start``, padding included) disagrees
    with the oracle on the two-scope program."""
    from runtime.ring import _sim

    def padded(self):
        owners = self.heap_owners
        while self.tail < len(owners) and self._dead(owners[self.tail]):
            self.tail += 1
        return self.tasks[owners[self.tail]].start if self.tail < len(owners) else 0

    monkeypatch.setattr(_sim._Engine, "_boundary", padded)
    result = ring.run(two_scopes, RingConfig(cores=1, ring_bytes=2048), make_alloc())
    assert result.fatal_task == 2 != _ring_programs.one_core_verdict(result.plan)


def test_teeth_exact_reclaim_must_wait_for_the_scope_to_close(make_alloc, monkeypatch):
    """Without the scope condition a slice dies as soon as its readers known from the plan are
    done, which a real runtime cannot know: one core then "fits" a slice the oracle (and the
    scope rule) says cannot fit."""
    config = RingConfig(cores=1, ring_bytes=1024)
    result = checked(read_then_alloc, config, make_alloc())
    assert result.fatal_task == 2 == _ring_programs.one_core_verdict(result.plan)
    _ring_mutants.apply("exact_reclaim_ignores_scope", monkeypatch)
    mutant = ring.run(read_then_alloc, config, make_alloc())
    assert mutant.fatal is None != _ring_programs.one_core_verdict(mutant.plan)


def span_h(rt, n: int = 12, h: int = 4) -> None:
    """Task k outputs 16 floats (one 64-byte slice) and reads task k - h's output: every span
    is exactly H."""
    outs = []
    for k in range(n):
        inputs = [outs[k - h]] if k >= h else []
        outs.append(rt.submit("step", inputs=inputs, outputs=[16], cost_ns=100).get_ref(0))


def test_window_reclaim_frees_up_to_vend_f_minus_h_exactly(make_alloc, monkeypatch):
    """Window mode, spans of exactly H=4: H + 1 live slices (320 bytes) fit; one slice less is
    fatal. The boundary one task late (``vend[F - H + 1]``) squeezes the run into 256 bytes,
    and the trace checker sees the reader's bytes overwritten."""
    for cores in (1, 3):
        fits = RingConfig(cores=cores, reclaim="window", h=4, ring_bytes=320)
        assert checked(span_h, fits, make_alloc()).fatal is None
        small = RingConfig(cores=cores, reclaim="window", h=4, ring_bytes=256)
        assert checked(span_h, small, make_alloc()).fatal.startswith("heap ring too small")
    _ring_mutants.apply("window_boundary_one_late", monkeypatch)
    config = RingConfig(cores=1, reclaim="window", h=4, ring_bytes=256)
    problems = ring.check_trace(ring.run(span_h, config, make_alloc()))
    assert any("reused ring bytes of task 0's slice while task 4" in p for p in problems), problems
