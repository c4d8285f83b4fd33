"""A test process that ignores or handles SIGCHLD gets true verdicts or a harness error, never
a raw ChildProcessError (issue 18, item 5)."""

from __future__ import annotations

import os
import signal

import pytest

import harness
from suites.harness import _targets


def _reaper(signum, frame):
    """A SIGCHLD handler that reaps every child that has ended, as servers often install."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


@pytest.fixture(params=["ignored", "reaping-handler"])
def sigchld(request):
    """SIGCHLD ignored, or handled by a reaper, in this process for the test's duration."""
    handler = signal.SIG_IGN if request.param == "ignored" else _reaper
    before = signal.signal(signal.SIGCHLD, handler)
    try:
        yield request.param
    finally:
        signal.signal(signal.SIGCHLD, before)


def test_fork_and_exec_report_a_harness_error_and_forkserver_runs(run, style, sigchld):
    outcome = run(_targets.abort_with, "CHECK failed")

    if style == "forkserver":  # its zygote reaps the children, whatever this process does
        outcome.assert_aborted("CHECK failed")
        return
    assert outcome.kind == "harness_error", outcome
    assert "SIGCHLD" in outcome.error
    assert "style='forkserver'" in outcome.error
    assert outcome.pid is None  # refused before it started: nothing was signalled


def test_auto_falls_back_to_forkserver(sigchld):
    outcome = harness.run_child(_targets.abort_with, "CHECK failed", timeout=30)

    assert outcome.style == "forkserver"
    outcome.assert_aborted("CHECK failed")


@pytest.mark.parametrize("style", ["fork", "exec"])
def test_a_child_reaped_by_someone_else_is_a_harness_error(monkeypatch, style):
    """A reaper the harness cannot see (a handler installed from C, os.wait() in another
    thread) takes the child's status first: a harness error saying so, not a raw
    ChildProcessError, and no signal to its pid once it is gone."""
    from harness import _reap

    real_waitpid = os.waitpid
    stolen: list[int] = []
    signalled: list[int] = []

    def someone_else_first(pid, options):
        if pid > 0 and not stolen:
            real_waitpid(pid, options)  # reaped elsewhere: the pid is free for reuse now
            stolen.append(pid)
        return real_waitpid(pid, options)

    def kill_group(pid, sig):
        if pid in stolen:
            signalled.append(sig)

    monkeypatch.setattr(os, "waitpid", someone_else_first)
    monkeypatch.setattr(_reap, "kill_group", kill_group)
    outcome = harness.run_child(_targets.abort_with, "CHECK failed", style=style, timeout=30)

    assert stolen == [outcome.pid]
    assert outcome.kind == "harness_error", outcome
    assert "the child was reaped by someone else" in outcome.error
    assert signalled == []
