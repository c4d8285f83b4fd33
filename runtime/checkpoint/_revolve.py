"""Binomial checkpointing: Griewank and Walther's Revolve (ACM TOMS 26(1), 2000, Algorithm 799),
and the schedule with the fewest forward calls in this executor's own model.

In Griewank and Walther's model, reversing a chain of ``l`` steps with ``s`` snapshot slots (one
of them holding the chain's input) takes at least ``t(l, s) = r*l - beta(s+1, r-1)`` forward
steps besides the one taping step per layer, where ``beta(s, t) = C(s+t, s)`` and ``r``, the
repetition number, is the smallest integer with ``beta(s, r) >= l``. That bound holds where a
snapshot is a *state* that its own step must recompute from. In this executor
(``_chain``) a kept activation is both the state after its layer and that layer's
tape, so it also serves its own backward, and fewer forward calls suffice at the same peak:
:func:`min_forward_calls` (a dynamic program, checked against an exhaustive search of the
executor's ``replay()`` rules) gives 64 for 32 layers and 6 activations where Revolve with 5
snapshots takes 100. :func:`revolve_schedule` keeps Revolve's schedule (it minimises ``t(l, s)``
in Griewank and Walther's model, not forward calls here); :func:`optimal_schedule` is the
executor's optimum. The Revolve schedule here reaches ``t(l, s)``: reversing
steps ``a .. b-1`` with ``s`` slots (``x_a`` in one of them) advances ``j`` steps, stores
``x_{a+j}``, reverses ``a+j .. b-1`` with ``s-1`` slots, frees it and reverses ``a .. a+j-1``
with ``s`` slots, where ``j`` lies in the range of optimal splits
``[max(beta(s, r-2), l - beta(s-1, r)), min(beta(s, r-1), l - beta(s-1, r-1))]``.
"""

from __future__ import annotations

from math import comb

import numpy as np

from .._checks import check_int
from ._chain import INPUT, Op, Schedule

__all__ = [
    "beta",
    "min_forward_calls",
    "optimal_schedule",
    "repetition_number",
    "revolve_forward_calls",
    "revolve_forward_count",
    "revolve_schedule",
]


def beta(s: int, t: int) -> int:
    """``C(s+t, s)``: the most steps ``s`` snapshots reverse with ``t`` repetitions (0 if
    ``t < 0``)."""
    return comb(s + t, s) if t >= 0 else 0


def repetition_number(steps: int, snaps: int) -> int:
    """The smallest ``r`` with ``beta(snaps, r) >= steps``.

    Raises:
        TypeError, ValueError: ``steps`` or ``snaps`` is not an int >= 1.
    """
    check_int("steps", steps, 1)
    check_int("snaps", snaps, 1)
    return _repetitions(steps, snaps)


def _repetitions(steps: int, snaps: int) -> int:
    """:func:`repetition_number` unchecked, by doubling then bisection (``beta`` grows in r)."""
    high = 1
    while comb(snaps + high, snaps) < steps:
        high *= 2
    low = high // 2  # beta(snaps, low) < steps, or low == 0
    while low < high:
        mid = (low + high) // 2
        if comb(snaps + mid, snaps) >= steps:
            high = mid
        else:
            low = mid + 1
    return 0 if steps <= 1 else low


def revolve_forward_count(steps: int, snaps: int) -> int:
    """``t(l, s) = r*l - beta(s+1, r-1)``: Griewank and Walther's minimal number of forward
    steps (advances) that reverse ``steps`` steps with ``snaps`` snapshots, not counting the one
    taping forward of each step, in their model (not this executor's: see
    :func:`min_forward_calls`). ``t(l, 1) = l*(l-1)/2``; ``t(l, s) = l - 1`` once ``s >= l - 1``.

    Raises:
        TypeError, ValueError: as :func:`repetition_number`.
    """
    r = repetition_number(steps, snaps)
    return r * steps - beta(snaps + 1, r - 1)


