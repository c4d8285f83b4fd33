"""Buffers, storages, views and ops on every backend, bad inputs included (DESIGN 2.3)."""

from __future__ import annotations

import gc
import re

import numpy as np
import pytest

from allocator import FREE_KINDS, Buffer, FreeCause, SizeMismatchError, UseAfterFreeError
from allocator._arena import ArenaRegistry
from allocator._buffer import MAX_ELEMENTS, element_count


def test_full_zeros_empty_and_readback(alloc):
    a = alloc.full(8, 2.5)
    assert isinstance(a, Buffer)
    assert (a.size, a.nbytes, a.offset) == (8, 32, 0)
    np.testing.assert_array_equal(alloc.to_numpy(a), np.full(8, 2.5, np.float32))
    np.testing.assert_array_equal(alloc.to_numpy(alloc.zeros(3)), np.zeros(3, np.float32))
    assert alloc.empty(5).size == 5
    assert alloc.to_numpy(a).dtype == np.float32


def test_ops_compute_elementwise(alloc):
    x = np.arange(1, 9, dtype=np.float32)
    a, b, c = alloc.from_numpy(x), alloc.full(8, 2.0), alloc.full(8, -1.0)
    np.testing.assert_array_equal(alloc.to_numpy(alloc.add(a, b)), x + 2)
    np.testing.assert_array_equal(alloc.to_numpy(alloc.mul(a, b)), x * 2)
    np.testing.assert_array_equal(alloc.to_numpy(alloc.fma(a, b, c)), x * 2 - 1)
    copied = alloc.copy(a)
    assert copied.storage is not a.storage
    np.testing.assert_array_equal(alloc.to_numpy(copied), x)
    assert alloc.sum(a) == 36.0


def test_sum_accumulates_in_float64(alloc):
    assert alloc.sum(alloc.full(1 << 20, 0.1)) == pytest.approx((1 << 20) * 0.1, rel=1e-6)


def test_from_numpy_copies(alloc):
    host = np.ones(4, np.float32)
    buf = alloc.from_numpy(host)
    host[:] = 7
    np.testing.assert_array_equal(alloc.to_numpy(buf), np.ones(4, np.float32))


def test_views_share_the_storage(alloc):
    base = alloc.from_numpy(np.arange(10, dtype=np.float32))
    view = base.view(2, 5)
    inner = view.view(1, 3)
    assert view.storage is base.storage is inner.storage
    assert (view.offset, view.size, inner.offset, inner.size) == (2, 5, 3, 3)
    np.testing.assert_array_equal(alloc.to_numpy(inner), np.array([3, 4, 5], np.float32))
    np.testing.assert_array_equal(alloc.to_numpy(alloc.add(view, view)), 2 * np.arange(2, 7))
    assert alloc.stats().live_buffers == 1  # the add's result is already finalized
    del base, view
    gc.collect()
    assert alloc.stats().live_buffers == 1  # the inner view alone keeps the storage alive
    assert alloc.sum(inner) == 12.0


@pytest.mark.parametrize(
    ("offset", "n", "error", "match"),
    [
        (-1, 2, ValueError, "offset must be >= 0"),
        (0, 0, ValueError, "n must be >= 1"),
        (3, 2, ValueError, "ends at 5, past the buffer's 4 elements"),
        (1.0, 2, TypeError, "offset must be an integer"),
        (0, "2", TypeError, "n must be an integer"),
    ],
)
def test_bad_views(alloc, offset, n, error, match):
    with pytest.raises(error, match=match):
        alloc.full(4, 1.0).view(offset, n)


def test_view_of_a_freed_buffer_is_refused(alloc):
    buf = alloc.full(4, 1.0)
    alloc.release(buf)
    with pytest.raises(ValueError, match=r"cannot view a freed buffer \(it was released by"):
        buf.view(0, 1)


