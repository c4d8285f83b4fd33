"""The pytest plugin end to end, in a pytest subprocess: plain, ``-n 2`` and ``--forked``."""

from __future__ import annotations

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
def test_death_tests_end_to_end(pytester, mode):
    pytester.makepyfile(deathtargets=TARGETS, test_e2e=TESTS)

    result = pytester.runpytest_subprocess("-rA", "-p", "no:cacheprovider", *mode)

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


def test_options_and_ini_reach_the_fixture(pytester):
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

    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--death-style", "exec", "--death-timeout", "7.5"
    )

    result.assert_outcomes(passed=1)
    result.stdout.re_match_lines([r"death tests: 2 children \(fork 1, exec 1\); .*"])


@pytest.mark.parametrize(
    ("option", "error"),
    [
        (["--death-timeout", "0"], "expected a positive finite number of seconds, got '0'"),
        (["--death-timeout", "nan"], "expected a positive finite number of seconds, got 'nan'"),
        (["--death-timeout", "1s"], "expected a positive finite number of seconds, got '1s'"),
        (["--death-style", "spawn"], "invalid choice: 'spawn'"),
    ],
)
def test_bad_options_are_usage_errors(pytester, option, error):
    result = pytester.runpytest_subprocess(*option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{error}*"])
