"""The checkpoint executor on the allocator: forward calls per layer and peak live bytes equal
the plan's prediction for every policy and N in 1..64, on every backend; ``sequential`` keeps
PyTorch's documented counts; ``revolve`` reaches Griewank and Walther's minimum with at most
``s+1`` activations live."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import DeviceOutOfMemory
from runtime.checkpoint import (
    ChainRun,
    CheckpointPlan,
    Op,
    Replay,
    beta,
    chain_result,
    checkpoint_plan,
    chen_peak_buffers,
    chen_peaks,
    chen_schedule,
    repetition_number,
    replay,
    revolve_forward_count,
    run_checkpointed,
)

from . import _targets

ELEMS = 16
LAYERS = range(1, 65)
PARAMETERS = {
    "all": [None],
    "boundary": [None],
    "sqrt": [None],
    "none": [None],
    "every_n": [1, 2, 3, 4, 7],
    "sequential": [1, 2, 3, 5, 8],
    "revolve": [2, 3, 5, 8],  # s = 1 in the revolve test below
}


def _plans(policy: str):
    for n in LAYERS:
        for parameter in PARAMETERS[policy]:
            if policy == "sequential" and parameter > n:
                continue
            starts = list(range(0, n, 7)) if policy == "boundary" else None
            yield checkpoint_plan(policy, n, interval=parameter, group_starts=starts)


def check_run(plan: CheckpointPlan, run: ChainRun, elems: int = ELEMS) -> None:
    """The executor's measurements against the plan's prediction; AssertionError if off."""
    __tracebackhide__ = True
    predicted = plan.predict()
    where = f"{plan.policy}(interval={plan.interval}) over {plan.n_layers} layers"
    assert run.forward_calls == predicted.forward_calls, f"{where}: forward calls"
    assert run.recomputes == predicted.recomputes, f"{where}: recomputes"
    assert run.peak_bytes == predicted.peak_bytes(elems), (
        f"{where}: peak {run.peak_bytes} bytes, predicted {predicted.peak_bytes(elems)}"
    )
    assert run.peak_activations == predicted.peak_activations, f"{where}: peak activations"
    assert run.kept == plan.saved, f"{where}: kept {run.kept}, saved {plan.saved}"
    assert run.n_kept == plan.n_checkpointed
    assert run.result == chain_result(plan.n_layers), f"{where}: wrong gradient {run.result}"


@pytest.mark.parametrize("policy", list(PARAMETERS))
def test_every_policy_matches_its_prediction(make_alloc, policy):
    for plan in _plans(policy):
        check_run(plan, run_checkpointed(make_alloc(), plan, elems=ELEMS))


def test_check_run_catches_a_wrong_peak_a_wrong_count_and_a_wrong_gradient(make_alloc):
    plan = checkpoint_plan("sqrt", 32)
    run = run_checkpointed(make_alloc(), plan, elems=ELEMS)
    check_run(plan, run)
    with pytest.raises(AssertionError, match=r"sqrt\(interval=5\) over 32 layers: peak"):
        check_run(plan, dataclasses.replace(run, peak_bytes=run.peak_bytes + 4))
    with pytest.raises(AssertionError, match="forward calls"):
        check_run(plan, dataclasses.replace(run, forward_calls=(1,) * 32))
    with pytest.raises(AssertionError, match="wrong gradient"):
        check_run(plan, dataclasses.replace(run, result=run.result - 2))


def test_the_sqrt_plan_of_llama7b_in_numbers(make_alloc):
    plan = checkpoint_plan("sqrt", 32)
    assert plan.saved == (0, 5, 10, 15, 20, 25, 30, 31)
    predicted = plan.predict()
    # forward: input + kept 0..30 (7) + 2 in flight; backward: layers 26..29 recomputed from
    # 25 with 6 kept (0..25), the input and two gradients: 3 + 6 + 4 = 13 buffers
    assert (predicted.recomputes, predicted.peak_buffers) == (24, 13)
    run = run_checkpointed(make_alloc(), plan, elems=ELEMS)
    assert run.peak_bytes == 13 * ELEMS * 4
    assert run.forward_calls == tuple(1 if i in plan.saved else 2 for i in range(32))


# -- sequential: torch.utils.checkpoint.checkpoint_sequential -----------------------------------


def test_sequential_matches_pytorchs_documented_counts(make_alloc):
    # n = 10 functions, 2 segments: the first 5 run twice (checkpointed), the rest once
    plan = checkpoint_plan("sequential", 10, interval=2)
    run = run_checkpointed(make_alloc(), plan, elems=ELEMS)
    assert run.forward_calls == (2,) * 5 + (1,) * 5
    assert (plan.saved, plan.boundaries, plan.n_checkpointed) == ((5, 6, 7, 8, 9), (), 5)
    check_run(plan, run)


def test_sequential_keeps_each_checkpointed_segments_input(make_alloc):
    # 9 functions, 3 segments of 3: [0..2] and [3..5] checkpointed, [6..8] plain; the input of
    # [3..5] (layer 2's output) is kept and [3..5] recomputes from it, not from the model input
    plan = checkpoint_plan("sequential", 9, interval=3)
    assert (plan.saved, plan.boundaries) == ((6, 7, 8), (2,))
    assert [plan.nearest_saved_before(i) for i in range(9)] == [-1, -1, -1, 2, 2, 2, 6, 7, 8]
    assert [plan.recompute_depth(i) for i in range(9)] == [1, 2, 3, 1, 2, 3, 0, 0, 0]
    run = run_checkpointed(make_alloc(), plan, elems=ELEMS)
    assert run.forward_calls == (2,) * 6 + (1,) * 3
    check_run(plan, run)


def test_sequential_segments_that_do_not_divide_leave_the_rest_to_the_last(make_alloc):
    plan = checkpoint_plan("sequential", 10, interval=3)  # size 3: [0..2], [3..5], plain [6..9]
    assert (plan.saved, plan.boundaries) == ((6, 7, 8, 9), (2,))
    check_run(plan, run_checkpointed(make_alloc(), plan, elems=ELEMS))


# -- revolve: Griewank and Walther's binomial schedule -------------------------------------------


@cache
def _minimal_forward_steps(steps: int, snaps: int) -> int:
    """Brute force over every first split: the true minimum the closed form claims."""
    if steps == 1:
        return 0
    if snaps == 1:
        return steps * (steps - 1) // 2
    return min(
        j + _minimal_forward_steps(steps - j, snaps - 1) + _minimal_forward_steps(j, snaps)
        for j in range(1, steps)
    )


def test_the_closed_form_is_the_brute_force_minimum():
    for snaps in range(1, 7):
        for steps in range(1, 41):
            assert revolve_forward_count(steps, snaps) == _minimal_forward_steps(steps, snaps)


def test_revolve_known_values():
    assert revolve_forward_count(10, 1) == 45  # l(l-1)/2: every reversal from the input
    assert revolve_forward_count(32, 5) == 68  # r = 3: 3*32 - C(8, 6)
    assert revolve_forward_count(100, 200) == 99  # ample snapshots: one sweep


def test_beta_is_the_binomial_and_0_for_negative_repetitions():
    assert [beta(3, t) for t in range(4)] == [1, 4, 10, 20]  # C(3+t, 3)
    assert beta(0, 5) == 1
    # t < 0: no steps at all, for any s (math.comb refuses C(-1, 0) and C(-1, 1))
    assert [beta(s, t) for s in (0, 1, 4) for t in (-1, -2, -5)] == [0] * 9


def test_the_repetition_number_is_the_smallest_r_with_beta_at_least_steps():
    for snaps in range(1, 7):
        for steps in range(1, 90):
            r = repetition_number(steps, snaps)
            assert beta(snaps, r) >= steps and (r == 0 or beta(snaps, r - 1) < steps)
    # steps exactly beta(snaps, r): r itself, not r + 1 (the bisection's boundary)
    assert [repetition_number(beta(s, r), s) for s, r in ((1, 3), (3, 2), (5, 3))] == [3, 2, 3]


@pytest.mark.parametrize("count", [repetition_number, revolve_forward_count])
def test_revolve_counts_name_the_bad_argument(count):
    assert repetition_number(1, 1) == 0 and repetition_number(32, 5) == 3
    for args, error, match in (
        ((0, 5), ValueError, r"^steps=0: expected an integer >= 1$"),
        ((32, 0), ValueError, r"^snaps=0: expected an integer >= 1$"),
        ((2.0, 5), TypeError, r"^steps must be an int, got float 2\.0$"),
        ((32, True), TypeError, r"^snaps must be an int, got bool True$"),
    ):
        with pytest.raises(error, match=match):
            count(*args)


@pytest.mark.parametrize("snaps", [1, 2, 3, 4, 6, 9])
def test_revolve_reaches_the_minimum_with_at_most_s_plus_1_activations(make_alloc, snaps):
    for n in LAYERS:
        plan = checkpoint_plan("revolve", n, interval=snaps)
        run = run_checkpointed(make_alloc(), plan, elems=ELEMS)
        assert run.recomputes == revolve_forward_count(n, snaps)
        assert run.peak_activations <= snaps + 1
        # measured by the allocator: input + two gradients + at most s+1 activations
        assert run.peak_bytes == (3 + min(n, snaps + 1)) * ELEMS * 4
        check_run(plan, run)


def test_revolve_origins():
    plan = checkpoint_plan("revolve", 3, interval=5)
    assert plan.saved == (2,)
    assert [plan.nearest_saved_before(i) for i in range(3)] == [-1, 0, 2]
    assert [plan.recompute_depth(i) for i in range(3)] == [1, 1, 0]


# -- the closed form against the schedule ---------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1)))))
def test_the_segment_peak_formula_equals_the_counted_schedule(case):
    n, saved = case
    saved = sorted(saved)
    replayed = replay(n, chen_schedule(n, saved))
    assert replayed.peak_buffers == chen_peak_buffers(n, saved)
    assert replayed.kept == tuple(saved)
    assert replayed.forward_calls == tuple(1 if i in saved else 2 for i in range(n))


@pytest.mark.parametrize(
    ("schedule", "match"),
    [
        (((Op.FORWARD, 1),), "needs A_0 live"),
        (((Op.RELEASE, 0),), "A_0 is not live"),
        (((Op.FORWARD, 0), (Op.BACKWARD, 0)), "before the loss"),
        (((Op.FORWARD, 0), (Op.LOSS, -1)), "ends with activations"),
        (
            ((Op.FORWARD, 0), (Op.LOSS, -1), (Op.LOSS, -1)),
            "^LOSS: the loss gradient exists already$",
        ),
    ],
)
def test_replay_rejects_a_broken_schedule(schedule, match):
    with pytest.raises(ValueError, match=match):
        replay(1, schedule)


F, R, LOSS, B = Op.FORWARD, Op.RELEASE, (Op.LOSS, -1), Op.BACKWARD


@pytest.mark.parametrize(
    ("n", "schedule", "match"),
    [
        (
            2,
            [(F, 0), (F, 1), LOSS, (B, 0)],
            r"^BACKWARD 0: out of order, before the loss or without A_0$",
        ),
        (1, [(F, 0), LOSS, (B, 0), (B, 0), (R, 0)], "BACKWARD 0: out of order"),  # twice
        (2, [(F, 0), (F, 1), (R, 1), LOSS, (B, 1)], "BACKWARD 1: out of order"),  # A_1 not live
        (1, [(F, 0), (F, 0)], r"^FORWARD 0: needs A_-1 live and A_0 not live$"),
        (
            1,
            [(F, 0), LOSS, (B, 0)],
            r"^schedule ends with activations \[0\] live or layers missed$",
        ),
        (
            2,
            [(F, 0), (F, 1), LOSS, (B, 1), (R, 1), (R, 0)],
            r"activations \[\] live or layers missed",
        ),
    ],
)
def test_replay_rejects_a_backward_out_of_order_or_a_layer_left_over(n, schedule, match):
    with pytest.raises(ValueError, match=match):
        replay(n, schedule)


# Three layers, whose forward pass holds all three activations (then frees 0 and 1): the
# backward recomputes 0 and 1 in an arena, releasing A_0 inside it, then recomputes 0 again.
HANDWRITTEN = [
    (F, 0), (F, 1), (F, 2), (R, 0), (R, 1), LOSS, (B, 2), (R, 2),
    (Op.ARENA_ENTER, -1), (F, 0), (F, 1), (R, 0), (B, 1), (Op.ARENA_EXIT, -1),
    (F, 0), (B, 0), (R, 0),
]  # fmt: skip


def test_replay_counts_a_handwritten_schedule_as_the_executor_runs_it(make_alloc):
    """The forward pass's peak (the input and three activations) is above every backward
    step's (input, two gradients and one or two activations): 4 buffers, not 5. An activation
    released inside an arena is not freed again at its exit."""
    replayed = replay(3, HANDWRITTEN)
    assert replayed == Replay(
        forward_calls=(3, 2, 1), peak_buffers=4, peak_activations=3, kept=(2,), origins=(-1, -1, 2)
    )

    class Handwritten:
        n_layers = 3

        def schedule(self):
            return HANDWRITTEN

    run = run_checkpointed(make_alloc(), Handwritten(), elems=ELEMS)
    assert run.forward_calls == replayed.forward_calls
    assert (run.peak_bytes, run.peak_activations) == (4 * ELEMS * 4, 3)
    assert run.kept == replayed.kept
    assert run.result == chain_result(3)


def test_chen_peaks_count_the_boundaries():
    # sequential(9, 3 segments) keeps layer 2 as a restart point: 7 buffers, 9 without it
    assert (
        chen_peak_buffers(9, (6, 7, 8), (2,))
        == 7
        == replay(9, chen_schedule(9, (6, 7, 8), (2,))).peak_buffers
    )
    assert chen_peak_buffers(9, (6, 7, 8)) == 9
    for saved, boundaries, said in [
        ((4,), (), "kept layers 4 .. 4: expected 0 .. 3"),
        ((), (4,), "kept layers 4 .. 4: expected 0 .. 3"),
        ((-1,), (2,), "kept layers -1 .. 2: expected 0 .. 3"),
    ]:
        with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
            chen_peaks(4, saved, boundaries)


# -- the executor in context --------------------------------------------------------------------


@pytest.mark.backends("sim")
def test_out_of_memory_leaves_nothing_allocated(make_alloc):
    alloc = make_alloc(sim_capacity_bytes=10 * ELEMS * 4)  # room for 10 buffers
    plan = checkpoint_plan("all", 32)  # needs 35
    with pytest.raises(DeviceOutOfMemory):
        run_checkpointed(alloc, plan, elems=ELEMS)
    stats = alloc.stats()
    assert (stats.live_bytes, stats.live_buffers, stats.arena_depth) == (0, 0, 0)


def test_inside_a_callers_arena_and_after_an_earlier_peak(make_alloc):
    alloc = make_alloc()
    plan = checkpoint_plan("sqrt", 16)
    with alloc.arena():
        held = alloc.full(4, 1.0)
        run = run_checkpointed(alloc, plan, elems=ELEMS)
        assert alloc.sum(held) == 4.0
    check_run(plan, run)
    big = alloc.full(10_000, 1.0)  # a peak higher than any run's ...
    alloc.release(big)
    assert run_checkpointed(alloc, plan, elems=ELEMS).peak_bytes is None  # ... cannot be split


def test_the_detector_sees_no_use_after_free(make_alloc):
    alloc = make_alloc(arena_debug="raise")
    for policy, interval in [("none", None), ("sequential", 4), ("revolve", 2)]:
        plan = checkpoint_plan(policy, 24, interval=interval)
        check_run(plan, run_checkpointed(alloc, plan, elems=ELEMS), ELEMS)
        alloc = make_alloc(arena_debug="raise")


@pytest.mark.parametrize("latency", [0, 3], ids=["events-done", "events-pending"])
def test_on_the_cuda_backend_over_a_fake_cupy(death, latency):
    report = death.run(_targets.executor_over_fake_cupy, latency).assert_clean().returned
    assert report == {"mismatches": [], "violations": 0, "backend": "cuda"}


def test_with_the_collector_running_at_every_allocation(death, pin):
    outcome = death.run(_targets.executor_under_gc, env=pin(), timeout=60)
    report = outcome.assert_clean().returned
    assert report == {"mismatches": [], "leaks": [], "collections": True}


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"policy": "sqrtt", "n_layers": 4}, ValueError, r"policy='sqrtt': expected one of all,"),
        ({"policy": "all", "n_layers": 0}, ValueError, r"n_layers=0: expected an integer >= 1"),
        ({"policy": "all", "n_layers": -3}, ValueError, r"n_layers=-3"),
        ({"policy": "all", "n_layers": 2.0}, TypeError, r"n_layers must be an int"),
        ({"policy": "every_n", "n_layers": 4, "interval": 0}, ValueError, r"interval=0"),
        ({"policy": "revolve", "n_layers": 4, "interval": 0}, ValueError, r"snaps=0"),
        (
            {"policy": "sequential", "n_layers": 4, "interval": 5},
            ValueError,
            r"^segments=5: expected 1 <= segments <= n_layers=4 \(PyTorch's checkpoint_sequential"
            r" fails for more segments than functions\)$",
        ),
        (
            {"policy": "none", "n_layers": 4, "interval": 2},
            ValueError,
            r"^interval=2: policy 'none' takes none; only every_n, sequential, revolve take one$",
        ),
        (
            {"policy": "boundary", "n_layers": 4},
            ValueError,
            r"^policy 'boundary' needs group_starts \(PipelinePlan\.group_starts\)$",
        ),
        (
            {"policy": "boundary", "n_layers": 4, "group_starts": [1]},
            ValueError,
            r"^group_starts=\[1\]: expected layer indices in 0 \.\. 3, starting with 0$",
        ),
        ({"policy": "boundary", "n_layers": 4, "group_starts": [0, 4]}, ValueError, r"0 \.\. 3"),
    ],
)
def test_bad_plans_are_rejected_naming_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        checkpoint_plan(**kwargs)


@pytest.mark.parametrize("method", ["should_save", "needs_recompute", "nearest_saved_before",
                                    "recompute_depth"])  # fmt: skip
def test_layer_queries_reject_a_layer_out_of_range(method):
    plan = checkpoint_plan("sqrt", 9)
    query = getattr(plan, method)
    for layer in (-1, 9, 100):
        with pytest.raises(IndexError, match=rf"{method}\({layer}\): expected a layer in 0 \.\. 8"):
            query(layer)
    for layer in ("3", 3.0, True):
        said = (
            rf"{method}: layer must be an int, got {type(layer).__name__} {re.escape(repr(layer))}"
        )
        with pytest.raises(TypeError, match=said):
            query(layer)


def test_bad_executor_arguments(make_alloc):
    plan = checkpoint_plan("all", 3)
    with pytest.raises(ValueError, match=r"elems=0: expected an integer >= 1"):
        run_checkpointed(make_alloc(), plan, elems=0)
    with pytest.raises(TypeError, match="elems must be an int"):
        run_checkpointed(make_alloc(), plan, elems="8")
    for method in ("saved_bytes", "avoided_bytes", "peak_activation_bytes", "peak_avoided_bytes"):
        with pytest.raises(
            ValueError, match=r"^layer_activation_bytes=-1: expected an integer >= 0"
        ):
            getattr(plan, method)(-1)
        with pytest.raises(TypeError, match=r"^layer_activation_bytes must be an int, got float"):
            getattr(plan, method)(1.0)


def test_bytes_and_overhead():
    plan = checkpoint_plan("every_n", 10, interval=4)  # saves 0, 4, 8, 9
    assert (plan.saved_bytes(100), plan.avoided_bytes(100)) == (400, 600)
    assert plan.recompute_overhead == 0.6
    assert math.isclose(checkpoint_plan("revolve", 32, interval=5).recompute_overhead, 68 / 32)
    sqrt = checkpoint_plan("sqrt", 32)  # 10 activations live at the peak, 22 of 32 avoided
    assert (sqrt.peak_activation_bytes(100), sqrt.peak_avoided_bytes(100)) == (1000, 2200)
    assert (sqrt.peak_activation_bytes(0), sqrt.peak_avoided_bytes(0)) == (0, 0)
    assert (sqrt.saved_bytes(0), sqrt.avoided_bytes(0)) == (0, 0)


def test_boundary_keeps_its_group_starts_sorted_once():
    plan = checkpoint_plan("boundary", 10, group_starts=[5, 0, 5])
    assert (plan.group_starts, plan.saved, plan.boundaries) == ((0, 5), (0, 5, 9), ())
    assert checkpoint_plan("sqrt", 10, group_starts=[0, 5]).group_starts == ()  # ignored


def test_to_dict_lists_the_boundary_layers_of_sequential_only():
    plan = checkpoint_plan("sequential", 9, interval=3)  # keeps layer 2 as segment [3..5]'s input
    assert plan.to_dict()["boundary_layers"] == [2]
    assert "boundary_layers" not in checkpoint_plan("sequential", 9, interval=2).to_dict()
    assert "boundary_layers" not in checkpoint_plan("sqrt", 9).to_dict()


def test_scaled_elems():
    """A model's per-layer activation bytes / 4 / scale, at least one element."""
    from runtime.checkpoint import DEFAULT_SCALE, scaled_elems

    assert scaled_elems(151_519_232) == 578 == 151_519_232 // 4 // DEFAULT_SCALE  # LLaMA-7B
    assert (scaled_elems(4 * 7 * 3, 7), scaled_elems(4 * 7 * 3 - 1, 7)) == (3, 2)
    assert (scaled_elems(0), scaled_elems(3, 1)) == (1, 1)
    with pytest.raises(ValueError, match=r"^layer_activation_bytes=-1: expected an integer >= 0"):
        scaled_elems(-1)
    with pytest.raises(TypeError, match=r"^layer_activation_bytes must be an int, got str"):
        scaled_elems("8")
    with pytest.raises(ValueError, match=r"^scale=0: expected an integer >= 1"):
        scaled_elems(8, 0)


