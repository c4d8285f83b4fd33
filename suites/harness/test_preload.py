"""A forkserver zygote's preloading is not the first child's time (issue 18, item 4)."""

from __future__ import annotations

from suites.harness import _targets


def test_a_slow_preload_does_not_count_against_the_first_child_s_timeout(run, preloading):
    preloading("suites.harness._slow_import")  # takes 1 s to import
    outcome = run(_targets.abort_with, "CHECK failed at once", timeout=0.5)

    outcome.assert_aborted("CHECK failed at once")
    assert outcome.duration_s < 0.5
