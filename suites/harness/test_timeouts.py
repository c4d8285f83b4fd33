"""Deadlines: stacks dumped, SIGTERM then SIGKILL to the whole group, always reaped; a child
timed out at its deadline stays timed out however it ends; any length, or none."""

from __future__ import annotations

import os
import signal

import pytest

import harness
from harness._reap import GRACE_S
from suites.harness import _procs, _targets
from suites.harness._procs import deadline_s

TIMEOUT_S = 1.0
SHORT_S = 0.3


def test_hang_is_timed_out_with_its_stack_and_its_grandchild_killed(run, style):
    timeout = deadline_s(style, TIMEOUT_S)
    outcome = run(_targets.hang_with_grandchild, timeout=timeout)

    assert outcome.kind == "timed_out"
    assert timeout <= outcome.duration_s <= timeout + 2.0
    assert outcome.signal is signal.SIGTERM
    assert outcome.ending == f"timed out after {timeout:g} s, then killed by SIGTERM"
    # once the deadline passed, the child's faulthandler dumped its Python stacks
    assert outcome.notes[0].startswith(
        f"devmem-harness: the child's {timeout:g} s timeout has passed; its Python stacks follow "
        "in its stderr (after byte "
    )
    assert "in hang_forever" in outcome.stderr
    assert "in hang_with_grandchild" in outcome.stderr
    grandchild = int(outcome.stdout.split()[0])
    assert _procs.wait_until_dead(grandchild), f"grandchild {grandchild} survived the timeout"
    assert _procs.zombies_of({os.getpid()}) == []


def test_sigterm_ignored_means_sigkill_after_the_grace_period(run, style):
    # in every style (a forkserver child's SIGKILL is followed by the zygote's "reaped" reply,
    # which it had never been asked for before: the mutation run of harness._forkserver)
    timeout = deadline_s(style, SHORT_S)
    outcome = run(_targets.ignore_sigterm_and_hang, timeout=timeout)

    assert outcome.kind == "timed_out", outcome
    assert outcome.signal is signal.SIGKILL
    assert timeout + GRACE_S <= outcome.duration_s <= timeout + 2.0
    assert "in hang_forever" in outcome.stderr


# Issue 9, case 1: the stack-dump signal cannot turn a hang into a death.
def test_a_hang_that_reset_the_dump_signal_is_timed_out_not_killed_by_it(run, style):
    # the target must have reset the signal before the deadline: an exec child's start counts
    outcome = run(_targets.reset_dump_signal_and_hang, timeout=deadline_s(style, SHORT_S))

    assert outcome.kind == "timed_out", outcome
    assert outcome.signal is signal.SIGTERM  # never sent SIGUSR2, whose default action kills
    assert "it does not handle SIGUSR2 (did the target reset it?)" in outcome.notes[0]
    with pytest.raises(harness.DeathTestFailure, match="the child did not die: it timed out"):
        outcome.assert_died()


def test_a_hang_that_dies_of_the_dump_signal_is_still_timed_out(run, style):
    timeout = deadline_s(style, SHORT_S)
    outcome = run(_targets.abort_on_dump_signal_and_hang, timeout=timeout)

    assert outcome.kind == "timed_out", outcome
    assert outcome.signal is signal.SIGABRT  # its handler aborted when the dump came
    assert outcome.ending == f"timed out after {timeout:g} s, then killed by SIGABRT"
    for check in (outcome.assert_aborted, outcome.assert_died):
        with pytest.raises(harness.DeathTestFailure, match="the child did not die: it timed out"):
            check()


# Issue 9, case 6: any finite timeout, or none.
@pytest.mark.parametrize("timeout", [None, 1e10, 3_000_000, 2**40])
def test_any_finite_timeout_or_none(run, timeout):
    outcome = run(_targets.give_back, timeout=timeout).assert_clean()

    assert outcome.timeout_s == timeout
    assert outcome.returned["flag"] == "1"


def test_a_child_without_a_deadline_ends_as_it_ends(run):
    outcome = run(_targets.abort_with, "no deadline", timeout=None).assert_aborted("no deadline")
    assert "devmem-harness" not in outcome.stderr  # no deadline, so no dump
