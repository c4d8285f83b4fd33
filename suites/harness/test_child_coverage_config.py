"""The launchers' part in issue 36 items 1 and 3, seen from the test process: which zygote a
process uses for its flags, and which coverage configuration a child's environment gets."""

from __future__ import annotations

import pytest

import harness
from harness import _coverage, _exec, _forkserver


def test_a_zygote_serves_one_set_of_interpreter_flags(monkeypatch):
    plain = _forkserver.zygote_name(("numpy",))
    monkeypatch.setattr(_forkserver, "interpreter_flags", lambda: ["-O"])
    optimized = _forkserver.zygote_name(("numpy",))
    assert optimized != plain
    assert optimized.rsplit("-", 1)[0] == plain.rsplit("-", 1)[0]  # the root's, another digest


@pytest.mark.parametrize("module", [_forkserver, _exec], ids=["forkserver", "exec"])
@pytest.mark.parametrize("env", [None, {"COVERAGE_PROCESS_CONFIG": None}], ids=["plain", "own"])
def test_a_child_gets_the_coverage_configuration_unless_its_env_names_it(monkeypatch, module, env):
    calls = []

    def spy(environ: dict, keep: bool = False) -> dict:
        calls.append(keep)
        return {**environ, "COVERAGE_SPY": "1"}

    monkeypatch.setattr(module, "with_child_config", spy)
    style = "forkserver" if module is _forkserver else "exec"
    outcome = harness.run_child(
        "suites.harness._targets:env_values", "COVERAGE_SPY", env=env, style=style, timeout=30
    )

    assert outcome.assert_clean().returned == ["1"]  # the environment the spy made
    assert calls[-1] is (env is not None)  # the request's own setting stands (before it: a
    # zygote started for this test gets the configuration in its environment, keep=False)


def test_with_child_config(monkeypatch):
    monkeypatch.setattr(_coverage, "child_config", lambda: None)
    assert _coverage.with_child_config({"A": "1"}) == {"A": "1"}  # not measuring
    monkeypatch.setattr(_coverage, "child_config", lambda: "CFG")
    assert _coverage.with_child_config({"A": "1"}) == {"A": "1", _coverage.ENV_NAME: "CFG"}
    mine = {_coverage.ENV_NAME: "mine"}
    assert _coverage.with_child_config(mine, keep=True) == mine


def test_nothing_is_measured_in_children_when_the_test_process_measures_nothing(monkeypatch):
    monkeypatch.setattr(_coverage, "measuring", lambda: None)
    assert _coverage.child_config() is None
    assert _coverage.fork_orders() is None
