"""``ci/mutation.py`` run as the docs say, with the real mutmut, on a tiny project.

The documented command is ``.venv/bin/python ci/mutation.py --module <module>``, in a shell
where the virtual environment is not activated. Running it on this project's own modules takes
minutes (mutmut generates every mutant of ``allocator/`` and maps every allocator test first),
so this runs the same script, copied into a throwaway project with one two-line module and two
tests, in a few seconds. The nightly (``ci/check.sh --nightly``) runs it on the whole project.

The throwaway tree has been tested before (its ``__pycache__`` holds pytest's bytecode, as a
developer's tree does), and one of its tests compares a frame's file with the test module's
``__file__``, as ``suites/allocator/test_history.py`` does: mutmut's copy of the tree keeps the
copied bytecode's file names unless ``ci/mutation.py`` gives its runs their own cache.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "ci"))
import mutation  # noqa: E402

PYPROJECT = """\
[tool.mutmut]
source_paths = ["tinypkg"]
also_copy = ["tests"]
pytest_add_cli_args = ["-p", "no:cacheprovider", "-x", "-q"]
pytest_add_cli_args_test_selection = ["tests"]

[tool.pytest.ini_options]
testpaths = ["tests"]
"""

CORE = """\
def double(x):
    return x * 2
"""

TESTS = """\
import inspect

from tinypkg.core import double

HERE = __file__


def test_double():
    assert double(3) == 6


def test_a_frame_names_this_file():
    assert inspect.currentframe().f_code.co_filename == HERE
"""


def _shell_env(**extra: str) -> dict[str, str]:
    """A new shell's environment: this run's pytest, xdist, coverage and bytecode variables
    gone, and the directory of this Python (the virtual environment's ``bin``) off ``PATH``."""
    here = os.path.dirname(sys.executable)
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("DEVMEM_", "PYTEST_", "COV_", "MUTANT_"))
        and name
        not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
    }
    env["PATH"] = os.pathsep.join(
        part for part in env.get("PATH", "").split(os.pathsep) if part and part != here
    )
    return {**env, **extra}


@pytest.fixture
def tiny_project(tmp_path: Path) -> Path:
    """A project with ``ci/mutation.py``, ``tinypkg/core.py`` and two tests, tested once."""
    project = tmp_path / "tiny"
    (project / "ci").mkdir(parents=True)
    shutil.copy2(ROOT / "ci" / "mutation.py", project / "ci" / "mutation.py")
    (project / "pyproject.toml").write_text(PYPROJECT)
    (project / "tinypkg").mkdir()
    (project / "tinypkg" / "__init__.py").write_text("")
    (project / "tinypkg" / "core.py").write_text(CORE)
    (project / "tests").mkdir()
    (project / "tests" / "test_core.py").write_text(TESTS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        env=_shell_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert list((project / "tests" / "__pycache__").glob("test_core.*pytest*.pyc"))
    return project


def test_the_documented_command_runs_mutmut_on_one_module(tiny_project):
    beside = shutil.which("mutmut", path=os.path.dirname(sys.executable))
    assert beside is not None, f"mutmut (the test extra) is not installed beside {sys.executable}"
    command = ["ci/mutation.py", "--module", "tinypkg.core", "--gate", "tinypkg"]
    done = subprocess.run(
        [sys.executable, *command, "--max-children", "1"],
        cwd=tiny_project,
        env=_shell_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"+ {beside} run tinypkg.core.x* --max-children 1\n")
    row = re.search(
        r"^\| tinypkg\.core \| (\d+) \| (\d+) \| 0 \| 0 \| 0 \| 100\.0% \|", done.stdout, re.M
    )
    assert row is not None, done.stdout
    assert int(row[1]) == int(row[2]) >= 2  # x * 2 has at least two mutants, each killed
    assert "tinypkg together: " in done.stdout


def test_mutmut_runs_with_a_bytecode_cache_of_its_own(tmp_path, monkeypatch):
    # the copied __pycache__ of mutants/ must not be used (see run_mutmut); the end-to-end test
    # above shows why, this shows how, for --mutmut and the default alike
    seen = tmp_path / "seen"
    fake = tmp_path / "mutmut"
    fake.write_text(
        f'#!/bin/sh\necho "$PYTHONPYCACHEPREFIX ${{PYTHONDONTWRITEBYTECODE-unset}}" > {seen}\n'
    )
    fake.chmod(0o755)
    monkeypatch.setattr(mutation, "MUTANTS_DIR", tmp_path / "mutants")
    monkeypatch.setattr(mutation, "PYCACHE_DIR", tmp_path / "mutants" / ".pycache")
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "theirs"))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # ci/check.sh's: the cache is written
    mutation.run_mutmut("fine", 1, str(fake))
    assert seen.read_text() == f"{tmp_path / 'mutants' / '.pycache'} unset\n"


