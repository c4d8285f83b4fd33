"""What Revolve minimises, and the executor's own optimum (issue 21 item 6).

Revolve reaches Griewank and Walther's ``t(N, s)``, the fewest forward steps where a snapshot is
a state that its own step recomputes from. In this executor a kept activation also serves its
own layer's backward, so Revolve is not minimal here. :func:`min_forward_calls` (a dynamic
program) is checked against an exhaustive search under the executor's own ``replay()`` rules,
and :func:`optimal_schedule` replays to exactly that count within the activation budget.
"""

from __future__ import annotations

import heapq
import math

import pytest

from runtime.checkpoint import (
    min_forward_calls,
    optimal_schedule,
    replay,
    revolve_forward_count,
    revolve_schedule,
)


def exhaustive_min_forward_calls(n: int, activations: int) -> float:
    """The oracle: a shortest-path search over the executor's states (the live activations,
    the next layer to backpropagate) with ``replay()``'s rules: FORWARD ``i`` needs ``A_{i-1}``
    live (or ``i == 0``) and costs 1; RELEASE is free; BACKWARD ``k`` needs ``A_k``, in order
    from the last layer. At most ``activations`` live at any time. ``inf`` if impossible."""
    start = (0, n - 1)
    best = {start: 0}
    queue = [(0, start)]
    while queue:
        cost, (live, k) = heapq.heappop(queue)
        if best.get((live, k), math.inf) < cost:
            continue
        if k < 0:
            return cost
        moves = []
        count = bin(live).count("1")
        for i in range(k + 1):  # activations of layers past k are of no use any more
            if not live >> i & 1 and (i == 0 or live >> (i - 1) & 1) and count < activations:
                moves.append((cost + 1, (live | 1 << i, k)))
        moves += [(cost, (live & ~(1 << i), k)) for i in range(n) if live >> i & 1]
        if live >> k & 1:
            moves.append((cost, (live & ~(1 << k), k - 1)))
        for new_cost, state in moves:
            if new_cost < best.get(state, math.inf):
                best[state] = new_cost
                heapq.heappush(queue, (new_cost, state))
    return math.inf


def test_the_dynamic_program_is_the_exhaustive_optimum():
    for n in range(1, 11):
        for activations in range(1, n + 2):
            expected = exhaustive_min_forward_calls(n, activations)
            if expected == math.inf:
                with pytest.raises(ValueError, match="activations=1: a chain of"):
                    min_forward_calls(n, activations)
            else:
                assert min_forward_calls(n, activations) == expected, (n, activations)


def test_the_optimal_schedule_replays_to_the_optimum_within_its_budget():
    cases = [(n, m) for n in range(1, 41) for m in range(2, 11)]
    for n, activations in [*cases, (64, 2), (64, 5), (64, 9), (64, 33), (64, 64)]:
        replayed = replay(n, optimal_schedule(n, activations))
        assert sum(replayed.forward_calls) == min_forward_calls(n, activations)
        assert replayed.peak_activations <= activations


def test_revolve_is_not_the_minimum_in_this_executor():
    """Revolve's ``N + t(N, s)`` at its peak of ``min(N, s+1)`` activations against the
    optimum at the same peak: never below it, above it in 567 of 576 plans (N <= 64,
    s <= 9), e.g. 100 calls against 64 for N = 32, s = 5 and 3 against 2 for N = 2, s = 1."""
    above = 0
    for n in range(1, 65):
        for s in range(1, 10):
            revolve = n + revolve_forward_count(n, s)  # its schedule's count (executor suite)
            optimum = min_forward_calls(n, min(n, s + 1))
            assert optimum <= revolve
            above += optimum < revolve
    assert above == 567
    assert sum(replay(32, revolve_schedule(32, 5)).forward_calls) == 100
    assert (32 + revolve_forward_count(32, 5), min_forward_calls(32, 6)) == (100, 64)
    assert (2 + revolve_forward_count(2, 1), min_forward_calls(2, 2)) == (3, 2)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((0, 2), ValueError, "n_layers=0"),
        ((3, 0), ValueError, "activations=0"),
        (
            (3, 1),
            ValueError,
            r"^activations=1: a chain of 3 layers needs 2 \(advancing holds the activation before"
            r" a layer and its own\)$",
        ),
        ((3.0, 2), TypeError, "n_layers must be an int"),
    ],
)
def test_bad_arguments(args, error, match):
    with pytest.raises(error, match=match):
        min_forward_calls(*args)
    with pytest.raises(error, match=match):
        optimal_schedule(*args)


class _OptimalPlan:
    """What :func:`run_checkpointed` reads of a plan, for the optimal schedule."""

    def __init__(self, n_layers: int, activations: int) -> None:
        self.n_layers = n_layers
        self._schedule = optimal_schedule(n_layers, activations)

    def schedule(self):
        return self._schedule


@pytest.mark.parametrize(("n", "activations"), [(1, 2), (2, 2), (7, 2), (32, 6), (33, 4), (64, 9)])
def test_the_optimal_schedule_runs_on_the_allocator(make_alloc, n, activations):
    from runtime.checkpoint import chain_result, run_checkpointed

    run = run_checkpointed(make_alloc(), _OptimalPlan(n, activations), elems=8)
    assert sum(run.forward_calls) == min_forward_calls(n, activations)
    assert run.peak_activations <= activations
    assert run.result == chain_result(n)  # the gradient is right: nothing recomputed wrongly


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((0, 2), ValueError, r"^n_layers=0: expected an integer >= 1$"),
        ((3, 0), ValueError, r"^snaps=0: expected an integer >= 1$"),
        ((3.0, 2), TypeError, r"^n_layers must be an int, got float 3\.0$"),
        ((3, "2"), TypeError, r"^snaps must be an int, got str '2'$"),
    ],
)
def test_revolve_counts_and_schedules_reject_bad_arguments_naming_them(args, error, match):
    from runtime.checkpoint import revolve_forward_calls

    with pytest.raises(error, match=match):
        revolve_forward_calls(*args)
    with pytest.raises(error, match=match):
        revolve_schedule(*args)
