"""The ANE pipeline planner, its scheduler and its ``exec()``-restart state file.

From the ANE training seed (``../shared/seeds/ane-pipeline-and-checkpointing.txt``): an Apple
Neural Engine process may compile only about 119 kernels, so a model with more layers than fit
is trained in groups of layers, compiled one group at a time, with an ``exec()`` restart
whenever a group does not fit what the process has left. Tensors live in a memory-mapped state
file that survives the restarts.

- :data:`PRESETS`, :class:`ModelConfig` and the memory and FLOP estimates;
- :func:`plan_pipeline` and :class:`BudgetTracker`, which share :func:`usable_budget`;
- :class:`Scheduler` (the state machine) and :func:`simulate`;
- :class:`StateFile` (atomic create, open with checks and crash recovery, commits, per-layer
  accessors);
- the CLI, :func:`main` (``python -m runtime.pipeline plan | state | train``).

Its modules (private; everything public is re-exported here): ``_model`` (presets, memory and
FLOP estimates), ``_plan`` (the planner and the compile budget), ``_scheduler`` (the training
state machine), ``_statefile`` (the state file), ``_report`` (the plan report), ``_cli`` (the
command line, which ``__main__`` runs). Activation checkpointing, which the planner's reports
price, lives below it in :mod:`runtime.checkpoint` (the same seed); this package imports it,
never the other way.
"""

from __future__ import annotations

from ._cli import interpreter_options, main, restart_argv
from ._model import (
    FLOAT32_BYTES,
    PRESETS,
    CompileConfig,
    ModelConfig,
    ModelDims,
    ane_flops_per_step,
    flops_per_step,
    global_bytes,
    layer_activation_bytes,
    layer_adam_bytes,
    layer_gradient_bytes,
    layer_weight_bytes,
    total_model_bytes,
)
from ._plan import (
    BudgetTracker,
    LayerGroup,
    PipelinePlan,
    effective_headroom,
    max_layers_per_compile,
    plan_pipeline,
    preset,
    usable_budget,
)
from ._report import plan_report
from ._scheduler import Action, Phase, Scheduler, SchedulerState, simulate, simulated_restarts
from ._statefile import (
    HEADER_BYTES,
    INT32_MAX,
    KILL_POINTS,
    LOCK_FD_ENV,
    SENTINEL,
    SLOT_OFFSETS,
    VERSION,
    StateFile,
    StateFileBusy,
    StateFileError,
    StateHeader,
    check_header_fields,
    journal_bytes,
    state_file_bytes,
)

__all__ = [
    "FLOAT32_BYTES",
    "HEADER_BYTES",
    "INT32_MAX",
    "KILL_POINTS",
    "LOCK_FD_ENV",
    "PRESETS",
    "SENTINEL",
    "SLOT_OFFSETS",
    "VERSION",
    "Action",
    "BudgetTracker",
    "CompileConfig",
    "LayerGroup",
    "ModelConfig",
    "ModelDims",
    "Phase",
    "PipelinePlan",
    "Scheduler",
    "SchedulerState",
    "StateFile",
    "StateFileBusy",
    "StateFileError",
    "StateHeader",
    "ane_flops_per_step",
    "check_header_fields",
    "effective_headroom",
    "flops_per_step",
    "global_bytes",
    "interpreter_options",
    "journal_bytes",
    "layer_activation_bytes",
    "layer_adam_bytes",
    "layer_gradient_bytes",
    "layer_weight_bytes",
    "main",
    "max_layers_per_compile",
    "plan_pipeline",
    "plan_report",
    "preset",
    "restart_argv",
    "simulate",
    "simulated_restarts",
    "state_file_bytes",
    "total_model_bytes",
    "usable_budget",
]
