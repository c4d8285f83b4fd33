"""Lines run in death-test children count wherever pytest was started (issue 36, item 3).

coverage.py looks for its configuration in the working directory: pytest started in a
subdirectory of the project measures the test process with none (no ``patch`` either), and
the children's lines were lost, silently. The harness hands each child the configuration
the test process measures with (``harness._coverage``), so the figure is the one from the
project's root.
"""

from __future__ import annotations

import pytest

from suites.harness.test_coverage import MODULE, TESTS

PYPROJECT = """
[tool.pytest.ini_options]
pythonpath = ["."]

[tool.coverage.run]
patch = ["subprocess", "fork", "_exit"]
"""


@pytest.mark.parametrize("where", ["root", "subdirectory"])
@pytest.mark.parametrize("style", ["fork", "forkserver", "exec"])
def test_children_are_covered_from_a_subdirectory(pytester, runpytest, monkeypatch, style, where):
    pytester.mkpydir("covpkg")
    pytester.path.joinpath("covpkg", "mod.py").write_text(MODULE)
    pytester.path.joinpath("pyproject.toml").write_text(PYPROJECT)
    sub = pytester.mkdir("tests")
    sub.joinpath("test_cov.py").write_text(TESTS)
    if where == "subdirectory":
        monkeypatch.chdir(sub)

    result = runpytest(
        f"--death-style={style}", "--cov=covpkg", "--cov-report=term-missing", "-p", "no:randomly"
    )

    result.assert_outcomes(passed=1)
    # 16 statements; missed: aborts (killed by a signal: lines 22-23) and never (27)
    result.stdout.re_match_lines([r".*covpkg/mod\.py\s+16\s+3\s+81%\s+22-23, 27$"])
    leftovers = sorted(path.name for path in pytester.path.rglob(".coverage.*"))
    assert leftovers == []  # combined, and no process (the zygote) saved after the combine
