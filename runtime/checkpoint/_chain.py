"""Schedules for a chain of layers, and their costs counted without running them.

The executor's model (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"): layer
``i``'s forward call reads the state before it (the model input ``X`` for layer 0, else the
activation of layer ``i-1``) and produces activation ``A_i`` (one buffer, which also holds the
layer's output); layer ``i``'s backward needs ``A_i`` and the gradient from above. The model input
``X`` lives for the whole run; the gradient is one buffer, two for a moment during each backward.

A schedule is a sequence of :class:`Op` pairs ``(op, layer)``:

- ``FORWARD i``: compute ``A_i`` from the state before layer ``i`` (which must be live);
- ``RELEASE i``: free ``A_i``;
- ``LOSS``: allocate the loss gradient (after the forward pass reached the last layer);
- ``BACKWARD i``: ``g = backward_i(g, A_i)``, then free the old ``g``;
- ``ARENA_ENTER`` / ``ARENA_EXIT``: an allocation epoch; its exit frees every activation
  allocated inside and keeps the gradient.

:func:`replay` counts a schedule's forward calls and live buffers step by step; the executor
(:mod:`runtime.checkpoint._executor`) runs the same schedule on the allocator.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["Op", "Replay", "chen_peak_buffers", "chen_peaks", "chen_schedule", "replay"]


class Op(enum.IntEnum):
    """One step of a schedule (see the module docstring)."""

    FORWARD = 0
    RELEASE = 1
    LOSS = 2
    BACKWARD = 3
    ARENA_ENTER = 4
    ARENA_EXIT = 5


Schedule = tuple[tuple[Op, int], ...]

INPUT = -1
"""The restart point that is the model input ``X`` rather than a layer's activation."""


def restart_points(n_layers: int, kept: Iterable[int]) -> list[int]:
    """For each layer ``i``, the nearest kept layer strictly before it, or :data:`INPUT`."""
    kept = set(kept)
    out, last = [], INPUT
    for i in range(n_layers):
        out.append(last)
        if i in kept:
            last = i
    return out


def chen_schedule(n_layers: int, saved: Sequence[int], boundaries: Sequence[int] = ()) -> Schedule:
    """The segment-recompute schedule of a saved set.

    The forward pass keeps the activations of ``saved`` layers (used by their own backward) and
    of ``boundaries`` (kept only as restart points, as ``checkpoint_sequential`` keeps each
    checkpointed segment's input). Backward walks down: a saved layer runs its backward; a run of
    unsaved layers ``a .. b`` is one segment, recomputed in an arena from the nearest kept layer
    before it (``a - 1``, or the model input), all of it kept until the segment's backward is
    done, then reclaimed by the arena's exit. A boundary is freed once the segment after it
    is done. Every unsaved layer is recomputed exactly once.
    """
    kept = set(saved) | set(boundaries)
    saved_set, boundary_set = set(saved), set(boundaries)
    before = restart_points(n_layers, kept)
    ops: list[tuple[Op, int]] = []
    for i in range(n_layers):
        ops.append((Op.FORWARD, i))
        if i >= 1 and i - 1 not in kept:
            ops.append((Op.RELEASE, i - 1))
    ops.append((Op.LOSS, INPUT))
    if n_layers - 1 not in kept:
        ops.append((Op.RELEASE, n_layers - 1))
    i = n_layers - 1
    while i >= 0:
        if i in saved_set:
            ops += [(Op.BACKWARD, i), (Op.RELEASE, i)]
            i -= 1
            continue
        start = before[i] + 1
        ops.append((Op.ARENA_ENTER, INPUT))
        ops += [(Op.FORWARD, t) for t in range(start, i + 1)]
        ops += [(Op.BACKWARD, t) for t in range(i, start - 1, -1)]
        ops.append((Op.ARENA_EXIT, INPUT))
        if before[i] in boundary_set:
            ops.append((Op.RELEASE, before[i]))
        i = start - 1
    return tuple(ops)


