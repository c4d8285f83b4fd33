"""The compile-budget planner and the budget tracker, sharing one :func:`usable_budget`.

The ANE compiles a bounded number of kernels per process. The planner splits a model's layers
into contiguous groups that each fit one process's usable budget; the tracker counts what the
running process has compiled and says when a group needs an ``exec()`` restart first.

The seed claimed the two agree but computed the usable budget twice: the planner as
``int(budget * (1 - h))`` in float32 (107 for 119 and 10%), the tracker as
``budget - int(budget * h)`` (108). Here both call :func:`usable_budget`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .._checks import check_int
from ..checkpoint import DEFAULT_HEADROOM, knobs
from ._model import PRESETS, CompileConfig, ModelConfig

__all__ = [
    "BudgetTracker",
    "LayerGroup",
    "PipelinePlan",
    "effective_headroom",
    "max_layers_per_compile",
    "plan_pipeline",
    "preset",
    "usable_budget",
]


def preset(
    name: str,
    *,
    n_layers: int | None = None,
    compile_budget: int | None = None,
    headroom_pct: float | None = None,
) -> ModelConfig:
    """The preset ``name`` (a key of :data:`PRESETS`) with optional overrides.

    ``headroom_pct=None`` takes ``DEVMEM_COMPILE_HEADROOM`` (read once per process), else 0.10.

    Raises:
        ValueError: an unknown name (the message lists the presets), or a bad override.
        TypeError: an override of the wrong type.
    """
    if name not in PRESETS:
        raise ValueError(f"model={name!r}: expected one of {', '.join(sorted(PRESETS))}")
    if headroom_pct is None:
        headroom_pct = knobs().headroom
    return PRESETS[name].with_overrides(
        n_layers=n_layers, compile_budget=compile_budget, headroom_pct=headroom_pct
    )


def effective_headroom(headroom_pct: float) -> np.float32:
    """The headroom actually used, as the C's ``float``: ``headroom_pct`` rounded to float32 if
    ``0 < h < 1`` there, else 0.10 (the seed's fallback, also for NaN and for values beyond
    float32's range, which are never cast: no overflow warning)."""
    if not 0 < headroom_pct < 1:
        return np.float32(DEFAULT_HEADROOM)
    h = np.float32(headroom_pct)
    return h if np.float32(0) < h < np.float32(1) else np.float32(DEFAULT_HEADROOM)


def usable_budget(compile: CompileConfig) -> int:
    """The kernels one process may compile: ``int(budget * (1 - h))``, computed in float32 as
    the seed's C does (119 and 10% give 107; 5% gives 113; 20% gives 95).

    Both the planner and :class:`BudgetTracker` use this one function.
    """
    h = effective_headroom(compile.headroom_pct)
    return int(np.float32(compile.compile_budget) * (np.float32(1) - h))


def max_layers_per_compile(compile: CompileConfig) -> int:
    """The most layers one process can compile: ``usable_budget // per_layer`` with
    ``per_layer = kernels_per_layer + static_per_layer`` (1 if ``per_layer`` is 0, as in the
    seed). 0 means not even one layer fits."""
    per_layer = compile.kernels_per_layer_total
    if per_layer <= 0:
        return 1
    return usable_budget(compile) // per_layer


@dataclasses.dataclass(frozen=True)
class LayerGroup:
    """Layers ``start .. end-1`` compiled together in one process.

    Attributes:
        start: the first layer (inclusive).
        end: one past the last layer (exclusive).
        weight_kernels: ``n_layers * kernels_per_layer``.
        static_kernels: ``n_layers * static_per_layer``.
    """

    start: int
    end: int
    weight_kernels: int
    static_kernels: int

    @property
    def n_layers(self) -> int:
        """``end - start``."""
        return self.end - self.start

    @property
    def total_kernels(self) -> int:
        """``weight_kernels + static_kernels``: what compiling the group costs."""
        return self.weight_kernels + self.static_kernels


@dataclasses.dataclass(frozen=True)
class PipelinePlan:
    """How a model's layers are grouped for compilation (the seed's ``PipelinePlan``).

    Attributes:
        config: the model it plans.
        usable_budget: :func:`usable_budget` of its compile config (kernels per process).
        max_layers_per_compile: :func:`max_layers_per_compile`.
        groups: contiguous groups covering layers ``0 .. n_layers-1``, all of
            ``max_layers_per_compile`` layers but the last, which may be shorter.
        total_exec_restarts: ``2 * len(groups)``: the seed's estimate of ``exec()`` restarts per
            forward+backward pass. It counts compiles (each group is compiled once forward and
            once backward) as if each needed a fresh process; the scheduler restarts only when a
            compile does not fit what the process has left (:func:`simulated_restarts`:
            Stories42M 9 restarts in its 10-pass step, LLaMA-7B 7 in 2).
    """

    config: ModelConfig
    usable_budget: int
    max_layers_per_compile: int
    groups: tuple[LayerGroup, ...]
    total_exec_restarts: int

    @property
    def n_groups(self) -> int:
        """``len(groups)``."""
        return len(self.groups)

    @property
    def group_starts(self) -> tuple[int, ...]:
        """The first layer of each group."""
        return tuple(group.start for group in self.groups)


def plan_pipeline(config: ModelConfig) -> PipelinePlan:
    """Split ``config``'s layers into compile groups (the seed's ``compute_pipeline_plan``).

    The group size is ``min(max_layers_per_compile, n_layers)``; groups are contiguous and the
    last one is shorter when the size does not divide ``n_layers``.

    Raises:
        ValueError: not even one layer fits the usable budget (e.g. ``compile_budget=5`` with 6
            kernels per layer): the scheduler could never compile it. The message gives the
            numbers.
    """
    compile_ = config.compile
    max_layers = max_layers_per_compile(compile_)
    usable = usable_budget(compile_)
    if max_layers < 1:
        raise ValueError(
            f"compile_budget={compile_.compile_budget} with headroom"
            f" {float(effective_headroom(compile_.headroom_pct)):g} leaves {usable} usable"
            f" kernels, fewer than one layer's {compile_.kernels_per_layer_total}"
            f" ({compile_.kernels_per_layer} weight + {compile_.static_per_layer} static): raise"
            " the budget or lower the headroom"
        )
    n_layers = config.dims.n_layers
    size = min(max_layers, n_layers)
    groups = tuple(
        LayerGroup(
            start=start,
            end=min(start + size, n_layers),
            weight_kernels=(min(start + size, n_layers) - start) * compile_.kernels_per_layer,
            static_kernels=(min(start + size, n_layers) - start) * compile_.static_per_layer,
        )
        for start in range(0, n_layers, size)
    )
    return PipelinePlan(
        config=config,
        usable_budget=usable,
        max_layers_per_compile=max_layers,
        groups=groups,
        total_exec_restarts=2 * len(groups),
    )


@dataclasses.dataclass
class BudgetTracker:
    """Kernels compiled by this process, against its usable budget (the seed's
    ``CompileBudget``). Mutable: one per process; an ``exec()`` restart starts a fresh one.

    Build it with :meth:`for_config`, which takes the threshold from :func:`usable_budget`, the
    same number the planner uses.

    Attributes:
        threshold: the most kernels this process may compile.
        used: kernels compiled so far.
    """

    threshold: int
    used: int = 0

    def __post_init__(self) -> None:
        check_int("threshold", self.threshold, 0)
        check_int("used", self.used, 0)

    @classmethod
    def for_config(cls, compile: CompileConfig) -> BudgetTracker:
        """A fresh tracker whose threshold is ``usable_budget(compile)``."""
        return cls(threshold=usable_budget(compile))

    def can_fit(self, n_kernels: int) -> bool:
        """Whether ``n_kernels`` more kernels fit: ``used + n_kernels <= threshold``.

        Raises:
            TypeError, ValueError: ``n_kernels`` is not an int >= 0.
        """
        return self.used + check_int("n_kernels", n_kernels, 0) <= self.threshold

    def consume(self, n_kernels: int) -> None:
        """Count ``n_kernels`` compiled kernels.

        Raises:
            TypeError, ValueError: ``n_kernels`` is not an int >= 0.
            ValueError: they do not fit (:meth:`can_fit` is false): restart first.
        """
        if not self.can_fit(n_kernels):
            raise ValueError(
                f"consume({n_kernels}): only {self.remaining} of {self.threshold} kernels left"
                " in this process; an exec() restart must come first"
            )
        self.used += n_kernels

    @property
    def needs_restart(self) -> bool:
        """True once the budget is spent: ``used >= threshold``."""
        return self.used >= self.threshold

    @property
    def remaining(self) -> int:
        """Kernels still available: ``max(threshold - used, 0)``."""
        return max(self.threshold - self.used, 0)
