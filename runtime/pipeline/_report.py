"""The ``plan`` report: one plain-data dict (``plan --json``) and its text rendering."""

from __future__ import annotations

import dataclasses

from ..checkpoint import PARAMETRIC, POLICY_NAMES, CheckpointPlan, checkpoint_plan, default_interval
from ._model import (
    ModelConfig,
    ane_flops_per_step,
    flops_per_step,
    human_bytes,
    layer_activation_bytes,
    layer_adam_bytes,
    layer_gradient_bytes,
    layer_weight_bytes,
    total_model_bytes,
)
from ._plan import BudgetTracker, PipelinePlan, effective_headroom
from ._scheduler import simulated_restarts
from ._statefile import state_file_bytes

__all__ = ["plan_report", "render_plan"]


def plan_report(plan: PipelinePlan, checkpoint: CheckpointPlan) -> dict:
    """Everything ``plan`` prints, as plain data (the keys of ``plan --json``)."""
    config = plan.config
    d = config.dims
    acts = layer_activation_bytes(d)
    restarts = simulated_restarts(config, 1)
    return {
        "model": config.name,
        "preset": config.preset,
        "dims": {
            **dataclasses.asdict(d),
            "head_dim": d.head_dim,
            "kv_dim": d.kv_dim,
            "score_ch": d.score_ch,
        },
        "compile": {
            **dataclasses.asdict(config.compile),
            "effective_headroom": float(effective_headroom(config.compile.headroom_pct)),
        },
        "usable_budget": plan.usable_budget,
        "max_layers_per_compile": plan.max_layers_per_compile,
        "groups": [[g.start, g.end, g.total_kernels] for g in plan.groups],
        "total_exec_restarts": plan.total_exec_restarts,
        "simulated_exec_restarts": {
            "per_step": restarts,
            "passes_per_step": config.compile.accum_steps,
            "per_pass": restarts / config.compile.accum_steps,
        },
        "memory": {
            "layer_weight_bytes": layer_weight_bytes(d),
            "layer_adam_bytes": layer_adam_bytes(d),
            "layer_gradient_bytes": layer_gradient_bytes(d),
            "layer_activation_bytes": acts,
            "total_model_bytes": total_model_bytes(config),
            "state_file_bytes": state_file_bytes(config),
        },
        "flops": {"per_step": flops_per_step(config), "ane_per_step": ane_flops_per_step(config)},
        "checkpoint": checkpoint.to_dict(acts),
        "budget_tracker": {"threshold": BudgetTracker.for_config(config.compile).threshold},
    }


def policy_table(plan: PipelinePlan) -> list[dict]:
    """Every policy with its default parameter for ``plan``'s model: name, interval,
    ``n_checkpointed``, the executor's peak activations live and the recompute overhead.

    The parameters are the policies' own defaults (:func:`default_interval`), never
    ``DEVMEM_CKPT_INTERVAL``: one value does not fit every policy (13 segments for 12 layers)."""
    rows = []
    n = plan.config.dims.n_layers
    for name in POLICY_NAMES:
        interval = default_interval(name, n) if name in PARAMETRIC else None
        ckpt = checkpoint_plan(name, n, interval=interval, group_starts=plan.group_starts)
        rows.append(
            {
                "policy": name,
                "interval": ckpt.interval,
                "n_checkpointed": ckpt.n_checkpointed,
                "peak_activations": ckpt.predict().peak_activations,
                "recompute_overhead": ckpt.recompute_overhead,
            }
        )
    return rows


