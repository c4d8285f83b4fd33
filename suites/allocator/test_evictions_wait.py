"""Evictions wait for completion events: on ``sim`` with latency > 0 and a cap, cap evictions
and the OOM flush free a block only after its event completes. A free to the device is
``cudaFree``, which synchronizes the whole device (DESIGN 2.4), so on ``sim`` (as on a GPU) the
event wait before it is redundant: a cache that skips it is harmless there, and the simulator's
check that no kernel uses a freed block fires only if its own free forgets the synchronize too
(the simulator before the fix)."""

from __future__ import annotations

import pytest

from harness import DeathTestFailure, Outcome

from . import _probes
from ._knobs import pinned_env

MIB = 1 << 20
ENV = pinned_env(
    "sim",
    DEVMEM_SIM_LATENCY_US="50",
    DEVMEM_CACHE_CAP_BYTES=str(MIB),
    DEVMEM_SIM_CAPACITY_BYTES=str(3 * MIB // 2),
)


def check_waits(outcome: Outcome) -> None:
    outcome.assert_clean()
    report = outcome.returned
    cap, flush = report["cap"], report["flush"]
    assert (cap["cache_bytes"], cap["cap_evictions"], cap["device_frees"]) == (MIB, 2, 2)
    assert flush["oom_flushes"] == 1 and report["big"] == 3 * 65536 + 32768
    assert flush["device_frees"] == 6 and flush["cache_bytes"] == 0


def test_evictions_and_the_flush_wait_for_events(death):
    check_waits(death.run(_probes.evictions_wait, env=ENV))


def test_an_eviction_that_frees_without_waiting_is_harmless_since_cudafree_synchronizes(death):
    check_waits(death.run(_probes.evictions_wait, "evict_without_wait", env=ENV))


def test_teeth_a_free_that_neither_waits_nor_synchronizes_is_caught(death):
    outcome = death.run(
        _probes.evictions_wait, "evict_without_wait+free_without_device_sync", env=ENV
    )
    with pytest.raises(DeathTestFailure, match="SIGABRT"):
        check_waits(outcome)
    outcome.assert_aborted(
        match=r"devmem sim: fatal: free of block #\d+ \(262144 bytes\) while a kernel"
    )
