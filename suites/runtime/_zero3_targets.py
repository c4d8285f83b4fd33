"""Targets for the ZeRO-3 suites' death-test children (no pytest import: children start fast).

Each builds its allocator explicitly or from the environment the parent pinned, runs one
scenario of ``runtime.zero3`` and returns plain data, or dies where the scenario must.
"""

from __future__ import annotations

import gc

import allocator
from allocator import Allocator, AllocatorConfig
from runtime.zero3 import Zero3
from runtime.zero3_graph import run_graph

from . import _zero3_mutants

NUMEL = 4097  # over 2 ranks: a padded base of 4098 elements
LATENCY_US = 100


def consumer_stream(mutant: str | None = None) -> dict:
    """The seed's ``record_stream`` on ``sim`` with a kernel latency.

    Parameter ``a`` is gathered on the gather stream (t = 0..100); a consumer stream waits for
    it, reads the view in a kernel (t = 100..200) and releases it there (its final release).
    The host is still at t = 0 when the default stream gathers parameter ``b`` of the same
    size: with the fix, ``a``'s block waits in the cache for the consumer's event, so ``b``
    gets another block; once the consumer's kernel completed, a third parameter gets ``a``'s
    block back. Without ``record_stream`` (the mutant) the gather stream gets ``a``'s block at
    once and its all-gather kernel races the consumer's read: the simulator aborts.
    """
    _zero3_mutants.apply(mutant)
    alloc = Allocator(AllocatorConfig(backend="sim", sim_latency_us=LATENCY_US))
    z3 = Zero3(alloc, 2)
    for name in "abc":
        z3.register(name, NUMEL)
    consumer = alloc.new_stream("consumer")
    view = z3.allgather("a")
    block = view.storage.block
    with alloc.use_stream(consumer):
        z3.wait(view, "a")
        out = alloc.mul(view, view)  # the consumer's kernel reads the view until t=200
        z3.release(view, "a", 1)
        report = {
            "freed_at_once": [view.size, alloc.stats().live_bytes - out.nbytes],
            "awaiting": [
                [blk is block, [s.name for s in streams]]
                for blk, streams in alloc._cache.awaiting()
            ],
        }
    b = z3.allgather("b")  # the host is still at t=0
    report["b_got_the_block"] = b.storage.block is block
    report["now_us"] = alloc.device.now_us
    consumer.synchronize()  # t=200: the consumer's kernel has completed
    c = z3.allgather("c")
    report["c_got_the_block"] = c.storage.block is block
    with alloc.use_stream(consumer):
        report["consumer_read"] = alloc.sum(out)
    report["expected_read"] = float((z3.param("a").values().astype("float64") ** 2).sum())
    return report


def read_after_wait(mutant: str | None = None) -> dict:
    """Gather a parameter on the gather stream (t = 0..100 on ``sim``), ``wait`` for it on the
    default stream and read the view there. With the ``wait_does_not_wait`` mutant the read is
    not ordered after the all-gather's write: the simulator's race check aborts."""
    _zero3_mutants.apply(mutant)
    alloc = Allocator(AllocatorConfig(backend="sim", sim_latency_us=LATENCY_US))
    z3 = Zero3(alloc, 2)
    z3.register("w", NUMEL)
    view = z3.wait(z3.allgather("w"), "w")
    out = alloc.mul(view, view)
    z3.release(view, "w", 1)
    return {
        "sum": alloc.sum(out),
        "expected": float((z3.param("w").values().astype("float64") ** 2).sum()),
    }


def overlap(mutant: str | None = None) -> dict:
    """A chain of 6 layers (a weight and a bias each, 4097 elements over 2 ranks) on ``sim``
    with kernels of 100 us, run with prefetch 0 and 2 (a fresh allocator each): the simulated
    time at which the last kernel completes, and each layer's op's completion time."""
    _zero3_mutants.apply(mutant)
    report = {}
    for prefetch in (0, 2):
        alloc = Allocator(AllocatorConfig(backend="sim", sim_latency_us=LATENCY_US))
        z3 = Zero3(alloc, 2)
        layers = [(f"w{k}", f"b{k}") for k in range(6)]
        for params in layers:
            for param_id in params:
                z3.register(param_id, NUMEL)
        x = alloc.full(NUMEL, 1.0)
        run = run_graph(z3, layers, x, prefetch=prefetch)
        report[f"prefetch={prefetch}"] = alloc.device.tail_us
        del run
    return report


def legacy_teardown() -> dict:
    """The pre-fix release path on ``sim`` with a latency: one layer, then the allocator is
    dropped. The gathered base (gather stream) was read by the layer's op on the default
    stream, and is freed to the device by the caching layer's finalizer: ``cudaFree``
    synchronizes the device, so this never aborts (before the fix it aborted inside
    ``CachingLayer.__del__``)."""
    alloc = Allocator(AllocatorConfig(backend="sim", sim_latency_us=LATENCY_US))
    z3 = Zero3(alloc, 2, legacy_release=True)
    z3.register("w", NUMEL)
    x = alloc.full(NUMEL, 1.0)
    run = run_graph(z3, [("w",)], x)
    device = alloc.device
    del run, x, z3, alloc
    gc.collect()
    return {"used_bytes": device.used_bytes, "now_us": device.now_us}


def use_after_release(legacy: bool = False) -> dict:
    """Gather a parameter of 4097 elements over 2 ranks, release it for good (``n_users=1``),
    then read the view: with the detector on (``DEVMEM_ARENA_DEBUG``, pinned by the parent) a
    use-after-release; off, a view of size 0 reads 0.0. ``legacy``: the pre-fix release, after
    which the view still reads the parameter."""
    alloc = allocator.get_allocator()
    z3 = Zero3(alloc, 2, legacy_release=legacy)
    z3.register("w", NUMEL)
    view = z3.wait(z3.allgather("w"), "w")
    z3.release(view, "w", 1)
    return {"size": view.size, "sum": alloc.sum(view), "live": alloc.stats().live_bytes}
