"""The commands ``ci/check.sh`` runs for each of its options, read from stand-ins for
``.venv/bin/python``, ruff, check-jsonschema and nvidia-smi that only log their arguments."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE = """\
#!/bin/sh
printf '[%s]' "$(basename "$0")" >> "$CHECK_LOG"
for arg in "$@"; do printf '[%s]' "$arg"; done >> "$CHECK_LOG"
echo >> "$CHECK_LOG"
"""
FAKE_SMI = "#!/bin/sh\necho 'GPU 0: Stand-in (UUID: GPU-0)'\n"


def _commands(tmp_path: Path, *options: str, pytest_args: str | None = None) -> list[list[str]]:
    """The commands ``ci/check.sh --no-build <options>`` runs (program name first), in a copy of
    the script whose ``.venv/bin`` has stand-ins for python, ruff and check-jsonschema that
    only log their arguments, and with a stand-in ``nvidia-smi`` that lists one GPU.
    ``PYTEST_ARGS`` is ``pytest_args`` (by default unset, whatever this run's is)."""
    repo = tmp_path / "repo"
    (repo / "ci").mkdir(parents=True)
    shutil.copy2(ROOT / "ci" / "check.sh", repo / "ci" / "check.sh")
    shutil.copytree(ROOT / ".github", repo / ".github")
    bin_ = repo / ".venv" / "bin"
    bin_.mkdir(parents=True)
    for name in ("python", "ruff", "check-jsonschema"):
        (bin_ / name).write_text(FAKE)
        (bin_ / name).chmod(0o755)
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "nvidia-smi").write_text(FAKE_SMI)
    (driver / "nvidia-smi").chmod(0o755)
    log = tmp_path / "log"
    log.write_text("")
    env = {name: value for name, value in os.environ.items() if name != "PYTEST_ARGS"}
    env["PATH"] = f"{driver}{os.pathsep}{env.get('PATH', '')}"
    if pytest_args is not None:
        env["PYTEST_ARGS"] = pytest_args
    done = subprocess.run(
        ["bash", "ci/check.sh", "--no-build", *options],
        cwd=repo,
        env={**env, "CHECK_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.endswith(
        "check passed.\nRun the suites again, in any shell: .venv/bin/pytest -n auto\n"
    )
    return [line[1:-1].split("][") for line in log.read_text().splitlines()]


def _pytest_runs(tmp_path: Path, *options: str, pytest_args: str | None = None) -> list[list[str]]:
    """The argument lists of the pytest runs of ``ci/check.sh --no-build --no-lint <options>``."""
    runs = _commands(tmp_path, "--no-lint", *options, pytest_args=pytest_args)
    return [run[3:] for run in runs if run[:3] == ["python", "-m", "pytest"]]


@pytest.mark.parametrize("nightly", [(), ("--nightly",)], ids=["ci", "nightly"])
def test_with_interop_only_the_interop_step_runs_interop_tests(tmp_path, nightly):
    runs = _pytest_runs(tmp_path, "--interop", *nightly)
    interop = [run for run in runs if "--interop" in run]
    assert interop == [["-n", "2", "-m", "interop", "--interop"]]
    others = [run for run in runs if "--interop" not in run]
    assert len(others) == 3  # every suite (or the nightly's), the harness forked, hostile
    for run in others:
        assert run[run.index("-m") + 1] == "not interop", run  # no "run with --interop" skips


def test_without_interop_the_interop_tests_skip_with_the_reason(tmp_path):
    runs = _pytest_runs(tmp_path)
    assert len(runs) == 3 and not any("-m" in run for run in runs)
    # the main step runs the harness under xdist; the second pass forks every test of it
    assert ["-n", "2", "--forked", "suites/harness"] in runs


def test_no_xdist_run_is_quiet(tmp_path):
    # pytest-xdist under -q prints "bringing up nodes..." twice instead of its status lines
    runs = _pytest_runs(tmp_path, "--interop")
    assert sum("-n" in run for run in runs) == 4  # every suite, interop, harness, hostile
    assert not [run for run in runs if "-n" in run and "-q" in run]


def test_lint_runs_ruff_and_validates_every_workflow(tmp_path):
    commands = _commands(tmp_path, "--no-test")
    assert commands == [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        [
            "check-jsonschema",
            "--builtin-schema",
            "vendor.github-workflows",
            ".github/workflows/ci.yml",
            ".github/workflows/nightly-gpu.yml",
        ],
    ]
    assert _commands(tmp_path / "no-lint", "--no-test", "--no-lint") == []


def test_ci_all_imports_every_module_first(tmp_path):
    commands = _commands(tmp_path, "--ci-all", "--no-lint", "--no-test")
    assert commands == [["python", "ci/import_all.py", "allocator", "harness", "runtime"]]


def test_cuda_pins_workers_to_gpus_and_runs_cuda_strictly(tmp_path):
    runs = _pytest_runs(tmp_path, "--cuda")
    assert runs[0][:4] == ["-n", "auto", "--backend", "cpu,sim"]  # cuda gets its own run
    strict = [run for run in runs if "--strict-backends" in run]
    assert strict == [["-n", "auto", "--backend", "cuda", "--strict-backends", "--gpus", "auto"]]
    hostile = runs[-1]
    assert hostile[:4] == ["-n", "auto", "--backend", "cpu,sim,cuda"] and "--gpus" in hostile


def test_nightly_writes_reports_then_runs_mutation_testing(tmp_path):
    commands = _commands(tmp_path, "--nightly", "--no-lint")
    first = commands[0]
    assert first[:4] == ["python", "-m", "pytest", "-n"] and "--stress-scale" in first
    assert first[first.index("--junitxml") + 1] == "reports/nightly.xml"
    programs = [command[1] for command in commands if command[0] == "python"][1:4]
    assert programs == ["ci/memory_pictures.py", "ci/nightly_summary.py", "ci/mutation.py"]
    assert ["python", "ci/mutation.py", "--out", "reports/mutation.md"] in commands


def test_pytest_args_reach_every_pytest_run(tmp_path):
    runs = _pytest_runs(tmp_path, pytest_args="-x --maxfail 3")
    assert len(runs) == 3 and all(run[-3:] == ["-x", "--maxfail", "3"] for run in runs)
