"""Death-test targets that make the cyclic garbage collector run at chosen points.

The collector can run at any allocation of a container object, also inside the allocator's own
critical sections, and run a ``Storage.__del__`` there. Each target puts a buffer into cyclic
garbage, then sets the collector's threshold so that a collection starts after ``extra`` more
allocations, for a sweep of ``extra``: some of those points fall inside the allocator. A target
that hangs is killed by the parent's deadline (a failure, not a stuck suite); one that returns
reports what the allocator's counters say, for the parent to check. Source: issue 8's defects
1 and 2, each found by exactly such a sweep on the code before it.
"""

from __future__ import annotations

import gc
import itertools
import random
import threading

from allocator import Allocator, AllocatorConfig

from . import _mutants, _snapshot_checks

N = 16  # elements: 64-byte blocks


def _into_cyclic_garbage(buf) -> None:
    """Leave ``buf`` reachable only from a reference cycle (freed only by the collector)."""
    cycle = [buf]
    cycle.append(cycle)


def _collect_after(extra: int) -> None:
    """Start a collection after ``extra`` more container allocations (generation 0)."""
    gc.set_threshold(gc.get_count()[0] + extra)


def _ledger(alloc: Allocator) -> dict:
    """The counters, and whether every block is accounted for: the device's used bytes equal
    the live bytes plus the cached bytes, and once the cache is flushed, the live bytes. With
    the memory history on, ``trace`` says whether its trace and segments add up to the
    counters (``None``: they do; else the first check's message)."""
    stats = alloc.stats()
    used = alloc.device.used_bytes
    trace = None
    if alloc._history.recording:
        snapshot = alloc.snapshot()
        try:
            _snapshot_checks.check_accounts(snapshot)
            _snapshot_checks.check_segments(snapshot)
        except AssertionError as exc:
            trace = str(exc)
    alloc.empty_cache()
    return {
        "trace": trace,
        "live": stats.live_bytes,
        "cache": stats.cache_bytes,
        "cap": stats.cache_cap_bytes,
        "allocs": stats.alloc_count,
        "hits_plus_misses": stats.cache_hits + stats.cache_misses,
        "used": used,
        "used_after_flush": alloc.device.used_bytes,
    }


def oom_under_collection(extras: list[int], mutant: str | None = None) -> list[dict]:
    """Defect 1, the issue's reproducer: a full 64-byte device, its one buffer reachable only
    from cyclic garbage, a cap of 1 byte, and an allocation that fails in the device while the
    collector runs somewhere along the way (on the old code: inside ``SimDevice.malloc``'s lock,
    where the finalizer's eviction waited on that same lock: a hang). For each ``extra``: what
    the allocation did (``ok`` or ``MemoryError``) and the ledger."""
    _mutants.apply(mutant)
    results = []
    threshold = gc.get_threshold()
    try:
        for extra in extras:
            alloc = Allocator(
                AllocatorConfig(backend="sim", cache_cap_bytes=1, sim_capacity_bytes=4 * N)
            )
            gc.collect()
            buf = alloc.full(N, 2.0)  # fills the device
            gc.set_threshold(100000)
            gc.collect(0)
            _into_cyclic_garbage(buf)
            del buf
            _collect_after(extra)
            try:
                alloc.empty(N)  # the device is full: it fails in malloc first
                outcome = "ok"
            except MemoryError:
                outcome = "MemoryError"
            gc.set_threshold(*threshold)
            results.append({"extra": extra, "outcome": outcome, **_ledger(alloc)})
    finally:
        gc.set_threshold(*threshold)
    return results


