"""Choosing the style: auto, fork refused when unsafe, closures, the forkserver's zygote."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import harness
from harness import _forkserver
from suites.harness import _targets


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


def _scenario(name: str, *args):
    """Run a scenario of ``_scenarios`` in a fresh interpreter (its own root and zygotes)."""
    return harness.run_child(f"suites.harness._scenarios:{name}", *args, style="exec", timeout=120)


def test_forkserver_zygote_is_restarted_after_it_dies():
    seen = _scenario("zygote_killed_then_restarted").assert_clean().returned

    assert seen["first"]["kind"] == "exited"
    assert seen["first"]["returned"] == seen["zygote"]  # the zygote forked it
    assert seen["dead"]
    assert seen["second"]["kind"] == "exited", seen["second"]
    assert seen["second"]["returned"] == seen["new_zygote"] != seen["zygote"]


def test_zygote_dying_mid_request_is_a_harness_error_and_the_next_child_gets_a_new_one():
    seen = _scenario("zygote_dies_mid_request").assert_clean().returned

    assert seen["broken"]["kind"] == "harness_error"
    assert "the forkserver zygote failed: it exited unexpectedly" in seen["broken"]["error"]
    assert seen["broken"]["duration_s"] < 10  # noticed at once, not at the deadline
    assert seen["child_dead"]  # the child died with its zygote
    assert seen["after"]["kind"] == "exited", seen["after"]


def test_forkserver_zygote_is_shut_down_at_exit_and_started_again_lazily():
    seen = _scenario("zygote_shut_down_and_started_again").assert_clean().returned

    assert seen["gone"] and seen["dead"]
    assert seen["zombies"] == []  # reaped, not left to init
    assert seen["again"]["kind"] == "exited"
    assert seen["new_zygote"] != seen["zygote"]


def test_forkserver_preload():
    seen = _scenario("preloads").assert_clean().returned

    assert "colorsys" not in seen["before"]["returned"]["modules"]
    assert "colorsys" in seen["after"]["returned"]["modules"]  # imported by the zygote
    assert seen["failed"]["kind"] == "harness_error"
    assert "suites.harness._no_such_preload" in seen["failed"]["error"]
    assert "ModuleNotFoundError" in seen["failed"]["error"]
    assert seen["recovered"]["kind"] == "exited"


# Issue 9, case 5: one zygote serves the process, whichever thread started it.
def test_forkserver_children_from_short_lived_threads_share_one_zygote():
    results = _scenario("forkserver_from_short_lived_threads", 6).assert_clean().returned

    assert [kind for kind, _ in results] == ["exited"] * 7, results
    assert len({zygote for _, zygote in results}) == 1, results  # never restarted


def test_a_zygote_that_cannot_start_is_a_harness_error_in_every_style(monkeypatch, style):
    monkeypatch.setattr(_forkserver, "_connections", {})  # no zygote yet, in this process
    monkeypatch.setattr(_forkserver, "_guarded_until", 0.0)  # and none trusted
    monkeypatch.setattr(_forkserver, "ZYGOTE_PATH", "/nonexistent/_zygote.py")

    outcome = harness.run_child(_targets.give_back, style=style)

    assert outcome.kind == "harness_error"
    assert "it exited before it was ready" in outcome.error
    assert "its stderr: " in outcome.error
    assert "can't open file '/nonexistent/_zygote.py'" in outcome.error
    if style == "forkserver":
        assert outcome.error.startswith("the forkserver zygote could not start: ")
        assert outcome.error.endswith("(after one restart)")
    else:  # a child that nothing would kill if this process died is not started
        assert outcome.error.startswith("no zygote to guard the child")
        assert outcome.pid is None


# Issue 9, case 11: a sys.path over 64 KiB once truncated the zygote's init message.
def test_a_sys_path_over_64_kib_reaches_the_zygote():
    seen = _scenario("forkserver_with_a_long_sys_path", 80).assert_clean().returned

    assert seen["sys_path_bytes"] > 64 * 1024
    assert seen["kind"] == "exited", seen
    assert seen["returned"]["flag"] == "1"


# Issue 9, case 10: interpreter start-up variables act only in a fresh interpreter.
@pytest.mark.parametrize(
    ("env", "seen"),
    [
        ({"PYTHONDEVMODE": "1"}, {"dev_mode": True}),
        (
            {"PYTHONWARNINGS": "error::DeprecationWarning"},
            {"warnoptions": ["error::DeprecationWarning"]},
        ),
    ],
)
def test_auto_picks_exec_for_a_start_up_variable(env, seen):
    outcome = harness.run_child(_targets.interpreter_flags, env=env).assert_clean()

    assert outcome.style == "exec"
    assert seen.items() <= outcome.returned.items()


@pytest.mark.parametrize("style", ["fork", "forkserver"])
def test_fork_styles_warn_about_a_start_up_variable(style):
    with pytest.warns(
        harness.HarnessWarning, match="env sets PYTHONDEVMODE, which acts only"
    ) as seen:
        outcome = harness.run_child(
            _targets.interpreter_flags, env={"PYTHONDEVMODE": "1"}, style=style
        )

    assert outcome.assert_clean().returned["dev_mode"] is False  # what the warning warns of
    assert seen[0].filename == __file__  # it points at the call


def test_a_closure_with_start_up_variables_warns_naming_them():
    def closure() -> bool:
        return True

    env = {"LD_PRELOAD": None, "MALLOC_ARENA_MAX": "2", "DEVMEM_X": "1"}  # unset counts too
    with pytest.warns(harness.HarnessWarning, match=r"env sets LD_PRELOAD, MALLOC_ARENA_MAX, "):
        harness.run_child(closure, env=env, style="fork").assert_clean()


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
