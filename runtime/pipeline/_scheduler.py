"""The pipeline scheduler: which action a training loop takes next (the seed's
``PipelineScheduler``).

One training step is ``accum_steps`` forward+backward passes and a weight update. A pass
compiles and runs each layer group forward (first to last), then compiles and runs each group
backward (last to first: backward recompiles every group). A group whose kernels do not fit what
the process has left needs an ``EXEC_RESTART`` before its ``COMPILE_GROUP``.

The loop is::

    while (action := scheduler.next_action()) is not Action.STEP_DONE:
        ...                                  # do it (compile, run, save and exec, update)
        scheduler.complete(action)

``next_action`` never changes the state; ``complete`` applies the action's transition.
"""

from __future__ import annotations

import dataclasses
import enum

from .._checks import check_int
from ._model import ModelConfig
from ._plan import BudgetTracker, PipelinePlan, plan_pipeline

__all__ = ["Action", "Phase", "Scheduler", "SchedulerState", "simulate", "simulated_restarts"]


class Phase(enum.IntEnum):
    """Where a pass is (the values are stored in the state file)."""

    FORWARD = 1
    BACKWARD = 2
    WEIGHT_UPDATE = 3


class Action(enum.IntEnum):
    """What the training loop does next (the values index the state file's action counters)."""

    COMPILE_GROUP = 0
    RUN_FORWARD_GROUP = 1
    RUN_BACKWARD_GROUP = 2
    EXEC_RESTART = 3
    WEIGHT_UPDATE = 4
    STEP_DONE = 5


@dataclasses.dataclass(frozen=True)
class SchedulerState:
    """What survives an ``exec()`` restart (saved in the state file's header).

    Attributes:
        phase: the current :class:`Phase`.
        group: the layer group being compiled or run.
        step: training steps completed.
        accum_step: forward+backward passes completed in the current step.
        total_steps: steps to run.
        learning_rate: the optimizer's learning rate.
        last_loss: the last loss seen (999.0 before any).
    """

    phase: Phase = Phase.FORWARD
    group: int = 0
    step: int = 0
    accum_step: int = 0
    total_steps: int = 1
    learning_rate: float = 3e-4
    last_loss: float = 999.0