def render_plan(report: dict, policies: list[dict]) -> str:
    """The text of ``plan`` (without ``--json``)."""
    d, c, m, f, ck = (report[k] for k in ("dims", "compile", "memory", "flops", "checkpoint"))
    sim = report["simulated_exec_restarts"]
    n = d["n_layers"]
    lines = [
        f"=== Pipeline plan: {report['model']} ===",
        f"  {n} layers | dim={d['dim']} hidden={d['hidden_dim']} heads={d['n_heads']}"
        f" kv_heads={d['n_kv_heads']} seq={d['seq_len']} vocab={d['vocab_size']}",
        f"  head_dim={d['head_dim']} kv_dim={d['kv_dim']} score_ch={d['score_ch']}",
        f"  compile budget {c['compile_budget']}, headroom {c['effective_headroom']:.2f}"
        f" -> {report['usable_budget']} usable kernels per process",
        f"  {c['kernels_per_layer']} weight + {c['static_per_layer']} static kernels per layer"
        f" -> at most {report['max_layers_per_compile']} layers per compile",
        f"  {len(report['groups'])} layer group(s):",
    ]
    kpl, spl = c["kernels_per_layer"], c["static_per_layer"]
    for index, (start, end, total) in enumerate(report["groups"]):
        layers = end - start
        lines.append(
            f"    group {index}: layers [{start}..{end}) {layers:>3} layers, {total:>3} kernels"
            f" ({layers * kpl} weight + {layers * spl} static)"
        )
    lines += [
        f"  exec() restarts per forward+backward pass: {sim['per_pass']:g} simulated"
        f" ({sim['per_step']} in a step of {sim['passes_per_step']} passes)",
        f"    (the seed's estimate, 2 x groups = {report['total_exec_restarts']}, counts every"
        " compile as a restart)",
        f"  budget tracker threshold: {report['budget_tracker']['threshold']} kernels per process",
        "",
        "=== Memory (float32) ===",
        f"  per layer: weights {human_bytes(m['layer_weight_bytes'])},"
        f" Adam {human_bytes(m['layer_adam_bytes'])},"
        f" gradients {human_bytes(m['layer_gradient_bytes'])},"
        f" activations {human_bytes(m['layer_activation_bytes'])}",
        f"  total model state {human_bytes(m['total_model_bytes'])};"
        f" state file {m['state_file_bytes']:,} bytes ({human_bytes(m['state_file_bytes'])})",
        "",
        "=== Compute per step (one forward+backward pass) ===",
        f"  {f['per_step'] / 1e9:,.1f} GFLOP, of which {f['ane_per_step'] / 1e9:,.1f} GFLOP on"
        f" the ANE ({100 * f['ane_per_step'] / f['per_step']:.0f}%)",
        "",
        f"=== Checkpoint policy: {ck['policy']}"
        + (f" (interval {ck['interval']})" if ck["interval"] is not None else "")
        + " ===",
        f"  {ck['n_checkpointed']}/{n} layers saved: {' '.join(map(str, ck['saved_layers']))}",
    ]
    if ck.get("boundary_layers"):
        lines.append(f"  segment inputs kept: {' '.join(map(str, ck['boundary_layers']))}")
    act_all = n * m["layer_activation_bytes"]
    lines += [
        f"  activation memory at its peak: {ck['peak_activations']} of {n} activations live,"
        f" {human_bytes(ck['peak_activation_bytes'])} of {human_bytes(act_all)};"
        f" {human_bytes(ck['memory_saved_bytes'])} avoided"
        f" ({100 * ck['memory_saved_bytes'] / act_all:.0f}%)",
        f"  checkpointed activations: {human_bytes(ck['saved_activation_bytes'])}",
        f"  recompute overhead: {100 * ck['recompute_overhead']:.0f}% extra forward FLOPs",
        "",
        "=== Policies compared (default parameters; peak: activations live at once when run) ===",
        f"  {'policy':<11} {'interval':>8} {'n_checkpointed':>14} {'peak':>5} {'recompute':>9}",
    ]
    for row in policies:
        interval = "-" if row["interval"] is None else str(row["interval"])
        lines.append(
            f"  {row['policy']:<11} {interval:>8} {row['n_checkpointed']:>14}"
            f" {row['peak_activations']:>5} {100 * row['recompute_overhead']:>8.0f}%"
        )
    return "\n".join(lines)


def model_summary(config: ModelConfig) -> str:
    """``LLaMA-7B (32 layers, dim 4096)``."""
    return f"{config.name} ({config.dims.n_layers} layers, dim {config.dims.dim})"
