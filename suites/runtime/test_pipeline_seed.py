"""The seed's own 26 unit tests (``test_pipeline_unit.c``), assertion for assertion.

Two change on purpose, as issue 12 asks: an out-of-range layer is an ``IndexError`` (the seed
answered false), and ``n_heads = 0`` is rejected (the seed returned ``head_dim = 0``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from runtime.checkpoint import checkpoint_plan
from runtime.pipeline import (
    PRESETS,
    CompileConfig,
    ModelDims,
    ane_flops_per_step,
    flops_per_step,
    layer_activation_bytes,
    layer_adam_bytes,
    layer_gradient_bytes,
    layer_weight_bytes,
    max_layers_per_compile,
    plan_pipeline,
    total_model_bytes,
    usable_budget,
)

STORIES110M, STORIES42M, LLAMA7B = PRESETS["stories110m"], PRESETS["stories42m"], PRESETS["llama7b"]


def _ckpt(policy, config, interval=None):
    plan = plan_pipeline(config)
    return plan, checkpoint_plan(
        policy, config.dims.n_layers, interval=interval, group_starts=plan.group_starts
    )


# -- model_config.h ------------------------------------------------------------------------------


def test_dims_init():
    d = ModelDims(dim=768, hidden_dim=2048, n_heads=12, n_kv_heads=12, n_layers=12,
                  vocab_size=32000, seq_len=256)  # fmt: skip
    assert d.head_dim == 64
    assert d.kv_dim == 768
    assert d.score_ch == 12 * 256


def test_stories110m_preset():
    cfg = STORIES110M
    assert (cfg.dims.dim, cfg.dims.n_layers, cfg.dims.n_heads) == (768, 12, 12)
    assert cfg.compile.compile_budget == 119
    assert cfg.compile.headroom_pct > 0.0


def test_llama7b_preset():
    assert (LLAMA7B.dims.dim, LLAMA7B.dims.n_layers, LLAMA7B.dims.hidden_dim) == (4096, 32, 11008)


def test_layer_memory_nonzero():
    d = STORIES110M.dims
    assert layer_weight_bytes(d) > 0
    assert layer_adam_bytes(d) > 0
    assert layer_activation_bytes(d) > 0
    assert layer_gradient_bytes(d) > 0
    assert total_model_bytes(STORIES110M) > 0


def test_adam_is_2x_weights():
    d = STORIES110M.dims
    assert layer_adam_bytes(d) == 2 * layer_weight_bytes(d)


# -- pipeline planning ---------------------------------------------------------------------------


def test_max_layers_per_compile():
    cc = CompileConfig(compile_budget=119, kernels_per_layer=5, static_per_layer=1,
                       headroom_pct=0.10)  # fmt: skip
    assert max_layers_per_compile(cc) == 17  # usable 107, 6 kernels per layer


def test_configurable_headroom():
    max5 = max_layers_per_compile(CompileConfig(headroom_pct=0.05))
    max20 = max_layers_per_compile(CompileConfig(headroom_pct=0.20))
    assert max5 > max20
    assert (max5, max20) == (18, 15)


def test_invalid_headroom_defaults():
    default = max_layers_per_compile(CompileConfig(headroom_pct=0.10))
    assert max_layers_per_compile(CompileConfig(headroom_pct=-0.5)) == default
    assert max_layers_per_compile(CompileConfig(headroom_pct=1.5)) == default


def test_plan_stories110m():
    plan = plan_pipeline(STORIES110M)
    assert plan.n_groups == 1
    group = plan.groups[0]
    assert (group.start, group.end, group.n_layers, group.total_kernels) == (0, 12, 12, 72)


def test_plan_llama7b_multiple_groups():
    plan = plan_pipeline(LLAMA7B)
    assert plan.n_groups >= 2
    assert all(group.n_layers > 0 for group in plan.groups)
    assert sum(group.n_layers for group in plan.groups) == 32
    for before, after in zip(plan.groups, plan.groups[1:], strict=False):
        assert after.start == before.end


def test_plan_kernel_budget():
    plan = plan_pipeline(LLAMA7B)
    c = LLAMA7B.compile
    usable = int(np.float32(c.compile_budget) * (np.float32(1) - np.float32(c.headroom_pct)))
    assert usable == usable_budget(c) == 107
    assert all(group.total_kernels <= usable for group in plan.groups)


def test_plan_single_layer():
    plan = plan_pipeline(STORIES110M.with_overrides(n_layers=1))
    assert plan.n_groups == 1
    assert plan.groups[0].n_layers == 1


def test_plan_exact_budget_fit():
    assert plan_pipeline(STORIES110M.with_overrides(n_layers=17)).n_groups == 1  # 102 <= 107


def test_plan_one_over_budget():
    plan = plan_pipeline(STORIES110M.with_overrides(n_layers=18))  # 108 > 107
    assert plan.n_groups == 2
    assert plan.groups[0].n_layers + plan.groups[1].n_layers == 18


# -- gradient_checkpoint.h -----------------------------------------------------------------------


def test_ckpt_all_saves_everything():
    _, cm = _ckpt("all", STORIES110M)
    assert cm.n_checkpointed == 12
    for i in range(12):
        assert cm.should_save(i)
        assert not cm.needs_recompute(i)
    assert cm.recompute_overhead < 0.001


def test_ckpt_none_saves_minimum():
    _, cm = _ckpt("none", STORIES110M)
    assert cm.n_checkpointed == 1
    assert cm.should_save(0)
    assert cm.needs_recompute(5)


def test_ckpt_sqrt_interval():
    _, cm = _ckpt("sqrt", LLAMA7B)
    assert cm.interval == int(np.sqrt(np.float32(32.0))) == 5
    assert cm.should_save(0)
    assert cm.should_save(5)
    assert not cm.should_save(3)
    assert cm.should_save(31)


def test_ckpt_boundary():
    plan, cm = _ckpt("boundary", LLAMA7B)
    for group in plan.groups:
        assert cm.should_save(group.start)
    assert cm.should_save(31)
    first = plan.groups[0]
    assert first.n_layers > 2
    assert cm.needs_recompute(first.start + first.n_layers // 2)


def test_ckpt_memory_savings():
    acts = layer_activation_bytes(LLAMA7B.dims)
    _, cm_all = _ckpt("all", LLAMA7B)
    _, cm_sqrt = _ckpt("sqrt", LLAMA7B)
    _, cm_none = _ckpt("none", LLAMA7B)
    assert cm_sqrt.avoided_bytes(acts) > 0
    assert cm_none.avoided_bytes(acts) > cm_sqrt.avoided_bytes(acts)
    assert cm_all.avoided_bytes(acts) == 0


def test_ckpt_recompute_depth():
    _, cm = _ckpt("sqrt", LLAMA7B)  # saved: 0, 5, 10, 15, 20, 25, 30, 31
    assert cm.recompute_depth(3) == 3
    assert cm.recompute_depth(7) == 2
    assert cm.recompute_depth(5) == 0


def test_ckpt_out_of_bounds():
    _, cm = _ckpt("all", STORIES110M)
    with pytest.raises(IndexError, match=r"should_save\(-1\): expected a layer in 0 \.\. 11"):
        cm.should_save(-1)
    with pytest.raises(IndexError, match=r"should_save\(100\): expected a layer in 0 \.\. 11"):
        cm.should_save(100)


def test_ckpt_every_n_custom_interval():
    _, cm3 = _ckpt("every_n", LLAMA7B, interval=3)
    _, cm8 = _ckpt("every_n", LLAMA7B, interval=8)
    assert (cm3.interval, cm8.interval) == (3, 8)
    assert cm3.n_checkpointed > cm8.n_checkpointed
    for cm in (cm3, cm8):
        assert cm.should_save(0)
        assert cm.should_save(31)


def test_ckpt_n_checkpointed_accuracy():
    for policy in ("all", "boundary", "sqrt", "every_n", "none"):
        _, cm = _ckpt(policy, LLAMA7B)
        actual = sum(1 for i in range(cm.n_layers) if cm.should_save(i))
        assert cm.n_checkpointed == actual, policy


def test_dims_init_zero_heads():
    d = dataclasses.asdict(STORIES110M.dims)
    with pytest.raises(ValueError, match=r"n_heads=0: expected an integer >= 1"):
        ModelDims(**{**d, "n_heads": 0, "n_kv_heads": 0})


# -- FLOP estimation -----------------------------------------------------------------------------


def test_flops_nonzero():
    total, ane = flops_per_step(STORIES110M), ane_flops_per_step(STORIES110M)
    assert total > 0
    assert ane > 0
    assert ane < total


def test_flops_scale_with_layers():
    assert flops_per_step(STORIES110M) > flops_per_step(STORIES42M)
