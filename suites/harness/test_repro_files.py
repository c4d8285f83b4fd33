"""A long request's file is written only when its repro command is read, a failure's stays,
and outside pytest a passing run leaves nothing behind (issue 36, item 7)."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import shlex
import subprocess
import sys

import pytest

import harness
from harness import _repro
from suites.harness import _targets

ROOT = pathlib.Path(__file__).resolve().parents[2]
LONG = 20_000  # characters of argument: past the 16 KiB inline limit


def _request_path(command: str) -> pathlib.Path:
    words = shlex.split(command)
    return pathlib.Path(words[words.index("--request-file") + 1])


@pytest.fixture
def provider(monkeypatch, tmp_path):
    """A directory provider, as the plugin's, that records each call."""
    calls: list[str] = []
    directory = tmp_path / "requests"

    def provide() -> str:
        calls.append("called")
        directory.mkdir(exist_ok=True)
        return str(directory)

    monkeypatch.setattr(_repro, "_request_dir", provide)
    return calls, directory


def test_a_passing_child_writes_no_request_file_and_a_failing_one_does(run, provider):
    calls, directory = provider
    outcome = run(_targets.abort_with_length, "p" * LONG).assert_aborted(f"got {LONG} char")
    assert calls == [] and not directory.exists()

    with pytest.raises(harness.DeathTestFailure) as failure:
        outcome.assert_clean()
    assert calls == ["called"]
    (path,) = directory.iterdir()
    assert f"--request-file {path}" in str(failure.value)
    assert json.loads(path.read_text())["args"] == ["p" * LONG]
    assert outcome.repro == outcome.repro and calls == ["called"]  # written once
    assert _request_path(outcome.repro) == path
    rerun = subprocess.run(["bash", "-c", outcome.repro], capture_output=True, text=True)
    assert rerun.returncode in (-6, 134) and f"got {LONG} characters" in rerun.stderr


def test_a_short_request_stays_inline_and_writes_nothing(provider):
    calls, directory = provider
    outcome = harness.run_child(_targets.abort_with_length, "s", style="exec", timeout=30)
    with pytest.raises(harness.DeathTestFailure):
        outcome.assert_clean()
    assert "--request '{" in outcome.repro and calls == [] and not directory.exists()


def test_a_pickled_outcome_carries_the_command_with_its_file(provider):
    calls, _ = provider
    outcome = harness.run_child(
        _targets.abort_with_length, "k" * LONG, style="forkserver", timeout=30
    )
    copy = pickle.loads(pickle.dumps(outcome))
    assert calls == ["called"]
    assert copy.repro == outcome.repro and copy == outcome
    assert _request_path(copy.repro).is_file()


def test_an_unwritable_directory_leaves_the_request_inline(monkeypatch, tmp_path):
    monkeypatch.setattr(_repro, "_request_dir", lambda: str(tmp_path / "missing" / "dir"))
    outcome = harness.run_child(
        _targets.abort_with_length, "u" * LONG, style="forkserver", timeout=30
    )
    with pytest.raises(harness.DeathTestFailure) as failure:
        outcome.assert_died(signal="SIGSEGV")
    assert "--request-file" not in outcome.repro
    assert "--request '{" in outcome.repro and "u" * LONG in outcome.repro
    assert "repro:" in str(failure.value)


_SCRIPT = """
import os, sys
import harness
import harness._repro
from suites.harness import _targets

def child(style):
    return harness.run_child(_targets.abort_with_length, "z" * 20000, style=style, timeout=30)

for style in ("fork", "forkserver", "exec"):
    child(style).assert_aborted()  # passing children, their commands never read
for action in sys.argv[1:]:
    outcome = child("forkserver").assert_aborted()
    if action in ("read", "read-then-fail"):
        print("read", outcome.repro.split()[-1], flush=True)
    if action in ("fail", "read-then-fail"):
        try:
            outcome.assert_exited(0)
        except harness.DeathTestFailure as failure:
            print("failed", outcome.repro.split()[-1], flush=True)
    if action == "fork-copy-exits":  # a copy of this process runs its atexit handlers too
        path = outcome.repro.split()[-1]
        pid = os.fork()
        if pid == 0:
            sys.exit(0)
        os.waitpid(pid, 0)
        print("after-copy" if os.path.exists(path) else "gone-after-copy", path, flush=True)
    if action == "provided-read":  # a provider's directory (pytest's) is not this clean-up's
        provided = os.path.join(os.environ["TMPDIR"], "provided")
        os.makedirs(provided, exist_ok=True)
        harness._repro.set_request_dir(lambda: provided)
        print("provided", child("forkserver").repro.split()[-1], flush=True)
        harness._repro.set_request_dir(None)
    if action == "user-file":
        path = outcome.repro.split()[-1]
        with open(os.path.join(os.path.dirname(path), "mine.txt"), "w") as out:
            out.write("a user's file")
        print("user", path, flush=True)
"""


