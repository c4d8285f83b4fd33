"""A task runtime's heap ring, simulated on the allocator: single-owner ``alloc_tensors``,
exact dependency reclaim, and the seed's pre-fix path for its mutant probe.

Source: ``../shared/seeds/pto-ring-heap-and-tensormap.txt`` (PyPTO's
``fully_distributed_within_core`` runtime: every core replays the whole orchestration, cores
race for each task with a fetch-max claim, task outputs live on a heap ring reclaimed behind
the completion frontier). Contract: ``../shared/DESIGN.md`` 5.3.

Pieces (each in its own private module of this package, re-exported here):

- :func:`plan` / :class:`Orchestrator` (``_program``): run a workload's orchestration once
  and record tasks, heap addresses, dependencies (via :mod:`runtime.tensormap`) and scopes,
  as :class:`Columns` (its :class:`PlannedTask` objects made on access);
- :func:`simulate` / :class:`RingConfig` / :class:`RunResult` (``_sim``): the seeded
  multi-core simulation over one ring storage from the allocator;
- :func:`check_trace` (``_trace``): every task's inputs complete when it ran, no live heap
  byte reused, checked by brute force over the trace;
- :func:`run` and the command line :func:`main` (``_run``; ``python -m runtime.ring`` runs
  ``__main__``);
- :data:`WORKLOADS` (``_workloads``): ``paged_attention``, ``long_span``, ``tiles``, and
  :func:`task_count`, the tasks a workload submits, without planning it.

Example::

    from allocator import Allocator, AllocatorConfig
    from runtime import ring

    alloc = Allocator(AllocatorConfig(backend="sim"))
    result = ring.run("paged_attention", ring.RingConfig(lag=((3, 16.0),)), alloc, batch=64)
    assert result.fatal is None and not ring.check_trace(result)

The command line: ``python -m runtime.ring run --workload paged_attention --batch 64
--q-tiles 2 --cores 4 --seed 0 --replay busy-wait --lag 3:16``.
"""

from __future__ import annotations

from ._program import (
    HEAP,
    Columns,
    Orchestrator,
    Plan,
    PlanLimits,
    PlannedTask,
    PlannedTasks,
    TaskRefs,
    Tensor,
    plan,
)
from ._run import cli_parser, format_summary, main, run
from ._sim import (
    MASK64,
    MAX_CORES,
    MAX_LAG,
    RECLAIM_MODES,
    REPLAY_MODES,
    RingConfig,
    RunResult,
    TaskOutputTensors,
    simulate,
)
from ._trace import check_trace, ground_truth_overwrites, ground_truth_producers
from ._workloads import WORKLOADS, long_span, paged_attention, task_count, tiles

__all__ = [
    "HEAP",
    "MASK64",
    "MAX_CORES",
    "MAX_LAG",
    "RECLAIM_MODES",
    "REPLAY_MODES",
    "WORKLOADS",
    "Columns",
    "Orchestrator",
    "Plan",
    "PlanLimits",
    "PlannedTask",
    "PlannedTasks",
    "RingConfig",
    "RunResult",
    "TaskOutputTensors",
    "TaskRefs",
    "Tensor",
    "check_trace",
    "cli_parser",
    "format_summary",
    "ground_truth_overwrites",
    "ground_truth_producers",
    "long_span",
    "main",
    "paged_attention",
    "plan",
    "run",
    "simulate",
    "task_count",
    "tiles",
]
