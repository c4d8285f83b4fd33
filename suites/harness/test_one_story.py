"""One outcome, one story (issue 36, item 4): a child killed on its way out after its target
raised or returned died of that signal; the raise or return is what happened before it."""

from __future__ import annotations

import re
import signal

import pytest

import harness
from harness._protocol import Raised
from harness._report import describe_ending
from suites.harness import _story_targets


def test_raise_then_abort_is_a_death_and_not_a_raise(run, style):
    outcome = run(_story_targets.raise_then, "abort", "boom on the way")

    assert (outcome.kind, outcome.signal, outcome.exit_code) == ("signaled", signal.SIGABRT, None)
    assert outcome.raised is not None and str(outcome.raised) == "ValueError: boom on the way"
    assert outcome.ending == "killed by SIGABRT after its target raised ValueError: boom on the way"
    assert f"<Outcome {outcome.target}: {outcome.ending} (style {style}" in repr(outcome)
    outcome.assert_aborted(match="boom on the way").assert_died(signal="SIGABRT")
    outcome.assert_died().assert_exit(lambda o: o.signal == signal.SIGABRT)

    with pytest.raises(harness.DeathTestFailure) as failure:
        outcome.assert_raised(ValueError)
    first = str(failure.value).splitlines()[0]
    assert first == (
        "death test failed: the target raised, but the child did not exit after it: the child "
        "was killed by SIGABRT after its target raised ValueError: boom on the way"
    )
    with pytest.raises(harness.DeathTestFailure, match="ValueError, not KeyError: the child was"):
        outcome.assert_raised(KeyError)
    with pytest.raises(harness.DeathTestFailure, match="the child was killed by SIGABRT after"):
        outcome.assert_exited(1)
    with pytest.raises(harness.DeathTestFailure, match="the child was killed by SIGABRT after"):
        outcome.assert_clean()
    with pytest.raises(harness.DeathTestFailure, match="killed by SIGSEGV"):
        outcome.assert_died(signal="SIGSEGV")


def test_return_then_abort_is_a_death(run, style):
    outcome = run(_story_targets.return_then, "abort", 7)

    assert (outcome.kind, outcome.signal, outcome.returned) == ("signaled", signal.SIGABRT, 7)
    assert outcome.raised is None
    assert outcome.ending == "killed by SIGABRT"
    outcome.assert_aborted().assert_died(signal=signal.SIGABRT)
    outcome.assert_exit(lambda o: o.signal == signal.SIGABRT)
    with pytest.raises(harness.DeathTestFailure) as failure:
        outcome.assert_clean()
    message = str(failure.value)
    assert message.splitlines()[0] == "death test failed: the child was killed by SIGABRT"
    assert "  returned: 7" in message.splitlines()
    with pytest.raises(harness.DeathTestFailure, match="the target did not raise"):
        outcome.assert_raised()


def test_raise_then_hang_is_a_timeout_and_not_a_raise(run, style):
    # 3 s: an exec child on a loaded machine must get to its raise before the deadline
    outcome = run(_story_targets.raise_then, "hang", "stuck on the way", timeout=3)

    assert outcome.kind == "timed_out"
    assert outcome.ending.startswith(
        "timed out after 3 s (its target had raised ValueError: stuck on the way), then "
    )
    outcome.assert_timed_out()
    with pytest.raises(harness.DeathTestFailure, match="did not exit after it: the child timed"):
        outcome.assert_raised(ValueError)
    with pytest.raises(harness.DeathTestFailure, match=r"^death test failed: the child did not"):
        outcome.assert_died()


def test_a_raise_that_exits_is_still_a_raise_and_not_a_death(run):
    outcome = run(_story_targets.raise_then, "exit", "plain raise")

    assert (outcome.kind, outcome.exit_code) == ("exited", 1)
    assert outcome.ending == "exited with status 1 after its target raised ValueError: plain raise"
    outcome.assert_raised(ValueError, match="plain raise")
    for check in (outcome.assert_died, outcome.assert_aborted):
        with pytest.raises(harness.DeathTestFailure, match="did not die: its target raised"):
            check()
    with pytest.raises(harness.DeathTestFailure, match="did not die: its target raised"):
        outcome.assert_exit(lambda o: True)


def test_describe_ending_puts_the_signal_first():
    raised = Raised("ValueError", "bad size", "")
    assert describe_ending("signaled", None, 6, 2.0, None, raised) == (
        "killed by SIGABRT after its target raised ValueError: bad size"
    )
    assert describe_ending("signaled", None, 6, 2.0, None) == "killed by SIGABRT"
    assert describe_ending("timed_out", None, 15, 2.0, None, raised) == (
        "timed out after 2 s (its target had raised ValueError: bad size), then killed by SIGTERM"
    )
    assert describe_ending("timed_out", None, 15, 2.0, None) == (
        "timed out after 2 s, then killed by SIGTERM"
    )


# Issue 36, item 6: a bytes pattern is refused, naming the argument, by every assertion.
@pytest.mark.parametrize("pattern", [re.compile(rb"x"), b"x", bytearray(b"x")])
def test_a_bytes_match_is_refused_naming_the_argument(pattern):
    outcome = harness.run_child(
        _story_targets.return_then, "exit", 1, style="forkserver", timeout=30
    )
    expected = (
        f"match={pattern!r} is a bytes pattern; the stderr it searches is text (decoded as "
        "UTF-8, undecodable bytes replaced): use a str pattern, e.g. match='x'"
    )
    checks = [
        outcome.assert_clean().assert_exited,
        outcome.assert_died,
        outcome.assert_aborted,
        outcome.assert_timed_out,
        outcome.assert_raised,
        lambda match: outcome.assert_exit(lambda o: True, match=match),
    ]
    for check in checks:
        with pytest.raises(harness.HarnessError) as refused:
            check(match=pattern)
        assert str(refused.value) == expected


def test_a_bytes_pattern_suggests_its_text_with_undecodable_bytes_escaped():
    outcome = harness.run_child(
        _story_targets.return_then, "exit", 1, style="forkserver", timeout=30
    )
    with pytest.raises(harness.HarnessError, match=re.escape(r"e.g. match='a\\xffb'")):
        outcome.assert_exited(0, match=re.compile(b"a\xffb"))
    outcome.assert_exited(0, match=re.compile("^$"))  # a str pattern still works
