"""Nothing of a child's process group outlives the test process, even one killed with SIGKILL.

Issue 9, case 7: a real pytest process runs a child in each style; each child starts three
``sleep`` grandchildren and hangs; the pytest process is then SIGKILLed. The children die with
their parent (``PR_SET_PDEATHSIG``), and the zygote, which outlives the test process, kills
their process groups, grandchildren included.
"""

from __future__ import annotations

import harness


def test_nothing_of_a_childs_group_outlives_a_sigkilled_pytest(tmp_path):
    outcome = harness.run_child(
        "suites.harness._scenarios:sigkill_a_pytest_process",
        str(tmp_path),
        style="exec",
        timeout=120,
    )
    seen = outcome.assert_clean().returned

    assert seen["started"], "the inner pytest did not start its children"
    assert seen["fork_parent"] == seen["inner"] != seen["zygote"]
    assert len(seen["everyone"]) == 3 + 1 + 9  # children, the zygote, sleepers
    assert seen["survivors"] == [], "still running after the test process was SIGKILLed"
    assert seen["in_groups"] == []