@pytest.mark.parametrize(
    ("n", "error", "match"),
    [
        (-1, ValueError, "n must be >= 1, got -1"),
        (0, ValueError, "n must be >= 1, got 0"),
        (3.0, TypeError, "n must be an integer element count, got float 3.0"),
        (True, TypeError, "n must be an integer element count, got bool True"),
        ("8", TypeError, "n must be an integer element count, got str '8'"),
        (None, TypeError, "n must be an integer element count, got NoneType"),
        (2**62, ValueError, "more than a device can address"),
    ],
)
def test_bad_sizes(alloc, n, error, match):
    before = alloc.stats()
    for make in (alloc.empty, alloc.zeros, lambda n: alloc.full(n, 1.0)):
        with pytest.raises(error, match=match):
            make(n)
    after = alloc.stats()
    assert (after.alloc_count, after.live_bytes) == (before.alloc_count, before.live_bytes)


def test_numpy_integer_sizes_are_accepted(alloc):
    assert alloc.full(np.int64(3), 1.0).size == 3


@pytest.mark.parametrize("value", ["1.0", None, 1 + 2j, [1.0]])
def test_full_rejects_a_non_real_value(alloc, value):
    message = f"^value must be a real number, got {type(value).__name__} {re.escape(repr(value))}$"
    with pytest.raises(TypeError, match=message):
        alloc.full(4, value)
    assert alloc.stats().alloc_count == 0


@pytest.mark.parametrize(
    ("array", "error", "match"),
    [
        (np.ones(4, np.float64), TypeError, "a must have dtype float32, got float64"),
        (np.ones(4, np.int32), TypeError, "a must have dtype float32, got int32"),
        (np.ones((2, 3), np.float32), ValueError, r"a must be 1-D, got shape \(2, 3\)"),
        (
            np.ones(0, np.float32),
            ValueError,
            "^a must hold at least one element, got an empty array$",
        ),
        ([1.0, 2.0], TypeError, "a must be a numpy.ndarray, got list"),
    ],
)
def test_from_numpy_bad_arrays(alloc, array, error, match):
    with pytest.raises(error, match=match):
        alloc.from_numpy(array)
    assert alloc.stats().alloc_count == 0


def test_non_contiguous_arrays_are_copied(alloc):
    host = np.arange(10, dtype=np.float32)[::2]
    np.testing.assert_array_equal(alloc.to_numpy(alloc.from_numpy(host)), host)


def test_release_frees_now_and_once(alloc):
    a = alloc.full(16, 1.0)
    view = a.view(4, 4)
    live = alloc.stats().live_bytes
    assert alloc.release(a) == 1
    assert alloc.release(a) == 0
    assert alloc.release(view) == 0
    assert (a.size, view.size, a.nbytes) == (0, 0, 0)
    assert a.freed and view.freed_reason == "released by release()"
    stats = alloc.stats()
    assert stats.live_bytes == live - 64 and stats.free_count == 1


def test_resize_zero_frees_with_views_alive(alloc):
    a = alloc.full(16, 1.0)
    view = a.view(0, 8)
    assert a.storage.resize_(0, "zero3.release_param") == 1
    assert a.storage.resize_(0, "again") == 0
    assert view.size == 0
    assert view.freed_reason == "released by zero3.release_param"
    assert alloc.stats().live_buffers == 0


@pytest.mark.parametrize(
    ("size", "reason", "error", "match"),
    [
        (8, "x", ValueError, "resize_ supports only size 0"),
        (False, "x", ValueError, "resize_ supports only size 0"),
        (0.0, "x", TypeError, r"^size must be the integer 0, got float 0\.0$"),  # issue 8
        ("0", "x", TypeError, r"^size must be the integer 0, got str '0'$"),
        (None, "x", TypeError, r"^size must be the integer 0, got NoneType None$"),
        (0, "", ValueError, "^reason must say who frees the block, got an empty string$"),
        (0, None, TypeError, "^reason must be a str, got NoneType$"),
        (0, 5, TypeError, "^reason must be a str, got int$"),
    ],
)
def test_bad_resize(alloc, size, reason, error, match):
    a = alloc.full(4, 1.0)
    with pytest.raises(error, match=match):
        a.storage.resize_(size, reason)
    assert a.size == 4


