"""The repro command reruns the child from a shell and ends the same way."""

from __future__ import annotations

import json
import pathlib
import shlex
import subprocess

import pytest

import harness
from suites.harness import _targets


def _shell(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=60, check=False
    )


def test_repro_of_an_abort_aborts(run, style):
    outcome = run(_targets.abort_with, "fatal: repro me").assert_aborted()

    assert "_exec_runner.py --request " in outcome.repro
    rerun = _shell(outcome.repro)
    assert rerun.returncode in (-6, 134)  # SIGABRT, directly or as reported by bash
    assert "fatal: repro me" in rerun.stderr


def test_repro_carries_arguments_and_env(run, monkeypatch):
    monkeypatch.setenv("REPRO_GONE", "set in the shell")
    outcome = run(
        _targets.env_values,
        "REPRO_SET",
        "REPRO_GONE",
        "DEVMEM_DEATH_CHILD",
        env={"REPRO_SET": "it's set", "REPRO_GONE": None},
    ).assert_clean()
    assert outcome.returned == ["it's set", None, "1"]

    rerun = _shell(outcome.repro)
    assert rerun.returncode == 0, rerun.stderr
    prefix = "devmem-death: returned "
    line = next(line for line in rerun.stderr.splitlines() if line.startswith(prefix))
    assert json.loads(line[len(prefix) :]) == {"value": ["it's set", None, "1"]}


# Issue 18, item 8: a long request goes to a file the repro names; a failure stays small.
@pytest.mark.parametrize("size", [200_000, 5_000_000])
def test_a_long_request_is_in_a_file_under_the_test_s_tmp_path(run, size, tmp_path_factory):
    outcome = run(_targets.abort_with_length, "x" * size).assert_aborted(f"got {size} characters")

    assert len(outcome.repro) < 2000
    words = shlex.split(outcome.repro)
    path = words[words.index("--request-file") + 1]
    assert path.startswith(str(tmp_path_factory.getbasetemp()))
    assert json.loads(pathlib.Path(path).read_text())["args"] == ["x" * size]
    rerun = _shell(outcome.repro)
    assert rerun.returncode in (-6, 134), rerun.stderr[-2000:]
    assert f"got {size} characters" in rerun.stderr
    with pytest.raises(harness.DeathTestFailure) as failure:
        outcome.assert_clean()
    assert len(str(failure.value)) < 20_000


def test_a_failure_shows_at_most_4000_characters_of_a_repro():
    outcome = harness.run_child(
        _targets.lives, env={"HUGE_VALUE": "v" * 50_000}, style="fork", timeout=30
    )
    with pytest.raises(harness.DeathTestFailure) as failure:
        outcome.assert_died()
    message = str(failure.value)
    assert "more characters: Outcome.repro has the whole command]" in message
    assert len(message) < 10_000
    assert len(outcome.repro) > 50_000


def test_outside_pytest_long_requests_share_one_temporary_directory(monkeypatch):
    from harness import _repro

    monkeypatch.setattr(_repro, "_request_dir", None)  # as outside the plugin
    paths = []
    for _ in range(2):
        outcome = harness.run_child(_targets.abort_with_length, "y" * 20_000, style="fork")
        words = shlex.split(outcome.repro)
        paths.append(pathlib.Path(words[words.index("--request-file") + 1]))
    assert paths[0] != paths[1]
    assert paths[0].parent == paths[1].parent
    assert paths[0].parent.name.startswith("devmem-repro-")
