"""The pytest plugin end to end, in a pytest subprocess: plain, ``-n 2`` and ``--forked``."""

from __future__ import annotations

import os
import re

import pytest

TARGETS = """
import os
import sys


def lives():
    print("still alive", file=sys.stderr)


def aborts():
    sys.stderr.write("fatal: boom\\n")
    sys.stderr.flush()
    os.abort()
"""

TESTS = """
import harness
import deathtargets

LIVELY = harness.Config("lively", {"E2E_FLAG": "1", "E2E_GONE": None})


@harness.matrix([harness.Config("on", {"E2E_FLAG": "1"}), harness.Config("off", {})])
def test_aborts(death, config):
    death.run(deathtargets.aborts, config=config).assert_aborted("fatal: boom")


def test_expects_death_but_child_lives(death):
    death.run(deathtargets.lives, config=LIVELY).assert_aborted("fatal: boom")
"""


@pytest.mark.parametrize("mode", [pytest.param([], id="plain"), ["-n", "2"], ["--forked"]], ids=str)
def test_death_tests_end_to_end(pytester, runpytest, mode):
    pytester.makepyfile(deathtargets=TARGETS, test_e2e=TESTS)

    result = runpytest("-rA", "--junitxml=report.xml", *mode)

    if "running the test EXITED with status 3" in result.stdout.str():
        pytest.fail(
            f"pytest-forked cannot carry pytest {pytest.__version__}'s reports out of its forked "
            "child (every test 'EXITED with status 3', the harness's or not): pin pytest<9.2 "
            "until pytest-forked supports it (see docs/death-tests.md)"
        )
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines_random(  # the matrix ids; -n 2 may finish them in any order
        ["PASSED test_e2e.py::test_aborts[[]on[]]", "PASSED test_e2e.py::test_aborts[[]off[]]"]
    )
    result.stdout.re_match_lines(
        [
            r"E\s+harness\.DeathTestFailure: death test failed: "
            r"the child did not die: it exited with status 0",
            r"E\s+target:   deathtargets:lives  \(style \w+, pid \d+, .*\)",
            r"E\s+config:   lively",
            r"E\s+env:      E2E_FLAG=1, E2E_GONE unset",
            r"E\s+expected: killed by SIGABRT, with stderr matching 'fatal: boom'",
            r"E\s+actual:   exited with status 0",
            r"E\s+" + re.escape("[  DEATH   ] still alive"),
            r"E\s+repro:",
            r"E\s+env -u E2E_GONE E2E_FLAG=1 DEVMEM_DEATH_CHILD=1 \S+ \S+_exec_runner\.py "
            r"--request '\{\"target\":\"deathtargets:lives\".*",
        ]
    )
    result.stdout.re_match_lines(
        [
            r"death tests: 3 children \((fork|forkserver) 3\); median [\d.]+ ms, "
            r"slowest [\d.]+ ms \(test_e2e\.py::\S+\)",
        ]
    )
    # Issue 9, case 11: the children travel to the summary without leaking into JUnit XML.
    junit = (pytester.path / "report.xml").read_text()
    assert junit.count("<testcase ") == 3
    assert "devmem_death" not in junit


def test_options_and_ini_reach_the_fixture(pytester, runpytest):
    pytester.makeini("[pytest]\ndeath_preload =\n    colorsys\n")
    pytester.makepyfile(
        deathtargets=TARGETS,
        test_options="""
import harness
from harness._forkserver import forkserver_preload
import deathtargets


def test_bound(death):
    assert (death.style, death.timeout) == ("exec", 7.5)
    assert forkserver_preload() == ("colorsys",)
    assert death.run(deathtargets.aborts).assert_aborted().style == "exec"
    assert death.run(deathtargets.lives, style="fork").style == "fork"
    assert [outcome.style for outcome in death.outcomes] == ["exec", "fork"]
""",
    )

    result = runpytest("--death-style", "exec", "--death-timeout", "7.5")

    result.assert_outcomes(passed=1)
    result.stdout.re_match_lines([r"death tests: 2 children \(fork 1, exec 1\); .*"])


TIMEOUT_ERROR = "expected a positive finite number of seconds, or 0 or 'none' for no deadline"


