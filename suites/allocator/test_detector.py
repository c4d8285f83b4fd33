"""The use-after-free detector at the ops' choke point, in ``raise`` and off modes (DESIGN 2.6).

``abort`` mode kills the process, so it is tested in death-test children (test_detector_death).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from allocator import SizeMismatchError, UseAfterFreeError

ARENA = "use-after-arena-free: {op} {role} was reclaimed by arena_exit at depth 0"


def _reclaimed(alloc, *values):
    alloc.arena_enter()
    bufs = [alloc.full(16, v) for v in values]
    alloc.arena_exit()
    return bufs


@pytest.mark.parametrize(
    ("op", "call", "role"),
    [
        ("buffer_add", lambda a, f, x: a.add(f, x), "lhs"),
        ("buffer_add", lambda a, f, x: a.add(x, f), "rhs"),
        ("buffer_mul", lambda a, f, x: a.mul(f, x), "lhs"),
        ("buffer_mul", lambda a, f, x: a.mul(x, f), "rhs"),
        ("buffer_fma", lambda a, f, x: a.fma(f, x, x), "arg0"),
        ("buffer_fma", lambda a, f, x: a.fma(x, f, x), "arg1"),
        ("buffer_fma", lambda a, f, x: a.fma(x, x, f), "arg2"),
        ("buffer_sum", lambda a, f, x: a.sum(f), "arg"),
        ("buffer_copy", lambda a, f, x: a.copy(f), "arg"),
        ("buffer_read", lambda a, f, x: a.to_numpy(f), "arg"),
    ],
)
def test_raise_mode_names_the_op_and_role(alloc, op, call, role):
    live = alloc.full(16, 1.0)
    (freed,) = _reclaimed(alloc, 3.0)
    before = alloc.stats()
    with pytest.raises(UseAfterFreeError) as info:
        call(alloc, freed, live)
    assert str(info.value) == ARENA.format(op=op, role=role)
    after = alloc.stats()
    assert (after.alloc_count, after.live_bytes) == (before.alloc_count, before.live_bytes)


def test_the_first_freed_operand_is_reported(alloc):
    a, b = _reclaimed(alloc, 3.0, 5.0)
    message = re.escape(ARENA.format(op="buffer_add", role="lhs"))
    with pytest.raises(UseAfterFreeError, match=message):
        alloc.add(a, b)


def test_released_buffers_are_use_after_release(alloc):
    live = alloc.full(16, 1.0)
    a = alloc.full(16, 1.0)
    alloc.release(a)
    with pytest.raises(
        UseAfterFreeError, match=r"^use-after-release: buffer_mul rhs was released by release\(\)$"
    ):
        alloc.mul(live, a)
    b = alloc.full(16, 1.0)
    view = b.view(0, 16)
    b.storage.resize_(0, "zero3.release_param")
    with pytest.raises(
        UseAfterFreeError,
        match=r"^use-after-release: buffer_fma arg1 was released by zero3\.release_param$",
    ):
        alloc.fma(live, view, live)


def test_a_valid_promotion_passes_the_detector(alloc):
    alloc.arena_enter()
    keep = alloc.full(16, 2.0)
    alloc.full(16, 0.0)
    alloc.arena_exit([keep])
    assert alloc.sum(alloc.add(keep, keep)) == 64.0


@pytest.fixture
def off(make_alloc):
    return make_alloc(arena_debug="off")


def test_off_mode_reports_a_size_mismatch(off):
    live = off.full(16, 1.0)
    (freed,) = _reclaimed(off, 3.0)
    with pytest.raises(SizeMismatchError, match=r"^buffer_add: size mismatch \(16 vs 0\)$"):
        off.add(live, freed)
    with pytest.raises(SizeMismatchError, match=r"^buffer_add: size mismatch \(0 vs 16\)$"):
        off.add(freed, live)


def test_off_mode_lets_two_freed_operands_slip_through(off):
    a, b = _reclaimed(off, 3.0, 5.0)
    before = off.stats().alloc_count
    result = off.add(a, b)
    assert result.size == 0 and not result.freed
    assert off.fma(a, b, a).size == 0
    assert off.mul(a, b).size == 0
    assert off.copy(a).size == 0
    assert off.sum(a) == 0.0
    read = off.to_numpy(a)
    assert read.shape == (0,) and read.dtype == np.float32
    assert off.stats().alloc_count == before  # the slip allocates nothing
    assert off.add(result, result).size == 0


def test_type_errors_come_before_liveness(alloc):
    with pytest.raises(TypeError, match="buffer_sum: arg must be a Buffer, got list"):
        alloc.sum([1.0])
    with pytest.raises(TypeError, match="buffer_add: lhs must be a Buffer, got NoneType"):
        alloc.add(None, alloc.full(4, 1.0))