def test_a_missing_mutmut_is_one_clear_line(tmp_path):
    env = _shell_env(PATH=str(tmp_path))  # nothing on PATH
    if sys.version_info < (3, 11):  # the script reads pyproject.toml first, with tomli
        import tomli

        env["PYTHONPATH"] = str(Path(tomli.__file__).parents[1])
    python = tmp_path / "bin" / "python"  # an interpreter with no mutmut beside it
    python.parent.mkdir()
    python.symlink_to(os.path.realpath(sys.executable))
    done = subprocess.run(
        [str(python), str(ROOT / "ci" / "mutation.py"), "--module", "allocator._locks"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"mutation: mutmut is neither beside {python} nor on PATH: install the test extra"
        " (pip install -e '.[test]') or name it with --mutmut"
    ]


def test_no_toml_reader_is_one_clear_error_naming_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tomllib", None)  # import raises ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "tomli", None)
    with pytest.raises(
        mutation.MutationError, match=r"needs tomllib \(Python 3\.11\+\) or.* tomli"
    ):
        mutation.mutated_files()


def test_a_bad_mutmut_option_names_it_and_exits_2(tmp_path):
    missing = tmp_path / "no-mutmut"
    command = [str(ROOT / "ci" / "mutation.py"), "--module", "allocator._locks"]
    done = subprocess.run(
        [sys.executable, *command, "--mutmut", str(missing)],
        env=_shell_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"--mutmut {missing}: not an executable file or a command on PATH" in done.stderr
    assert "Traceback" not in done.stderr


def test_every_option_reaches_the_run_and_the_report(tmp_path, monkeypatch, capsys):
    # a stand-in mutmut: logs its arguments and writes the results a real one would
    mutants = tmp_path / "mutants"
    log = tmp_path / "log"
    fake = tmp_path / "fake-mutmut"
    meta = mutants / "allocator" / "_locks.py.meta"
    codes = json.dumps(
        {
            "exit_code_by_key": {
                "allocator._locks.x_a__mutmut_1": 1,
                "allocator._locks.x_a__mutmut_2": 0,
            }
        }
    )
    fake.write_text(
        f"#!/bin/sh\necho \"$@\" >> {log}\nmkdir -p {meta.parent}\necho '{codes}' > {meta}\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(mutation, "MUTANTS_DIR", mutants)
    monkeypatch.setattr(mutation, "PYCACHE_DIR", mutants / ".pycache")
    mutants.mkdir()
    (mutants / "mutmut-stats.json").write_text("{}")  # a stale map: removed before the run
    out = tmp_path / "reports" / "mutation.md"
    argv = ["--module", "allocator._locks", "--mutmut", str(fake), "--max-children", "3"]
    # allocator._locks has a survivor nobody explained: the default gate fails it...
    assert mutation.main([*argv, "--out", str(out)]) == 1
    assert log.read_text() == "run allocator._locks.x* --max-children 3\n"
    assert not (mutants / "mutmut-stats.json").exists()
    assert "| allocator._locks | 2 | 1 | 0 | 1 | 0 | 50.0% |" in out.read_text()
    assert "allocator._locks: 1 unexplained survivors" in capsys.readouterr().err
    # ...a gate elsewhere only reports it, and --min-score applies to the gated modules
    assert mutation.main([*argv, "--gate", "harness", "--min-score", "100"]) == 0
    assert mutation.main([*argv, "--no-run", "--gate", "harness", "--min-score", "100"]) == 0
    assert log.read_text().count("run ") == 2  # --no-run ran nothing


def test_resume_runs_only_the_mutants_without_a_verdict_and_the_unexplained_verdicts(
    tmp_path, monkeypatch, capsys
):
    # mutmut runs every mutant a pattern names again; --resume names the ones left
    mutants = tmp_path / "mutants"
    log = tmp_path / "log"
    fake = tmp_path / "fake-mutmut"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    fake.chmod(0o755)
    equivalents = tmp_path / "equivalent-mutants"
    equivalents.mkdir()
    (equivalents / "allocator._locks.txt").write_text(
        "allocator._locks.x_a__mutmut_4  # same\nallocator._locks.x_a__mutmut_7  # same\n"
    )
    monkeypatch.setattr(mutation, "MUTANTS_DIR", mutants)
    monkeypatch.setattr(mutation, "PYCACHE_DIR", mutants / ".pycache")
    monkeypatch.setattr(mutation, "EQUIVALENT_DIR", equivalents)
    argv = ["--module", "allocator._locks", "--mutmut", str(fake), "--resume"]

    # no results yet: every mutant, by the module's pattern
    assert mutation.main([*argv, "--gate", "harness"]) == 1  # no results for the report
    assert log.read_text() == "run allocator._locks.x* --max-children 2\n"
    assert capsys.readouterr().out.startswith(f"+ {fake} run allocator._locks.x* ")

    meta = mutants / "allocator" / "_locks.py.meta"
    meta.parent.mkdir(parents=True)
    codes = {
        "killed": 1,
        "timed_out": -24,
        "survived": 0,
        "equivalent": 0,
        "pending": None,
        "unreached": 33,  # no test reached it: one added since may
        "listed_killed": 1,  # listed as equivalent, yet killed: a flaky kill, or a new test
    }
    names = {key: f"allocator._locks.x_a__mutmut_{n}" for n, key in enumerate(codes, 1)}
    meta.write_text(json.dumps({"exit_code_by_key": {names[k]: c for k, c in codes.items()}}))
    log.unlink()
    # (this mutmut gives no new verdicts: the listed one killed is still a stale entry)
    assert mutation.main([*argv, "--gate", "harness"]) == 1
    said = capsys.readouterr()
    assert f"stale equivalent entry {names['listed_killed']} (killed now)" in said.err
    assert log.read_text().splitlines() == [
        f"run {names['survived']} {names['pending']} {names['unreached']}"
        f" {names['listed_killed']} --max-children 2",
        f"run {names['pending']} --max-children 2",  # still without a verdict: once more
    ]
    assert said.out.startswith(f"+ {fake} run <4 mutants> --max-children 2\n")

    # nothing left: one mutant runs, so that mutmut makes the mutants again (and drops the
    # verdicts of functions changed since, which a second pass would run)
    survived = {names["equivalent"]: 0, names["listed_killed"]: 0}  # listed, and surviving
    meta.write_text(json.dumps({"exit_code_by_key": {names["killed"]: 1, **survived}}))
    log.unlink()
    assert mutation.main([*argv, "--gate", "harness"]) == 0
    assert log.read_text() == f"run {names['killed']} --max-children 2\n"


def test_resume_and_no_run_together_are_refused_by_name(capsys):
    with pytest.raises(SystemExit) as exited:
        mutation.main(["--resume", "--no-run"])
    assert exited.value.code == 2
    assert "--resume runs mutmut, --no-run does not: give one of them" in capsys.readouterr().err


def _parent_seen_by_mutmut(tmp_path, monkeypatch, status: int = 0, orphan: str = "") -> str:
    """Run a stand-in mutmut that writes its parent's pid, runs ``orphan`` (shell) and exits
    ``status``; what it wrote."""
    seen = tmp_path / "seen"
    fake = tmp_path / "mutmut"
    fake.write_text(
        f'#!/bin/sh\necho "$PPID" > {seen}\necho "$$" > {seen}.pid\n{orphan}\nexit {status}\n'
    )
    fake.chmod(0o755)
    monkeypatch.setattr(mutation, "MUTANTS_DIR", tmp_path / "mutants")
    monkeypatch.setattr(mutation, "PYCACHE_DIR", tmp_path / "mutants" / ".pycache")
    mutation.run_mutmut("fine", 1, str(fake))
    return seen.read_text().strip()


def test_mutmut_runs_in_a_pid_namespace_of_its_own_under_a_reaper(tmp_path, monkeypatch, capsys):
    # a mutant of the zygote's guard-table reader SIGKILLs a made-up process group (1 among
    # others): in the namespace, only mutmut's own processes can be hit
    if not mutation.isolation():
        pytest.skip("no PID namespace can be made here (unshare: neither root nor user ns)")
    started = time.monotonic()
    # an orphan holding mutmut's output open: the run would wait for it, 600 s
    seen = _parent_seen_by_mutmut(tmp_path, monkeypatch, orphan="(sleep 600 &)")

    assert seen == "1"  # the namespace's reaper
    pid = int((tmp_path / "seen.pid").read_text())
    assert pid >= 1_000_000  # a part of a pid names no process (see mutation._INIT)
    assert time.monotonic() - started < 120  # the orphan died with the namespace
    assert "(in a PID namespace of its own: unshare --pid" in capsys.readouterr().out
    with pytest.raises(mutation.MutationError, match=r"\(status 3\)"):
        _parent_seen_by_mutmut(tmp_path, monkeypatch, status=3)  # its status comes through


def test_without_a_pid_namespace_mutmut_runs_as_it_is_and_the_run_says_so(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(mutation, "isolation", list)

    assert _parent_seen_by_mutmut(tmp_path, monkeypatch) == str(os.getpid())
    assert "no PID namespace can be made here" in capsys.readouterr().out


def test_isolation_is_none_where_unshare_is_missing(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert mutation.isolation() == []


def test_resume_runs_again_the_mutants_whose_verdicts_mutmut_dropped(tmp_path, monkeypatch):
    # a function changed since the last run: mutmut makes its mutants again and drops their
    # verdicts, so they were not among the names; --resume runs them in a second pass
    mutants = tmp_path / "mutants"
    log = tmp_path / "log"
    meta = mutants / "allocator" / "_locks.py.meta"
    name = "allocator._locks.x_a__mutmut_{}".format
    after = {"1": {name(1): None, name(2): 1}, "2": {name(1): 1, name(2): 1}}
    fake = tmp_path / "fake-mutmut"
    # each call logs its arguments, then leaves the verdicts a real mutmut would: the first
    # drops mutant 1's (its function changed) and kills 2; the second kills 1
    fake.write_text(
        f'#!/bin/sh\necho "$@" >> {log}\nn=$(wc -l < {log})\ncp {tmp_path}/after-$n.json {meta}\n'
    )
    fake.chmod(0o755)
    for call, codes in after.items():
        (tmp_path / f"after-{call}.json").write_text(json.dumps({"exit_code_by_key": codes}))
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": {name(1): 1, name(2): None}}))
    monkeypatch.setattr(mutation, "MUTANTS_DIR", mutants)
    monkeypatch.setattr(mutation, "PYCACHE_DIR", mutants / ".pycache")
    monkeypatch.setattr(mutation, "EQUIVALENT_DIR", tmp_path)
    argv = ["--module", "allocator._locks", "--mutmut", str(fake), "--resume", "--gate", "x"]

    assert mutation.main(argv) == 0

    assert log.read_text().splitlines() == [
        f"run {name(2)} --max-children 2",  # the one without a verdict
        f"run {name(1)} --max-children 2",  # the one whose verdict was dropped
    ]
    assert (
        mutation.tally(
            "allocator._locks", json.loads(meta.read_text())["exit_code_by_key"], []
        ).killed
        == 2
    )
