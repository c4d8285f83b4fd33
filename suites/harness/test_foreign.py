"""Verdicts stay the real child's when the target's own processes run the harness's code.

A target that calls ``os.fork()`` gets a copy of the child in which the harness's code is on
the stack; the copy returning or raising must behave as a plain interpreter does (traceback,
exit status) and never write the real child's status.
"""

from __future__ import annotations

import pytest

import harness
from suites.harness import _targets


def test_a_copy_that_raises_does_not_make_the_child_raise(run):
    outcome = run(_targets.fork_copy_raises, "return")

    outcome.assert_clean()
    assert outcome.raised is None
    assert "raised in the target's own forked copy" in outcome.stderr  # its traceback, as python
    with pytest.raises(harness.DeathTestFailure, match="did not raise"):
        outcome.assert_raised(ValueError)


def test_a_copy_that_raises_does_not_hide_the_abort(run):
    outcome = run(_targets.fork_copy_raises, "abort")

    outcome.assert_aborted("CHECK failed")


def test_a_copy_that_returns_does_not_replace_the_child_s_raise(run):
    outcome = run(_targets.fork_copy_returns, "raise")

    outcome.assert_raised(KeyError, match="raised by the real child")
    assert outcome.returned is None


def test_a_copy_that_returns_does_not_replace_the_child_s_value(run):
    outcome = run(_targets.fork_copy_returns, "return")

    outcome.assert_clean()
    assert outcome.returned == "returned by the real child"


def test_a_copy_that_exits_exits_with_its_code_and_touches_nothing(run):
    outcome = run(_targets.fork_copy_exits, 7)

    outcome.assert_clean()
    assert "copy exit status 7" in outcome.stderr


def test_a_nested_fork_child_gets_streams_of_its_own(run):
    outcome = run(_targets.nested_fork_child).assert_clean()

    assert outcome.stdout == "outer child\n"
    assert outcome.returned == {"inner_stdout": "giving back 1\n", "inner_kind": "exited"}
