"""The commands ``ci/check.sh`` runs, read from a stand-in ``.venv/bin/python`` that logs its
arguments: which pytest runs leave the interop tests out, and which are quiet."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTHON = """\
#!/bin/sh
for arg in "$@"; do printf '[%s]' "$arg"; done >> "$CHECK_LOG"
echo >> "$CHECK_LOG"
"""


def _pytest_runs(tmp_path: Path, *options: str) -> list[list[str]]:
    """The argument lists of the pytest runs of ``ci/check.sh --no-build --no-lint <options>``,
    in a copy of the script whose ``.venv/bin/python`` only logs them."""
    repo = tmp_path / "repo"
    (repo / "ci").mkdir(parents=True)
    shutil.copy2(ROOT / "ci" / "check.sh", repo / "ci" / "check.sh")
    python = repo / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    log = tmp_path / "log"
    log.write_text("")
    env = {name: value for name, value in os.environ.items() if name != "PYTEST_ARGS"}
    done = subprocess.run(
        ["bash", "ci/check.sh", "--no-build", "--no-lint", *options],
        cwd=repo,
        env={**env, "CHECK_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [line[1:-1].split("][") for line in log.read_text().splitlines()]
    return [run[2:] for run in runs if run[:2] == ["-m", "pytest"]]


@pytest.mark.parametrize("nightly", [(), ("--nightly",)], ids=["ci", "nightly"])
def test_with_interop_only_the_interop_step_runs_interop_tests(tmp_path, nightly):
    runs = _pytest_runs(tmp_path, "--interop", *nightly)
    interop = [run for run in runs if "--interop" in run]
    assert interop == [["-n", "2", "-m", "interop", "--interop"]]
    others = [run for run in runs if "--interop" not in run]
    assert len(others) == 4  # every suite (or the nightly's), the harness twice, hostile
    for run in others:
        assert run[run.index("-m") + 1] == "not interop", run  # no "run with --interop" skips


def test_without_interop_the_interop_tests_skip_with_the_reason(tmp_path):
    runs = _pytest_runs(tmp_path)
    assert len(runs) == 4 and not any("-m" in run for run in runs)


def test_no_xdist_run_is_quiet(tmp_path):
    # pytest-xdist under -q prints "bringing up nodes..." twice instead of its status lines
    runs = _pytest_runs(tmp_path, "--interop")
    assert sum("-n" in run for run in runs) == 4
    assert not [run for run in runs if "-n" in run and "-q" in run]
