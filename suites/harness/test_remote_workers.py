"""xdist workers that run elsewhere: the documented multi-host command works (issue 18, item
10). Simulated locally: ``popen//chdir=`` takes xdist's remote path handling, and a worker's
``env:PATH`` without ``nvidia-smi`` is a host without a GPU."""

from __future__ import annotations

import os
import stat

TEST_FILE = """
import harness


def lives():
    return 7


def test_in_a_child(death):
    assert death.run(lives).assert_clean().returned == 7


def test_plain():
    pass
"""


def test_path_arguments_reach_workers_that_run_in_their_chdir(pytester, runpytest):
    pytester.makepyfile(test_remote=TEST_FILE)
    sub = pytester.path / "sub"
    sub.mkdir()
    (sub / "test_deeper.py").write_text("def test_deeper():\n    pass\n")

    result = runpytest("-d", "--tx", f"2*popen//chdir={pytester.path}", "test_remote.py", "sub")

    result.assert_outcomes(passed=3)
    assert "not relative to an rsync root" not in result.stdout.str() + result.stderr.str()


def test_an_argument_outside_the_rootdir_is_refused_saying_why(pytester, runpytest, tmp_path):
    pytester.makepyfile(test_remote=TEST_FILE)
    outside = tmp_path / "elsewhere"
    outside.mkdir()

    result = runpytest(
        "-d",
        "--tx",
        f"1*popen//chdir={pytester.path}",
        "--rootdir",
        str(pytester.path),
        str(outside),
    )

    assert result.ret != 0
    assert "is outside the rootdir" in result.stdout.str() + result.stderr.str()


def test_a_worker_without_a_gpu_fails_its_tests_with_one_line_and_does_not_crash(
    pytester, runpytest, tmp_path, monkeypatch
):
    pytester.makepyfile(test_remote=TEST_FILE)
    smi = tmp_path / "driver" / "nvidia-smi"  # the controller's host has a GPU...
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\nprintf 'GPU 0: NVIDIA H200 (UUID: GPU-a)\\n'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    no_driver = tmp_path / "no-driver"  # ...its workers' host has none

    result = runpytest(
        "-d",
        "--tx",
        f"2*popen//env:PATH={no_driver}",
        "--gpus",
        "auto",
        "--max-worker-restart=1",
        "-rE",
    )

    result.assert_outcomes(errors=2)
    output = result.stdout.str()
    assert "node down" not in output and "replacing crashed worker" not in output, output
    result.stdout.fnmatch_lines(
        ["ERROR test_remote.py::test_* - Failed: --gpus auto found no GPU*"]
    )
    result.stdout.fnmatch_lines(
        ["--gpus auto found no GPU: no NVIDIA driver: nvidia-smi is not on*"]
    )
    # each test's error section says which worker and host (the -rE summary may repeat it,
    # cut to the terminal's width, so count the sections' own lines)
    reports = [
        line
        for line in output.splitlines()
        if line.startswith("--gpus auto found no GPU") and "(on xdist worker gw" in line
    ]
    assert len(reports) == 2, output