def chen_peaks(
    n_layers: int, saved: Sequence[int], boundaries: Sequence[int] = ()
) -> tuple[int, int]:
    """``(peak buffers, peak activations)`` of :func:`chen_schedule`, in closed form, in
    ``O(|K| log |K|)`` for ``K = saved | boundaries`` (a boundary is not saved).

    With ``|K[..j]|`` the members of ``K`` up to ``j``:

    - forward: the activations peak at ``2 + |K[..N-3]|`` (``A_{N-2}`` and ``A_{N-1}``
      beside the kept ones; 1 for ``N = 1``), the buffers at ``3 + |K[..N-2]|`` (input, kept
      activations, ``A_{N-1}`` and the loss gradient);
    - a saved layer ``i``'s backward: ``|K[..i]|`` activations, 3 more buffers (input, two
      gradients); the largest is at the last saved layer;
    - a segment of ``L`` layers recomputed from ``r`` (the kept layer before it, or the input):
      ``|K[..r]| + L`` activations, 3 more buffers. The segments are the gaps between
      consecutive members of ``K`` (a boundary ends the gap below it and belongs to it: its
      activation is released, then recomputed) and the run after the last member.

    Raises:
        ValueError: a layer of ``saved`` or ``boundaries`` outside ``0 .. N-1``.
    """
    kept = np.unique(np.fromiter(itertools.chain(saved, boundaries), dtype=np.int64))
    if kept.size and (kept[0] < 0 or kept[-1] >= n_layers):
        raise ValueError(f"kept layers {kept[0]} .. {kept[-1]}: expected 0 .. {n_layers - 1}")
    is_saved = np.isin(kept, np.fromiter(saved, dtype=np.int64))

    def upto(j: int) -> int:  # |K[..j]|
        return int(np.searchsorted(kept, j, side="right"))

    acts = upto(int(kept[is_saved][-1])) if is_saved.any() else 0  # during backward
    # the gap (previous, k) of each kept k, with k itself if a boundary; index = |K[..prev]|
    previous = np.concatenate(([INPUT], kept[:-1]))
    lengths = kept - previous - 1 + ~is_saved
    if lengths.size:
        gaps = np.arange(kept.size) + lengths
        acts = max(acts, int(gaps[lengths > 0].max(initial=0)))
    last = int(kept[-1]) if kept.size else INPUT
    if last < n_layers - 1:
        acts = max(acts, int(kept.size) + n_layers - 1 - last)
    forward_acts = 1 if n_layers == 1 else 2 + upto(n_layers - 3)
    return max(3 + upto(n_layers - 2), 3 + acts), max(forward_acts, acts)


def chen_peak_buffers(n_layers: int, saved: Sequence[int], boundaries: Sequence[int] = ()) -> int:
    """The most buffers :func:`chen_schedule` holds at once (:func:`chen_peaks`)."""
    return chen_peaks(n_layers, saved, boundaries)[0]


@dataclasses.dataclass(frozen=True)
class Replay:
    """What a schedule does, counted (no allocator).

    Attributes:
        forward_calls: forward calls per layer.
        peak_buffers: the most buffers live at once (input, activations and gradients).
        peak_activations: the most layer activations live at once (the input excluded).
        kept: layers whose backward used the activation of their first forward call.
        origins: per layer, where the activation its backward used came from: the layer
            itself when it was kept from its first forward call, else the layer (or
            :data:`INPUT`) whose activation, live at the previous backward, started the chain of
            forward calls that recomputed it.
    """

    forward_calls: tuple[int, ...]
    peak_buffers: int
    peak_activations: int
    kept: tuple[int, ...]
    origins: tuple[int, ...]


def replay(n_layers: int, schedule: Iterable[tuple[Op, int]]) -> Replay:
    """Run ``schedule`` on counters and check that it is well formed.

    Raises:
        ValueError: the schedule reads an activation that is not live, allocates one that is,
            backpropagates before the loss or twice through a layer, misses a layer's backward
            or leaves activations live at the end.
    """
    calls = [0] * n_layers
    live: dict[int, tuple[int, int]] = {}  # layer -> (generation, origin)
    arena: set[int] | None = None
    grads = 0
    peak = peak_acts = 0
    kept: list[int] = []
    origins = [INPUT - 1] * n_layers
    done = [False] * n_layers
    rested: set[int] = set()  # activations live at the last LOSS or BACKWARD: restart points

    def bump(extra: int = 0) -> None:
        nonlocal peak, peak_acts
        peak = max(peak, 1 + len(live) + grads + extra)
        peak_acts = max(peak_acts, len(live))

    for op, i in schedule:
        if op is Op.FORWARD:
            if i in live or (i > 0 and i - 1 not in live):
                raise ValueError(f"FORWARD {i}: needs A_{i - 1} live and A_{i} not live")
            calls[i] += 1
            origin = i - 1 if i == 0 or i - 1 in rested else live[i - 1][1]
            live[i] = (calls[i], origin)
            if arena is not None:
                arena.add(i)
            bump()
        elif op is Op.RELEASE:
            if i not in live:
                raise ValueError(f"RELEASE {i}: A_{i} is not live")
            del live[i]
            if arena is not None:
                arena.discard(i)
        elif op is Op.LOSS:
            if grads:
                raise ValueError("LOSS: the loss gradient exists already")
            grads = 1
            rested = set(live)
            bump()
        elif op is Op.BACKWARD:
            if not grads or i not in live or done[i] or (i + 1 < n_layers and not done[i + 1]):
                raise ValueError(f"BACKWARD {i}: out of order, before the loss or without A_{i}")
            bump(extra=1)  # the new gradient, while the old one is still live
            done[i] = True
            generation, origin = live[i]
            if generation == 1:
                kept.append(i)
                origins[i] = i
            else:
                origins[i] = origin
            rested = set(live)
        elif op is Op.ARENA_ENTER:
            arena = set()
        elif op is Op.ARENA_EXIT:
            for j in arena or ():
                del live[j]
            arena = None
    if live or not all(done):
        raise ValueError(f"schedule ends with activations {sorted(live)} live or layers missed")
    return Replay(tuple(calls), peak, peak_acts, tuple(sorted(kept)), tuple(origins))
