"""The checkpoint executor: runs a chain of layers on the allocator under a schedule.

Each activation is one buffer of ``elems`` float32 elements (a model's per-layer activation
bytes scaled down). The arithmetic makes every value exact and checkable: the input ``X`` is all
ones; layer ``i``'s forward is ``A_i = state + X`` (so ``A_i`` holds ``i + 2``); the loss
gradient is all ones; layer ``i``'s backward is ``g = g + A_i``. The gradient that comes out is
``1 + N*(N+3)/2`` in every element, whatever the policy: a recomputation from the wrong place
changes it.

Only the allocator's public API is used: ``full``, ``add``, ``sum``, ``release``,
``arena``/``arena_enter``/``arena_exit`` and ``stats``.

Imports run one way: the checkpoint planner (:mod:`runtime.checkpoint`) imports this module to
run its plans, and this module knows nothing of it. What a run needs of a plan is the
:class:`ChainPlan` protocol below (its layer count and schedule), which every
:class:`~runtime.checkpoint.CheckpointPlan` satisfies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from .._checks import FLOAT32_BYTES, check_int
from ._chain import Op

if TYPE_CHECKING:
    from allocator import Allocator, Buffer

__all__ = ["ChainPlan", "ChainRun", "chain_result", "run_checkpointed"]


class ChainPlan(Protocol):
    """What :func:`run_checkpointed` needs of a plan (a
    :class:`~runtime.checkpoint.CheckpointPlan`; a protocol, so that this module need not import
    the planner's).

    Attributes:
        n_layers: layers in the chain, >= 1.
    """

    n_layers: int

    def schedule(self) -> Sequence[tuple[Op, int]]:
        """The ``(op, layer)`` steps to run, in order (see :mod:`runtime.checkpoint._chain`)."""


def chain_result(n_layers: int) -> float:
    """The gradient value every element ends with for a chain of ``n_layers`` layers:
    ``1 + N*(N+3)/2``."""
    return 1 + n_layers * (n_layers + 3) / 2


@dataclasses.dataclass(frozen=True)
class ChainRun:
    """What :func:`run_checkpointed` measured.

    Attributes:
        forward_calls: forward calls per layer.
        recomputes: ``sum(forward_calls) - n_layers``.
        kept: layers whose backward used the activation of their first forward call (the
            forward pass kept it), ascending.
        peak_activations: the most activation buffers the executor held at once.
        peak_bytes: the allocator's ``peak_bytes`` after the run minus its ``live_bytes``
            before it: the run's peak above what was live already. ``None`` when the
            allocator had peaked higher before the run (its statistics cannot isolate the run
            then; use a fresh allocator).
        buffer_bytes: bytes per buffer (``elems * 4``).
        result: the gradient value that came out (:func:`chain_result` when right).
    """

    forward_calls: tuple[int, ...]
    recomputes: int
    kept: tuple[int, ...]
    peak_activations: int
    peak_bytes: int | None
    buffer_bytes: int
    result: float

    @property
    def n_kept(self) -> int:
        """``len(kept)``: the executor's count of kept activations."""
        return len(self.kept)


def run_checkpointed(alloc: Allocator, plan: ChainPlan, *, elems: int = 256) -> ChainRun:
    """Run a chain of ``plan.n_layers`` layers forward and backward under ``plan`` on ``alloc``.

    The forward pass keeps only the saved layers' activations (and ``sequential``'s segment
    boundaries); backward recomputes each run of unsaved layers from the nearest kept activation
    before it inside an arena (Chen et al. 2016), or follows the binomial schedule for
    ``revolve``. Everything the run allocates is freed when it returns, also when it raises
    (an outer arena reclaims it).

    Args:
        alloc: the allocator (any backend).
        plan: a :class:`~runtime.checkpoint.CheckpointPlan`.
        elems: float32 elements per activation buffer, >= 1.

    Returns:
        A :class:`ChainRun`; ``plan.predict()`` says in advance what it will hold.

    Raises:
        TypeError, ValueError: ``elems`` is not an int >= 1.
        allocator.DeviceOutOfMemory: the device cannot hold the run.
    """
    check_int("elems", elems, 1)
    n_layers = plan.n_layers
    schedule = plan.schedule()
    before = alloc.stats()
    calls = [0] * n_layers
    live: dict[int, tuple[Buffer, int]] = {}  # layer -> (activation, its forward call's number)
    kept: list[int] = []
    peak_activations = 0
    inner: set[int] | None = None  # activations allocated in the open inner arena
    with alloc.arena():
        x = alloc.full(elems, 1.0)
        g = x  # replaced by LOSS before any BACKWARD
        try:
            for op, i in schedule:
                if op is Op.FORWARD:
                    calls[i] += 1
                    live[i] = (alloc.add(x if i == 0 else live[i - 1][0], x), calls[i])
                    peak_activations = max(peak_activations, len(live))
                    if inner is not None:
                        inner.add(i)
                elif op is Op.RELEASE:
                    alloc.release(live.pop(i)[0])
                    if inner is not None:
                        inner.discard(i)
                elif op is Op.LOSS:
                    g = alloc.full(elems, 1.0)
                elif op is Op.BACKWARD:
                    activation, call = live[i]
                    new = alloc.add(g, activation)
                    alloc.release(g)
                    g = new
                    if call == 1:
                        kept.append(i)
                elif op is Op.ARENA_ENTER:
                    alloc.arena_enter()
                    inner = set()
                else:  # ARENA_EXIT: frees the segment's recomputed activations, keeps g
                    alloc.arena_exit(keep=[g])
                    for j in inner or ():
                        del live[j]
                    inner = None
        except BaseException:
            if inner is not None:
                alloc.arena_exit()
            raise
        result = alloc.sum(g) / elems
        alloc.release(g)
        alloc.release(x)
    after = alloc.stats()
    peak = after.peak_bytes - before.live_bytes if before.peak_bytes <= before.live_bytes else None
    return ChainRun(
        forward_calls=tuple(calls),
        recomputes=sum(calls) - n_layers,
        kept=tuple(sorted(kept)),
        peak_activations=peak_activations,
        peak_bytes=peak,
        buffer_bytes=elems * FLOAT32_BYTES,
        result=result,
    )
