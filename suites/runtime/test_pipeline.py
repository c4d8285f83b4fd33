"""The planner, the budget tracker, the scheduler and the ``plan`` CLI, from the ANE seed
(``../shared/seeds/ane-pipeline-and-checkpointing.txt``) and issue 12's facts."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.pipeline import (
    PRESETS,
    Action,
    BudgetTracker,
    CompileConfig,
    ModelDims,
    Phase,
    Scheduler,
    SchedulerState,
    ane_flops_per_step,
    flops_per_step,
    global_bytes,
    layer_activation_bytes,
    layer_weight_bytes,
    main,
    max_layers_per_compile,
    plan_pipeline,
    preset,
    simulate,
    state_file_bytes,
    total_model_bytes,
    usable_budget,
)

from . import _mutants

# -- model arithmetic, restated from the issue -----------------------------------------------------


@pytest.mark.parametrize("name", list(PRESETS))
def test_memory_and_flops_follow_the_issues_formulas(name):
    config = PRESETS[name]
    d = config.dims
    D, H, S, V, N = d.dim, d.hidden_dim, d.seq_len, d.vocab_size, d.n_layers
    w = (4 * D * D + 3 * H * D + 2 * D) * 4
    a = (10 * D * S + 3 * H * S) * 4
    assert layer_weight_bytes(d) == w
    assert layer_activation_bytes(d) == a
    assert global_bytes(d) == 16 * D * (V + 1)
    assert total_model_bytes(config) == N * (w + 2 * w + w + a) + 16 * D * (V + 1)
    journal = -(-(4096 + 64 * config.dims.n_layers) // 4096) * 4096
    assert state_file_bytes(config) == 4096 + total_model_bytes(config) + journal
    fwd = N * (8 * D * D * S + 6 * D * H * S)
    sdpa = N * 2 * d.n_heads * 5 * S * S * (D // d.n_heads)
    assert flops_per_step(config) == 3 * fwd + sdpa + 6 * V * D * S
    assert ane_flops_per_step(config) == 2 * fwd + sdpa


def test_stories110m_in_numbers():
    config = PRESETS["stories110m"]
    assert layer_weight_bytes(config.dims) == 28_317_696
    assert layer_activation_bytes(config.dims) == 14_155_776
    assert total_model_bytes(config) == 1_922_347_008
    assert (flops_per_step(config), ane_flops_per_step(config)) == (174_248_165_376, 93_012_885_504)


@pytest.mark.parametrize(
    ("name", "shape", "accum"),
    [
        ("stories42m", ("Stories42M", 512, 1376, 8, 8, 8, 32000, 256), 10),
        ("stories110m", ("Stories110M", 768, 2048, 12, 12, 12, 32000, 256), 10),
        ("llama1b", ("LLaMA-1.1B", 2048, 5504, 16, 16, 22, 32000, 512), 4),
        ("llama7b", ("LLaMA-7B", 4096, 11008, 32, 32, 32, 32000, 512), 2),
    ],
)
def test_presets(name, shape, accum):
    config = PRESETS[name]
    d = config.dims
    assert (config.name, d.dim, d.hidden_dim, d.n_heads, d.n_kv_heads, d.n_layers,
            d.vocab_size, d.seq_len) == shape  # fmt: skip
    assert config.compile == CompileConfig(119, 5, 1, accum, 0.10)


# -- planner and tracker: one usable budget --------------------------------------------------------

HEADROOMS = [0.10, 0.05, 0.20, 0.33, 0.5, 0.999, 0.0, -1.0, 1.0, float("nan")]


def check_agreement(budgets=range(1, 1001), headrooms=HEADROOMS) -> None:
    """The planner's groups and the scheduler's tracker agree on what one process may compile:
    the threshold is the planner's usable budget, every group fits a fresh tracker, and one
    more layer than the planner allows would not. AssertionError at the first disagreement."""
    __tracebackhide__ = True
    config = PRESETS["llama7b"].with_overrides(n_layers=40)
    per_layer = config.compile.kernels_per_layer_total
    for headroom in headrooms:
        for budget in budgets:
            cc = dataclasses.replace(config.compile, compile_budget=budget, headroom_pct=headroom)
            tracker = BudgetTracker.for_config(cc)  # the scheduler's way of building it
            usable, most = usable_budget(cc), max_layers_per_compile(cc)
            where = f"budget={budget} headroom={headroom}"
            assert tracker.threshold == usable, (
                f"{where}: tracker {tracker.threshold}, planner {usable}"
            )
            assert tracker.can_fit(most * per_layer), f"{where}: the planner's group does not fit"
            assert not tracker.can_fit((most + 1) * per_layer), (
                f"{where}: the tracker fits {most + 1} layers, the planner groups {most}"
            )
            if most == 0:
                with pytest.raises(ValueError, match="fewer than one layer's 6"):
                    plan_pipeline(dataclasses.replace(config, compile=cc))
                continue
            plan = plan_pipeline(dataclasses.replace(config, compile=cc))
            for group in plan.groups:
                assert BudgetTracker.for_config(cc).can_fit(group.total_kernels), where


def test_planner_and_tracker_agree_for_every_budget_up_to_1000():
    check_agreement()


def test_teeth_the_seeds_two_formulas_are_caught(monkeypatch):
    _mutants.patch("seed_tracker_formula", monkeypatch)
    assert BudgetTracker.for_config(CompileConfig()).threshold == 108  # the seed's tracker
    with pytest.raises(AssertionError, match=r"budget=1 headroom=0.1: tracker 1, planner 0"):
        check_agreement()


@pytest.mark.parametrize(
    ("headroom", "usable", "most"),
    [(0.10, 107, 17), (0.05, 113, 18), (0.20, 95, 15), (0.5, 59, 9), (0.0, 107, 17),
     (1.5, 107, 17), (-0.5, 107, 17), (float("nan"), 107, 17), (0.9999999999, 107, 17),
     (1e-50, 107, 17)],  # 1e-50 is positive but 0 in float32: the fallback, not a 0% headroom
)  # fmt: skip
def test_usable_budget_in_float32_as_the_c_does(headroom, usable, most):
    cc = CompileConfig(headroom_pct=headroom)
    assert (usable_budget(cc), max_layers_per_compile(cc)) == (usable, most)


def test_a_kernel_free_layer_is_one_per_group():
    cc = CompileConfig(kernels_per_layer=0, static_per_layer=0)
    assert max_layers_per_compile(cc) == 1  # the seed's guard


def test_a_one_kernel_layer_fills_the_usable_budget():
    for kernels, static in ((1, 0), (0, 1)):
        cc = CompileConfig(kernels_per_layer=kernels, static_per_layer=static)
        assert max_layers_per_compile(cc) == usable_budget(cc) == 107  # not the 0-kernel guard


def test_tracker():
    tracker = BudgetTracker(threshold=10)
    assert (tracker.can_fit(10), tracker.can_fit(11), tracker.remaining) == (True, False, 10)
    tracker.consume(6)
    assert (tracker.used, tracker.remaining, tracker.needs_restart) == (6, 4, False)
    with pytest.raises(ValueError, match=r"consume\(5\): only 4 of 10 kernels left"):
        tracker.consume(5)
    tracker.consume(4)
    assert (tracker.needs_restart, tracker.remaining) == (True, 0)
    with pytest.raises(ValueError, match="n_kernels=-1"):
        tracker.can_fit(-1)


def test_tracker_errors_in_full():
    tracker = BudgetTracker(threshold=10, used=4)
    with pytest.raises(ValueError) as info:
        tracker.consume(7)
    assert str(info.value) == (
        "consume(7): only 6 of 10 kernels left in this process; an exec() restart must come first"
    )
    assert tracker.used == 4  # refused: nothing counted
    for kwargs, error, message in [
        ({"threshold": -1}, ValueError, "threshold=-1: expected an integer >= 0"),
        ({"threshold": 1.0}, TypeError, "threshold must be an int, got float 1.0"),
        ({"threshold": 3, "used": -2}, ValueError, "used=-2: expected an integer >= 0"),
        ({"threshold": 3, "used": "1"}, TypeError, "used must be an int, got str '1'"),
    ]:
        with pytest.raises(error) as info:
            BudgetTracker(**kwargs)
        assert str(info.value) == message


def test_a_budget_below_one_layer_says_so_in_full():
    config = PRESETS["llama7b"].with_overrides(compile_budget=5)
    with pytest.raises(ValueError) as info:
        plan_pipeline(config)
    assert str(info.value) == (
        "compile_budget=5 with headroom 0.1 leaves 4 usable kernels, fewer than one layer's 6"
        " (5 weight + 1 static): raise the budget or lower the headroom"
    )


# -- the scheduler ---------------------------------------------------------------------------------

C, F, B, R = (
    Action.COMPILE_GROUP,
    Action.RUN_FORWARD_GROUP,
    Action.RUN_BACKWARD_GROUP,
    Action.EXEC_RESTART,
)


def test_llama7b_one_step_action_by_action():
    # groups [0..17) 102 kernels and [17..32) 90 kernels, 107 per process, 2 passes per step
    first_pass = [C, F, R, C, F, R, C, B, R, C, B]
    second_pass = [R, C, F, R, C, F, R, C, B, R, C, B]
    expected = first_pass + second_pass + [Action.WEIGHT_UPDATE, Action.STEP_DONE]
    assert simulate(PRESETS["llama7b"], 1) == expected


@pytest.mark.parametrize(
    ("name", "restarts"), [("stories42m", 9), ("stories110m", 19), ("llama1b", 11), ("llama7b", 7)]
)
def test_restart_counts_per_step(name, restarts):
    config = PRESETS[name]
    plan = plan_pipeline(config)
    passes = config.compile.accum_steps
    for steps in (1, 2):
        actions = simulate(config, steps)
        count = {action: actions.count(action) for action in Action}
        assert count[C] == 2 * plan.n_groups * passes * steps  # backward recompiles every group
        assert count[F] == count[B] == plan.n_groups * passes * steps
        assert (count[Action.WEIGHT_UPDATE], count[Action.STEP_DONE]) == (steps, 1)
        if steps == 1:
            assert count[R] == restarts


def test_scheduler_phases_and_misuse():
    config = PRESETS["stories42m"]
    scheduler = Scheduler(config, 1)
    assert scheduler.next_action() is C
    with pytest.raises(ValueError, match=r"complete\(RUN_FORWARD_GROUP\): the scheduler's next"):
        scheduler.complete(F)
    scheduler.complete(C)
    scheduler.complete(F)
    assert scheduler.state.phase is Phase.BACKWARD
    assert Scheduler(config, 0).next_action() is Action.STEP_DONE
    with pytest.raises(ValueError, match="the run is over"):
        Scheduler(config, 0).complete(Action.STEP_DONE)
    for state, match in [
        (SchedulerState(group=1), r"group=1: expected 0 <= group < 1"),
        (SchedulerState(accum_step=10), r"accum_step=10"),
        (SchedulerState(step=2, total_steps=1), r"step=2"),
    ]:
        with pytest.raises(ValueError, match=match):
            Scheduler(config, 1, state=state)


def test_a_restart_that_cannot_help_is_an_error(monkeypatch):
    monkeypatch.setattr(BudgetTracker, "for_config", classmethod(lambda cls, cc: cls(threshold=5)))
    scheduler = Scheduler(PRESETS["stories42m"], 1)  # 48 kernels per group, 5 per process
    assert scheduler.next_action() is R
    with pytest.raises(ValueError, match="more than a fresh process's 5: restarting cannot help"):
        scheduler.complete(R)


# -- bad model input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "error", "match"),
    [
        ("n_heads", 0, ValueError, r"n_heads=0: expected an integer >= 1"),
        ("dim", -1, ValueError, r"dim=-1"),
        ("n_layers", 1.5, TypeError, r"n_layers must be an int"),
        ("seq_len", True, TypeError, r"seq_len must be an int"),
    ],
)
def test_bad_dims(field, value, error, match):
    fields = {**dataclasses.asdict(PRESETS["stories110m"].dims), field: value}
    with pytest.raises(error, match=match):
        ModelDims(**fields)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"compile_budget": 0}, ValueError, r"compile_budget=0"),
        ({"accum_steps": 0}, ValueError, r"accum_steps=0"),
        ({"kernels_per_layer": -1}, ValueError, r"kernels_per_layer=-1"),
        ({"headroom_pct": "0.1"}, TypeError, r"headroom_pct must be a real number"),
    ],
)
def test_bad_compile_config(kwargs, error, match):
    with pytest.raises(error, match=match):
        CompileConfig(**kwargs)


def test_preset_names_and_overrides():
    with pytest.raises(ValueError, match=r"model='gpt2': expected one of llama1b, llama7b"):
        preset("gpt2")
    config = preset("llama7b", n_layers=4, compile_budget=50, headroom_pct=0.2)
    assert (config.dims.n_layers, config.compile.compile_budget) == (4, 50)
    assert config.compile.headroom_pct == 0.2


# -- the plan CLI ----------------------------------------------------------------------------------


def _run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_plan_json_has_the_issues_keys(capsys):
    status, out, _ = _run(capsys, "plan", "--model", "llama7b", "--checkpoint", "sqrt", "--json")
    report = json.loads(out)
    assert status == 0
    assert set(report) >= {"model", "dims", "usable_budget", "max_layers_per_compile", "groups",
                           "total_exec_restarts", "memory", "flops", "checkpoint",
                           "budget_tracker"}  # fmt: skip
    assert report["model"] == "LLaMA-7B"
    assert (report["dims"]["head_dim"], report["dims"]["kv_dim"], report["dims"]["score_ch"]) == (
        128, 4096, 16384)  # fmt: skip
    assert (report["usable_budget"], report["max_layers_per_compile"]) == (107, 17)
    assert report["groups"] == [[0, 17, 102], [17, 32, 90]]
    assert report["total_exec_restarts"] == 4
    assert set(report["memory"]) == {
        "layer_weight_bytes", "layer_adam_bytes", "layer_gradient_bytes",
        "layer_activation_bytes", "total_model_bytes", "state_file_bytes",
    }  # fmt: skip
    assert set(report["flops"]) == {"per_step", "ane_per_step"}
    ck = report["checkpoint"]
    assert (ck["policy"], ck["interval"], ck["n_checkpointed"]) == ("sqrt", 5, 8)
    assert ck["saved_layers"] == [0, 5, 10, 15, 20, 25, 30, 31]
    acts = report["memory"]["layer_activation_bytes"]
    assert ck["peak_activations"] == 10 and ck["peak_activation_bytes"] == 10 * acts
    assert ck["memory_saved_bytes"] == 22 * acts  # main at 6c47d36: 24, unsaved layers counted
    assert ck["seed_memory_saved_bytes"] == 24 * acts
    assert ck["recompute_overhead"] == 0.75
    assert report["budget_tracker"] == {"threshold": 107}


def test_plan_text(capsys):
    status, out, _ = _run(capsys, "plan", "--model", "llama7b", "--checkpoint", "sqrt")
    assert status == 0
    assert "group 1: layers [17..32)  15 layers,  90 kernels (75 weight + 15 static)" in out
    assert "budget tracker threshold: 107 kernels per process" in out
    assert "8/32 layers saved: 0 5 10 15 20 25 30 31" in out
    assert "  sqrt               5              8    10       75%" in out


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--model", "gpt2"], "invalid choice: 'gpt2'"),
        (["--layers", "0"], "argument --layers: expected an integer in 1 .. 1,000,000, got '0'"),
        (["--checkpoint", "sqrtt"], "invalid choice: 'sqrtt'"),
        (["--checkpoint", "sqrt", "--interval", "3"], "interval=3: policy 'sqrt' takes none"),
        (["--budget", "5"], "leaves 4 usable kernels, fewer than one layer's 6"),
        (["--checkpoint", "sequential", "--interval", "40"], r"segments=40: expected 1 <="),
    ],
)
def test_plan_bad_arguments_exit_2_with_the_reason(capsys, argv, match):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", *argv])
    assert exit_info.value.code == 2
    assert match in capsys.readouterr().err


def test_plan_headroom_out_of_range_warns_and_uses_the_default(capsys):
    status, out, err = _run(capsys, "plan", "--model", "llama7b", "--headroom", "1.5", "--json")
    assert status == 0
    assert "warning: --headroom 1.5 is not in (0, 1); using 0.1" in err
    assert json.loads(out)["usable_budget"] == 107
    _, out, _ = _run(capsys, "plan", "--model", "llama7b", "--headroom", "0.2", "--json")
    assert json.loads(out)["groups"] == [[0, 15, 90], [15, 30, 90], [30, 32, 12]]


@pytest.mark.parametrize("module", ["runtime.pipeline", "runtime.checkpoint"])
def test_public_surface(module):
    import importlib

    mod = importlib.import_module(module)
    assert len(mod.__all__) == len(set(mod.__all__))
    for name in mod.__all__:
        value = getattr(mod, name)
        if callable(value):
            assert value.__doc__, f"{module}.{name} has no docstring"


@pytest.mark.parametrize(
    "policy", ["all", "boundary", "sqrt", "every_n", "none", "sequential", "revolve"]
)
def test_memory_avoided_is_what_the_peak_avoids_for_every_policy(capsys, make_alloc, policy):
    from runtime.checkpoint import checkpoint_plan, run_checkpointed

    assert main(["plan", "--model", "llama7b", "--checkpoint", policy, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    ck, n = report["checkpoint"], 32
    acts = report["memory"]["layer_activation_bytes"]
    # the oracle: the activations the executor really holds at its peak, on the allocator
    plan = checkpoint_plan(policy, n, group_starts=[0, 17])
    live = run_checkpointed(make_alloc(), plan, elems=1).peak_activations
    assert ck["peak_activations"] == live
    assert ck["memory_saved_bytes"] == (n - live) * acts
    assert main(["plan", "--model", "llama7b", "--checkpoint", policy]) == 0
    text = capsys.readouterr().out
    assert f"activation memory at its peak: {live} of 32 activations live" in text
    if policy in ("all", "none"):  # main at 6c47d36 said "4.4 GiB avoided (97%)" for none
        assert "0 B avoided (0%)" in text


# -- restarts: the simulated figure beside the seed's estimate (issue 21 item 8) ---------------


@pytest.mark.parametrize(
    ("model", "per_step", "passes", "estimate"),
    [
        ("stories42m", 9, 10, 2),
        ("stories110m", 19, 10, 2),
        ("llama1b", 11, 4, 4),
        ("llama7b", 7, 2, 4),
    ],
)
def test_plan_prints_the_simulated_restarts_beside_the_estimate(
    capsys, model, per_step, passes, estimate
):

    config = PRESETS[model]
    assert simulate(config, 1).count(Action.EXEC_RESTART) == per_step  # the oracle
    assert main(["plan", "--model", model, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["total_exec_restarts"] == estimate
    assert report["simulated_exec_restarts"] == {
        "per_step": per_step, "passes_per_step": passes, "per_pass": per_step / passes,
    }  # fmt: skip
    assert main(["plan", "--model", model]) == 0
    text = capsys.readouterr().out
    assert (
        f"exec() restarts per forward+backward pass: {per_step / passes:g} simulated"
        f" ({per_step} in a step of {passes} passes)\n    (the seed's estimate, 2 x groups ="
        f" {estimate}, counts every compile as a restart)"
    ) in text


@settings(max_examples=150, deadline=None)
@given(
    layers=st.integers(1, 40),
    budget=st.integers(6, 200),
    accum=st.integers(1, 6),
    steps=st.integers(0, 3),
)
def test_simulated_restarts_is_simulates_count(layers, budget, accum, steps):
    from runtime.pipeline import simulated_restarts

    config = PRESETS["stories42m"].with_overrides(n_layers=layers, compile_budget=budget)
    config = dataclasses.replace(
        config, compile=dataclasses.replace(config.compile, accum_steps=accum)
    )
    try:
        expected = simulate(config, steps).count(Action.EXEC_RESTART)
    except ValueError:  # not even one layer fits
        with pytest.raises(ValueError):
            simulated_restarts(config, steps)
        return
    assert simulated_restarts(config, steps) == expected
