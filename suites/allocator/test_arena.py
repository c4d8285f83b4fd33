"""Arenas: epochs, reclamation at exit, promotion of keep, and misuse (DESIGN 2.5)."""

from __future__ import annotations

import gc

import pytest

from allocator import ArenaError, EpochStats, UseAfterFreeError


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


def test_a_buffer_released_mid_scope_is_skipped(alloc):
    alloc.arena_enter()
    a = alloc.full(16, 1.0)
    alloc.release(a)
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
    with pytest.raises(ArenaError, match=r"arena_exit\(\) called with no open arena"):
        alloc.arena_exit()
    alloc.arena_enter()
    alloc.arena_exit()
    with pytest.raises(ArenaError):
        alloc.arena_exit()


@pytest.mark.parametrize(
    ("make_keep", "error", "match"),
    [
        (lambda alloc, buf: buf, TypeError, r"keep must be an iterable of Buffers, got a Buffer"),
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
    with pytest.raises(ArenaError, match="not open"):
        scope.keep(alloc.full(4, 1.0))
    with scope, pytest.raises(TypeError, match=r"buffers\[0\] must be a Buffer, got int"):
        scope.keep(3)
    with pytest.raises(ArenaError, match="entered only once"), scope:
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
