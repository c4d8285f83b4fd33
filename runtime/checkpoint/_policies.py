"""Activation-checkpoint policies with exact counts, and an executor that runs them on the
allocator.

A policy decides which layers' activations the forward pass keeps (``should_save``); the others
are recomputed during backward from the nearest kept activation before them. ``n_checkpointed``
is the number of saved layers, counted from the saved set itself: the seed
(``../shared/seeds/ane-pipeline-and-checkpointing.txt``) first counted arithmetically, and its
SQRT count for 32 layers was 7 where 8 layers were saved (0, 5, ..., 30 and the last, 31).

Policies over layers ``0 .. N-1`` (``N >= 1``):

- ``all``: every layer.
- ``boundary``: each compile group's first layer, and ``N-1``.
- ``sqrt``: ``0, k, 2k, ...`` and ``N-1``, ``k = floor(sqrtf(N))`` in float32 as the seed, >= 1.
- ``every_n``: the same with ``k = interval`` (4 if not given).
- ``none``: only layer 0.
- ``sequential``: PyTorch's ``torch.utils.checkpoint.checkpoint_sequential(functions,
  segments, input)``: ``segments - 1`` checkpointed segments of ``N // segments`` layers, whose
  layers are recomputed and whose inputs are kept, then a last segment that runs without
  checkpointing (its layers are the saved ones). Default ``segments``: ``floor(sqrtf(N))``.
- ``revolve``: Griewank and Walther's binomial schedule with ``interval`` snapshots (default
  ``floor(sqrtf(N))``): ``N + t(N, s)`` forward calls, ``t = r*N - beta(s+1, r-1)``, at most
  ``s + 1`` activations live. ``t`` is the minimum in *their* model, where a snapshot is a state
  that its own step recomputes from; it is not the minimum here, where a kept activation also
  serves its own layer's backward (:func:`~runtime.checkpoint.min_forward_calls`, checked against
  an exhaustive search: 64 calls for 32 layers at 6 activations, where ``revolve`` with 5
  snapshots takes 100). Its snapshots are restart states; only the last layer's activation
  goes straight from the forward pass to its backward, so its ``n_checkpointed`` is 1.

The executor (:func:`run_checkpointed`) runs a chain of ``N`` layers under a plan on an
:class:`allocator.Allocator` and reports the forward calls per layer and the peak live bytes from
the allocator's own statistics; :meth:`CheckpointPlan.predict` says in advance what they will
be.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers

import numpy as np

from .._checks import FLOAT32_BYTES, check_int
from ._chain import INPUT, Op, chen_peaks, chen_schedule, replay
from ._executor import ChainRun, chain_result, run_checkpointed
from ._knobs import POLICY_NAMES, CheckpointKnobs, knobs
from ._revolve import (
    beta,
    repetition_number,
    revolve_forward_calls,
    revolve_forward_count,
    revolve_schedule,
)

__all__ = [
    "INPUT",
    "POLICY_NAMES",
    "ChainRun",
    "CheckpointKnobs",
    "CheckpointPlan",
    "Prediction",
    "beta",
    "chain_result",
    "checkpoint_plan",
    "default_interval",
    "knobs",
    "repetition_number",
    "revolve_forward_count",
    "run_checkpointed",
    "scaled_elems",
    "sqrt_interval",
]

PARAMETRIC = {"every_n": "interval", "sequential": "segments", "revolve": "snaps"}
"""The policies that take a parameter (``interval`` / ``DEVMEM_CKPT_INTERVAL``), and its name."""

EVERY_N_DEFAULT = 4


DEFAULT_SCALE = 1 << 16
"""The executor's default scale: an activation buffer holds a model's per-layer activation bytes
divided by this (Stories42M: 36 floats, LLaMA-7B: 578)."""


def scaled_elems(layer_activation_bytes: int, scale: int = DEFAULT_SCALE) -> int:
    """Elements of one executor activation buffer: ``layer_activation_bytes / 4 / scale``,
    at least 1.

    Raises:
        TypeError, ValueError: an argument is not an int (``layer_activation_bytes >= 0``,
            ``scale >= 1``).
    """
    check_int("layer_activation_bytes", layer_activation_bytes, 0)
    check_int("scale", scale, 1)
    return max(1, layer_activation_bytes // FLOAT32_BYTES // scale)


def sqrt_interval(n_layers: int) -> int:
    """``floor(sqrtf(n_layers))`` computed in float32 as the seed's C, at least 1 (equal to
    ``math.isqrt(n_layers)`` below 2**22, perfect squares included: 4 for 16, 8 for 64)."""
    return max(1, int(np.sqrt(np.float32(n_layers))))


def default_interval(policy: str, n_layers: int) -> int | None:
    """The parameter ``policy`` takes when none is given and no knob is set: ``every_n`` 4,
    ``sequential`` and ``revolve`` ``floor(sqrtf(N))``, ``sqrt`` its ``k``; ``None`` for the
    policies without one.

    Raises:
        ValueError: an unknown policy. TypeError, ValueError: a bad ``n_layers``.
    """
    n = check_int("n_layers", n_layers, 1)
    if policy not in POLICY_NAMES:
        raise ValueError(f"policy={policy!r}: expected one of {', '.join(POLICY_NAMES)}")
    if policy == "every_n":
        return EVERY_N_DEFAULT
    if policy in ("sqrt", "sequential", "revolve"):
        return sqrt_interval(n)
    return None


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What running a plan costs, known before running it.

    Attributes:
        forward_calls: forward calls per layer (each layer runs at least once).
        recomputes: forward calls beyond one per layer: ``sum(forward_calls) - N``.
        peak_buffers: the most buffers the executor holds at once: the model input, the live
            activations and the gradient (two during each backward).
        peak_activations: the most layer activations live at once.
    """

    forward_calls: tuple[int, ...]
    recomputes: int
    peak_buffers: int
    peak_activations: int

    def peak_bytes(self, elems: int) -> int:
        """``peak_buffers`` in bytes for buffers of ``elems`` float32 elements."""
        return self.peak_buffers * elems * FLOAT32_BYTES


