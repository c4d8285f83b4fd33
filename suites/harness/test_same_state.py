"""One verdict whatever the style (issue 36): the child has the test process's state (item 1),
a class of the script run as ``__main__`` is the same in every style (item 2), an explicit
fork with threads warns (item 5), and what the docs promise of process groups, threads and
escaped grandchildren holds in every style (item 8)."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest

import harness
from harness import _child, _exec, _forkserver, _state
from harness._styles import choose_style
from suites.harness import _procs, _scenarios, _state_targets, _targets

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- item 1: the test process's umask, limits, nice value, warning filters, flags ---------------


@pytest.mark.own_process  # its umask, limits and nice value (which only goes up) stay there
def test_a_child_has_the_test_process_state_at_the_request(run, style):
    os.umask(0o077)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (200, hard))
    stack_hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
    resource.setrlimit(resource.RLIMIT_STACK, (4 << 20, stack_hard))
    os.nice(3)
    sys.dont_write_bytecode = True
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(5000)
    warnings.simplefilter("error", UserWarning)  # the test's own filters, as pytest sets them
    try:
        expected = _state_targets.state()
        seen = run(_state_targets.state).assert_clean()
    finally:
        warnings.resetwarnings()

    assert expected["umask"] == 0o077 and expected["user_warning_raises"]
    assert expected["rlimits"]["RLIMIT_NOFILE"][0] == 200
    if style != "fork":  # the project's filter on HarnessWarning: never imported for it
        expected["filters"] = [item for item in expected["filters"] if item[1] != "HarnessWarning"]
    assert seen.returned == expected
    assert seen.notes == ()


@pytest.mark.parametrize(
    "flags",
    [
        ["-O"],
        ["-X", "dev", "-W", "error::UserWarning"],
        ["-B"],
        ["-OO", "-b", "-s", "-X", "utf8"],
        # -X options subprocess._args_from_interpreter_flags leaves out; and the harness's own
        # text streams give an encoding (no EncodingWarning, an error here, in the parent)
        [
            "-X",
            "warn_default_encoding",
            "-X",
            "int_max_str_digits=1000",
            "-W",
            "error::EncodingWarning",
        ],
    ],
)
def test_interpreter_flags_reach_every_style(flags, tmp_path):
    script = tmp_path / "flags.py"
    script.write_text(
        textwrap.dedent(
            """
            import json
            import harness
            from suites.harness import _state_targets

            seen = {"parent": _state_targets.state()}
            for style in ("fork", "forkserver", "exec"):
                outcome = harness.run_child(_state_targets.state, style=style, timeout=30)
                seen[style] = outcome.returned if outcome.kind == "exited" else repr(outcome)
            print(json.dumps(seen))
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": ROOT}
    for name in ("COVERAGE_PROCESS_CONFIG", "PYTHONDONTWRITEBYTECODE"):  # the flags: -B's own
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, *flags, str(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    parent = seen.pop("parent")
    assert parent["optimize"] == (2 if "-OO" in flags else 1 if "-O" in flags else 0)
    assert parent["dev_mode"] == ("dev" in flags)
    assert seen == {"fork": parent, "forkserver": parent, "exec": parent}


ZYGOTE_STARTED_UNDER_A_VARIABLE = """
import json
import os
import harness
from suites.harness import _state_targets

os.environ["PYTHONOPTIMIZE"] = "1"  # as a test's monkeypatch.setenv, when the zygote starts
os.environ["PYTHONDEVMODE"] = "1"
first = harness.run_child(_state_targets.state, style="forkserver", timeout=30).returned
del os.environ["PYTHONOPTIMIZE"], os.environ["PYTHONDEVMODE"]
later = harness.run_child(_state_targets.state, style="forkserver", timeout=30).returned
print(json.dumps([_state_targets.state(), first, later]))
"""


def test_a_zygote_is_the_interpreter_the_test_process_started_as(tmp_path):
    # a start-up variable set in os.environ when the zygote starts acts in no forkserver child:
    # a fork child's interpreter started without it too
    script = tmp_path / "zygote_env.py"
    script.write_text(ZYGOTE_STARTED_UNDER_A_VARIABLE)
    env = {**os.environ, "PYTHONPATH": ROOT}
    for name in ("COVERAGE_PROCESS_CONFIG", "PYTHONOPTIMIZE", "PYTHONDEVMODE"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )

    assert done.returncode == 0, done.stderr
    parent, first, later = json.loads(done.stdout.splitlines()[-1])
    assert (parent["optimize"], parent["dev_mode"]) == (0, False)
    assert first == parent
    assert later == parent


def test_a_start_up_variable_set_by_the_test_acts_in_no_style(run, style, monkeypatch):
    # the test process's interpreter started without it, and so does every child's; the
    # child sees it in os.environ, as a fork child does
    monkeypatch.setenv("PYTHONOPTIMIZE", "1")
    outcome = run(_state_targets.optimize_and_env).assert_clean()
    assert outcome.returned == [sys.flags.optimize, "1"]
    if style == "exec":  # asked for in env: an exec child acts on it (auto picks exec for it)
        seen = run(_state_targets.optimize_and_env, env={"PYTHONOPTIMIZE": "2"}).assert_clean()
        assert seen.returned == [2, "2"]


def test_the_flags_a_zygote_and_an_exec_child_start_with(monkeypatch):
    # this process's: what multiprocessing passes on, and the -X options it leaves out
    assert _state.interpreter_flags()[: len(subprocess._args_from_interpreter_flags())] == (
        subprocess._args_from_interpreter_flags()
    )
    monkeypatch.setattr(sys, "_xoptions", {"dev": True, "int_max_str_digits": "1000"})
    monkeypatch.setattr(sys, "warnoptions", [])
    monkeypatch.setattr(subprocess, "_args_from_interpreter_flags", lambda: ["-X", "dev"])
    assert _state.interpreter_flags() == ["-X", "dev", "-X", "int_max_str_digits=1000"]


def test_a_state_the_child_cannot_take_is_a_note(style, run, monkeypatch):
    with open("/proc/sys/fs/nr_open") as file:  # no process may go above it, root neither
        too_many = int(file.read()) + 1
    real = _state.process_state

    def impossible() -> dict:
        made = real()
        made["rlimits"]["RLIMIT_NOFILE"] = [too_many, too_many]
        return made

    if style == "fork":
        pytest.skip("a fork child has the test process's state by being a copy of it")
    monkeypatch.setattr(_forkserver, "process_state", impossible)
    monkeypatch.setattr(_exec, "process_state", impossible)

    outcome = run(_state_targets.state).assert_clean()

    assert outcome.returned["rlimits"]["RLIMIT_NOFILE"] == list(
        resource.getrlimit(resource.RLIMIT_NOFILE)
    )
    assert len(outcome.notes) == 1, outcome.notes
    assert outcome.notes[0].startswith(
        f"devmem-harness: the child could not take the test process's RLIMIT_NOFILE "
        f"({too_many}, {too_many})"
    )


def test_a_warning_filter_the_child_cannot_set_is_a_note(style, run):
    gone = type("GoneWarning", (UserWarning,), {"__module__": "no_such_module_36"})
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=gone)
        warnings.filterwarnings("error", category=pytest.PytestWarning)  # never in a child
        warnings.filterwarnings("error", category=RuntimeWarning)
        outcome = run(_state_targets.state).assert_clean()
        seen = run(_targets.hygiene).assert_clean().returned

    filters = outcome.returned["filters"]
    assert filters[0] == ["error", "RuntimeWarning", None]
    if style == "fork":  # a copy: every filter, the class itself
        assert outcome.notes == ()
        assert filters[1:3] == [["error", "PytestWarning", None], ["error", "GoneWarning", None]]
        return
    assert outcome.notes == (
        "devmem-harness: the child could not set the test process's warning filters "
        "error::no_such_module_36.GoneWarning: their categories could not be imported here",
    )
    assert "PytestWarning" not in str(filters) and "GoneWarning" not in str(filters)
    assert seen["pytest_imported"] is False  # not imported to set a filter on its category