class Scheduler:
    """The state machine of one training run.

    Args:
        config: the model (its plan comes from :func:`plan_pipeline`).
        total_steps: training steps to run, >= 0.
        learning_rate: stored with the state.
        state: a state to resume from (after an ``exec()`` restart); the compile budget starts
            fresh, as in a new process.

    Raises:
        TypeError, ValueError: a bad ``total_steps``, or a ``state`` that does not fit the plan
            (its group or accumulation step out of range); the message names the field.
        ValueError: the plan cannot be made (see :func:`plan_pipeline`).

    Attributes:
        plan: the :class:`PipelinePlan`.
        tracker: this process's :class:`BudgetTracker`.
        state: the current :class:`SchedulerState` (read it; :meth:`complete` replaces it).
    """

    def __init__(
        self,
        config: ModelConfig,
        total_steps: int,
        *,
        learning_rate: float = 3e-4,
        state: SchedulerState | None = None,
    ) -> None:
        self.plan: PipelinePlan = plan_pipeline(config)
        self.tracker = BudgetTracker.for_config(config.compile)
        self._compiled = False
        if state is None:
            state = SchedulerState(
                total_steps=check_int("total_steps", total_steps, 0), learning_rate=learning_rate
            )
        self._check(state)
        self.state = state

    def _check(self, state: SchedulerState) -> None:
        n_groups = self.plan.n_groups
        accum = self.plan.config.compile.accum_steps
        check_int("total_steps", state.total_steps, 0)
        if not 0 <= state.step <= state.total_steps:
            raise ValueError(f"step={state.step}: expected 0 <= step <= {state.total_steps}")
        if not 0 <= state.accum_step < accum:
            raise ValueError(f"accum_step={state.accum_step}: expected 0 <= accum_step < {accum}")
        if not 0 <= state.group < n_groups:
            raise ValueError(f"group={state.group}: expected 0 <= group < {n_groups}")
        if not isinstance(state.phase, Phase):
            raise ValueError(f"phase={state.phase!r}: expected a Phase")

    def next_action(self) -> Action:
        """The action to take now; ``STEP_DONE`` once every step has run. Changes nothing."""
        state = self.state
        if state.step >= state.total_steps:
            return Action.STEP_DONE
        if state.phase is Phase.WEIGHT_UPDATE:
            return Action.WEIGHT_UPDATE
        if self._compiled:
            if state.phase is Phase.FORWARD:
                return Action.RUN_FORWARD_GROUP
            return Action.RUN_BACKWARD_GROUP
        if self.tracker.can_fit(self.plan.groups[state.group].total_kernels):
            return Action.COMPILE_GROUP
        return Action.EXEC_RESTART

    def complete(self, action: Action) -> None:
        """Record that ``action`` (the current :meth:`next_action`) was done.

        ``EXEC_RESTART`` starts a fresh compile budget, as the new process would (a loop that
        really restarts builds a new scheduler from the saved state instead).

        Raises:
            ValueError: ``action`` is not the current :meth:`next_action`, or it is
                ``STEP_DONE`` (there is nothing after it), or an ``EXEC_RESTART`` would not help
                (a fresh process cannot fit the group either).
        """
        expected = self.next_action()
        if action is not expected or action is Action.STEP_DONE:
            raise ValueError(
                f"complete({Action(action).name}): the scheduler's next action is"
                f" {expected.name}" + (" (the run is over)" if expected is Action.STEP_DONE else "")
            )
        state = self.state
        groups = self.plan.groups
        if action is Action.EXEC_RESTART:
            if self.tracker.used == 0:
                raise ValueError(
                    f"group {state.group} needs {groups[state.group].total_kernels} kernels, more"
                    f" than a fresh process's {self.tracker.threshold}: restarting cannot help"
                )
            self.tracker = BudgetTracker.for_config(self.plan.config.compile)
        elif action is Action.COMPILE_GROUP:
            self.tracker.consume(groups[state.group].total_kernels)
            self._compiled = True
        elif action is Action.RUN_FORWARD_GROUP:
            self._compiled = False
            if state.group + 1 < len(groups):
                self.state = dataclasses.replace(state, group=state.group + 1)
            else:
                self.state = dataclasses.replace(state, phase=Phase.BACKWARD)
        elif action is Action.RUN_BACKWARD_GROUP:
            self._compiled = False
            if state.group > 0:
                self.state = dataclasses.replace(state, group=state.group - 1)
            elif state.accum_step + 1 < self.plan.config.compile.accum_steps:
                self.state = dataclasses.replace(
                    state, phase=Phase.FORWARD, accum_step=state.accum_step + 1
                )
            else:
                self.state = dataclasses.replace(state, phase=Phase.WEIGHT_UPDATE)
        else:  # WEIGHT_UPDATE ends the step
            self.state = dataclasses.replace(
                state, phase=Phase.FORWARD, group=0, step=state.step + 1, accum_step=0
            )

    def describe(self) -> str:
        """One status line: ``step=0/1 accum=1/2 phase=BACKWARD group=1/2 budget=90/107``."""
        s = self.state
        return (
            f"step={s.step}/{s.total_steps}"
            f" accum={s.accum_step}/{self.plan.config.compile.accum_steps}"
            f" phase={s.phase.name} group={s.group}/{self.plan.n_groups}"
            f" budget={self.tracker.used}/{self.tracker.threshold}"
        )


def simulate(config: ModelConfig, total_steps: int) -> list[Action]:
    """Every action of a run of ``total_steps`` steps, restarts simulated in-process, ending
    with ``STEP_DONE``. Raises as :class:`Scheduler`."""
    scheduler = Scheduler(config, total_steps)
    actions = []
    while (action := scheduler.next_action()) is not Action.STEP_DONE:
        actions.append(action)
        scheduler.complete(action)
    actions.append(Action.STEP_DONE)
    return actions


def simulated_restarts(config: ModelConfig, total_steps: int = 1) -> int:
    """The ``EXEC_RESTART`` actions of a run of ``total_steps`` steps: the count of
    :func:`simulate`, without building the action list (``O(steps * accum_steps * groups)``).

    A pass compiles each group forward (first to last) and backward (last to first); a compile
    that does not fit what the process has left restarts it first, and the budget carries over
    between passes and steps.

    Raises:
        TypeError, ValueError: as :class:`Scheduler`.
    """
    steps = check_int("total_steps", total_steps, 0)
    plan = plan_pipeline(config)
    threshold = BudgetTracker.for_config(config.compile).threshold
    costs = [g.total_kernels for g in plan.groups]
    sequence = costs + costs[::-1]
    restarts = used = 0
    for _ in range(steps * config.compile.accum_steps):
        for cost in sequence:
            if used + cost > threshold:
                restarts += 1
                used = 0
            used += cost
    return restarts