@dataclasses.dataclass(frozen=True)
class CheckpointPlan:
    """Which layers' activations a policy keeps, and how the rest are recomputed.

    Build it with :func:`checkpoint_plan`.

    Attributes:
        policy: the policy's name (one of :data:`POLICY_NAMES`).
        n_layers: N, >= 1.
        interval: the policy's parameter: the interval of ``sqrt`` and ``every_n``, the
            segments of ``sequential``, the snapshots of ``revolve``; ``None`` for the others.
        saved: the saved layers, ascending: their activation from the forward pass is kept for
            their own backward, never recomputed.
        boundaries: activations kept only as restart points (``sequential``'s segment inputs);
            their layers are recomputed too. Empty for the other policies.
        group_starts: ``boundary``'s compile-group starts; empty for the other policies.
    """

    policy: str
    n_layers: int
    interval: int | None
    saved: tuple[int, ...]
    boundaries: tuple[int, ...] = ()
    group_starts: tuple[int, ...] = ()

    @property
    def n_checkpointed(self) -> int:
        """The number of saved layers: ``len(saved)`` (the seed's fix: count the set)."""
        return len(self.saved)

    def _layer(self, i: int, what: str) -> int:
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise TypeError(f"{what}: layer must be an int, got {type(i).__name__} {i!r}")
        if not 0 <= i < self.n_layers:
            raise IndexError(f"{what}({i}): expected a layer in 0 .. {self.n_layers - 1}")
        return int(i)

    @functools.cached_property
    def _saved_set(self) -> frozenset[int]:
        return frozenset(self.saved)

    def should_save(self, i: int) -> bool:
        """Whether the forward pass keeps layer ``i``'s activation for its backward.

        Raises:
            IndexError: ``i`` is not in ``0 .. n_layers-1`` (the seed answered false).
            TypeError: ``i`` is not an int.
        """
        return self._layer(i, "should_save") in self._saved_set

    def needs_recompute(self, i: int) -> bool:
        """Whether backward must recompute layer ``i``'s activation: ``not should_save(i)``.
        Raises as :meth:`should_save` (the seed answered true out of range)."""
        return self._layer(i, "needs_recompute") not in self._saved_set

    def nearest_saved_before(self, i: int) -> int:
        """Where layer ``i``'s activation comes from for its backward: ``i`` itself when saved,
        else the kept activation that its recomputation starts from (the nearest saved or
        boundary layer before it for the segment policies; the restored snapshot for
        ``revolve``), or -1 for the model input. Raises as :meth:`should_save`."""
        return self._origins[self._layer(i, "nearest_saved_before")]

    def recompute_depth(self, i: int) -> int:
        """Forward calls that recompute layer ``i``'s activation for its backward:
        ``i - nearest_saved_before(i)``; 0 when saved. Raises as :meth:`should_save`."""
        return self._layer(i, "recompute_depth") - self.nearest_saved_before(i)

    def saved_bytes(self, layer_activation_bytes: int) -> int:
        """Activation memory of the saved layers: ``n_checkpointed * layer_activation_bytes``."""
        return self.n_checkpointed * check_int("layer_activation_bytes", layer_activation_bytes, 0)

    def avoided_bytes(self, layer_activation_bytes: int) -> int:
        """The seed's ``checkpoint_memory_saved``: ``(n_layers - n_checkpointed) *
        layer_activation_bytes``. It counts unsaved layers, not memory a run saves (``none``
        "avoids" 31 of 32 while all 32 are live at once during its backward): report
        :meth:`peak_avoided_bytes` instead."""
        n = check_int("layer_activation_bytes", layer_activation_bytes, 0)
        return (self.n_layers - self.n_checkpointed) * n

    def peak_activation_bytes(self, layer_activation_bytes: int) -> int:
        """The most activation memory live at once when the plan runs:
        ``predict().peak_activations * layer_activation_bytes``.

        Raises:
            TypeError, ValueError: ``layer_activation_bytes`` is not an int >= 0.
        """
        n = check_int("layer_activation_bytes", layer_activation_bytes, 0)
        return self.predict().peak_activations * n

    def peak_avoided_bytes(self, layer_activation_bytes: int) -> int:
        """Activation memory the plan's peak avoids against keeping every layer (``all``, whose
        peak is ``n_layers``): ``(n_layers - predict().peak_activations) *
        layer_activation_bytes``; 0 for ``all`` and ``none``. Raises as
        :meth:`peak_activation_bytes`."""
        n = check_int("layer_activation_bytes", layer_activation_bytes, 0)
        return (self.n_layers - self.predict().peak_activations) * n

    @property
    def recompute_overhead(self) -> float:
        """Extra forward work as a fraction of one forward pass: ``recomputes / n_layers``
        (``(N - n_checkpointed) / N`` for all but ``revolve``)."""
        return self.predict().recomputes / self.n_layers

    def schedule(self) -> tuple[tuple[Op, int], ...]:
        """The executor's schedule (see :mod:`runtime.checkpoint._chain`)."""
        if self.policy == "revolve":
            return revolve_schedule(self.n_layers, self.interval)  # type: ignore[arg-type]
        return chen_schedule(self.n_layers, self.saved, self.boundaries)

    @functools.cached_property
    def _replay(self):
        return replay(self.n_layers, self.schedule())

    @functools.cached_property
    def _prediction(self) -> Prediction:
        n = self.n_layers
        if self.policy == "revolve":
            s = self.interval
            assert s is not None
            calls = revolve_forward_calls(n, s)
            if sum(calls) != n + revolve_forward_count(n, s):  # pragma: no cover - a bug
                raise AssertionError(f"revolve schedule for {n} layers, {s} snapshots: {calls}")
            return Prediction(calls, sum(calls) - n, 3 + min(n, s + 1), min(n, s + 1))
        per_layer = [2] * n
        for i in self.saved:
            per_layer[i] = 1
        calls = tuple(per_layer)
        buffers, activations = chen_peaks(n, self.saved, self.boundaries)
        return Prediction(calls, sum(calls) - n, buffers, activations)

    @property
    def _origins(self) -> tuple[int, ...]:
        return self._replay.origins

    def predict(self) -> Prediction:
        """Forward calls per layer and the executor's peak, from closed forms, without building
        the schedule (``O(N)``; computed once per plan).

        Segment policies: every unsaved layer is recomputed once, so layer ``i`` runs
        ``1 + needs_recompute(i)`` times, and the peaks are :func:`chen_peaks`.
        ``revolve``: ``N + t(N, s)`` forward calls with ``t`` from
        :func:`revolve_forward_count`, split per layer by
        :func:`runtime.checkpoint._revolve.revolve_forward_calls`, and ``3 + min(N, s+1)`` buffers
        (``min(N, s+1)`` activations).
        """
        return self._prediction

    def to_dict(self, layer_activation_bytes: int | None = None) -> dict:
        """Plain data: ``policy``, ``interval``, ``saved_layers``, ``n_checkpointed``,
        ``peak_activations``, ``recompute_overhead`` and, given the model's per-layer activation
        bytes, ``peak_activation_bytes``, ``memory_saved_bytes`` (:meth:`peak_avoided_bytes`:
        what the peak avoids against ``all``), ``saved_activation_bytes`` (the checkpointed
        layers' activations) and ``seed_memory_saved_bytes`` (the seed's count,
        :meth:`avoided_bytes`)."""
        out: dict = {
            "policy": self.policy,
            "interval": self.interval,
            "saved_layers": list(self.saved),
            "n_checkpointed": self.n_checkpointed,
            "peak_activations": self.predict().peak_activations,
        }
        if self.boundaries:
            out["boundary_layers"] = list(self.boundaries)
        if layer_activation_bytes is not None:
            out["peak_activation_bytes"] = self.peak_activation_bytes(layer_activation_bytes)
            out["memory_saved_bytes"] = self.peak_avoided_bytes(layer_activation_bytes)
            out["saved_activation_bytes"] = self.saved_bytes(layer_activation_bytes)
            out["seed_memory_saved_bytes"] = self.avoided_bytes(layer_activation_bytes)
        out["recompute_overhead"] = self.recompute_overhead
        return out