def test_a_warning_filter_on_a_nested_category(run):
    # pkg.mod.Outer.NestedWarning: its module is the longest importable prefix of the name
    with warnings.catch_warnings():
        warnings.simplefilter("error", _state_targets.Outer.NestedWarning)
        outcome = run(_state_targets.warn_nested)

    outcome.assert_raised(_state_targets.Outer.NestedWarning, match="nested")
    assert outcome.notes == ()


def test_a_filter_on_the_harness_category_is_set_once_the_target_imports_it(run):
    # the child never imports the harness for it (suites/harness/test_spare.py checks that);
    # a target whose module imports the harness (a nested death test) has the filter
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "nested harness", harness.HarnessWarning)
        outcome = run(_scenarios.harness_warning_filter).assert_clean()

    assert outcome.returned[0] == ["error", "nested harness"]
    assert outcome.notes == ()


def test_a_nice_value_the_child_cannot_take_is_a_note(monkeypatch):
    def refuse(*_args: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)
    have = os.getpriority(os.PRIO_PROCESS, 0)

    notes = _child.apply_state({"nice": have - 1})

    assert notes == [
        f"devmem-harness: the child could not take the test process's nice value {have - 1} "
        f"(Operation not permitted: lowering it takes a privilege); it runs at {have}"
    ]
    assert _child.apply_state({"nice": have}) == []  # the same: nothing to set