def _outside_pytest(tmp_path: pathlib.Path, *actions: str) -> dict[str, list[pathlib.Path]]:
    """Run the script in a python of its own (no pytest, no plugin) with ``TMPDIR`` at
    ``tmp_path``; return the paths it printed, by what it did."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *actions],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed: dict[str, list[pathlib.Path]] = {}
    for line in done.stdout.splitlines():
        what, path = line.split(" ", 1)
        printed.setdefault(what, []).append(pathlib.Path(path))
    return printed


def _repro_dirs(tmp_path: pathlib.Path) -> list[pathlib.Path]:
    return sorted(tmp_path.glob("devmem-repro-*"))


def test_outside_pytest_a_passing_run_leaves_no_request_file(tmp_path):
    printed = _outside_pytest(tmp_path, "read", "read")
    assert len(printed["read"]) == 2
    assert _repro_dirs(tmp_path) == []  # what was read for no failure is gone at exit too


def test_outside_pytest_a_failure_s_request_file_stays(tmp_path):
    printed = _outside_pytest(tmp_path, "read", "fail", "read-then-fail", "read")
    kept = printed["failed"]
    assert len(kept) == 2 and all(path.is_file() for path in kept)
    (directory,) = _repro_dirs(tmp_path)
    assert sorted(directory.iterdir()) == sorted(kept)
    assert json.loads(kept[0].read_text())["args"] == ["z" * 20000]


def test_outside_pytest_a_forked_copy_of_the_process_cleans_nothing(tmp_path):
    printed = _outside_pytest(tmp_path, "fork-copy-exits")
    assert "gone-after-copy" not in printed
    assert len(printed["after-copy"]) == 1
    assert _repro_dirs(tmp_path) == []  # the process itself cleaned it at its exit


def test_outside_pytest_a_provided_directory_s_files_stay(tmp_path):
    printed = _outside_pytest(tmp_path, "read", "provided-read")  # "read": a clean-up runs
    (path,) = printed["provided"]
    assert path.parent == tmp_path / "provided" and path.is_file()
    assert _repro_dirs(tmp_path) == []


def test_outside_pytest_the_clean_up_leaves_a_user_s_file_and_its_directory(tmp_path):
    printed = _outside_pytest(tmp_path, "user-file")
    (directory,) = _repro_dirs(tmp_path)
    assert [path.name for path in directory.iterdir()] == ["mine.txt"]
    assert not printed["user"][0].exists()


def test_a_failure_keeps_its_fallback_request_file_and_a_read_for_no_failure_does_not(
    run, monkeypatch, tmp_path
):
    # the in-process side of the tests above (outside pytest, the fallback directory): which
    # files the clean-up at exit removes. A failure's stays, as its message names it
    monkeypatch.setattr(_repro, "_request_dir", None)  # no provider: the fallback directory
    monkeypatch.setattr(_repro.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(_repro, "_fallback_dir", None)
    monkeypatch.setattr(_repro, "_made", [])
    monkeypatch.setattr(_repro, "_unkept", {})
    monkeypatch.setattr(_repro, "_owner", os.getpid())  # no clean-up at this process's exit

    read = run(_targets.abort_with_length, "r" * LONG).assert_aborted()
    read_path = _request_path(read.repro)
    failed = run(_targets.abort_with_length, "f" * LONG).assert_aborted()
    with pytest.raises(harness.DeathTestFailure) as failure:
        failed.assert_clean()
    failed_path = _request_path(failed.repro)

    assert f"--request-file {failed_path}" in str(failure.value)
    assert read_path.parent == failed_path.parent and read_path.parent.parent == tmp_path
    assert list(_repro._unkept) == [str(read_path)]  # removed at exit; the failure's stays
