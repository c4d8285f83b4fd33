"""Failure messages: target, config, env, expected vs actual, [  DEATH   ] lines, repro."""

from __future__ import annotations

import signal

import pytest

import harness
from harness._protocol import Raised
from suites.harness import _targets

LIVELY = harness.Config("lively", {"OUTCOME_FLAG": "1", "OUTCOME_GONE": None})


def test_a_child_that_lives_fails_a_death_assertion_and_says_so_plainly():
    outcome = harness.run_child(_targets.lives, config=LIVELY, style="fork")

    with pytest.raises(harness.DeathTestFailure) as failure:
        outcome.assert_aborted("boom")
    message = str(failure.value)
    lines = message.splitlines()

    assert isinstance(failure.value, AssertionError)
    assert lines[0] == "death test failed: the child did not die: it exited with status 0"
    assert lines[1].startswith("  target:   suites.harness._targets:lives  (style fork, pid ")
    assert "  config:   lively" in lines
    assert "  env:      OUTCOME_FLAG=1, OUTCOME_GONE unset" in lines
    assert "  expected: killed by SIGABRT, with stderr matching 'boom'" in lines
    assert "  actual:   exited with status 0" in lines
    assert "[  DEATH   ] still alive" in lines
    assert lines[-2:] == ["repro:", f"  {outcome.repro}"]
    assert "env -u OUTCOME_GONE OUTCOME_FLAG=1 DEVMEM_DEATH_CHILD=1 " in outcome.repro


def test_right_ending_wrong_stderr():
    outcome = harness.run_child(_targets.abort_with, "fatal: the real message", style="fork")
    outcome.assert_aborted("real message")

    with pytest.raises(harness.DeathTestFailure) as failure:
        outcome.assert_aborted("use-after-free")
    message = str(failure.value)
    assert message.startswith(
        "death test failed: the child ended as expected, but its stderr does not match "
        "'use-after-free'"
    )
    assert "[  DEATH   ] fatal: the real message" in message.splitlines()


def test_a_timeout_is_not_a_death():
    outcome = harness.run_child(_targets.hang_forever, style="fork", timeout=0.4)

    assert outcome.kind == "timed_out"
    with pytest.raises(harness.DeathTestFailure, match="the child did not die: it timed out"):
        outcome.assert_died()
    with pytest.raises(harness.DeathTestFailure, match=r"timed out after 0\.4 s"):
        outcome.assert_exited(0)


def test_wrong_death():
    outcome = harness.run_child(_targets.exit_with, 3, style="fork")

    with pytest.raises(harness.DeathTestFailure) as failure:
        outcome.assert_aborted()
    assert str(failure.value).startswith("death test failed: the child exited with status 3\n")
    with pytest.raises(harness.DeathTestFailure, match="expected: killed by SIGSEGV"):
        outcome.assert_died(signal=signal.SIGSEGV)

    aborted = harness.run_child(_targets.abort_with, "x", style="fork")
    with pytest.raises(harness.DeathTestFailure) as failure:
        aborted.assert_exited(0)
    assert str(failure.value).startswith("death test failed: the child was killed by SIGABRT\n")


def _outcome(**fields) -> harness.Outcome:
    values = {
        "kind": "signaled",
        "exit_code": None,
        "signal": signal.SIGABRT,
        "stdout": "",
        "stderr": "",
        "returned": None,
        "raised": None,
        "duration_s": 0.0123,
        "style": "forkserver",
        "pid": 4242,
        "repro": "env DEVMEM_DEATH_CHILD=1 python _exec_runner.py --request '{}'",
        "target": "pkg.mod:fn",
    }
    values.update(fields)
    return harness.Outcome(**values)


def test_long_stderr_shows_its_head_and_tail():
    stderr = "".join(f"line {i}\n" for i in range(100))
    with pytest.raises(harness.DeathTestFailure) as failure:
        _outcome(stderr=stderr).assert_exited(0)
    lines = str(failure.value).splitlines()

    assert "stderr (first 20 and last 50 of 100 lines):" in lines
    death_lines = [line for line in lines if line.startswith("[  DEATH   ] ")]
    assert death_lines == [
        *(f"[  DEATH   ] line {i}" for i in range(20)),
        "[  DEATH   ] [... 30 lines ...]",
        *(f"[  DEATH   ] line {i}" for i in range(50, 100)),
    ]
    assert "  target:   pkg.mod:fn  (style forkserver, pid 4242, 12.3 ms)" in lines
    assert "  config:   (none)" in lines
    assert "  env:      (no overrides)" in lines


def test_empty_stderr_and_a_raised_exception_are_shown():
    raised = Raised("ValueError", "bad size", "Traceback ...\nValueError: bad size\n")
    outcome = _outcome(kind="exited", exit_code=1, signal=None, raised=raised)
    with pytest.raises(harness.DeathTestFailure) as failure:
        outcome.assert_clean()
    lines = str(failure.value).splitlines()
    assert "  raised:   ValueError: bad size" in lines
    assert "stderr: (empty)" in lines


def test_repr_says_how_it_ended_in_words():
    assert repr(_outcome()) == "<Outcome pkg.mod:fn: killed by SIGABRT (style forkserver, 12.3 ms)>"
    exited = _outcome(kind="exited", exit_code=3, signal=None, config_id="capped", duration_s=1.5)
    assert repr(exited) == (
        "<Outcome pkg.mod:fn: exited with status 3 (style forkserver, config 'capped', 1.50 s)>"
    )
    error = _outcome(kind="harness_error", signal=None, error="the zygote died")
    assert error.ending == "harness error (not a crash): the zygote died"


def test_assert_died_takes_a_signal_by_enum_number_or_name():
    segv = _outcome(signal=signal.SIGSEGV)
    for wanted in (signal.SIGSEGV, int(signal.SIGSEGV), "SIGSEGV", "segv"):
        assert segv.assert_died(signal=wanted) is segv
    with pytest.raises(harness.DeathTestFailure, match="expected: killed by SIGSEGV"):
        _outcome(kind="exited", exit_code=11, signal=None).assert_died(signal="SIGSEGV")
