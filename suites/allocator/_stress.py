"""The stress and leak checks, shared by the in-process suites and their mutant probes.

Each function drives an :class:`~allocator.Allocator` and raises ``AssertionError`` with a
message saying which bound broke. No pytest import: death-test children run these too.
Source: TorchLean's ``runArenaStress`` (``../shared/seeds/torchlean-cuda-arena-and-cache-cap.txt``).
"""

from __future__ import annotations

from allocator import Allocator, Buffer


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)


def arena_round(alloc: Allocator, n: int, k: int) -> None:
    """One arena over ``k`` buffers of ``n`` floats, held by the caller across the exit.

    Inside the scope allocations go up by exactly k and frees do not move; after the exit (with
    nothing kept, every buffer still referenced) frees went up by exactly k and ``live_bytes``
    is back to its value before the scope.
    """
    before = alloc.stats()
    alloc.arena_enter()
    held = [alloc.full(n, float(i)) for i in range(k)]
    inside = alloc.stats()
    _check(
        inside.alloc_count - before.alloc_count == k,
        f"allocations inside the scope went up by {inside.alloc_count - before.alloc_count},"
        f" expected exactly {k}",
    )
    _check(
        inside.free_count == before.free_count,
        f"frees moved inside the scope: {before.free_count} -> {inside.free_count}",
    )
    alloc.arena_exit()
    after = alloc.stats()
    _check(
        after.free_count - before.free_count == k,
        f"arena_exit freed {after.free_count - before.free_count} buffers, expected exactly {k}"
        " (the test still holds every one: only the arena can free them)",
    )
    _check(
        after.live_bytes == before.live_bytes,
        f"live_bytes after the exit is {after.live_bytes}, expected {before.live_bytes}",
    )
    _check(all(buf.size == 0 for buf in held), "a reclaimed buffer still reports its size")


def _promote(alloc: Allocator, n: int, k: int) -> Buffer:
    """In a new arena: a keeper of ``n`` twos plus ``k`` scratch buffers; the exit keeps the
    keeper. Checks exactly k frees, the scratch reclaimed, and the keeper usable through an op
    (the detector's choke point) with ``sum == 2 n`` (within 0.1). Returns the keeper."""
    before = alloc.stats()
    depth = alloc.arena_enter()
    keeper = alloc.full(n, 2.0)
    scratch = [alloc.full(n, 1.0) for _ in range(k)]
    alloc.arena_exit(keep=[keeper])
    after = alloc.stats()
    _check(
        after.free_count - before.free_count == k,
        f"the exit at depth {depth} freed {after.free_count - before.free_count} buffers,"
        f" expected exactly {k} (the keeper is kept)",
    )
    _check(keeper.size == n, f"the keeper was freed: size {keeper.size}")
    _check(all(buf.size == 0 for buf in scratch), "a scratch buffer survived the exit")
    total = alloc.sum(alloc.add(keeper, alloc.zeros(n)))
    _check(abs(total - 2.0 * n) <= 0.1, f"sum(keeper) is {total}, expected {2.0 * n}")
    return keeper


def promotion_round(alloc: Allocator, n: int, k: int) -> None:
    """A keeper promoted out of the outermost arena (then untracked) stays usable."""
    alloc.release(_promote(alloc, n, k))


def nested_round(alloc: Allocator, n: int, k: int) -> None:
    """The promotion through two nested arenas: kept at the inner level, reclaimed at the
    outer one, which frees exactly that one buffer and restores ``live_bytes``."""
    before = alloc.stats()
    alloc.arena_enter()
    keeper = _promote(alloc, n, k)
    inner = alloc.stats()
    alloc.arena_exit()
    outer = alloc.stats()
    _check(
        outer.free_count - inner.free_count == 1,
        f"the outer exit freed {outer.free_count - inner.free_count}, expected exactly 1 (the"
        " keeper promoted into it)",
    )
    _check(keeper.size == 0, "the keeper survived the outer exit")
    _check(outer.live_bytes == before.live_bytes, "live_bytes not restored after nested exits")


def arena_stress(alloc: Allocator, n: int = 4096, k: int = 64, arenas: int = 4) -> None:
    """The whole arena stress: ``arenas`` plain rounds, then the promotion and nested rounds."""
    for _ in range(arenas):
        arena_round(alloc, n, k)
    promotion_round(alloc, n, k)
    nested_round(alloc, n, k)


def leak_step(alloc: Allocator, n: int = 4096) -> float:
    """``full(n, 1.5)``, ``full(n, -0.5)``, their add and mul, a sum, and four releases."""
    a = alloc.full(n, 1.5)
    b = alloc.full(n, -0.5)
    c = alloc.add(a, b)
    d = alloc.mul(a, b)
    total = alloc.sum(c) + alloc.sum(d)
    for buf in (a, b, c, d):
        alloc.release(buf)
    return total


def leak_bound(alloc: Allocator, steps: int = 128, n: int = 4096) -> None:
    """Two blocks of ``steps`` leak steps: each block frees exactly ``4 * steps``, and
    ``live_bytes`` and ``alloc_count - free_count`` after two blocks equal those after one,
    equal to the baseline."""
    baseline = alloc.stats()
    after = []
    for block in range(2):
        start = alloc.stats()
        for _ in range(steps):
            total = leak_step(alloc, n)
            _check(abs(total - (n * 1.0 - n * 0.75)) <= 1e-3 * n, f"a step computed {total}")
        end = alloc.stats()
        _check(
            end.free_count - start.free_count == 4 * steps,
            f"block {block} freed {end.free_count - start.free_count}, expected {4 * steps}",
        )
        after.append((end.live_bytes, end.alloc_count - end.free_count))
    expected = (baseline.live_bytes, baseline.alloc_count - baseline.free_count)
    _check(
        after[0] == after[1] == expected,
        f"(live_bytes, allocs - frees) after one block {after[0]}, after two {after[1]},"
        f" baseline {expected}: the steps leak",
    )
