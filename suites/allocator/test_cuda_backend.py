"""The ``cuda`` backend without a GPU: its order of operations over a fake CuPy, and the
behaviour with CuPy or a device missing. (The real-GPU runs are every suite's ``[cuda]`` items,
which skip here with the reason.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import harness
from allocator import fork_unsafe_reason
from allocator.device import backend_unavailable_reason
from allocator.device.cuda import kernel_probe_reason
from harness import Outcome

from . import _cuda_probes, _fake_cupy

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


def test_without_nvrtc_cuda_is_unavailable_with_cupys_reason(death):
    report = death.run(_cuda_probes.without_nvrtc).assert_clean().returned
    assert report["error"] == (
        "device 0: a tiny CuPy kernel failed to compile or run: RuntimeError: "
        + _fake_cupy.NVRTC_MISSING
    )
    assert report["fork_unsafe"] == "allocator: the cuda backend initialized CUDA on device 0"


def check_backend_logic(outcome: Outcome) -> dict:
    outcome.assert_clean()
    report = outcome.returned
    assert report["violations"] == 0, "a block was freed while a kernel was using it"
    assert report["wrong_device"] == [], "an operation ran on the current device, not its own"
    return report


@pytest.mark.parametrize("latency", [0, 3], ids=["events-done", "events-pending"])
def test_backend_logic_over_fake_cupy(death, latency):
    report = check_backend_logic(death.run(_cuda_probes.backend_logic, latency))
    expected = "allocator: the cuda backend initialized CUDA on device 1"
    assert report["allocator_fork_unsafe"] == expected and report["device_id"] == 1
    assert report["fork_unsafe"] == expected  # through harness.add_fork_safety_check
    assert "style='fork' is refused" in report["fork_refused"]
    assert expected in report["fork_refused"]
    assert report["add"] == [8.0] * 16 and report["fma_sum"] == 16 * 18.0
    cap = report["cap"]
    assert (cap["cache_bytes"], cap["cap_evictions"], cap["cache_cap_bytes"]) == (MIB, 28, MIB)
    assert report["events_made_after_reuse"] == report["events_made"]  # events are pooled
    assert report["events_made"] <= 32
    # the stream rule: the same stream reuses a cached block at once, its event done or not
    assert report["hits"] >= 4
    assert report["oom"]["oom_flushes"] == 1 and report["oom"]["cache_bytes"] == 0
    assert report["other_error"].startswith("CUDARuntimeError: cudaErrorIllegalAddress")
    assert report["flushes_on_other_error"] == 0
    assert report["interop_live_delta"] == 1004  # rounded up to whole float32 elements
    assert report["interop_owner"] == "Buffer" and report["interop_after_drop"] == 0
    assert report["interop_device"] == 1 and report["interop_memory"] == [1001, True]
    assert report["interop_zero"] == [0, 0, 1]
    oom = report["interop_oom"]
    assert oom["is_cupy_oom"] and oom["is_device_oom"] and oom["pickles_as"] == "DeviceOutOfMemory"
    assert oom["message"].startswith(f"out of device memory on cuda: requested={64 * MIB} bytes")
    device_reason = f"cudaMalloc({64 * MIB}): cudaErrorMemoryAllocation: out of memory"
    assert oom["reason"] == device_reason and oom["message"].endswith(f" ({device_reason})")
    assert oom["cupy_fields"][0] == 64 * MIB and oom["cupy_fields"][2] == 0
    assert report["after_collect"] == 7 * MIB and report["flushes_after_collect"] == 1
    assert report["interop_wrong_backend"] == (
        "cupy_allocator needs an allocator on the cuda backend, got 'sim' (set"
        " DEVMEM_BACKEND=cuda or pass Allocator(AllocatorConfig(backend='cuda')))"
    )
    free, total = report["memory_info"]
    assert total == 10 * MIB and 0 <= free <= total


def test_teeth_an_eviction_that_frees_without_waiting_is_caught(death):
    outcome = death.run(_cuda_probes.backend_logic, 3, "evict_without_wait")
    with pytest.raises(AssertionError, match="freed while a kernel was using it"):
        check_backend_logic(outcome)


def test_teeth_kernels_on_the_current_device_are_caught(death):
    outcome = death.run(_cuda_probes.backend_logic, 0, "kernels_on_the_current_device")
    with pytest.raises(AssertionError, match="ran on the current device, not its own"):
        check_backend_logic(outcome)


def test_dropping_the_allocator_frees_its_blocks(death):
    report = death.run(_cuda_probes.teardown).assert_clean().returned
    assert (report["cached"], report["device_blocks"]) == (3 * 1024, 4)
    assert (report["device_blocks_after"], report["frees"]) == (0, 4)


def test_no_cuda_free_during_interpreter_shutdown(death):
    report = death.run(_cuda_probes.teardown, True).assert_clean().returned
    assert (report["device_blocks_after"], report["frees"]) == (4, 0)


def _fake_cupy_on_path(tmp_path, monkeypatch, nvrtc: bool) -> None:
    """A ``cupy`` module in ``tmp_path`` that installs the fake (on ``PYTHONPATH`` for child
    interpreters, on ``sys.path`` for ``find_spec`` here; this process never imports it), and a
    fake ``nvidia-smi`` that lists one GPU."""
    (tmp_path / "cupy.py").write_text(
        f"from suites.allocator import _fake_cupy\n_fake_cupy.install(nvrtc={nvrtc})\n"
    )
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: Fake GPU (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_the_availability_check_runs_a_kernel_in_a_child(tmp_path, monkeypatch):
    _fake_cupy_on_path(tmp_path, monkeypatch, nvrtc=True)
    assert kernel_probe_reason() is None
    assert backend_unavailable_reason("cuda") is None
    assert "cupy" not in sys.modules and fork_unsafe_reason() is None  # CUDA stayed in the child


def test_without_nvrtc_the_availability_check_gives_cupys_reason(tmp_path, monkeypatch):
    _fake_cupy_on_path(tmp_path, monkeypatch, nvrtc=False)
    expected = (
        "device 0: a tiny CuPy kernel failed to compile or run: RuntimeError: "
        + _fake_cupy.NVRTC_MISSING
    )
    assert kernel_probe_reason() == expected
    assert backend_unavailable_reason("cuda") == expected


def test_a_probe_that_hangs_or_dies_silently_is_a_reason(tmp_path, monkeypatch):
    (tmp_path / "cupy.py").write_text(
        "import os, time\nif os.environ.get('HANG'): time.sleep(60)\nos._exit(3)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert kernel_probe_reason() == "the CuPy kernel probe exited with status 3"
    monkeypatch.setenv("HANG", "1")
    assert kernel_probe_reason(timeout=1) == "the CuPy kernel probe did not finish within 1 s"


def test_the_interop_draws_from_the_default_allocator_by_default(death):
    env = {"DEVMEM_BACKEND": "cuda", "DEVMEM_CACHE_CAP_BYTES": None, "DEVMEM_ARENA_DEBUG": None}
    outcome = death.run(_cuda_probes.interop_on_the_default_allocator, env=env)
    assert outcome.assert_clean().returned == {"owner_is_default": True, "live": 64}


@pytest.mark.parametrize("latency", [0, 50], ids=["events-done", "events-pending"])
def test_the_memory_history_on_cuda_adds_up(death, latency):
    report = death.run(_cuda_probes.history_on_cuda, latency).assert_clean().returned
    assert report["verdicts"] == {"accounts": None, "segments": None, "page": None}
    assert report["pointers_are_addresses"] is True
    assert {"alloc", "free_requested", "free_completed", "segment_alloc"} <= set(report["actions"])
    assert {"segment_free", "oom"} <= set(report["actions"])  # the flush, then the oom
    cached = "active_pending_free" if latency else "inactive"  # events still running, or done
    assert report["states"] == ["active_allocated", cached]


def check_streams(outcome: Outcome) -> dict:
    report = check_backend_logic(outcome)
    assert report["default_is_null"] and report["side"] == ["stream1", True, 1]
    assert report["current_inside"] == [True, 1] and report["current_after"] == [True, 0]
    assert report["reentered"] == [True, 1] and report["after_reentry"] == [True, True]
    assert report["fill_log"] == [["kernel", "stream1"]]
    assert report["wait_log"] == [["event.record", "stream1"], ["stream.wait_event", "null"]]
    assert report["mul_log"] == [["kernel", "null"]] * 3  # out, a, a
    # its own stream's event, then one on the stream record_stream named
    assert report["free_log"] == [["event.record", "stream1"], ["event.record", "null"]], (
        "no event on the recorded stream"
    )
    assert report["awaiting"] == [["default"]]  # the null stream's kernel is in flight
    assert report["reused"] and report["sum"] == 16.0
    return report


def test_streams_over_fake_cupy(death):
    check_streams(death.run(_cuda_probes.streams_logic, 1))


def test_teeth_a_free_that_ignores_the_recorded_streams_is_caught(death):
    outcome = death.run(_cuda_probes.streams_logic, 1, "free_ignores_record_stream")
    with pytest.raises(AssertionError, match="no event on the recorded stream"):
        check_streams(outcome)


def test_events_over_fake_cupy(death):
    report = death.run(_cuda_probes.events_logic).assert_clean().returned
    assert report == {
        "made": 1,
        "device": 1,
        "log": [["event.record", "stream1"], ["stream.wait_event", "null", "stream1"]],
        "first_query": False,
        "after_sync": True,
        "sum": 16.0,
        "wrong_device": [],
        "violations": 0,
    }


@pytest.mark.backends("cuda")
def test_a_cuda_death_child_finds_cupy_imported_by_the_zygote(death, backend):
    # Where cuda runs (a GPU, or the fake-GPU lane) the conftest adds CuPy to the zygote's
    # preload list: a forkserver child then pays for its CUDA context, not for the import.
    assert {"cupy", "allocator.device.cuda"} <= set(harness.forkserver_preload())
    outcome = death.run(_cuda_probes.what_the_zygote_imported, style="forkserver")
    report = outcome.assert_clean().returned
    assert report == {"cupy": True, "fork_unsafe": None, "cupy_initialized_cuda": False}


def test_the_fake_fails_cuda_in_a_process_forked_after_initialization(death):
    report = death.run(_cuda_probes.fake_fork_after_init).assert_clean().returned
    assert report == {
        "before": "ok",
        "after": "CUDARuntimeError: cudaErrorInitializationError: initialization error",
        "here": True,
        "initialized_in_this_process": True,
    }


RACE_LINE = (
    r"fake cuda: stream null reads block #1 \(cudaMalloc 0x[0-9a-f]+\) while stream stream1's"
    r" write \(until t=\d+\) is not waited for; on a GPU this reads or writes the block unordered"
)


def test_the_fake_aborts_on_a_read_of_another_streams_unwaited_write(death):
    death.run(_cuda_probes.fake_stream_read, "none").assert_aborted(RACE_LINE)


@pytest.mark.parametrize("waits", ["wait_stream", "synchronize"])
def test_the_fake_lets_an_ordered_read_through(death, waits):
    assert death.run(_cuda_probes.fake_stream_read, waits).assert_clean().returned == 48.0


def test_the_fakes_free_memory_moves_with_other_tenants_and_its_own_blocks(death):
    busy = death.run(_cuda_probes.fake_memory_info, True).assert_clean().returned
    quiet = death.run(_cuda_probes.fake_memory_info, False).assert_clean().returned
    assert busy["total"] == quiet["total"] == 64 * MIB
    assert busy["free"][0] != busy["free"][1]  # another tenant moved it between two calls
    assert all(free < 64 * MIB for free in busy["free"])
    assert quiet["free"] == [64 * MIB, 64 * MIB, 63 * MIB]  # only its own block


def test_a_fork_style_test_after_a_cuda_test_in_the_same_worker_forks(tmp_path):
    # The first H200 run: a cuda allocator built in an xdist worker made it refuse every later
    # style="fork" test. On the fake GPU (ci/fake_gpu: the fake CuPy as cupy, a stand-in
    # nvidia-smi), one worker runs a cuda item that builds an allocator, then fork-style tests.
    root = Path(__file__).resolve().parents[2]
    fake = root / "ci" / "fake_gpu"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(fake), os.environ.get("PYTHONPATH")])),
        "PATH": f"{fake / 'bin'}{os.pathsep}{os.environ['PATH']}",
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "1", "-v"]
    argv += ["--backend", "cuda", "--strict-backends", "--junitxml", str(tmp_path / "r.xml")]
    argv += [
        "suites/allocator/test_stats.py::test_device_memory_fields",  # builds a cuda allocator
        "suites/harness/test_endings.py::test_exit_code_three[fork]",
        "suites/harness/test_endings.py::test_returned_value[fork]",
    ]
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
    lines = done.stdout.splitlines()
    ran = [line.split("PASSED ", 1)[1].strip() for line in lines if line.startswith("[gw0]")]
    assert ran == [  # in this order, on the one worker
        "suites/allocator/test_stats.py::test_device_memory_fields[cuda]",
        "suites/harness/test_endings.py::test_exit_code_three[fork]",
        "suites/harness/test_endings.py::test_returned_value[fork]",
    ], lines
    assert any(line.startswith("death tests: 2 children (fork 2)") for line in lines), lines


@pytest.mark.parametrize("waits", [False, True], ids=["unordered", "waited"])
def test_the_stream_check_counts_memory_handed_to_cupy_as_written(death, waits):
    report = death.run(_cuda_probes.cupy_memory_read_on_another_stream, waits)
    report = report.assert_clean().returned
    if waits:
        assert report == {"sum": 0.0, "error": None}
    else:
        assert report["sum"] is None
        assert report["error"].startswith(
            "devmem cuda: stream check: stream default reads block #1 (sum) while stream"
            " side's write (allocate"
        ), report
