"""Misuse is a HarnessError that names the bad argument, raised before any child starts."""

from __future__ import annotations

import math

import numpy
import pytest

import harness
from suites.harness import _targets


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (42, "must be a module-level function or a 'module:qualname' str, not int"),
        ("no colon here", "must look like 'package.module:function'"),
        ("pkg.mod:", "must look like"),
        ("pkg mod:f", "must look like"),
    ],
)
def test_bad_target(target, message):
    with pytest.raises(harness.HarnessError, match=message):
        harness.run_child(target)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (((1, 2),), r"the arguments\[0\] has type tuple"),
        (([1, {2}],), r"the arguments\[0\]\[1\] has type set"),
        (({"k": numpy.int64(3)},), r"the arguments\[0\]\['k'\] has type numpy.int64"),
        (({1: "x"},), "has a key 1 of type int; keys must be str"),
        ((object(),), "has type object, which is not JSON plain data"),
    ],
)
def test_arguments_must_be_plain_data(args, message):
    with pytest.raises(harness.HarnessError, match=message):
        harness.run_child(_targets.give_back, *args)


# Issue 18, item 2: arguments that cannot be encoded are a HarnessError naming them.
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((10**5000,), r"the arguments\[0\] is an int of 16610 bits, too long to send as JSON"),
        ((1, {"k": [10**5000]}), r"the arguments\[1\]\['k'\]\[0\] is an int of 16610 bits"),
        ((_targets.deep_list(100_000),), r"the arguments\[0\]\[0\].* nests lists and dicts"),
        (({10**5000: 1},), "the arguments\\[0\\] has a key <int object> of type int"),
    ],
    ids=["huge-int", "nested-huge-int", "deep-100000", "unprintable-key"],
)
def test_arguments_that_cannot_be_encoded(args, message):
    with pytest.raises(harness.HarnessError, match=message):
        harness.run_child(_targets.give_back, *args)


def test_cyclic_argument():
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(harness.HarnessError, match="reference cycle"):
        harness.run_child(_targets.give_back, cycle)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (["A=1"], r"run_child\(env=...\) must be a mapping"),
        ({"": "1"}, "bad variable name ''"),
        ({"A=B": "1"}, "bad variable name 'A=B'"),
        ({"A": 1}, "the value of A must be a str"),
        ({"A": "x\0y"}, r"the value of A must be a str \(without NUL\)"),
        ({"A\0B": "1"}, r"bad variable name 'A\\x00B'"),
        ({1: "1"}, "bad variable name 1"),
    ],
)
def test_bad_env(env, message):
    with pytest.raises(harness.HarnessError, match=message):
        harness.run_child(_targets.give_back, env=env)


@pytest.mark.parametrize("timeout", [0, -1, math.inf, math.nan, "5", True])
def test_bad_timeout(timeout):
    message = r"timeout=...\) must be a positive finite number of seconds, or None for no deadline"
    with pytest.raises(harness.HarnessError, match=message):
        harness.run_child(_targets.give_back, timeout=timeout)


def test_bad_style():
    with pytest.raises(harness.HarnessError, match="style must be one of 'auto', 'fork'"):
        harness.run_child(_targets.give_back, style="spawn")


def test_bad_config():
    with pytest.raises(harness.HarnessError, match=r"must be a harness\.Config"):
        harness.run_child(_targets.give_back, config={"A": "1"})


def test_config_validation():
    with pytest.raises(harness.HarnessError, match="non-empty str"):
        harness.Config("", {})
    with pytest.raises(harness.HarnessError, match="non-empty str, not 3"):
        harness.Config(3, {})  # type: ignore[arg-type]
    with pytest.raises(harness.HarnessError, match=r"Config\('x'\).env: the value of A"):
        harness.Config("x", {"A": 3})
    with pytest.raises(harness.HarnessError, match=r"Config\('x'\).env must be a mapping"):
        harness.Config("x", ["A=1"])  # type: ignore[arg-type]
    config = harness.Config("capped", {"CAP": "1", "DEBUG": None})
    assert config.env == {"CAP": "1", "DEBUG": None}
    with pytest.raises(TypeError):
        config.env["CAP"] = "2"  # read-only
    assert repr(config) == "Config('capped', {'CAP': '1', 'DEBUG': None})"
    assert hash(config) == hash(harness.Config("capped", {"CAP": "1", "DEBUG": None}))


def test_death_runner_validates_its_defaults():
    with pytest.raises(harness.HarnessError, match=r"DeathRunner\(style=...\) must be one of"):
        harness.DeathRunner(style="vfork")
    with pytest.raises(harness.HarnessError, match=r"DeathRunner\(timeout=...\)"):
        harness.DeathRunner(timeout=0)


def test_death_runner_timeout_none_means_no_deadline_and_a_left_out_one_the_runners():
    runner = harness.DeathRunner(style="fork", timeout=None)
    assert repr(runner) == "DeathRunner(style='fork', timeout=None)"
    assert runner.run(_targets.give_back).timeout_s is None
    bounded = harness.DeathRunner(style="fork", timeout=7.5)
    assert repr(bounded) == "DeathRunner(style='fork', timeout=7.5)"
    assert bounded.run(_targets.give_back).timeout_s == 7.5
    assert bounded.run(_targets.give_back, timeout=None).timeout_s is None
    assert bounded.run(_targets.give_back, timeout=2).timeout_s == 2.0
    assert [outcome.timeout_s for outcome in bounded.outcomes] == [7.5, None, 2.0]


def test_assertion_arguments():
    outcome = harness.run_child(_targets.exit_with, 0, style="fork")
    with pytest.raises(harness.HarnessError, match="not a signal"):
        outcome.assert_died(signal="SIGNOPE")
    with pytest.raises(harness.HarnessError, match="not a valid regex"):
        outcome.assert_exited(0, match="(")
    with pytest.raises(harness.HarnessError, match="regex str or compiled pattern, not 3"):
        outcome.assert_clean().assert_exited(0, match=3)  # type: ignore[arg-type]
    for code in (256, -1, True, "0"):
        with pytest.raises(harness.HarnessError, match="int from 0 to 255"):
            outcome.assert_exited(code)  # type: ignore[arg-type]
    for bad in (True, 0, 99999, "", 6.0):
        with pytest.raises(harness.HarnessError, match="is not a signal"):
            outcome.assert_died(signal=bad)  # type: ignore[arg-type]
