"""The seed's bug as a death test: one child per configuration
(``../shared/seeds/pto-ring-heap-and-tensormap.txt``).

The seed: on a2a3sim, ``paged_attention_unroll`` at batch >= 16 replayed as busy-waits of the
recorded kernel times crashed at random with SIGABRT (``get_ref``'s ``always_assert(index <
output_count_)``); with real kernels it never did. Cause: every core ran ``alloc_tensors``'
back-pressure check, and a core replaying more than H tasks behind the frontier computed
``heap_next - vend[F - H]`` in ``uint64_t``, which wrapped: a false "heap ring too small", an
empty result, the assertion. Fix: one owner elected on a separate cursor runs the check.

Each configuration (batch 4, 16, 64 x busy-wait or kernel replay x a lagging core or not, in
the seed's window mode with H = 64) runs two children: the fixed runtime, which must complete
with no fatal and a clean trace, and the pre-fix path (``alloc_election=False``, the mutant
probe), which must abort with the false fatal and the assertion exactly where the seed's did
(busy-wait, a lagging core, batch >= 16) and pass everywhere else, as in the seed.

That ``kernel`` replay passes is the model's doing, not a property of real kernels: its kernels
cost a 200 ns launch plus 0.5 ns per element, less than replaying one submit (1000 ns), so no
core falls H tasks behind. Priced at 20 or 100 ns per element the pre-fix path aborts in
``kernel`` replay too (:func:`test_kernel_replay_passes_only_because_its_kernels_are_cheap`).
"""

from __future__ import annotations

import functools

import pytest

import harness
from harness import Config, DeathTestFailure, Outcome
from suites.allocator._knobs import pinned_env

from . import _ring_targets

LAG = 16.0
"""Core 3's kernels take 16x their recorded time (a throttled core)."""

FALSE_FATAL = (
    r"set_fatal: heap ring too small: task \d+ needs a live window of 1844674407370\d{7} bytes"
    r", more than the ring's 1048576 \(frontier F=\d+\)\n"
    r"always_assert\(index < output_count_\) failed: get_ref\(0\) on the result of task \d+"
    r" with 0 outputs"
)
"""The window wraps to about 2**64 (18446744073709...), then the assertion fires."""

CASES = {
    f"batch{batch}-{replay}-{'lag' if lag > 1 else 'even'}": (batch, replay, lag)
    for batch in (4, 16, 64)
    for replay in ("busy-wait", "kernel")
    for lag in (1.0, LAG)
}


def expect_completed(outcome: Outcome) -> dict:
    """The suite's check of a run that must complete: clean exit, no fatal, every task done,
    a clean trace."""
    __tracebackhide__ = True
    summary = outcome.assert_clean().returned
    assert summary["fatal"] is None, summary["fatal"]
    assert summary["completed"] == summary["tasks"], summary
    assert summary["violations"] == [], summary["violations"]
    return summary


def expect_seed_abort(outcome: Outcome) -> None:
    """The seed's crash: the false fatal with a wrapped window, then get_ref's assertion."""
    __tracebackhide__ = True
    outcome.assert_aborted(match=FALSE_FATAL)


@harness.matrix([Config(case_id) for case_id in CASES])
def test_the_seeds_bug_with_and_without_election(death, backend, config):
    batch, replay, lag = CASES[config.id]
    run = functools.partial(
        death.run,
        _ring_targets.paged_attention,
        batch,
        replay,
        lag,
        config=config,
        env=pinned_env(backend),
    )
    summary = expect_completed(run(True))
    assert summary["tasks"] == batch * 2 * 8 and summary["alloc_election"] is True
    prefix = run(False)
    if replay == "busy-wait" and lag > 1 and batch >= 16:
        expect_seed_abort(prefix)
        with pytest.raises(DeathTestFailure, match="killed by SIGABRT"):
            expect_completed(prefix)  # the suite's own check fires on the mutant
    else:  # as in the seed: no core falls more than H tasks behind the frontier
        assert expect_completed(prefix)["alloc_election"] is False


@pytest.mark.parametrize("ns_per_element", [20.0, 100.0])
def test_kernel_replay_passes_only_because_its_kernels_are_cheap(death, backend, ns_per_element):
    env = pinned_env(backend)
    target = _ring_targets.paged_attention
    rest = ("window", 0, None, ns_per_element)  # reclaim, seed, mutant, ns_per_element
    expect_completed(death.run(target, 64, "kernel", LAG, True, *rest, env=env))
    expect_seed_abort(death.run(target, 64, "kernel", LAG, False, *rest, env=env))


def test_exact_reclaim_needs_the_election_even_more(death, backend):
    """With exact reclaim the reclaim frontier runs closer to the front than F - H, so the
    pre-fix check wraps even at batch 4 (seed 1); the election keeps it sound."""
    env = pinned_env(backend)
    args = (4, "busy-wait", LAG)
    expect_completed(death.run(_ring_targets.paged_attention, *args, True, "exact", 1, env=env))
    expect_seed_abort(death.run(_ring_targets.paged_attention, *args, False, "exact", 1, env=env))


def test_a_real_fatal_keeps_its_outputs_only_with_the_election(death, backend):
    env = pinned_env(backend)
    fixed = death.run(_ring_targets.nested_allocs, True, env=env).assert_clean().returned
    assert fixed["fatal"].startswith("heap ring too small: task 1 needs a live window of 3136")
    assert fixed["outputs"] == [256, 16] and fixed["violations"] == []
    # the pre-fix path checks before materializing: the same fatal crashes the process
    death.run(_ring_targets.nested_allocs, False, env=env).assert_aborted(
        match=r"set_fatal: heap ring too small: task 1 [\s\S]*get_ref\(0\) on the result of task 1"
    )


def test_get_ref_on_an_empty_result_aborts(death):
    death.run(_ring_targets.empty_get_ref).assert_aborted(
        match=r"always_assert\(index < output_count_\) failed: get_ref\(0\) on the result of"
        r" task 7 with 0 outputs"
    )


def test_teeth_expect_seed_abort_fails_on_a_clean_run(death):
    outcome = death.run(_ring_targets.paged_attention, 4, "busy-wait", LAG, False)
    with pytest.raises(DeathTestFailure, match="exited with status 0"):
        expect_seed_abort(outcome)


def test_the_cli_aborts_on_the_pre_fix_path(death, backend):
    args = ["run", "--batch", "64", "--q-tiles", "2", "--lag", "3:16", "--reclaim", "window"]
    death.run(_ring_targets.cli, *args, env=pinned_env(backend)).assert_exited(0)
    outcome = death.run(_ring_targets.cli, *args, "--no-alloc-election", env=pinned_env(backend))
    expect_seed_abort(outcome)
