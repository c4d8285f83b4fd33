"""Choosing the style: auto, fork refused when unsafe, closures, the forkserver's zygote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

import harness
from harness import _forkserver
from suites.harness import _procs, _targets


def test_auto_forks_when_alone_and_avoids_fork_with_threads_or_when_marked_unsafe():
    # In a fresh interpreter (exec): the test process itself may have native threads.
    outcome = harness.run_child(_targets.auto_styles, style="exec", timeout=60.0).assert_clean()
    seen = outcome.returned

    assert seen["alone"] == "fork"
    assert seen["threaded"] == "forkserver"
    assert seen["marked"] == "forkserver"
    assert seen["reason"] == "test: pretend CUDA is initialized"
    assert "style='fork' is refused" in seen["refused"]
    assert "test: pretend CUDA is initialized" in seen["refused"]
    assert "mark_fork_unsafe" in seen["refused"]


def test_closure_runs_in_fork_only():
    captured = {"value": 41}

    def closure() -> int:
        return captured["value"] + 1

    outcome = harness.run_child(closure, style="fork").assert_clean()
    assert outcome.returned == 42
    assert "only style='fork' runs it" in outcome.repro
    for style in ("forkserver", "exec", "auto"):
        with pytest.raises(harness.HarnessError, match="not importable as module:qualname"):
            harness.run_child(closure, style=style)


def test_lambda_and_bound_method_are_not_importable():
    with pytest.raises(harness.HarnessError, match="style='fork'"):
        harness.run_child(lambda: 1, style="exec")
    with pytest.raises(harness.HarnessError, match="style='fork'"):
        harness.run_child([].copy, style="forkserver")


def test_builtin_target_by_function_and_by_name(style):
    assert harness.run_child(os.getpid, style=style).returned is not None
    outcome = harness.run_child("os:getcwd", style=style).assert_clean()
    assert outcome.returned == os.getcwd()
    harness.run_child(os.abort, style=style).assert_aborted()


SCRIPT = """
import json, sys
import harness


def answer(x):
    return {"x": x, "main": __name__}


if __name__ == "__main__":
    outcomes = [harness.run_child(answer, 41, style=s) for s in ("fork", "forkserver", "exec")]
    outcomes.append(harness.run_child("__main__:answer", 42, style="fork"))
    print(json.dumps([[o.style, o.kind, o.returned] for o in outcomes]))
"""


def test_target_in_a_scripts_main_module(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(result.stdout) == [
        ["fork", "exited", {"x": 41, "main": "__main__"}],
        ["forkserver", "exited", {"x": 41, "main": "__mp_main__"}],  # as multiprocessing does
        ["exec", "exited", {"x": 41, "main": "__mp_main__"}],
        ["fork", "exited", {"x": 42, "main": "__main__"}],  # by name: the parent's __main__
    ]


def test_a_request_too_long_for_argv_still_reaches_the_child(run):
    big = "x" * 300_000
    outcome = run(_targets.give_back, big).assert_clean()
    assert outcome.returned["args"] == [big]


def test_forkserver_zygote_is_restarted_after_it_dies():
    first = harness.run_child(_targets.give_back, style="forkserver").assert_clean()
    zygote = _forkserver.server().pid
    assert zygote is not None and zygote != first.pid

    os.kill(zygote, signal.SIGKILL)
    assert _procs.wait_until_dead(zygote)

    second = harness.run_child(_targets.give_back, style="forkserver").assert_clean()
    assert _forkserver.server().pid not in (None, zygote)
    assert second.returned["flag"] == "1"


def test_zygote_dying_mid_request_is_a_harness_error_and_the_next_child_gets_a_new_one():
    outcome = harness.run_child(_targets.kill_parent_and_hang, style="forkserver", timeout=20)

    assert outcome.kind == "harness_error"
    assert "the forkserver zygote failed: it exited unexpectedly" in outcome.error
    assert outcome.duration_s < 10  # noticed at once, not at the deadline
    assert _procs.wait_until_dead(outcome.pid)  # the child died with its zygote
    harness.run_child(_targets.give_back, style="forkserver").assert_clean()


def test_forkserver_zygote_is_shut_down_at_exit_and_started_again_lazily():
    harness.run_child(_targets.give_back, style="forkserver").assert_clean()
    zygote = _forkserver.server().pid
    assert zygote is not None

    _forkserver._shutdown_at_exit()  # what atexit runs

    assert _forkserver.server().pid is None
    assert _procs.wait_until_dead(zygote)
    assert _procs.zombies_of({os.getpid()}) == []  # reaped, not left to init
    harness.run_child(_targets.give_back, style="forkserver").assert_clean()
    assert _forkserver.server().pid not in (None, zygote)


def test_forkserver_preload():
    try:
        harness.set_forkserver_preload([])
        before = harness.run_child(_targets.hygiene, style="forkserver").assert_clean()
        harness.set_forkserver_preload(["colorsys"])
        after = harness.run_child(_targets.hygiene, style="forkserver").assert_clean()
    finally:
        harness.set_forkserver_preload([])
    assert "colorsys" not in before.returned["modules"]
    assert "colorsys" in after.returned["modules"]  # imported by the zygote, inherited


def test_forkserver_preload_failure_is_a_harness_error_naming_the_module():
    try:
        harness.set_forkserver_preload(["suites.harness._no_such_preload"])
        outcome = harness.run_child(_targets.give_back, style="forkserver")
    finally:
        harness.set_forkserver_preload([])
    assert outcome.kind == "harness_error"
    assert "suites.harness._no_such_preload" in outcome.error
    assert "ModuleNotFoundError" in outcome.error
    harness.run_child(_targets.give_back, style="forkserver").assert_clean()  # recovers


@pytest.mark.parametrize("bad", ["numpy", [1], ["", "x"], None])
def test_set_forkserver_preload_rejects_bad_lists(bad):
    with pytest.raises(harness.HarnessError, match="set_forkserver_preload"):
        harness.set_forkserver_preload(bad)


def test_mark_fork_unsafe_needs_a_reason():
    with pytest.raises(harness.HarnessError, match="non-empty str"):
        harness.mark_fork_unsafe("  ")
    with pytest.raises(harness.HarnessError, match="non-empty str, not None"):
        harness.mark_fork_unsafe(None)  # type: ignore[arg-type]
    assert harness.fork_unsafe_reason() is None


def test_a_fork_safety_check_steers_auto_and_refuses_fork():
    outcome = harness.run_child(_targets.checked_styles, style="exec", timeout=60.0)
    seen = outcome.assert_clean().returned
    assert seen["before"] == "fork"
    assert seen["after"] == "forkserver"
    assert "test: a library initialized CUDA" in seen["refused"]
    assert "style='fork' is refused" in seen["refused"]
    assert "checked_styles.<locals>.<lambda> returned 42" in seen["broken"]


def test_add_fork_safety_check_needs_a_callable():
    with pytest.raises(harness.HarnessError, match="needs a callable, not 'no'"):
        harness.add_fork_safety_check("no")  # type: ignore[arg-type]