def _split(steps: int, snaps: int) -> int:
    """An optimal first advance for ``steps >= 2`` steps and ``snaps >= 2`` slots."""
    r = _repetitions(steps, snaps)
    return min(steps - 1, beta(snaps, r - 1), steps - beta(snaps - 1, r - 1))


def revolve_schedule(n_layers: int, snaps: int) -> Schedule:
    """The binomial schedule for a chain of ``n_layers`` layers (see ``_chain``).

    Snapshot slot 0 holds the model input, so at most ``snaps - 1`` activations are kept as
    snapshots, plus the state being advanced and the one being taped: at most ``snaps + 1``
    activations are live at any time. Every layer's forward is taped once, right before its
    backward; the loss follows the first (the last layer's).

    Raises:
        TypeError, ValueError: ``n_layers`` or ``snaps`` is not an int >= 1.
    """
    check_int("n_layers", n_layers, 1)
    check_int("snaps", snaps, 1)
    ops: list[tuple[Op, int]] = []

    def advance(start: int, stop: int) -> None:  # x_start is held; leaves A_{stop-1} live
        for t in range(start, stop):
            ops.append((Op.FORWARD, t))
            if t > start:
                ops.append((Op.RELEASE, t - 1))

    def tape_and_reverse(i: int) -> None:
        ops.append((Op.FORWARD, i))
        if i == n_layers - 1:
            ops.append((Op.LOSS, INPUT))
        ops.extend([(Op.BACKWARD, i), (Op.RELEASE, i)])

    # Explicit stack (a chain of 1,000 layers with ample snapshots nests 1,000 deep):
    # ("reverse", a, b, s) reverses a .. b-1 with x_a held; ("release", k) frees A_k.
    tasks: list[tuple[str, int, int, int]] = [("reverse", 0, n_layers, snaps)]
    while tasks:
        kind, a, b, s = tasks.pop()
        if kind == "release":
            ops.append((Op.RELEASE, a))
        elif b - a == 1:
            tape_and_reverse(a)
        elif s == 1:
            for i in range(b - 1, a - 1, -1):
                advance(a, i)
                tape_and_reverse(i)
                if i > a:
                    ops.append((Op.RELEASE, i - 1))
        else:
            j = _split(b - a, s)
            advance(a, a + j)
            tasks += [("reverse", a, a + j, s), ("release", a + j - 1, 0, 0)]
            tasks.append(("reverse", a + j, b, s - 1))
    return tuple(ops)


def revolve_forward_calls(n_layers: int, snaps: int) -> tuple[int, ...]:
    """The forward calls per layer of :func:`revolve_schedule`, counted without building it:
    ``O(N)`` time and memory where the schedule holds ``N + t(N, s)`` forward steps (4.5
    million for 3,000 layers and one snapshot).

    Raises:
        TypeError, ValueError: ``n_layers`` or ``snaps`` is not an int >= 1.
    """
    check_int("n_layers", n_layers, 1)
    check_int("snaps", snaps, 1)
    ramp = [0] * (n_layers + 2)  # second differences: the s == 1 ramps
    step = [0] * (n_layers + 1)  # first differences: the advances and tapes
    tasks = [(0, n_layers, snaps)]
    while tasks:
        a, b, s = tasks.pop()
        if s + 1 >= b - a:  # r = 1: every layer but the last runs twice (t = l - 1)
            step[a] += 2
            step[b - 1] -= 1
            step[b] -= 1
        elif s == 1:  # layer a+k runs b-a-k times: once per later layer's advance, one tape
            step[a] += b - a  # then one less per layer: b-a-k at a+k, 0 from b on
            ramp[a + 1] -= 1
            ramp[b + 1] += 1
        else:
            j = _split(b - a, s)
            step[a] += 1  # advance a .. a+j-1
            step[a + j] -= 1
            tasks += [(a, a + j, s), (a + j, b, s - 1)]
    calls, slope, value = [], 0, 0
    for i in range(n_layers):
        slope += ramp[i]
        value += step[i] + slope
        calls.append(value)
    return tuple(calls)


