"""Config matrices: one pytest item per Config, with the config's id."""

from __future__ import annotations

import pytest

import harness
from suites.harness import _targets

CONFIGS = [
    harness.Config("capped", {"MATRIX_CAP": "1"}),
    harness.Config("unbounded", {"MATRIX_CAP": None}),
]


@harness.matrix(CONFIGS)
def test_matrix_ids(config, request):
    assert isinstance(config, harness.Config)
    assert request.node.name == f"test_matrix_ids[{config.id}]"
    items = [item.name for item in request.session.items if item.originalname == "test_matrix_ids"]
    assert items == ["test_matrix_ids[capped]", "test_matrix_ids[unbounded]"]


@harness.matrix(CONFIGS)
def test_matrix_config_reaches_the_child(config, death, monkeypatch):
    monkeypatch.setenv("MATRIX_CAP", "from the parent")
    outcome = death.run(_targets.env_values, "MATRIX_CAP", config=config).assert_clean()
    expected = {"capped": "1", "unbounded": None}[config.id]
    assert outcome.returned == [expected]
    assert outcome.config_id == config.id


def test_matrix_misuse():
    with pytest.raises(harness.HarnessError, match="at least one Config"):
        harness.matrix([])
    with pytest.raises(harness.HarnessError, match="takes Config values"):
        harness.matrix(["capped"])
    with pytest.raises(harness.HarnessError, match="iterable of Config"):
        harness.matrix(CONFIGS[0])
    with pytest.raises(harness.HarnessError, match="the id 'capped' twice"):
        harness.matrix([CONFIGS[0], harness.Config("capped", {})])

    def test_without_config(death):
        pass

    with pytest.raises(harness.HarnessError, match="no 'config' parameter"):
        harness.matrix(CONFIGS)(test_without_config)
    with pytest.raises(harness.HarnessError, match="decorates test functions, not 42"):
        harness.matrix(CONFIGS)(42)  # type: ignore[type-var]


# Issue 18, item 9: a matrix needs no plugin to make its items.
def test_a_matrix_works_without_the_plugin(pytester, runpytest):
    pytester.makepyfile(
        test_plain="""
import harness

@harness.matrix([harness.Config("on", {"X": "1"}), harness.Config("off", {})])
def test_configs(config):
    assert config.id in ("on", "off")
"""
    )
    result = runpytest("-p", "no:devmem_death", "-v")

    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines_random(
        [
            "*test_plain.py::test_configs[[]on[]] PASSED*",
            "*test_plain.py::test_configs[[]off[]] PASSED*",
        ]
    )
