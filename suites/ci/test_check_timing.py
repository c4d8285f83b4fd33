"""``ci/check.sh`` says how long each step took, and that a long silent command still runs.

On a small machine the first run takes half an hour, most of it in silent installs; a step
that prints nothing for minutes looks hung. Each step ends with ``<== <step>: done after 1m05s``
(or ``failed (exit status N) after ...``), the run with ``all steps: ...``, and pip and mutation
testing print ``... still running, 2m00s so far`` every ``CHECK_PROGRESS_S`` seconds."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from suites.ci import read_toml

ROOT = Path(__file__).resolve().parents[2]

# a stand-in .venv/bin/python: pip takes 1.6 s, silently; the editable install fails when
# $FAIL_INSTALL is set
FAKE_PYTHON = """\
#!/bin/sh
case "$*" in
    *"-m pip install"*) sleep 1.6; case "$*" in *-e*) [ -z "$FAIL_INSTALL" ] || exit 3 ;; esac ;;
esac
exit 0
"""


def _check(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    repo = tmp_path / "repo"
    (repo / "ci").mkdir(parents=True)
    shutil.copy2(ROOT / "ci" / "check.sh", repo / "ci" / "check.sh")
    python = repo / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return subprocess.run(
        ["bash", "ci/check.sh", "--no-lint", "--no-test"],
        cwd=repo,
        env={**os.environ, "CHECK_PROGRESS_S": "1", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_each_step_says_how_long_it_took_and_a_long_one_that_it_still_runs(tmp_path):
    done = _check(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert re.search(r"\n    \.\.\. still running, [12]s so far\n", done.stdout), done.stdout
    ends = [line for line in lines if line.startswith("<== ")]
    assert len(ends) == 1 and re.fullmatch(
        r"<== build: \.venv with the project and its test and plot extras: done after [3-9]s",
        ends[0],
    ), done.stdout
    assert re.fullmatch(r"all steps: [3-9]s", lines[-3]), done.stdout
    assert lines[-2:] == [
        "check passed.",
        "Run the suites again, in any shell: .venv/bin/pytest -n auto",
    ]


def test_a_failed_step_says_so_with_its_time_and_the_run_its_total(tmp_path):
    done = _check(tmp_path, FAIL_INSTALL="1")
    assert done.returncode == 3
    assert re.search(
        r"\n<== build: [^\n]*: failed \(exit status 3\) after [2-9]s\n"
        r"all steps: [2-9]s, check failed\.\n$",
        done.stdout,
    ), done.stdout


@pytest.mark.parametrize("script", ["check.sh", "pythons.sh"])
@pytest.mark.parametrize("every", ["0", "-5", "1.5", "sixty", "060"])
def test_a_bad_progress_interval_is_refused_by_name(tmp_path, script, every):
    # before, the ticker's sleep failed at once and the progress lines were silently lost
    repo = tmp_path / "repo"
    (repo / "ci").mkdir(parents=True)
    shutil.copy2(ROOT / "ci" / script, repo / "ci" / script)
    done = subprocess.run(
        ["bash", f"ci/{script}"],
        cwd=repo,
        env={**os.environ, "CHECK_PROGRESS_S": every},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    assert done.stderr == (
        f"ci/{script}: CHECK_PROGRESS_S must be a whole number of seconds above 0, got '{every}'\n"
    )


# a stand-in Python 3.10 for ci/pythons.sh: says its version, makes a venv of itself, pip takes
# 1.6 s, pytest passes (its arguments written to $PYTEST_CALLS)
FAKE_PYTHON_310 = """\
#!/bin/sh
case "$*" in
    *version_info*) echo 3.10 ;;
    *"-m venv"*) mkdir -p "$3/bin" && cp "$0" "$3/bin/python" ;;
    *"-m pip install"*) sleep 1.6 ;;
    *"-m pytest"*) echo "$*" >> "$PYTEST_CALLS" ;;
esac
exit 0
"""


def _pythons_sh(tmp_path) -> subprocess.CompletedProcess:
    """ci/pythons.sh run in a copy of ``ci/`` where the only other Python is the stand-in 3.10,
    which writes each pytest call's arguments to ``tmp_path / "pytest-calls"``."""
    repo = tmp_path / "repo"
    (repo / "ci").mkdir(parents=True)
    shutil.copy2(ROOT / "ci" / "pythons.sh", repo / "ci" / "pythons.sh")
    fake = tmp_path / "pyenv" / "versions" / "3.10.0" / "bin" / "python3.10"
    fake.parent.mkdir(parents=True)
    fake.write_text(FAKE_PYTHON_310)
    fake.chmod(0o755)
    tools = tmp_path / "tools"  # the system's commands but its Pythons: only the fake 3.10 runs
    tools.mkdir()
    for directory in ("/usr/bin", "/bin"):
        for name in os.listdir(directory) if os.path.isdir(directory) else ():
            if not name.startswith("python") and not (tools / name).exists():
                (tools / name).symlink_to(os.path.join(directory, name))
    return subprocess.run(
        ["bash", "ci/pythons.sh"],
        cwd=repo,
        env={
            "PATH": str(tools),
            "HOME": str(tmp_path),
            "PYENV_ROOT": str(tmp_path / "pyenv"),
            "CHECK_PROGRESS_S": "1",
            "PYTEST_CALLS": str(tmp_path / "pytest-calls"),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_pythons_sh_says_how_long_each_python_took_and_that_pip_still_runs(tmp_path):
    done = _pythons_sh(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\n    \.\.\. still running, [12]s so far\n", done.stdout), done.stdout
    assert re.search(r"\n<== Python 3\.10: passed after [3-9]s\n", done.stdout), done.stdout
    assert done.stdout.endswith("ci/pythons.sh: passed on Python 3.10\n"), done.stdout


def test_pythons_sh_runs_the_suites_of_every_package_the_project_installs(tmp_path):
    # each promised Python runs what a user imports: a package without its suites there would
    # be checked on one Python only
    packages = read_toml(ROOT / "pyproject.toml")["tool"]["setuptools"]["packages"]["find"]
    suites = {f"suites/{pattern.rstrip('*')}" for pattern in packages["include"]}
    assert suites == {"suites/allocator", "suites/harness", "suites/runtime"}

    done = _pythons_sh(tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    (call,) = (tmp_path / "pytest-calls").read_text().splitlines()
    assert {word for word in call.split() if word.startswith("suites/")} == suites, call
    assert "--backend cpu,sim" in call
