"""The allocator under the cyclic garbage collector and threads (DESIGN 2.9, issue 8).

A finalizer can run at any allocation, inside the allocator's own critical sections too, so it
must never run allocator logic: ``Storage.__del__`` only queues its block. Each scenario runs in
a child with a deadline, so a deadlock is a failed test, not a stuck suite; the child reports
the allocator's ledger (every block live, cached or handed back) for the parent to check.
Defects 1 and 2 hung and leaked on the code before this change; the mutant probe puts the old
finalizer back and shows that the checks catch it.
"""

from __future__ import annotations

import os

import pytest

from . import _gc_probes

DEADLINE_S = 60.0
MUTANT_DEADLINE_S = 3.0


def check_ledger(row: dict) -> None:
    """Every block accounted for: device bytes in use = live + cached, and = live once the
    cache is flushed; the cache under its cap; each allocation a hit or a miss."""
    where = f"at extra={row.get('extra')}: {row}"
    assert row["used"] == row["live"] + row["cache"], f"a block was lost {where}"
    assert row["used_after_flush"] == row["live"], f"a block leaked on the device {where}"
    if row["cap"]:
        assert row["cache"] <= row["cap"], f"the cache passed its cap {where}"
    assert row["allocs"] == row["hits_plus_misses"], f"allocs != hits + misses {where}"


def test_an_oom_while_the_collector_runs_never_hangs(death):
    # Defect 1 (the reproducer, extra in 0..20): on the old code extra=2 and 3 hung.
    outcome = death.run(_gc_probes.oom_under_collection, list(range(21)), timeout=DEADLINE_S)
    rows = outcome.assert_clean().returned
    assert [row["extra"] for row in rows] == list(range(21))
    for row in rows:
        # the collection before the flush frees the cyclic buffer: the allocation fits
        assert row["outcome"] == "ok", row
        check_ledger(row)
        assert row["live"] == 0


def test_an_arena_exit_while_the_collector_runs_loses_no_block(death):
    # Defect 2: on the old code extra=7 lost the finalized 320-byte block (a device leak).
    outcome = death.run(_gc_probes.exit_under_collection, list(range(60)), timeout=DEADLINE_S)
    rows = outcome.assert_clean().returned
    assert len(rows) == 60
    for row in rows:
        check_ledger(row)
        assert row["allocs"] == 9


def test_stress_threads_cycles_cap_and_ooms(death, stress_scale):
    scale = min(stress_scale, 10)  # a collection every few allocations: 1.2 s per unit here
    outcome = death.run(_gc_probes.stress, scale, timeout=DEADLINE_S * scale)
    report = outcome.assert_clean().returned
    assert report["errors"] == []
    assert report["ooms"] > 0, "no allocation failed: the OOM path was not exercised"
    check_ledger(report)
    assert (report["live"], report["live_buffers"]) == (0, 0)
    assert report["frees"] == report["allocs"]


@pytest.mark.skipif(
    "MUTANT_UNDER_TEST" in os.environ,
    reason="under mutmut the mutant finalizer runs mutmut's trampolines inside the collector,"
    " which crashes CPython's contextvars; this probe checks the test, not the code under mutation",
)
@pytest.mark.parametrize(
    ("target", "args"),
    [
        (_gc_probes.exit_under_collection, (list(range(60)),)),
        (_gc_probes.stress, (1,)),
    ],
    ids=["exit-under-collection", "stress"],
)
def test_teeth_a_finalizer_that_frees_under_the_lock_is_caught(death, target, args):
    # The old finalizer (free at once, wherever the collector runs it) re-enters a layer whose
    # lock its own thread holds: the child deadlocks, and the deadline turns that into a failure.
    outcome = death.run(target, *args, "finalizer_frees_at_once", timeout=MUTANT_DEADLINE_S)
    assert outcome.kind == "timed_out", f"the mutant was not caught: {outcome.kind}"
    # the stacks dumped at the deadline show the finalizer blocked inside the allocator
    assert "in finalize" in outcome.stderr and "allocator/_cache.py" in outcome.stderr


# -- with the memory history recording (issue 11) ---------------------------------------------


def test_recording_history_under_the_collector_loses_nothing_and_adds_up(death):
    # The history's layers and lock under the same sweep: every ledger balances and every
    # trace adds up to the counters (a free recorded twice or never would not).
    outcome = death.run(
        _gc_probes.exit_under_collection, list(range(60)), None, True, timeout=DEADLINE_S
    )
    for row in outcome.assert_clean().returned:
        check_ledger(row)
        assert row["trace"] is None, row


def test_recording_history_with_threads_cycles_cap_and_ooms(death, stress_scale):
    outcome = death.run(
        _gc_probes.stress, stress_scale, None, True, timeout=DEADLINE_S * stress_scale
    )
    report = outcome.assert_clean().returned
    assert report["errors"] == [] and report["ooms"] > 0
    check_ledger(report)
    assert report["trace"] is None, report["trace"]


@pytest.mark.skipif(
    "MUTANT_UNDER_TEST" in os.environ,
    reason="under mutmut the mutant finalizer runs mutmut's trampolines inside the collector",
)
def test_teeth_a_finalizer_that_records_history_is_caught(death):
    # A finalizer that records its own free (a stack walk and the history's lock) instead of
    # only queueing the block re-enters the recorder under the collector: a deadlock.
    outcome = death.run(
        _gc_probes.exit_under_collection,
        list(range(60)),
        "finalizer_records_history",
        True,
        timeout=MUTANT_DEADLINE_S,
    )
    assert outcome.kind == "timed_out", f"the mutant was not caught: {outcome.kind}"
    assert "in finalize" in outcome.stderr and "allocator/_history.py" in outcome.stderr
