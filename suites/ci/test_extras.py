"""``pip install -e .[test]`` is enough to run the suites: every module a suite imports or skips
without is in the ``test`` extra, but for the opt-in lanes' (PyTorch for ``--interop``, CuPy
for ``cuda``). Before, the plot extra was missing from it and 26 tests of
``test_memory_cli.py`` failed where it was not installed."""

from __future__ import annotations

import re
from pathlib import Path

from suites.ci import read_toml

ROOT = Path(__file__).resolve().parents[2]
OPT_IN = {
    "torch": "ci/check.sh --interop installs torch==2.13.0",
    "cupy": "the cuda extra, on a machine with a GPU",
    "tomllib": "the standard library from Python 3.11",
    "tomli": "tomllib's stand-in on Python 3.10",
}
DISTRIBUTION = {}  # module -> distribution, where the names differ


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9_.-]+", r)[0].lower().replace("_", "-") for r in requirements}


def _extras() -> dict[str, list[str]]:
    return read_toml(ROOT / "pyproject.toml")["project"]["optional-dependencies"]


def test_the_test_extra_has_what_the_suites_import_or_skip():
    skipped = set()
    for path in (ROOT / "suites").rglob("*.py"):
        for name in re.findall(r"importorskip\(\s*[\"']([\w.]+)[\"']", path.read_text()):
            skipped.add(name.split(".")[0])
    assert "matplotlib" in skipped  # the scan sees them
    test = _requirement_names(_extras()["test"])
    missing = {m for m in skipped - set(OPT_IN) if DISTRIBUTION.get(m, m) not in test}
    assert not missing, f"add to the test extra, or to OPT_IN with the reason: {sorted(missing)}"


def test_the_test_extra_includes_the_plot_extra():
    extras = _extras()
    assert _requirement_names(extras["plot"]) <= _requirement_names(extras["test"])