# -- item 2: a class of the script run as __main__ ----------------------------------------------

MAIN_SCRIPT = """
import harness


class MyError(Exception):
    pass


def raise_it():
    raise MyError("mine")


if __name__ == "__main__":
    for style in ("fork", "forkserver", "exec"):
        outcome = harness.run_child(raise_it, style=style, timeout=30)
        try:
            outcome.assert_raised(MyError, match="mine")
            outcome.assert_raised("__main__.MyError")
            outcome.assert_raised(Exception)
            outcome.assert_raised("__mp_main__.MyError")  # the child's name for it
            print(style, "passed", outcome.raised.type, *outcome.raised.bases)
        except harness.DeathTestFailure as failure:
            print(style, "failed", str(failure).splitlines()[0])
        try:
            outcome.assert_raised(KeyError)
        except harness.DeathTestFailure as failure:
            print(style, str(failure).splitlines()[0])
"""


def test_assert_raised_with_a_class_of_the_script_run_as_main(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(MAIN_SCRIPT)
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )

    assert done.returncode == 0, done.stderr
    two_names = (
        " (in the child also __mp_main__.MyError, the parent's script loaded again: one class,"
        " two names)"
    )
    assert done.stdout.splitlines() == [
        line
        for style in ("fork", "forkserver", "exec")
        for line in (
            f"{style} passed __main__.MyError Exception BaseException",
            f"{style} death test failed: the target raised __main__.MyError"
            f"{'' if style == 'fork' else two_names}, not KeyError: the child exited with "
            "status 1 after its target raised __main__.MyError: mine",
        )
    ]


MODULE_SCRIPT = """
from .helper import VALUE

import harness


class MyError(Exception):
    pass


def raise_it():
    raise MyError(VALUE)


if __name__ == "__main__":
    for style in ("fork", "forkserver", "exec"):
        outcome = harness.run_child(raise_it, style=style, timeout=30)
        try:
            outcome.assert_raised(MyError, match="from the helper")
            print(style, "passed", outcome.raised.type)
        except harness.DeathTestFailure as failure:
            print(style, "failed", str(failure).splitlines()[0])
"""


