"""Activation checkpointing of the ANE training seed
(``../shared/seeds/ane-pipeline-and-checkpointing.txt``): policies with exact counts, and an
executor that runs them on the allocator (DESIGN 5.2).

The lower of the seed's two packages: :mod:`runtime.pipeline` imports it to price its plans,
and nothing here imports the pipeline.

Its modules (private; everything public is re-exported here):

- ``_policies``: :func:`checkpoint_plan`, :class:`CheckpointPlan` and its
  :class:`Prediction` (the policies, their saved sets and exact counts);
- ``_chain``: the schedule of a chain of layers (:class:`Op`), Chen et al.'s schedules and
  their peaks, and :func:`replay`, which counts what a schedule does without an allocator;
- ``_revolve``: Griewank and Walther's binomial schedule and the exhaustive minimum it is
  checked against;
- ``_executor``: :func:`run_checkpointed`, which runs a plan on an allocator;
- ``_knobs``: ``DEVMEM_CKPT_POLICY``, ``DEVMEM_CKPT_INTERVAL`` and ``DEVMEM_COMPILE_HEADROOM``,
  read once per process (:func:`knobs`).
"""

from __future__ import annotations

from ._chain import INPUT, Op, Replay, chen_peak_buffers, chen_peaks, chen_schedule, replay
from ._executor import ChainPlan, ChainRun, chain_result, run_checkpointed
from ._knobs import DEFAULT_HEADROOM, POLICY_NAMES, CheckpointKnobs, knobs
from ._policies import (
    DEFAULT_SCALE,
    EVERY_N_DEFAULT,
    PARAMETRIC,
    CheckpointPlan,
    Prediction,
    checkpoint_plan,
    default_interval,
    scaled_elems,
    sqrt_interval,
)
from ._revolve import (
    beta,
    min_forward_calls,
    optimal_schedule,
    repetition_number,
    revolve_forward_calls,
    revolve_forward_count,
    revolve_schedule,
)

__all__ = [
    "DEFAULT_HEADROOM",
    "DEFAULT_SCALE",
    "EVERY_N_DEFAULT",
    "INPUT",
    "PARAMETRIC",
    "POLICY_NAMES",
    "ChainPlan",
    "ChainRun",
    "CheckpointKnobs",
    "CheckpointPlan",
    "Op",
    "Prediction",
    "Replay",
    "beta",
    "chain_result",
    "checkpoint_plan",
    "chen_peak_buffers",
    "chen_peaks",
    "chen_schedule",
    "default_interval",
    "knobs",
    "min_forward_calls",
    "optimal_schedule",
    "repetition_number",
    "replay",
    "revolve_forward_calls",
    "revolve_forward_count",
    "revolve_schedule",
    "run_checkpointed",
    "scaled_elems",
    "sqrt_interval",
]
