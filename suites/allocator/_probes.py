"""Targets for death-test children: each runs one scenario on the default allocator.

The parent pins every ``DEVMEM_*`` knob in the child's environment, so each child builds its
default allocator from exactly the configuration under test. Targets return plain data (JSON)
for the parent to check; a ``mutant`` argument patches a known bug back in first (see
:mod:`suites.allocator._mutants`). No pytest import: children start fast.
"""

from __future__ import annotations

import dataclasses

import allocator as dm
from allocator import Allocator, AllocatorConfig, DeviceOutOfMemory

from . import _mutants, _stress


def stats() -> dict:
    """The default allocator's statistics as a dict."""
    return dataclasses.asdict(dm.stats())


def planted_use_after_free(via: str = "add", mutant: str | None = None) -> dict:
    """The planted probe: ``a, b = full(16, 3.0), full(16, 5.0)`` in an arena, exit keeping
    nothing, then use them through ``via``: ``add``, ``fma`` (a ternary op), ``sum`` (a unary
    op), ``read`` (readback) or ``inner`` (an add of buffers an inner epoch reclaimed).

    With the detector on the child dies (abort) or raises (``raise``); off, it returns the
    silent slip: ``{"size": 0}`` for the ops, ``{"sum": 0.0}`` for ``sum``.
    """
    _mutants.apply(mutant)
    if via == "inner":
        dm.arena_enter()
        dm.arena_enter()
        a, b = dm.full(16, 3.0), dm.full(16, 5.0)
        dm.arena_exit()
        dm.arena_exit()
    else:
        with dm.arena():
            a, b = dm.full(16, 3.0), dm.full(16, 5.0)
    if via in ("add", "inner"):
        return {"size": dm.add(a, b).size}
    if via == "fma":
        return {"size": dm.fma(a, b, b).size}
    if via == "sum":
        return {"sum": dm.sum(a)}
    if via == "read":
        return {"size": int(dm.to_numpy(a).size)}
    raise ValueError(f"via={via!r}: expected add, fma, sum, read or inner")


def valid_promotion(mutant: str | None = None) -> dict:
    """The negative probe: ``keep = full(16, 2.0)`` and a scratch buffer in an arena, exit
    keeping ``keep``, then ``sum(add(keep, keep))`` through the detector's choke point."""
    _mutants.apply(mutant)
    with dm.arena() as scope:
        keep = dm.full(16, 2.0)
        dm.full(16, 0.0)
        scope.keep(keep)
    return {"sum": dm.sum(dm.add(keep, keep))}


def cache_cap(n: int = 65536, k: int = 32, mutant: str | None = None) -> dict:
    """The cache-cap workload: ``k`` buffers of ``n`` floats allocated, then all released.

    Returns the statistics and the cap the allocator parsed from the environment (its
    configuration's ``cache_cap_bytes``, which the ``cpu`` stub does not report in its stats).
    """
    _mutants.apply(mutant)
    buffers = [dm.full(n, 1.0) for _ in range(k)]
    for buf in buffers:
        dm.release(buf)
    return {"parsed_cap": dm.get_allocator().config.cache_cap_bytes, "stats": stats()}


def oom_flush(case: str, mutant: str | None = None) -> dict:
    """OOM on a small ``sim`` device (``DEVMEM_SIM_CAPACITY_BYTES`` = 1 MiB).

    ``fits-after-flush``: four 256 KiB buffers fill the device and go to the cache; a 512 KiB
    buffer then fits only after the flush. ``never-fits``: a 2 MiB request, which raises
    :class:`DeviceOutOfMemory`; the child reports its message and live bytes around it.
    """
    _mutants.apply(mutant)
    if case == "fits-after-flush":
        for buf in [dm.full(65536, 1.0) for _ in range(4)]:  # the device is full
            dm.release(buf)  # ... of cached 256 KiB blocks
        big = dm.full(131072, 1.0)
        return {"size": big.size, "sum": dm.sum(big), "stats": stats()}
    if case == "never-fits":
        held = dm.full(16, 1.0)
        before = dm.stats()
        try:
            dm.full(1 << 19, 1.0)
        except DeviceOutOfMemory as exc:
            after = dm.stats()
            return {
                "error": type(exc).__name__,
                "is_memory_error": isinstance(exc, MemoryError),
                "message": str(exc),
                "requested_bytes": exc.requested_bytes,
                "live_before": before.live_bytes,
                "live_after": after.live_bytes,
                "stats": stats(),
                "held": dm.sum(held),
            }
        return {"error": None}
    raise ValueError(f"case={case!r}: expected fits-after-flush or never-fits")


def evictions_wait(mutant: str | None = None) -> dict:
    """Cap evictions and the OOM flush on ``sim`` with latency > 0 (the parent sets
    ``DEVMEM_SIM_LATENCY_US``, a 1 MiB cap and a 1.5 MiB device).

    Every block freed to the device must wait on its completion event first, or the simulator
    aborts naming the block.
    """
    _mutants.apply(mutant)
    buffers = [dm.full(65536, 1.0) for _ in range(6)]  # 1.5 MiB of fills still in flight
    for buf in buffers:
        dm.release(buf)  # 4 cached, 2 evicted after waiting on their events
    after_cap = stats()
    busy = [dm.full(65536, 2.0) for _ in range(4)]  # the 4 cached blocks, in use again
    for buf in busy:
        dm.release(buf)  # cached again, their fills still in flight
    big = dm.full(3 * 65536 + 32768, 1.0)  # 896 KiB: fits only after the flush waits
    return {"cap": after_cap, "flush": stats(), "big": big.size}


def stress_check(which: str, backend: str, mutant: str | None = None) -> None:
    """Run the in-process check ``which`` (``arena_stress`` or ``leak_bound``) on a fresh
    allocator, after patching ``mutant`` in; an ``AssertionError`` reports what broke."""
    _mutants.apply(mutant)
    alloc = Allocator(AllocatorConfig(backend=backend, arena_debug="raise"))
    if which == "arena_stress":
        _stress.arena_stress(alloc, k=16, arenas=2)
    elif which == "leak_bound":
        _stress.leak_bound(alloc, steps=16)
    else:
        raise ValueError(f"which={which!r}: expected arena_stress or leak_bound")