def test_assert_raised_with_a_class_of_a_module_run_with_python_m(tmp_path):
    # python -m pkg.script: the child loads it by its name, as multiprocessing does (a relative
    # import needs its package), not by its path
    package = tmp_path / "mainpkg36"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text("VALUE = 'from the helper'\n")
    (package / "script.py").write_text(MODULE_SCRIPT)
    env = {**os.environ, "PYTHONPATH": ROOT}
    if env.get("MUTANT_UNDER_TEST") == "stats":
        # under mutmut's first run the script's trampolines would look for mutmut's
        # configuration in tmp_path; run them unmutated (a mutant's run still applies)
        env["MUTANT_UNDER_TEST"] = ""
    done = subprocess.run(
        [sys.executable, "-m", "mainpkg36.script"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{style} passed __main__.MyError" for style in ("fork", "forkserver", "exec")
    ]


WARNING_SCRIPT = """
import warnings

import harness


class MyWarning(UserWarning):
    pass


def warn_it():
    warnings.warn("mine", MyWarning)
    return "not raised"


if __name__ == "__main__":
    warnings.simplefilter("error", MyWarning)
    for style in ("fork", "forkserver", "exec"):
        outcome = harness.run_child(warn_it, style=style, timeout=30)
        print(style, outcome.raised and outcome.raised.type, outcome.returned, outcome.notes)
"""


def test_a_warning_filter_on_a_category_of_the_script_run_as_main(tmp_path):
    # the category is the child's once the target's module (__mp_main__) is loaded: the filter
    # is set then, as a fork child has it, not left out with a note
    script = tmp_path / "script.py"
    script.write_text(WARNING_SCRIPT)
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{style} __main__.MyWarning None ()" for style in ("fork", "forkserver", "exec")
    ]


# -- item 5: an explicit fork with other threads running -----------------------------------------


def test_an_explicit_fork_with_threads_runs_and_warns():
    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        with pytest.warns(harness.HarnessWarning, match=r"style='fork' with \d+ threads") as got:
            outcome = harness.run_child("os:getpid", style="fork", timeout=30)
        with warnings.catch_warnings():  # the harness's own forks (own_process) do not warn
            warnings.simplefilter("error", harness.HarnessWarning)
            assert choose_style("fork", importable=True, warn_threads=False) == "fork"
    finally:
        stop.set()
        for thread in threads:
            thread.join()

    outcome.assert_clean()
    ours = [w for w in got if issubclass(w.category, harness.HarnessWarning)]
    assert [w.filename for w in ours] == [__file__]  # it points at the call
    auto = harness.run_child("os:getpid", timeout=30)  # auto never warns: it avoids the fork
    assert auto.style in ("fork", "forkserver")


def test_a_fork_from_a_single_threaded_process_does_not_warn():
    # in a fresh interpreter, whatever threads this pytest process (an xdist worker) has
    outcome = harness.run_child(_state_targets.no_thread_fork_warning, style="exec", timeout=60)
    assert outcome.assert_clean().returned == []


# -- item 8: process groups, threads, escaped grandchildren ---------------------------------------


def test_a_child_can_join_its_parents_process_group(run, style):
    if style == "exec" and sys.version_info < (3, 11):
        assert run(_state_targets.session_leader).assert_clean().returned is True
        pytest.skip("on Python 3.10 an exec child leads a session of its own (documented)")
    assert run(_state_targets.session_leader).assert_clean().returned is False
    assert run(_state_targets.join_parent_group).assert_clean().returned == [True, None]


def test_a_non_daemon_thread_is_not_waited_for(run, tmp_path):
    path = tmp_path / "late"

    outcome = run(_state_targets.late_thread, str(path)).assert_clean()

    assert outcome.duration_s < _state_targets.LATE_S  # the child did not wait for its thread
    time.sleep(_state_targets.LATE_S + 0.2)  # the thread would have written, had it lived on
    assert not path.exists()


def test_a_grandchild_that_escaped_with_stderr_is_a_leak_note(run):
    outcome = run(_state_targets.escape_with_stderr, 30.0).assert_clean()
    grandchild = outcome.returned
    try:
        leaks = [note for note in outcome.notes if "still held open" in note]
        assert len(leaks) == 2, outcome.notes  # stdout and stderr
        assert f"by {grandchild} (" in leaks[1]
        assert leaks[1].startswith("devmem-harness: the child's stderr is still held open by")
    finally:
        os.kill(grandchild, signal.SIGKILL)
    assert _procs.wait_until_dead(grandchild)


def test_a_grandchild_killed_with_the_group_is_no_leak(run):
    outcome = run("suites.harness._targets:leave_grandchild").assert_clean()
    assert not [note for note in outcome.notes if "still held open" in note]