def exit_under_collection(
    extras: list[int], mutant: str | None = None, history: bool = False
) -> list[dict]:
    """Defect 2: an untracked 320-byte buffer reachable only from cyclic garbage while an arena
    exit reclaims eight buffers of eight sizes, each making a new free list in the reuse cache
    (on the old code the collector ran at one of those list allocations, inside the cache; the
    finalizer re-entered it through the re-entrant lock and stored its 320-byte block in a list
    that the exit then overwrote: the block was lost, a device leak). For each ``extra``: the
    ledger. ``history``: the allocator records its memory history, with stacks."""
    _mutants.apply(mutant)
    results = []
    threshold = gc.get_threshold()
    try:
        for extra in extras:
            alloc = Allocator(AllocatorConfig(backend="sim", arena_debug="raise"))
            alloc.record_history(history)
            gc.collect()
            gc.set_threshold(100000)
            _into_cyclic_garbage(alloc.full(5 * N, 3.0))
            alloc.arena_enter()
            held = [alloc.full(k * N, 1.0) for k in range(1, 9)]
            _collect_after(extra)
            alloc.arena_exit()
            gc.set_threshold(*threshold)
            del held
            results.append({"extra": extra, **_ledger(alloc)})
    finally:
        gc.set_threshold(*threshold)
    return results


def stress(scale: int = 1, mutant: str | None = None, history: bool = False) -> dict:
    """Threads x streams x finalizers from reference cycles x a cap x injected OOMs, on ``sim``
    with a kernel latency, with the collector running every few allocations. Four threads, each
    on a stream of its own, each do ``400 * scale`` random steps: allocate and fill
    (sizes 16 to 2048 bytes), release, record another thread's stream on a buffer, drop into a
    reference cycle, drop plainly, wait for its stream, inject a device failure, or use a stream
    of its own once and drop it into a reference cycle (its cached block goes back to the device
    once the collector finds the stream, whose weak reference's callback may run inside any
    critical section); then
    everything is dropped and collected. Blocks recorded on other streams wait for their events
    in the cache, so the cache's event processing runs under its lock too. Besides the
    collections the threshold starts, every third event recording (the simulator's ``record``,
    which builds dicts under the reuse cache's lock, so a collection may start there) runs one:
    a point inside the allocator's critical sections that every run reaches. Returns the ledger
    and the errors the threads raised (only ``MemoryError`` is expected). ``history``: the
    allocator records its memory history, with stacks."""
    _mutants.apply(mutant)
    alloc = Allocator(
        AllocatorConfig(
            backend="sim", cache_cap_bytes=4096, sim_capacity_bytes=8192, sim_latency_us=5
        )
    )
    record, records = alloc.device.record, itertools.count()

    def record_and_collect(block) -> None:
        record(block)
        if next(records) % 3 == 0:
            gc.collect(0)

    alloc.device.record = record_and_collect
    alloc.record_history(history)
    streams = [alloc.new_stream(f"worker{seed}") for seed in range(4)]
    errors: list[str] = []
    ooms = [0]

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        held = []
        try:
            with alloc.use_stream(streams[seed]):
                for _ in range(400 * scale):
                    step = rng.random()
                    if step < 0.4:
                        try:
                            held.append(alloc.full(rng.choice((4, 16, 64, 256, 512)), 1.0))
                        except MemoryError:
                            ooms[0] += 1
                    elif step < 0.5 and held:
                        alloc.release(held.pop(rng.randrange(len(held))))
                    elif step < 0.6 and held:
                        rng.choice(held).record_stream(rng.choice(streams))
                    elif step < 0.75 and held:
                        _into_cyclic_garbage(held.pop(rng.randrange(len(held))))
                    elif step < 0.92 and held:
                        held.pop(rng.randrange(len(held)))
                    elif step < 0.97:
                        streams[seed].synchronize()
                    elif step < 0.985:
                        alloc.device.fail_next_mallocs(rng.choice((1, 2)))
                    else:  # a short-lived stream, dropped into a reference cycle
                        brief = alloc.new_stream()
                        try:
                            with alloc.use_stream(brief):
                                alloc.release(alloc.full(4, 1.0))
                        except MemoryError:
                            ooms[0] += 1
                        _into_cyclic_garbage(brief)
                        del brief
        except BaseException as exc:  # reported to the parent
            errors.append(f"{type(exc).__name__}: {exc}")
        held.clear()

    threshold = gc.get_threshold()
    gc.set_threshold(7, 3, 3)
    try:
        threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        gc.set_threshold(*threshold)
    gc.collect()
    stats = alloc.stats()
    return {
        "errors": errors,
        "ooms": ooms[0],
        "frees": stats.free_count,
        "live_buffers": stats.live_buffers,
        **_ledger(alloc),
    }
