"""Arena stress: k live, never-released buffers per scope, held across the exit, so only the
arena can free them (TorchLean's ``runArenaStress``). In-process, on every backend; scaled by
``--stress-scale``."""

from __future__ import annotations

import pytest

from . import _probes, _stress

N = 4096
K = 64
ARENAS = 4


def test_arena_stress(make_alloc, stress_scale):
    alloc = make_alloc(arena_debug="raise")
    for _ in range(ARENAS * stress_scale):
        _stress.arena_round(alloc, N, K * stress_scale)


def test_promotion_round(make_alloc, stress_scale):
    _stress.promotion_round(make_alloc(arena_debug="raise"), N, K * stress_scale)


def test_promotion_through_two_nested_arenas(make_alloc, stress_scale):
    _stress.nested_round(make_alloc(arena_debug="raise"), N, K * stress_scale)


def test_teeth_an_exit_that_forgets_to_free_is_caught(death, backend):
    outcome = death.run(_probes.stress_check, "arena_stress", backend, "exit_forgets_free")
    outcome.assert_raised("AssertionError")
    assert outcome.raised is not None and outcome.raised.type == "AssertionError"
    assert outcome.raised.message.startswith("arena_exit freed 0 buffers, expected exactly 16")


def test_the_mutant_probe_passes_without_the_mutant(death, backend):
    death.run(_probes.stress_check, "arena_stress", backend).assert_clean()


@pytest.mark.parametrize("k", [1, 7])
def test_small_scopes(make_alloc, k):
    _stress.arena_stress(make_alloc(arena_debug="raise"), n=16, k=k, arenas=2)