def _every(n: int, k: int) -> tuple[int, ...]:
    return tuple(sorted(set(range(0, n, k)) | {n - 1}))


def checkpoint_plan(
    policy: str | None,
    n_layers: int,
    *,
    interval: int | None = None,
    group_starts: tuple[int, ...] | list[int] | None = None,
) -> CheckpointPlan:
    """The checkpoint plan of ``policy`` for ``n_layers`` layers.

    Args:
        policy: one of :data:`POLICY_NAMES`; ``None`` takes ``DEVMEM_CKPT_POLICY`` (default
            ``all``).
        n_layers: N, >= 1 (the seed's behaviour for 0 was undefined).
        interval: the parameter of ``every_n`` (interval, default 4), ``sequential``
            (segments, 1 .. N, default ``floor(sqrtf(N))``) and ``revolve`` (snapshots, >= 1,
            default ``floor(sqrtf(N))``). ``None`` takes ``DEVMEM_CKPT_INTERVAL``, else the
            default; the knob is ignored by the policies without a parameter.
        group_starts: the first layer of each compile group (``PipelinePlan.group_starts``);
            required by ``boundary``, ignored by the others.

    Raises:
        ValueError: an unknown policy; ``n_layers < 1``; an interval out of range or given to a
            policy without one; ``boundary`` without valid group starts (each message names
            the argument and what it accepts).
        TypeError: ``n_layers`` or ``interval`` is not an int.
    """
    from_knobs = knobs()
    if policy is None:
        policy = from_knobs.policy
    if not isinstance(policy, str) or policy.lower() not in POLICY_NAMES:
        raise ValueError(f"policy={policy!r}: expected one of {', '.join(POLICY_NAMES)}")
    policy = policy.lower()
    n = check_int("n_layers", n_layers, 1)
    if interval is not None and policy not in PARAMETRIC:
        raise ValueError(
            f"interval={interval!r}: policy {policy!r} takes none; only"
            f" {', '.join(PARAMETRIC)} take one"
        )
    if interval is None and policy in PARAMETRIC:
        interval = from_knobs.interval
    if interval is not None:
        check_int(PARAMETRIC[policy], interval, 1)

    if policy == "all":
        return CheckpointPlan(policy, n, None, tuple(range(n)))
    if policy == "none":
        return CheckpointPlan(policy, n, None, (0,))
    if policy == "sqrt":
        k = sqrt_interval(n)
        return CheckpointPlan(policy, n, k, _every(n, k))
    if policy == "every_n":
        k = EVERY_N_DEFAULT if interval is None else interval
        return CheckpointPlan(policy, n, k, _every(n, k))
    if policy == "boundary":
        if group_starts is None:
            raise ValueError("policy 'boundary' needs group_starts (PipelinePlan.group_starts)")
        starts = sorted(set(group_starts))
        if not starts or starts[0] != 0 or starts[-1] >= n:
            raise ValueError(
                f"group_starts={list(group_starts)!r}: expected layer indices in 0 .. {n - 1},"
                " starting with 0"
            )
        saved = tuple(sorted(set(starts) | {n - 1}))
        return CheckpointPlan(policy, n, None, saved, group_starts=tuple(starts))
    if policy == "sequential":
        segments = sqrt_interval(n) if interval is None else interval
        if segments > n:
            raise ValueError(
                f"segments={segments}: expected 1 <= segments <= n_layers={n} (PyTorch's"
                " checkpoint_sequential fails for more segments than functions)"
            )
        size = n // segments
        plain = (segments - 1) * size  # the last segment, [plain, n), runs without checkpoint
        boundaries = tuple(c * size - 1 for c in range(1, segments - 1))
        return CheckpointPlan(policy, n, segments, tuple(range(plain, n)), boundaries)
    snaps = sqrt_interval(n) if interval is None else interval
    return CheckpointPlan("revolve", n, snaps, (n - 1,))
