"""What the docs say of the project's own configuration, checked against that configuration:
the flags ``.ci/run`` passes, the modules mutation testing mutates, the shape of a death test's
failure report. Each of these once drifted from the truth (issue 41)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import harness
from suites.ci import read_toml

ROOT = Path(__file__).resolve().parents[2]


def _ci_run_flags() -> list[str]:
    """The options ``.ci/run`` adds to ``ci/check.sh --ci-all``."""
    text = (ROOT / ".ci" / "run").read_text()
    (line,) = re.findall(r"(?m)^ci/check\.sh --ci-all((?: --[\w-]+)*)\s*$", text)
    assert "exec ci/pythons.sh" in text
    return line.split()


def test_the_readme_says_what_ci_run_adds():
    flags = _ci_run_flags()
    assert flags, ".ci/run adds nothing to --ci-all?"
    readme = " ".join((ROOT / "README.md").read_text().split())
    said = re.search(r"\(`\.ci/run`, which adds (.*?), then runs `ci/pythons\.sh`", readme)
    assert said, "the README no longer says what .ci/run adds to --ci-all"
    assert re.findall(r"`(--[\w-]+)`", said[1]) == flags
    assert f"`.ci/run` runs `ci/check.sh --ci-all {' '.join(flags)}`, then `ci/pythons.sh`" in (
        readme
    )


def test_check_sh_help_says_what_ci_run_adds():
    help_text = subprocess.run(
        ["bash", str(ROOT / "ci" / "check.sh"), "-h"], capture_output=True, text=True, check=True
    ).stdout
    said = re.search(r"\(\.ci/run adds ((?:--[\w-]+ ?)+), then runs\s+ci/pythons\.sh\)", help_text)
    assert said, help_text
    assert said[1].split() == _ci_run_flags()


def _mutmut() -> dict:
    return read_toml(ROOT / "pyproject.toml")["tool"]["mutmut"]


def _configured_paths() -> set[str]:
    """``only_mutate`` as the docs name it: ``allocator/*`` is ``allocator/``, and each
    ``do_not_mutate`` path is named as the exception."""
    config = _mutmut()
    named = {p[:-2] if p.endswith("/*") else p for p in config["only_mutate"]}
    named = {p + "/" if (ROOT / p).is_dir() else p for p in named}
    return named | set(config.get("do_not_mutate", []))


def test_the_mutation_docs_list_every_mutated_module():
    text = (ROOT / "docs" / "mutation.md").read_text()
    bullet = text.split("- What is mutated", 1)[1].split("; each mutant against", 1)[0]
    listed = set(re.findall(r"`((?:allocator|harness|runtime)/[\w/.]*)`", bullet))
    assert listed == _configured_paths()


UNSELECTED = {
    "suites/harness/test_plugin.py": "pytester runs of the plugin: subprocesses the map cannot see",
}
"""Harness test files that import a mutated harness module but are left out of mutmut's
selection, with the reason."""


def test_a_harness_test_of_a_mutated_module_is_in_mutmut_s_selection():
    # a test file left out is never run against a mutant: test_child_state_helpers.py was,
    # and the mutation run of harness._child went on without it
    config = _mutmut()
    mutated = {p[: -len(".py")].replace("/", ".") for p in config["only_mutate"]}
    mutated = {name for name in mutated if name.startswith("harness.")}
    selected = set(config["pytest_add_cli_args_test_selection"])
    left_out = []
    for path in sorted((ROOT / "suites" / "harness").glob("test_*.py")):
        text = path.read_text()
        imported = {
            f"harness.{name}"
            for name in re.findall(r"(?m)^\s*from harness(?:\.|\s+import\s+)(_\w+)", text)
        }
        imported |= {
            f"harness.{name}"
            for names in re.findall(r"(?m)^\s*from harness import ([\w, ]+)$", text)
            for name in re.split(r",\s*", names)
        }
        relative = str(path.relative_to(ROOT))
        if imported & mutated and relative not in selected and relative not in UNSELECTED:
            left_out.append(relative)
    assert mutated, "no harness module is mutated?"
    assert left_out == []


def test_check_sh_help_names_the_mutated_modules_all_or_none():
    help_text = subprocess.run(
        ["bash", str(ROOT / "ci" / "check.sh"), "-h"], capture_output=True, text=True, check=True
    ).stdout
    nightly = help_text.split("\n  --nightly", 1)[1].split("\n  --no-build", 1)[0]
    named = set(re.findall(r"\b(?:allocator|harness|runtime)/[\w/.]*", nightly))
    assert named in (set(), _configured_paths()), nightly
    if not named:
        assert "[tool.mutmut]" in nightly


def _exits() -> None:
    pass


TARGET_LINE = re.compile(
    r"target:   \S+  \(style \w+, pid \d+, [\d.]+ (?:ms|s|us|µs|min), host \S+\)$"
)


def test_the_docs_failure_reports_have_the_target_line_a_run_prints():
    """The docs' example reports are pasted from runs: their ``target:`` lines must have the
    shape a run prints today (``, host ...`` at the end since failures name the host)."""
    outcome = harness.run_child(_exits, timeout=30)
    with pytest.raises(harness.DeathTestFailure) as failure:
        outcome.assert_aborted()
    (printed,) = [line.strip() for line in str(failure.value).splitlines() if "target:" in line]
    assert TARGET_LINE.search(printed), printed
    text = (ROOT / "docs" / "death-tests.md").read_text()
    in_docs = [
        line.split("E         ", 1)[-1].strip()
        for line in text.splitlines()
        if line.startswith("E ") and "target:" in line
    ]
    assert in_docs
    for line in in_docs:
        assert TARGET_LINE.search(line), f"docs/death-tests.md: {line!r} is not {printed!r}'s shape"
