"""The repro command reruns the child from a shell and ends the same way."""

from __future__ import annotations

import json
import subprocess

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
