"""Lines run in death-test children count under ``pytest --cov`` (issue 18, item 12).

With coverage.py's own process support configured (``[run] patch = subprocess, fork, _exit``),
a child that exits (returned, raised, ``sys.exit``) in any style saves what it ran, and
pytest-cov combines it; a child killed by a signal saves nothing.
"""

from __future__ import annotations

import pytest

MODULE = """
import os
import sys


def returns():
    x = 1  # line 7
    return x


def raises():
    y = 2  # line 12
    raise ValueError(y)


def exits():
    z = 3  # line 17
    sys.exit(z)


def aborts():
    w = 4  # line 22: never saved, the child dies of SIGABRT
    os.abort()


def never():
    return 5  # line 27
"""

TESTS = """
from covpkg import mod


def test_children(death):
    death.run(mod.returns).assert_clean()
    death.run(mod.raises).assert_raised(ValueError)
    death.run(mod.exits).assert_exited(3)
    death.run(mod.aborts).assert_aborted()
"""

COVERAGE_CONFIG = """
[run]
patch = subprocess, fork, _exit
"""


@pytest.mark.parametrize("style", ["fork", "forkserver", "exec"])
def test_lines_run_in_children_that_exit_are_covered(pytester, runpytest, style):
    pytester.mkpydir("covpkg")
    pytester.path.joinpath("covpkg", "mod.py").write_text(MODULE)
    pytester.makepyfile(test_cov=TESTS)
    pytester.path.joinpath(".coveragerc").write_text(COVERAGE_CONFIG)

    result = runpytest(
        f"--death-style={style}", "--cov=covpkg", "--cov-report=term-missing", "-p", "no:randomly"
    )

    result.assert_outcomes(passed=1)
    # 16 statements; missed: aborts (killed by a signal: lines 22-23) and never (27)
    result.stdout.re_match_lines([r"covpkg/mod\.py\s+16\s+3\s+81%\s+22-23, 27$"])
    leftovers = sorted(path.name for path in pytester.path.glob(".coverage.*"))
    assert leftovers == []  # combined, and no process (the zygote) saved after the combine
