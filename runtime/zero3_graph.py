"""A compiled graph's wrapper over ZeRO-3 parameters, replayed: the seed's test scaffolding.

Source: ``../shared/seeds/deepspeed-zero3-release-lifetime.txt``. Inductor's generated wrapper
for a graph over ZeRO-3 parameters calls DeepCompile's custom ops (``allgather_param``,
``wait_allgather``, ``release_param``, :class:`runtime.zero3.Zero3`'s ``allgather``, ``wait``
and ``release``) around each op, and keeps ``buf1 = buf0`` aliases of every gathered view until
the graph ends: that is why the pre-fix release freed nothing before the end of the graph.
:func:`run_graph` replays such a wrapper for a chain of layers; the runtime module itself holds
only DeepSpeed's mechanism.

Order of operations, per layer ``k``: all-gather the parameters of layers ``k + 1 .. k +
prefetch`` (DeepCompile's prefetch pass); for each of the layer's parameters, ``allgather``
then ``wait``, each result kept in an alias; the op; ``release`` of each parameter, with
``n_users`` = the number of layers that use it; the previous activation is dropped. Live bytes
are sampled after every allocation and around every release. If anything raises (an
out-of-memory in a layer, say), the registry and the countdowns are restored to what they were
before the graph (the bases it gathered freed, the countdowns it armed disarmed) before the
exception propagates, so a retry starts clean.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Hashable, Sequence

from allocator import Buffer

from ._checks import integer
from .zero3 import Zero3

__all__ = ["GraphRun", "Release", "run_graph"]


@dataclasses.dataclass(frozen=True)
class Release:
    """One ``release_param`` of a :func:`run_graph` replay.

    Attributes:
        layer: the layer whose op used the parameter.
        param_id: the parameter.
        final: whether its countdown reached 0 here.
        live_before, live_after: the allocator's live bytes around the call.
    """

    layer: int
    param_id: Hashable
    final: bool
    live_before: int
    live_after: int


@dataclasses.dataclass(frozen=True)
class GraphRun:
    """What a :func:`run_graph` replay did.

    Attributes:
        output: the graph's output buffer (the caller owns it).
        releases: every release, in order.
        peak_bytes: the most live bytes seen while the graph ran (sampled after every
            allocation, where live bytes can only have grown).
        live_at_end: live bytes after the last op, the wrapper's aliases still alive.
        live_after: live bytes once the wrapper returned (its aliases dropped), the output
            still held.
    """

    output: Buffer
    releases: tuple[Release, ...]
    peak_bytes: int
    live_at_end: int
    live_after: int


def run_graph(
    zero3: Zero3, layers: Sequence[Sequence[Hashable]], x: Buffer, *, prefetch: int = 0
) -> GraphRun:
    """Replay the wrapper Inductor generates for a chain of layers over ZeRO-3 parameters.

    Layer ``k`` uses one parameter (``y = x * w``) or two (``y = x * w + b``), each of
    ``x.size`` elements; the module docstring gives the order of the calls.

    Args:
        zero3: the parameters' :class:`~runtime.zero3.Zero3`.
        layers: the parameter ids of each layer (one or two each).
        x: the input, which the caller keeps.
        prefetch: how many layers ahead to gather, >= 0.

    Returns:
        A :class:`GraphRun`: the output, every release with the live bytes around it, the
        peak, and the live bytes before and after the wrapper's aliases were dropped.

    Raises:
        TypeError: ``zero3`` is not a Zero3, ``x`` not a Buffer, ``prefetch`` not an integer.
        ValueError: ``layers`` is empty, a layer has no parameter or more than two, a
            parameter's ``numel`` differs from ``x.size``, ``x`` was freed, or ``prefetch`` <
            0.
        KeyError: a parameter is not registered.
        Exception: whatever a layer raised (e.g. ``DeviceOutOfMemory``), after the registry
            and the countdowns were restored to what they were before the graph.
    """
    if not isinstance(zero3, Zero3):
        raise TypeError(f"zero3 must be a runtime.zero3.Zero3, got {type(zero3).__name__}")
    if not isinstance(x, Buffer):
        raise TypeError(f"x must be a Buffer, got {type(x).__name__}")
    if x.freed:
        raise ValueError(f"x was freed ({x.freed_reason})")
    prefetch = integer(prefetch, "prefetch", 0)
    layers = [tuple(params) for params in layers]
    if not layers:
        raise ValueError("layers must name at least one layer")
    for k, params in enumerate(layers):
        if not 1 <= len(params) <= 2:
            raise ValueError(f"layers[{k}] must name 1 or 2 parameters, got {len(params)}")
        for param_id in params:
            numel = zero3.param(param_id).numel
            if numel != x.size:
                raise ValueError(
                    f"layers[{k}]: param_id={param_id!r} has {numel} elements, x has {x.size}"
                )
    gathered = frozenset(zero3._gathered)
    countdowns = zero3._countdowns()
    try:
        return _replay(zero3, layers, x, prefetch)
    except BaseException:
        zero3._restore(gathered, countdowns)
        raise


def _replay(zero3: Zero3, layers: list[tuple], x: Buffer, prefetch: int) -> GraphRun:
    """:func:`run_graph` after validation: the wrapper's body."""
    alloc = zero3.alloc
    users = collections.Counter(param_id for params in layers for param_id in params)
    wrapper: dict[str, object] = {}  # the generated function's locals: buf0, buf1, ...
    names = itertools.count()
    releases = []
    peak = alloc.stats().live_bytes

    def alias(value: Buffer) -> Buffer:  # ``bufN = value``, alive until the graph ends
        wrapper[f"buf{next(names)}"] = value
        return value

    def sample() -> int:
        nonlocal peak
        live = alloc.stats().live_bytes
        peak = max(peak, live)
        return live

    activation = x
    for k, params in enumerate(layers):
        for ahead in layers[k + 1 : k + 1 + prefetch]:  # DeepCompile's prefetch pass
            for param_id in ahead:
                zero3.allgather(param_id)
        sample()
        views = []
        for param_id in params:
            view = alias(zero3.allgather(param_id))
            sample()
            views.append(alias(zero3.wait(view, param_id)))
        if len(views) == 1:
            out = alloc.mul(activation, views[0])
        else:
            out = alloc.fma(activation, views[0], views[1])
        sample()
        for param_id, view in zip(params, views, strict=True):
            before = sample()
            zero3.release(view, param_id, users[param_id])
            final = zero3.countdown(param_id) == 0
            releases.append(Release(k, param_id, final, before, sample()))
        activation = out  # the previous activation's last use is over: dropped
    live_at_end = sample()
    del view, views, out
    wrapper.clear()  # the graph returns: its aliases die
    return GraphRun(activation, tuple(releases), peak, live_at_end, alloc.stats().live_bytes)
