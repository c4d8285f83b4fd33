"""A forkserver zygote's preloading is not the first child's time (issue 18, item 4)."""

from __future__ import annotations

import pytest

import harness
from harness._forkserver import forkserver_preload
from suites.harness import _targets


@pytest.fixture
def slow_preload():
    """A preload list with a module that takes 1 s to import (a fresh zygote for it)."""
    before = list(forkserver_preload())
    harness.set_forkserver_preload([*before, "suites.harness._slow_import"])
    try:
        yield
    finally:
        harness.set_forkserver_preload(before)


def test_a_slow_preload_does_not_count_against_the_first_child_s_timeout(run, slow_preload):
    outcome = run(_targets.abort_with, "CHECK failed at once", timeout=0.5)

    outcome.assert_aborted("CHECK failed at once")
    assert outcome.duration_s < 0.5