@pytest.mark.parametrize(
    ("option", "error"),
    [
        (["--death-timeout", "-1"], f"{TIMEOUT_ERROR}, got '-1'"),
        (["--death-timeout", "nan"], f"{TIMEOUT_ERROR}, got 'nan'"),
        (["--death-timeout", "1s"], f"{TIMEOUT_ERROR}, got '1s'"),
        (["--death-style", "spawn"], "invalid choice: 'spawn'"),
        (["-o", "death_timeout=soon"], f"the death_timeout ini option: {TIMEOUT_ERROR}"),
        (["-o", "death_style=vfork"], "the death_style ini option must be one of 'auto',"),
    ],
)
def test_bad_options_are_usage_errors(pytester, runpytest, option, error):
    result = runpytest(*option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{error}*"])


DEFAULTS = """
import pytest

import deathtargets


def test_ini(death):
    assert (death.style, death.timeout) == ("exec", None)


@pytest.mark.death(style="fork", timeout=2.5)
def test_marker(death):
    assert (death.style, death.timeout) == ("fork", 2.5)
    assert death.run(deathtargets.lives).timeout_s == 2.5
    assert death.run(deathtargets.lives, timeout=None).timeout_s is None


@pytest.mark.death(timeout=None)
def test_marker_no_deadline(death):
    assert death.timeout is None
    assert death.run(deathtargets.lives, style="fork").assert_clean().timeout_s is None


@pytest.mark.death(timeout=3_000_000)
def test_marker_long(death):
    assert death.run(deathtargets.lives, style="fork").assert_clean().timeout_s == 3_000_000


@pytest.mark.death(style="spawn")
def test_bad_marker(death):
    pass
"""


def test_ini_options_and_the_death_marker_set_the_fixtures_defaults(pytester, runpytest):
    pytester.makeini("[pytest]\ndeath_style = exec\ndeath_timeout = none\n")
    pytester.makepyfile(deathtargets=TARGETS, test_defaults=DEFAULTS)

    result = runpytest("--strict-markers")

    result.assert_outcomes(passed=4, errors=1)
    result.stdout.fnmatch_lines(
        ["*HarnessError: @pytest.mark.death(style=...) must be one of 'auto', *, not 'spawn'"]
    )


@pytest.mark.parametrize(
    ("timeout", "expected"), [("none", None), ("0", None), ("3000000", 3_000_000.0)]
)
def test_death_timeout_option_takes_none_zero_or_any_length(pytester, runpytest, timeout, expected):
    pytester.makeini("[pytest]\ndeath_timeout = 5\n")  # the command line wins over the ini
    pytester.makepyfile(
        deathtargets=TARGETS,
        test_timeout=f"""
import deathtargets


def test_timeout(death):
    assert death.timeout == {expected!r}
    assert death.run(deathtargets.lives, style="fork").assert_clean().timeout_s == {expected!r}
""",
    )
    result = runpytest("--death-timeout", timeout)
    result.assert_outcomes(passed=1)


# Issue 9, case 9: targets in a test module imported with --import-mode=importlib.
IMPORTLIB_TESTS = """
import sys

import pytest


def lives():
    return __name__


def aborts():
    import os
    os.abort()


@pytest.mark.parametrize("style", ["auto", "forkserver", "exec"])
def test_targets_of_this_module(death, style):
    assert "tests.test_here" in sys.modules  # importlib mode's name, not importable as such
    assert death.run(lives, style=style).assert_clean().returned == "tests.test_here"
    death.run(aborts, style=style).assert_aborted()
"""


def test_targets_in_a_test_module_under_import_mode_importlib_and_xdist(pytester, runpytest):
    project = pytester.mkdir("project")
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "tests").mkdir()
    (project / "tests" / "test_here.py").write_text(IMPORTLIB_TESTS)

    result = runpytest("--import-mode=importlib", "-n", "2", "project/tests")

    result.assert_outcomes(passed=3)


# Issue 9, case 11: under --forked, every test shares the zygote its pytest process started,
# which is reaped at the end (no <defunct> zygotes).
FORKED_TESTS = """
import pytest

import deathtargets


@pytest.mark.parametrize("i", range(4))
def test_forked(death, i):
    zygote = death.run(deathtargets.parent, style="forkserver").assert_clean().returned
    with open(f"zygote-{i}.txt", "w") as out:
        out.write(str(zygote))
"""


def test_forked_tests_share_one_zygote_that_is_reaped_at_the_end(pytester, runpytest):
    pytester.makepyfile(
        deathtargets=TARGETS + "\n\ndef parent():\n    return os.getppid()\n",
        test_forked=FORKED_TESTS,
    )

    result = runpytest("--forked")

    result.assert_outcomes(passed=4)
    zygotes = {(pytester.path / f"zygote-{i}.txt").read_text() for i in range(4)}
    assert len(zygotes) == 1, zygotes
    assert not os.path.exists(f"/proc/{zygotes.pop()}")  # gone, not a zombie
    result.stdout.re_match_lines([r"death tests: 4 children \(forkserver 4\); .*"])


TRACEBACKS = """
import harness


def test_bad_target(death):
    death.run(42)


def test_bad_timeout():
    harness.run_child("os:getpid", timeout=-1)


def test_bad_match(death):
    death.run("os:getpid", style="fork").assert_clean().assert_exited(0, match="(")
"""


def test_harness_errors_point_at_the_users_line(pytester, runpytest):
    pytester.makepyfile(test_tracebacks=TRACEBACKS)

    result = runpytest("--tb=long")

    result.assert_outcomes(failed=3)
    output = result.stdout.str()
    for line in ("death.run(42)", 'harness.run_child("os:getpid", timeout=-1)', 'match="("'):
        assert re.search(rf"^>\s+.*{re.escape(line)}", output, flags=re.MULTILINE), line
    frames = re.findall(r"^(\S+\.py):\d+: ", output, flags=re.MULTILINE)
    assert frames == ["test_tracebacks.py"] * 3, frames  # no frame of the harness's own
