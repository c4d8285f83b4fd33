"""Deadlines: stacks dumped, SIGTERM then SIGKILL to the whole group, always reaped."""

from __future__ import annotations

import os
import signal

import harness
from harness._reap import GRACE_S
from suites.harness import _procs, _targets

TIMEOUT_S = 1.0


def test_hang_is_timed_out_with_its_stack_and_its_grandchild_killed(run):
    outcome = run(_targets.hang_with_grandchild, timeout=TIMEOUT_S)

    assert outcome.kind == "timed_out"
    assert TIMEOUT_S <= outcome.duration_s <= TIMEOUT_S + 2.0
    assert outcome.signal is signal.SIGTERM
    assert outcome.ending == "timed out after 1 s, then killed by SIGTERM"
    # shortly before the deadline, the child's faulthandler dumped its Python stacks
    assert "devmem-harness: the child's 1 s timeout is near; its Python stacks follow\n" in (
        outcome.stderr
    )
    assert "in hang_forever" in outcome.stderr
    assert "in hang_with_grandchild" in outcome.stderr
    grandchild = int(outcome.stdout.split()[0])
    assert _procs.wait_until_dead(grandchild), f"grandchild {grandchild} survived the timeout"
    assert _procs.zombies_of({os.getpid()}) == []


def test_sigterm_ignored_means_sigkill_after_the_grace_period():
    outcome = harness.run_child(_targets.ignore_sigterm_and_hang, style="fork", timeout=TIMEOUT_S)

    assert outcome.kind == "timed_out"
    assert outcome.signal is signal.SIGKILL
    assert TIMEOUT_S + GRACE_S <= outcome.duration_s <= TIMEOUT_S + 2.0
    assert "in hang_forever" in outcome.stderr