def _min_calls_table(n_layers: int, activations: int) -> np.ndarray:
    """``F[n, m]``: the fewest forward calls that reverse ``n`` layers with at most ``m``
    activations live (the state before the first layer held outside them), ``inf`` where
    impossible. ``O(N * N * M)`` elementwise, vectorised over the split."""
    table = np.full((n_layers + 1, activations + 1), np.inf)
    table[0, :] = 0
    if activations >= 1 and n_layers >= 1:
        table[1, 1:] = 1
    for m in range(2, activations + 1):
        right, left = table[:, m - 1], table[:, m]
        for n in range(2, n_layers + 1):
            j = np.arange(1, n + 1)  # advance j layers, keep A_{j-1}
            left[n] = np.min(j + right[n - j] + left[j - 1])
    return table


def min_forward_calls(n_layers: int, activations: int) -> int:
    """The fewest forward calls that reverse a chain of ``n_layers`` layers in this executor
    with at most ``activations`` layer activations live at once (the executor's
    ``peak_activations``; the model input is not one).

    ``F(0, m) = 0``; ``F(1, m) = 1``; ``F(n, 1)`` is impossible for ``n >= 2`` (advancing needs
    the activation before and the new one); else ``F(n, m) = min over j in 1..n of j + F(n-j,
    m-1) + F(j-1, m)``: advance ``j`` layers keeping ``A_{j-1}``, reverse the ``n-j`` layers
    after it with one activation fewer, run layer ``j-1``'s backward on ``A_{j-1}`` (kept, so
    not recomputed), reverse the ``j-1`` before it. Checked against an exhaustive search of
    the executor's ``replay()`` rules for every ``n <= 9``. ``O(N * N * M)``.

    Raises:
        TypeError, ValueError: ``n_layers`` or ``activations`` is not an int >= 1.
        ValueError: ``activations == 1`` and ``n_layers >= 2`` (no schedule exists).
    """
    check_int("n_layers", n_layers, 1)
    check_int("activations", activations, 1)
    if activations == 1 and n_layers >= 2:
        raise ValueError(
            f"activations=1: a chain of {n_layers} layers needs 2 (advancing holds the"
            " activation before a layer and its own)"
        )
    m = min(activations, n_layers)  # more than N activations never help
    return int(_min_calls_table(n_layers, m)[n_layers, m])


def optimal_schedule(n_layers: int, activations: int) -> Schedule:
    """A schedule with :func:`min_forward_calls` forward calls and at most ``activations``
    activations live, for the executor (see ``_chain``). Raises as
    :func:`min_forward_calls`."""
    total = min_forward_calls(n_layers, activations)
    m_top = min(activations, n_layers)
    table = _min_calls_table(n_layers, m_top)
    ops: list[tuple[Op, int]] = []
    loss_done = False

    def backward(i: int) -> None:
        nonlocal loss_done
        if not loss_done:
            ops.append((Op.LOSS, INPUT))
            loss_done = True
        ops.extend([(Op.BACKWARD, i), (Op.RELEASE, i)])

    # ("reverse", a, b, m): reverse layers a .. b-1, the state before a held, m activations;
    # ("backward", i): A_i is live: run its backward and free it.
    tasks: list[tuple[str, int, int, int]] = [("reverse", 0, n_layers, m_top)]
    while tasks:
        kind, a, b, m = tasks.pop()
        if kind == "backward":
            backward(a)
            continue
        n = b - a
        if n == 0:
            continue
        if n == 1:
            ops.append((Op.FORWARD, a))
            backward(a)
            continue
        j = next(
            j for j in range(1, n + 1) if j + table[n - j, m - 1] + table[j - 1, m] == table[n, m]
        )
        for t in range(a, a + j):  # advance, keeping only A_{a+j-1}
            ops.append((Op.FORWARD, t))
            if t > a:
                ops.append((Op.RELEASE, t - 1))
        tasks += [("reverse", a, a + j - 1, m), ("backward", a + j - 1, 0, 0)]
        tasks.append(("reverse", a + j, b, m - 1))
    assert sum(op is Op.FORWARD for op, _ in ops) == total
    return tuple(ops)
