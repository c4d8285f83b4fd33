"""The ``cuda`` backend without a GPU: its order of operations over a fake CuPy, and the
behaviour with CuPy or a device missing. (The real-GPU runs are every suite's ``[cuda]`` items,
which skip here with the reason.)"""

from __future__ import annotations

import pytest

from harness import Outcome

from . import _cuda_probes

MIB = 1 << 20


def test_without_cupy_cuda_is_unavailable_with_the_reason(death):
    report = death.run(_cuda_probes.without_cupy).assert_clean().returned
    assert report["reason"].startswith("CuPy is not installed")
    assert report["error"].startswith("CuPy is not installed")
    assert report["fork_unsafe"] is None


def test_without_a_device_the_error_carries_cupys_reason(death):
    report = death.run(_cuda_probes.no_device).assert_clean().returned
    assert report["error"] == (
        "CuPy cannot reach a CUDA device: cudaErrorNoDevice: no CUDA-capable device is detected"
    )
    assert report["fork_unsafe"] is None


def check_backend_logic(outcome: Outcome) -> dict:
    outcome.assert_clean()
    report = outcome.returned
    assert report["violations"] == 0, "a block was freed while a kernel was using it"
    return report


@pytest.mark.parametrize("latency", [0, 3], ids=["events-done", "events-pending"])
def test_backend_logic_over_fake_cupy(death, latency):
    report = check_backend_logic(death.run(_cuda_probes.backend_logic, latency))
    assert report["fork_unsafe"].startswith("allocator: the cuda backend initialized CUDA")
    assert "style='fork' is refused" in report["fork_refused"]
    assert report["add"] == [8.0] * 16 and report["fma_sum"] == 16 * 18.0
    cap = report["cap"]
    assert (cap["cache_bytes"], cap["cap_evictions"], cap["cache_cap_bytes"]) == (MIB, 28, MIB)
    assert report["events_made_after_reuse"] == report["events_made"]  # events are pooled
    assert report["events_made"] <= 32
    if latency == 0:
        assert report["hits"] >= 4
    assert report["oom"]["oom_flushes"] == 1 and report["oom"]["cache_bytes"] == 0
    assert report["other_error"].startswith("CUDARuntimeError: cudaErrorIllegalAddress")
    assert report["flushes_on_other_error"] == 0
    assert report["interop_live_delta"] == 1004  # rounded up to whole float32 elements
    assert report["interop_owner"] == "Buffer" and report["interop_after_drop"] == 0
    assert report["interop_zero"] == 0
    assert "needs an allocator on the cuda backend, got 'sim'" in report["interop_wrong_backend"]
    free, total = report["memory_info"]
    assert total == 10 * MIB and 0 <= free <= total


def test_teeth_an_eviction_that_frees_without_waiting_is_caught(death):
    outcome = death.run(_cuda_probes.backend_logic, 3, "evict_without_wait")
    with pytest.raises(AssertionError, match="freed while a kernel was using it"):
        check_backend_logic(outcome)
