"""``--gpus``: one GPU per xdist worker through CUDA_VISIBLE_DEVICES (no GPU needed)."""

from __future__ import annotations

import os
import re
import stat

import pytest

from harness import HarnessError
from harness._gpus import gpu_for_worker, list_gpus, resolve_gpus


@pytest.fixture
def no_visible(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _fake_smi(tmp_path, monkeypatch, output: str, status: int = 0) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nprintf '{output}'\nexit {status}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_list_gpus_reads_nvidia_smi(tmp_path, monkeypatch, no_visible):
    _fake_smi(
        tmp_path,
        monkeypatch,
        "GPU 0: NVIDIA H200 (UUID: GPU-a)\\nGPU 1: NVIDIA H200 (UUID: GPU-b)\\n",
    )
    assert list_gpus() == (["0", "1"], None)
    assert resolve_gpus("auto") == ["0", "1"]


def test_list_gpus_says_why_there_are_none(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # no driver: the variable alone is not a GPU
    _fake_smi(tmp_path, monkeypatch, "NVIDIA-SMI has failed", status=9)
    ids, reason = list_gpus()
    assert ids == [] and reason == "no GPU visible to nvidia-smi -L (NVIDIA-SMI has failed)"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert list_gpus() == ([], "no NVIDIA driver: nvidia-smi is not on PATH")
    with pytest.raises(HarnessError, match="--gpus auto found no GPU: no NVIDIA driver"):
        resolve_gpus("auto")


def test_cuda_visible_devices_wins(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch, "GPU 0: A\\nGPU 1: B\\nGPU 2: C\\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4, 6")
    assert resolve_gpus("auto") == ["4", "6"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(HarnessError, match="CUDA_VISIBLE_DEVICES is set but empty"):
        resolve_gpus("auto")


@pytest.mark.parametrize(
    ("spec", "gpus"), [("3", ["0", "1", "2"]), ("0,2", ["0", "2"]), ("GPU-a", ["GPU-a"])]
)
def test_resolve_counts_and_lists(spec, gpus):
    assert resolve_gpus(spec) == gpus


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("0", "--gpus 0: expected a count >= 1"),
        ("", "--gpus '': expected 'auto', a count N >= 1, or a comma-separated list of GPU"),
        (" , ", "got nothing"),
        ("banana", "'banana' is neither"),
        ("1.5", "'1.5' is neither"),
        ("0,,2", "'' is neither"),
        ("0, GPU-", "'GPU-' is neither"),
    ],
)
def test_resolve_refuses_bad_specs(spec, says):
    # Issue 14: banana and 1.5 used to pass through as CUDA_VISIBLE_DEVICES, hiding every GPU.
    with pytest.raises(HarnessError, match=re.escape(says)):
        resolve_gpus(spec)


@pytest.mark.parametrize("spec", ["MIG-4f2a-77/1/0", "GPU-8e3f1c2a-0b1d-4c6e-9f00-123456789abc"])
def test_resolve_takes_uuids(spec):
    assert resolve_gpus(spec) == [spec]


def test_gpu_for_worker():
    assert [gpu_for_worker(f"gw{i}", ["0", "1"]) for i in range(4)] == ["0", "1", "0", "1"]
    assert gpu_for_worker(None, ["3", "1"]) == "3"
    with pytest.raises(HarnessError, match="unexpected xdist worker id 'worker-1'"):
        gpu_for_worker("worker-1", ["0"])
    with pytest.raises(HarnessError, match="no GPU to pin to"):
        gpu_for_worker("gw0", [])


PINNED = """
import os

import harness


def visible():
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_pinned_{i}(death):
    worker = os.environ["PYTEST_XDIST_WORKER"]
    expected = str(int(worker[2:]) % 2)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == expected
    assert death.run(visible).assert_clean().returned == expected  # children inherit it
    with open(f"pinned-{i}.txt", "w") as out:
        out.write(f"{{worker}} {{expected}}")
"""


def test_each_xdist_worker_is_pinned_and_children_inherit(pytester, runpytest, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pytester.makepyfile(**{f"test_pin{i}": PINNED.format(i=i) for i in range(4)})
    result = runpytest("--tx", "2*popen", "--dist", "loadfile", "--gpus", "2")
    result.assert_outcomes(passed=4)
    seen = {(pytester.path / f"pinned-{i}.txt").read_text() for i in range(4)}
    assert seen == {"gw0 0", "gw1 1"}, seen  # both workers ran, each on its own GPU


@pytest.mark.parametrize(
    ("value", "line"), [("0", "*--gpus 0: expected a count >= 1*"), ("banana", "*'banana' is*")]
)
def test_a_bad_gpus_value_is_a_usage_error(pytester, runpytest, value, line):
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = runpytest("--gpus", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([line])


# Issue 9, case 11: with local xdist workers, a --gpus value that finds no GPU fails once, in
# the controller, with one line (not once per worker, with a traceback each).
def test_gpus_auto_without_a_gpu_fails_once_under_xdist(pytester, runpytest, tmp_path, monkeypatch):
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    monkeypatch.setenv("PATH", str(tmp_path / "no-driver"))  # no nvidia-smi

    result = runpytest("-n", "2", "--gpus", "auto")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.lines + result.stderr.lines
    errors = [line for line in output if "--gpus auto found no GPU" in line]
    assert errors == [
        "ERROR: --gpus auto found no GPU: no NVIDIA driver: nvidia-smi is not on PATH"
    ]
    assert not [line for line in output if "node down" in line or "Traceback" in line], output