def test_default_interval_rejects_a_bad_policy_or_layer_count():
    from runtime.checkpoint import default_interval

    with pytest.raises(ValueError, match=r"^n_layers=0: expected an integer >= 1"):
        default_interval("sqrt", 0)
    with pytest.raises(TypeError, match=r"^n_layers must be an int, got float"):
        default_interval("sqrt", 4.0)
    expected = (
        "policy='sqrtt': expected one of all, boundary, sqrt, every_n, none, sequential, revolve"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        default_interval("sqrtt", 4)


# -- closed forms instead of schedules (issue 21 item 11) --------------------------------------


def test_chen_peaks_equal_the_replay_for_every_saved_set_up_to_10_layers():
    for n in range(1, 11):
        for mask in range(1 << n):
            saved = [i for i in range(n) if mask >> i & 1]
            replayed = replay(n, chen_schedule(n, saved))
            assert chen_peaks(n, saved) == (replayed.peak_buffers, replayed.peak_activations), (
                n,
                saved,
            )


def test_chen_peaks_equal_the_replay_for_every_saved_and_boundary_set_up_to_7_layers():
    """Boundaries anywhere, not only where ``sequential`` puts them (there the segment below a
    boundary never holds the peak): each layer plain, saved or a boundary, a boundary followed
    by a plain layer (the segment it restarts; ``chen_schedule`` needs one)."""
    for n in range(1, 8):
        for kinds in itertools.product("psb", repeat=n):
            if any(k == "b" and (i + 1 == n or kinds[i + 1] != "p") for i, k in enumerate(kinds)):
                continue
            saved = [i for i, k in enumerate(kinds) if k == "s"]
            boundaries = [i for i, k in enumerate(kinds) if k == "b"]
            replayed = replay(n, chen_schedule(n, saved, boundaries))
            assert chen_peaks(n, saved, boundaries) == (
                replayed.peak_buffers,
                replayed.peak_activations,
            ), (n, saved, boundaries)
    # the segment below boundary 3 (layers 0..3) holds the peak: 4 activations, 7 buffers
    assert chen_peaks(6, (5,), (3,)) == (7, 4)


def test_chen_peaks_equal_the_replay_for_every_policy_plan_up_to_40_layers():
    for n in range(1, 41):
        plans = [checkpoint_plan("sequential", n, interval=k) for k in range(1, n + 1)]
        plans += [checkpoint_plan("every_n", n, interval=k) for k in range(1, n + 1)]
        plans += [checkpoint_plan(p, n, group_starts=range(0, n, 17)) for p in ("boundary",)]
        plans += [checkpoint_plan(p, n) for p in ("all", "none", "sqrt")]
        for plan in plans:
            replayed = replay(n, chen_schedule(n, plan.saved, plan.boundaries))
            assert chen_peaks(n, plan.saved, plan.boundaries) == (
                replayed.peak_buffers,
                replayed.peak_activations,
            ), (plan.policy, n, plan.interval)


def test_revolve_forward_calls_equal_the_replay():
    from runtime.checkpoint import revolve_forward_calls, revolve_schedule

    for n in range(1, 65):
        for s in range(1, 13):
            assert revolve_forward_calls(n, s) == replay(n, revolve_schedule(n, s)).forward_calls


def test_plan_builds_no_schedule(monkeypatch, capsys):
    """``plan`` predicts from closed forms: a schedule of 100,000 layers is never built (main
    at 6c47d36 replayed every policy's schedule and rescanned the kept layers per layer:
    quadratic, over 120 s). Timing is bench/checkpoint.py's; this checks the structure."""
    from runtime.checkpoint import _chain, _policies, _revolve
    from runtime.pipeline import main

    def refuse(*args, **kwargs):
        raise AssertionError("plan built a schedule")

    for module, name in (
        (_policies, "replay"),
        (_policies, "chen_schedule"),
        (_policies, "revolve_schedule"),
        (_chain, "replay"),
        (_revolve, "revolve_schedule"),
    ):
        monkeypatch.setattr(module, name, refuse)
    for policy in ("all", "boundary", "sqrt", "every_n", "none", "sequential", "revolve"):
        assert main(["plan", "--layers", "100000", "--checkpoint", policy, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["checkpoint"]["policy"] == policy
    assert main(["plan", "--layers", "3000", "--checkpoint", "revolve", "--interval", "1"]) == 0
    assert "recompute overhead: 149950% extra forward FLOPs" in capsys.readouterr().out
