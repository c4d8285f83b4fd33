"""Arenas: epochs, reclamation at exit, promotion of keep, and misuse (DESIGN 2.5)."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import pytest

import allocator
from allocator import ArenaError, EpochStats, UseAfterFreeError
from allocator._arena import SWEEP_MIN


def test_exit_frees_reachable_buffers(alloc):
    depth = alloc.arena_enter()
    a, b = alloc.full(16, 1.0), alloc.full(32, 2.0)
    assert depth == 0 and alloc.stats().arena_depth == 1
    stats = alloc.arena_exit()
    assert (a.size, b.size) == (0, 0)
    assert a.freed_reason == "reclaimed by arena_exit at depth 0"
    assert stats == EpochStats(
        depth=0,
        allocs=2,
        reclaimed_buffers=2,
        reclaimed_bytes=192,
        kept_buffers=0,
        kept_bytes=0,
        peak_bytes=192,
    )
    totals = alloc.stats()
    assert (totals.live_bytes, totals.arena_reclaimed_buffers, totals.arena_reclaimed_bytes) == (
        0,
        2,
        192,
    )
    assert totals.free_count == 2 and totals.arena_depth == 0


def test_a_buffer_finalized_mid_scope_is_skipped(alloc):
    alloc.arena_enter()
    a = alloc.full(16, 1.0)
    b = alloc.full(16, 1.0)
    del b
    gc.collect()
    assert alloc.stats().free_count == 1
    stats = alloc.arena_exit()
    assert stats.reclaimed_buffers == 1 and stats.allocs == 2
    assert alloc.stats().free_count == 2
    assert a.size == 0


def test_the_exit_walk_goes_past_entries_finalized_before_the_live_ones(alloc):
    alloc.arena_enter()
    alloc.full(16, 1.0)  # dropped at once: the registry's first entry is dead
    a, b = alloc.full(16, 1.0), alloc.full(32, 1.0)
    stats = alloc.arena_exit()
    assert (stats.reclaimed_buffers, stats.reclaimed_bytes) == (2, 192)
    assert (a.size, b.size, a.storage.epoch, b.storage.epoch) == (0, 0, None, None)


def test_a_buffer_released_mid_scope_is_skipped(alloc):
    alloc.arena_enter()
    a = alloc.full(16, 1.0)
    assert a.storage.epoch is not None
    alloc.release(a)
    assert a.storage.epoch is None  # untracked at once
    assert alloc.arena_exit().reclaimed_buffers == 0
    assert a.freed_reason == "released by release()"


def test_buffers_allocated_before_the_arena_are_untouched(alloc):
    outside = alloc.full(16, 1.0)
    alloc.arena_enter()
    alloc.arena_exit()
    assert outside.size == 16


def test_keep_promotes_to_the_parent_and_untracks_at_depth_zero(alloc):
    alloc.arena_enter()
    kept = alloc.full(16, 2.0)
    scratch = alloc.full(16, 0.0)
    stats = alloc.arena_exit(keep=[kept])
    assert (stats.reclaimed_buffers, stats.kept_buffers, stats.kept_bytes) == (1, 1, 64)
    assert scratch.size == 0 and kept.size == 16
    assert alloc.sum(alloc.add(kept, kept)) == 64.0
    # untracked now: a later arena does not reclaim it
    alloc.arena_enter()
    assert alloc.arena_exit().reclaimed_buffers == 0
    assert kept.size == 16


def test_promotion_through_two_nested_epochs(alloc):
    assert alloc.arena_enter() == 0
    outer_scratch = alloc.full(16, 0.0)
    assert alloc.arena_enter() == 1
    keeper = alloc.full(16, 2.0)
    inner_scratch = alloc.full(16, 0.0)
    inner = alloc.arena_exit(keep=[keeper.view(0, 4)])  # a view keeps its whole storage
    assert (inner.depth, inner.reclaimed_buffers, inner.kept_buffers) == (1, 1, 1)
    assert inner_scratch.freed_reason == "reclaimed by arena_exit at depth 1"
    assert keeper.size == 16 and outer_scratch.size == 16
    outer = alloc.arena_exit()
    assert (outer.depth, outer.reclaimed_buffers, outer.kept_buffers) == (0, 2, 0)
    assert keeper.freed_reason == "reclaimed by arena_exit at depth 0"
    assert outer_scratch.size == 0


def test_kept_at_both_levels_survives(alloc):
    alloc.arena_enter()
    alloc.arena_enter()
    keeper = alloc.full(16, 2.0)
    alloc.arena_exit(keep=[keeper])
    alloc.arena_exit(keep=[keeper])
    assert alloc.sum(keeper) == 32.0


def test_peak_folds_into_the_parent(alloc):
    alloc.arena_enter()
    alloc.full(16, 1.0)  # dropped at once: the outer epoch's own peak is 64 bytes
    kept_outer = alloc.full(64, 1.0)  # 256 bytes held across the child
    alloc.arena_enter()
    child = [alloc.full(256, 1.0) for _ in range(2)]  # 2 KiB
    inner = alloc.arena_exit(keep=child[:1])
    outer = alloc.arena_exit()
    assert inner.peak_bytes == 2048
    assert outer.peak_bytes == 256 + 2048  # what the outer held, plus the child's peak
    assert outer.reclaimed_bytes == 256 + 1024  # kept_outer and the promoted child buffer
    assert kept_outer.size == 0


def test_exit_without_enter_raises(alloc):
    message = r"^arena_exit\(\) called with no open arena; call arena_enter\(\) first$"
    with pytest.raises(ArenaError, match=message):
        alloc.arena_exit()
    alloc.arena_enter()
    alloc.arena_exit()
    with pytest.raises(ArenaError):
        alloc.arena_exit()


@pytest.mark.parametrize(
    ("make_keep", "error", "match"),
    [
        (
            lambda alloc, buf: buf,
            TypeError,
            r"^keep must be an iterable of Buffers, got a Buffer \(write keep=\[buf\]\)$",
        ),
        (lambda alloc, buf: 5, TypeError, r"keep must be an iterable of Buffers, got int"),
        (lambda alloc, buf: [buf, "x"], TypeError, r"keep\[1\] must be a Buffer, got str"),
    ],
)
def test_bad_keep_leaves_the_epoch_open_and_intact(alloc, make_keep, error, match):
    alloc.arena_enter()
    buf = alloc.full(16, 1.0)
    with pytest.raises(error, match=match):
        alloc.arena_exit(make_keep(alloc, buf))
    assert alloc.stats().arena_depth == 1 and buf.size == 16
    alloc.arena_exit([buf])
    assert buf.size == 16


def test_keep_holding_a_freed_buffer_is_refused(alloc):
    alloc.arena_enter()
    keep, gone = alloc.full(16, 1.0), alloc.full(16, 1.0)
    alloc.release(gone)
    with pytest.raises(
        ValueError, match=r"keep\[1\] cannot be kept: it was already released by release\(\)"
    ):
        alloc.arena_exit([keep, gone])
    assert keep.size == 16 and alloc.stats().arena_depth == 1
    alloc.arena_exit()


def test_keep_from_another_allocator_is_refused(alloc, make_alloc):
    other = make_alloc()
    foreign = other.full(4, 1.0)
    alloc.arena_enter()
    with pytest.raises(ValueError, match=r"keep\[0\] belongs to another allocator"):
        alloc.arena_exit([foreign])
    alloc.arena_exit()


def test_context_manager_keeps_what_it_is_told(alloc):
    with alloc.arena() as scope:
        assert scope.depth == 0
        a = alloc.full(16, 1.0)
        b = alloc.add(a, a)
        scope.keep(b)
    assert scope.depth is None
    assert scope.stats.reclaimed_buffers == 1 and scope.stats.kept_buffers == 1
    assert a.size == 0 and alloc.sum(b) == 32.0


def test_context_manager_exception_path_keeps_nothing_and_reraises(alloc):
    with pytest.raises(KeyError, match="boom"), alloc.arena() as scope:
        a = alloc.full(16, 1.0)
        scope.keep(a)
        raise KeyError("boom")
    assert a.size == 0
    assert scope.stats.reclaimed_buffers == 1 and scope.stats.kept_buffers == 0
    assert alloc.stats().arena_depth == 0


def test_context_manager_with_a_bad_keep_closes_the_epoch_and_reports(alloc):
    with pytest.raises(ValueError, match="cannot be kept"), alloc.arena() as scope:
        a = alloc.full(16, 1.0)
        scope.keep(a)
        alloc.release(a)
    assert alloc.stats().arena_depth == 0


def test_scopes_must_close_innermost_first(alloc):
    outer = alloc.arena()
    outer.__enter__()
    alloc.arena_enter()
    with pytest.raises(ArenaError, match="scope at depth 0 exited while the epoch at depth 1"):
        outer.__exit__(None, None, None)
    alloc.arena_exit()
    alloc.arena_exit()


def test_scope_misuse(alloc):
    scope = alloc.arena()
    with pytest.raises(ArenaError, match=r"^keep\(\) called on an arena scope that is not open$"):
        scope.keep(alloc.full(4, 1.0))
    with scope, pytest.raises(TypeError, match=r"buffers\[0\] must be a Buffer, got int"):
        scope.keep(3)
    with pytest.raises(ArenaError, match=r"^an arena scope can be entered only once$"), scope:
        pass


def test_run_in_arena_keeps_what_fn_returns(alloc):
    scratch = []

    def step(x, scale):
        y = alloc.mul(x, alloc.full(16, scale))
        scratch.append(alloc.full(16, 0.0))
        return {"y": y, "pair": (alloc.copy(y), 3)}

    x = alloc.full(16, 2.0)
    out = alloc.run_in_arena(step, x, scale=3.0)
    assert alloc.sum(out["y"]) == 96.0 and alloc.sum(out["pair"][0]) == 96.0
    assert scratch[0].size == 0 and x.size == 16


def test_run_in_arena_exception_path(alloc):
    held = []

    def step():
        held.append(alloc.full(16, 1.0))
        raise RuntimeError("step failed")

    with pytest.raises(RuntimeError, match="step failed"):
        alloc.run_in_arena(step)
    assert held[0].size == 0 and alloc.stats().arena_depth == 0


def test_depths_appear_in_detector_messages(alloc):
    alloc.arena_enter()
    alloc.arena_enter()
    inner = alloc.full(16, 1.0)
    alloc.arena_exit()
    outer_kept = alloc.full(16, 1.0)
    alloc.arena_exit()
    message = r"^use-after-arena-free: buffer_sum arg was reclaimed by arena_exit at depth 1$"
    with pytest.raises(UseAfterFreeError, match=message):
        alloc.sum(inner)
    with pytest.raises(UseAfterFreeError, match=r"at depth 0$"):
        alloc.sum(outer_kept)


def test_a_free_inside_the_child_is_charged_to_it_and_folds_into_the_parents_peak(alloc):
    # Issue 8, defect 3 (DESIGN 2.5's example): the outer epoch reported 2000, not 3000.
    alloc.arena_enter()
    outer_buffer = alloc.full(250, 1.0)  # 1000 B
    alloc.arena_enter()
    inner_buffer = alloc.full(500, 1.0)  # 2000 B, reclaimed by the inner exit
    alloc.release(outer_buffer)  # 3000 B were live just before
    inner = alloc.arena_exit()
    outer = alloc.arena_exit()
    assert (inner.peak_bytes, outer.peak_bytes) == (2000, 3000)
    assert inner_buffer.freed_reason == "reclaimed by arena_exit at depth 1"


def test_the_parent_keeps_counting_after_a_promotion(alloc):
    # A child's net bytes (here a kept buffer) fold into the parent's live bytes, which later
    # allocations of the parent start from.
    alloc.arena_enter()
    held = [alloc.full(25, 1.0)]  # 100 B in the outer epoch
    alloc.arena_enter()
    kept = alloc.full(50, 1.0)  # 200 B, kept by the inner exit
    alloc.arena_exit(keep=[kept])
    held.append(alloc.full(100, 1.0))  # 400 B more in the outer epoch: 700 live since it opened
    outer = alloc.arena_exit()
    assert outer.peak_bytes == 700
    assert (outer.reclaimed_buffers, outer.reclaimed_bytes) == (3, 700)


def test_sibling_epochs_fold_one_after_the_other(alloc):
    alloc.arena_enter()
    held = alloc.full(25, 1.0)  # 100 B
    alloc.arena_enter()
    first_scratch = alloc.full(125, 1.0)  # 500 B
    first = alloc.arena_exit()
    alloc.arena_enter()
    second_scratch = alloc.full(75, 1.0)  # 300 B
    second = alloc.arena_exit()
    assert first_scratch.size == second_scratch.size == 0
    outer = alloc.arena_exit()
    assert (first.peak_bytes, second.peak_bytes, outer.peak_bytes) == (500, 300, 600)
    assert held.size == 0


def test_an_epochs_allocations_add_up_across_reads_of_the_statistics(alloc):
    alloc.arena_enter()
    held = [alloc.full(4, 1.0) for _ in range(2)]
    assert alloc.stats().alloc_count == 2  # folds the statistics mid-epoch
    held += [alloc.full(4, 1.0) for _ in range(3)]
    assert alloc.arena_exit().allocs == 5


def test_two_keeps_in_one_exit_sum(alloc):
    alloc.arena_enter()
    alloc.arena_enter()
    a, b = alloc.full(16, 1.0), alloc.full(32, 1.0)
    scratch = alloc.full(8, 0.0)
    inner = alloc.arena_exit(keep=[a, b])
    assert scratch.size == 0
    assert (inner.kept_buffers, inner.kept_bytes, inner.reclaimed_bytes) == (2, 192, 32)
    outer = alloc.arena_exit()
    assert (outer.reclaimed_buffers, outer.reclaimed_bytes) == (2, 192)


def test_reclaimed_totals_add_up_over_two_exits(alloc):
    held = []
    for n in (16, 32):
        alloc.arena_enter()
        held += [alloc.full(n, 1.0), alloc.full(n, 2.0)]
        alloc.arena_exit()
    stats = alloc.stats()
    assert (stats.arena_reclaimed_buffers, stats.arena_reclaimed_bytes) == (4, 2 * 64 + 2 * 128)
    assert stats.free_count == 4


def held_blocks(stats) -> int:
    """Blocks the allocator holds on the device: obtained and not handed back."""
    return stats.device_mallocs - stats.device_frees


@pytest.mark.backends("sim", "cuda")
def test_an_exit_caches_or_frees_every_block_it_reclaims(make_alloc):
    # Every reclaimed block either goes to the reuse cache or back to the device: cached plus
    # freed bytes equal the reclaimed bytes, and after empty_cache the device is back to start.
    alloc = make_alloc(cache_cap_bytes=3 * 1024)
    start = alloc.stats()
    alloc.arena_enter()
    held = [alloc.full(256, 1.0) for _ in range(5)]  # 5 KiB
    exit_stats = alloc.arena_exit()
    after = alloc.stats()
    freed_bytes = (after.device_frees - start.device_frees) * 1024
    assert after.cache_bytes + freed_bytes == exit_stats.reclaimed_bytes == 5 * 1024
    assert (after.cache_bytes, after.cap_evictions) == (3 * 1024, 2)
    # the blocks this allocator holds on the device (not device_free_bytes: cudaMemGetInfo is
    # device-wide, and other processes, xdist workers, move it meanwhile)
    assert held_blocks(after) == held_blocks(start) + 3
    alloc.empty_cache()
    assert held_blocks(alloc.stats()) == held_blocks(start)
    assert all(buf.size == 0 for buf in held)


def test_a_scope_whose_keep_went_bad_does_not_close_an_inner_epoch(alloc):
    # The exit with an empty keep after a bad one still checks that its own epoch is the
    # innermost: an inner epoch left open is an error, not something to close quietly.
    message = "scope at depth 0 exited while the epoch at depth 1"
    with pytest.raises(ArenaError, match=message), alloc.arena() as scope:
        a = alloc.full(16, 1.0)
        scope.keep(a)
        alloc.release(a)  # the keep is now bad
        alloc.arena_enter()  # and an inner epoch is still open
    assert alloc.stats().arena_depth == 2
    alloc.arena_exit()
    alloc.arena_exit()


def test_dead_registry_entries_do_not_accumulate(alloc):
    # Issue 8, defect 4: 100,000 short-lived temporaries in one arena kept 100,001 registry
    # entries for 1 live buffer (here 20,000 keep 20,001 on the old code). Entries of finalized
    # storages are pruned once the registry has doubled, so it holds at most 2 x live + SWEEP_MIN.
    alloc.arena_enter()
    kept = alloc.full(4, 1.0)
    for _ in range(20_000):
        alloc.empty(4)  # dropped at once: finalized
    epoch = alloc._arenas._epochs[-1]
    assert len(epoch.tracked) <= 2 + SWEEP_MIN
    assert alloc.arena_exit().reclaimed_buffers == 1
    assert kept.size == 0


def test_an_arenas_memory_does_not_grow_with_its_temporaries(alloc):
    # The same, seen from outside: the memory the allocator's code holds does not grow with the
    # temporaries' count (on the old code it grew by about 88 bytes per temporary).
    alloc.arena_enter()
    kept = alloc.full(4, 1.0)
    for _ in range(1000):
        alloc.empty(4)
    mine = [tracemalloc.Filter(True, str(Path(allocator.__file__).parent / "*"))]
    tracemalloc.start()
    try:
        alloc.stats()  # folds the statistics' log (at most FOLD_EVERY entries) before each look
        before = tracemalloc.take_snapshot().filter_traces(mine)
        for _ in range(5000):
            alloc.empty(4)
        alloc.stats()
        after = tracemalloc.take_snapshot().filter_traces(mine)
    finally:
        tracemalloc.stop()
    alloc.arena_exit()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert grown < 64 * 1024, f"the arena's memory grew by {grown} bytes over 5,000 temporaries"
    assert kept.size == 0