def test_finalization_frees_when_the_last_view_dies(alloc):
    a = alloc.full(16, 1.0)
    view = a.view(0, 4)
    del a
    gc.collect()
    assert alloc.stats().live_buffers == 1
    del view
    stats = alloc.stats()
    assert (stats.live_buffers, stats.live_bytes, stats.free_count) == (0, 0, 1)


def test_release_of_a_non_buffer_or_foreign_buffer(alloc, make_alloc):
    with pytest.raises(TypeError, match="buf must be a Buffer, got ndarray"):
        alloc.release(np.ones(4, np.float32))
    other = make_alloc()
    foreign = other.full(4, 1.0)
    with pytest.raises(ValueError, match=r"^buf belongs to another allocator$"):
        alloc.release(foreign)
    with pytest.raises(ValueError, match="buffer_add: rhs belongs to another allocator"):
        alloc.add(alloc.full(4, 1.0), foreign)
    mine = alloc.full(4, 1.0)
    for args, message in [
        ((1.0, mine, mine), "^buffer_fma: arg0 must be a Buffer, got float$"),
        ((mine, "x", mine), "^buffer_fma: arg1 must be a Buffer, got str$"),
        ((mine, mine, 1.0), "^buffer_fma: arg2 must be a Buffer, got float$"),
    ]:
        with pytest.raises(TypeError, match=message):
            alloc.fma(*args)
    for args, role in [((foreign, mine, mine), "arg0"), ((mine, foreign, mine), "arg1")]:
        with pytest.raises(ValueError, match=f"^buffer_fma: {role} belongs to another allocator$"):
            alloc.fma(*args)


def test_a_buffer_subclass_is_a_buffer(alloc):
    class Tagged(Buffer):
        __slots__ = ()

    a = alloc.full(4, 2.0)
    tagged = Tagged(a.storage, 0, 4)
    assert alloc.sum(alloc.add(tagged, tagged)) == 16.0


def test_size_mismatch_names_the_op_and_sizes(alloc):
    with pytest.raises(SizeMismatchError, match=r"^buffer_mul: size mismatch \(4 vs 5\)$"):
        alloc.mul(alloc.full(4, 1.0), alloc.full(5, 1.0))
    with pytest.raises(SizeMismatchError, match=r"^buffer_fma: size mismatch \(4 vs 4 vs 3\)$"):
        alloc.fma(alloc.full(4, 1.0), alloc.full(4, 1.0), alloc.full(3, 1.0))
    assert alloc.stats().live_buffers == 0


def test_repr_says_what_a_buffer_is(alloc):
    a = alloc.full(16, 1.0)
    assert repr(a) == f"<Buffer 16 x float32 on {alloc.backend}>"
    assert repr(a.view(4, 8)) == f"<Buffer 8 x float32 view [4:12] of 16 on {alloc.backend}>"
    assert repr(a.view(0, 8)) == f"<Buffer 8 x float32 view [0:8] of 16 on {alloc.backend}>"
    assert repr(a.storage) == f"<Storage 64 bytes on {alloc.backend}, live>"
    alloc.release(a)
    assert repr(a) == "<Buffer freed (released by release())>"
    assert repr(a.storage) == f"<Storage 64 bytes on {alloc.backend}, released by release()>"
    assert repr(alloc).startswith(f"<Allocator backend={alloc.backend} live=0.00MiB")


def test_resize_with_any_reason_is_a_release(alloc):
    # Issue 8, defect 6: a reason that reads "arena_exit" made the buffer report "reclaimed by
    # arena_exit at depth None". Why a block was freed is a kind plus a reason.
    a = alloc.full(16, 1.0)
    assert a.storage.resize_(np.int64(0), "arena_exit") == 1
    assert a.storage.cause == FreeCause("release", "arena_exit")
    assert a.freed_reason == "released by arena_exit"
    with pytest.raises(UseAfterFreeError, match=r"^use-after-release: buffer_sum arg was released"):
        alloc.sum(a)


