"""Mutants: the seed's bugs, patched back into the runtime (DESIGN 4).

``apply(name)`` patches the calling process only: call it in a death-test child, or use
``patch(name, monkeypatch)`` in-process. Each suite runs at least one of these and asserts that
its own check catches it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from runtime.checkpoint import CheckpointPlan, _policies, sqrt_interval
from runtime.pipeline import (
    BudgetTracker,
    CompileConfig,
    StateFile,
    _cli,
    _statefile,
    effective_headroom,
)


def _seed_count(plan: CheckpointPlan) -> int:
    """The seed's first ``n_checkpointed``: arithmetic per policy, not the saved set's size
    (``n_groups + 1`` for BOUNDARY, ``ceil(N / k)`` for SQRT and EVERY_N)."""
    n = plan.n_layers
    if plan.policy == "boundary":
        return len(plan.group_starts) + 1  # one per group, plus the last layer
    if plan.policy in ("sqrt", "every_n"):
        k = plan.interval if plan.policy == "every_n" else sqrt_interval(n)
        return (n + k - 1) // k
    return len(plan.saved)


def _seed_tracker(cls, compile: CompileConfig) -> BudgetTracker:
    """The seed's tracker: ``budget - int(budget * h)`` (108 for 119 and 10%, not 107)."""
    h = effective_headroom(compile.headroom_pct)
    budget = compile.compile_budget
    return cls(threshold=budget - int(np.float32(budget) * h))


def _restart_drops_argv(argv):
    """The seed's restart: ``execl(argv[0], argv[0], "--pipeline-resume", path)``: only the
    resume flag and the state file survive."""
    path = argv[argv.index("--state") + 1]
    return _ORIGINAL_RESTART(["train", "--state", path, "--resume"])


def _sqrt_float64_minus_epsilon(n_layers: int) -> int:
    """``floor(sqrt(N) - 1e-9)`` in float64: right everywhere but at the perfect squares."""
    return max(1, int(np.sqrt(np.float64(n_layers)) - 1e-9))


_ORIGINAL_RESTART = _cli.restart_argv
_ORIGINAL_COMMIT = StateFile.commit


def _header_at_restart_only(self, header, writes=()):
    """main at 6c47d36: tensors written in place at once, the header only at an
    ``EXEC_RESTART`` and at the end of the run."""
    mapping = self._mapping()
    for offset, data in writes:
        mapping[offset : offset + len(data)] = data
    restart = header.restarts != self.header.restarts
    done = header.scheduler.step == header.scheduler.total_steps
    if restart or done:
        _ORIGINAL_COMMIT(self, header)
    else:
        self.header = dataclasses.replace(header, generation=self.header.generation + 1)


def _commit_without_journal(self, header, writes=()):
    """Tensors written in place before a header-only commit: nothing can undo half a change."""
    mapping = self._mapping()
    for i, (offset, data) in enumerate(writes):
        mapping[offset : offset + len(data)] = data
        if i == 0:
            _statefile._kill_point(self.header.generation + 1, "write")
    _statefile._kill_point(self.header.generation + 1, "written")
    _ORIGINAL_COMMIT(self, header)


def _header_in_place(self, header, writes=()):
    """One header, rewritten in place: a torn write leaves no valid header."""
    self._slot = 1 - self._slot  # commit() writes to the slot it is not in
    _ORIGINAL_COMMIT(self, header, writes)


PATCHES: dict[str, tuple[object, str, Callable]] = {
    "arithmetic_count": (CheckpointPlan, "n_checkpointed", property(_seed_count)),
    "seed_tracker_formula": (BudgetTracker, "for_config", classmethod(_seed_tracker)),
    "restart_drops_argv": (_cli, "restart_argv", _restart_drops_argv),
    "sqrt_float64_minus_epsilon": (_policies, "sqrt_interval", _sqrt_float64_minus_epsilon),
    "header_at_restart_only": (StateFile, "commit", _header_at_restart_only),
    "commit_without_journal": (StateFile, "commit", _commit_without_journal),
    "header_in_place": (StateFile, "commit", _header_in_place),
}


def apply(name: str | None) -> None:
    """Patch mutant ``name`` into this process (``None``: no mutant).

    Raises:
        ValueError: an unknown name.
    """
    if name is None:
        return
    if name not in PATCHES:
        raise ValueError(f"mutant={name!r}: expected one of {', '.join(PATCHES)}")
    owner, attribute, value = PATCHES[name]
    setattr(owner, attribute, value)


def patch(name: str, monkeypatch) -> None:
    """Patch mutant ``name`` for one test (``monkeypatch`` undoes it)."""
    owner, attribute, value = PATCHES[name]
    monkeypatch.setattr(owner, attribute, value)
