"""Leak bound: two blocks of 128 steps (full, full, add, mul, sum, four releases) leave
``live_bytes`` and ``alloc_count - free_count`` exactly where they started."""

from __future__ import annotations

from . import _probes, _stress


def test_leak_bound(make_alloc, stress_scale):
    _stress.leak_bound(make_alloc(arena_debug="raise"), steps=128 * stress_scale)


def test_teeth_a_leaking_temporary_is_caught(death, backend):
    outcome = death.run(_probes.stress_check, "leak_bound", backend, "sum_leaks_a_temporary")
    outcome.assert_raised("AssertionError")
    assert outcome.raised is not None and outcome.raised.type == "AssertionError"
    assert "the steps leak" in outcome.raised.message


def test_the_mutant_probe_passes_without_the_mutant(death, backend):
    death.run(_probes.stress_check, "leak_bound", backend).assert_clean()