def test_every_free_records_its_cause(alloc):
    released, resized, finalized_view = alloc.full(4, 1.0), alloc.full(4, 1.0), alloc.full(4, 1.0)
    alloc.release(released)
    resized.storage.resize_(0, "zero3.release_param")
    alloc.arena_enter()
    alloc.arena_enter()
    reclaimed = alloc.full(4, 1.0)
    alloc.arena_exit()
    alloc.arena_exit()
    assert released.storage.cause == FreeCause("release", "release()")
    assert resized.storage.cause == FreeCause("release", "zero3.release_param")
    assert reclaimed.storage.cause == FreeCause("arena_exit", "arena_exit", depth=1)
    assert finalized_view.storage.cause is None  # live


@pytest.mark.parametrize(
    ("kind", "reason", "depth", "message"),
    [
        (
            "free",
            "x",
            None,
            "kind='free': expected one of release, arena_exit, finalize, cap_evict, empty_cache,"
            " oom_flush, teardown, stream_dropped",
        ),
        ("release", "", None, "reason must say who frees the block, got an empty string"),
        (
            "arena_exit",
            "arena_exit",
            None,
            "depth=None: an arena_exit cause needs the epoch's depth, and no other kind has one",
        ),
        (
            "release",
            "x",
            0,
            "depth=0: an arena_exit cause needs the epoch's depth, and no other kind has one",
        ),
    ],
)
def test_bad_free_causes(kind, reason, depth, message):
    with pytest.raises(ValueError) as info:
        FreeCause(kind, reason, depth)
    assert str(info.value) == message


def test_free_kinds():
    # storage-level kinds first, then the reuse cache's (test_bad_free_causes pins the list)
    assert FREE_KINDS[:3] == ("release", "arena_exit", "finalize")
    assert FreeCause("arena_exit", "arena_exit", 2).describe() == (
        "reclaimed by arena_exit at depth 2"
    )
    assert FreeCause("finalize", "finalize").describe() == "released by finalize"


def test_an_op_on_freed_operands_with_the_detector_off_gives_an_empty_buffer(make_alloc):
    off = make_alloc(arena_debug="off")
    a = off.full(4, 1.0)
    off.release(a)
    for result in (off.add(a, a), off.mul(a, a), off.fma(a, a, a), off.copy(a)):
        assert (result.size, result.offset, result.nbytes, result.freed) == (0, 0, 0, False)
        assert (result.storage.nbytes, result.storage.block) == (0, None)
        assert repr(result) == "<Buffer empty>"


def test_a_kernel_that_fails_frees_its_output_as_a_release(alloc, monkeypatch):
    freed = []
    free = ArenaRegistry.free

    def spy(registry, st, cause):
        freed.append((st, cause))
        return free(registry, st, cause)

    def boom(stream, out, value):
        raise RuntimeError("kernel failed")

    monkeypatch.setattr(ArenaRegistry, "free", spy)
    monkeypatch.setattr(alloc.device, "fill", boom)
    with pytest.raises(RuntimeError, match=r"^kernel failed$"):
        alloc.full(4, 1.0)
    ((storage, cause),) = freed
    assert cause == storage.cause == FreeCause("release", "release()")
    stats = alloc.stats()
    assert (stats.live_bytes, stats.alloc_count, stats.free_count) == (0, 1, 1)


def test_element_counts_up_to_what_a_device_can_address():
    assert element_count(MAX_ELEMENTS, "n") == MAX_ELEMENTS
    assert element_count(np.int32(0), "offset", minimum=0) == 0
    with pytest.raises(ValueError) as info:
        element_count(MAX_ELEMENTS + 1, "n")
    assert str(info.value) == (
        f"n={MAX_ELEMENTS + 1} elements is {4 * (MAX_ELEMENTS + 1)} bytes, more than a device"
        f" can address (at most {MAX_ELEMENTS} float32 elements)"
    )
