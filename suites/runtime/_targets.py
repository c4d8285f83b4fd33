"""Targets for the runtime suites' death-test children (no pytest import: children start fast).

The parent pins every knob in the child's environment (``DEVMEM_BACKEND`` and the
``DEVMEM_CKPT_*`` / ``DEVMEM_COMPILE_HEADROOM`` knobs), so each child reads exactly the
configuration under test, once. Targets return plain data for the parent to check; a ``mutant``
argument patches a seed bug back in first (:mod:`suites.runtime._mutants`).
"""

from __future__ import annotations

import gc
import os

import allocator
from runtime import checkpoint, pipeline

from ..allocator import _fake_cupy
from . import _mutants


def checkpoint_counts(preset: str, mutant: str | None = None) -> dict:
    """Plan ``preset`` with the knobs of this process (policy, interval, headroom), run the
    chain under its checkpoint plan on the default allocator, and report both sides."""
    _mutants.apply(mutant)
    knobs = checkpoint.knobs()
    config = pipeline.preset(preset)
    plan = pipeline.plan_pipeline(config)
    ckpt = checkpoint.checkpoint_plan(None, config.dims.n_layers, group_starts=plan.group_starts)
    elems = checkpoint.scaled_elems(pipeline.layer_activation_bytes(config.dims))
    run = checkpoint.run_checkpointed(allocator.get_allocator(), ckpt, elems=elems)
    return {
        "backend": allocator.get_allocator().backend,
        "knobs": {"policy": knobs.policy, "interval": knobs.interval, "headroom": knobs.headroom},
        "headroom": config.compile.headroom_pct,
        "group_starts": list(plan.group_starts),
        "policy": ckpt.policy,
        "interval": ckpt.interval,
        "saved": list(ckpt.saved),
        "n_checkpointed": ckpt.n_checkpointed,
        "kept": list(run.kept),
        "forward_calls": list(run.forward_calls),
        "predicted_forward_calls": list(ckpt.predict().forward_calls),
        "peak_bytes": run.peak_bytes,
        "predicted_peak_bytes": ckpt.predict().peak_bytes(elems),
        "result": run.result,
        "expected_result": checkpoint.chain_result(config.dims.n_layers),
    }


def read_knobs_twice() -> dict:
    """Read the knobs, change the environment, read them again (a warning, if any, goes to
    stderr at the first read only)."""
    first = checkpoint.knobs()
    os.environ["DEVMEM_CKPT_POLICY"] = "none"
    os.environ["DEVMEM_CKPT_INTERVAL"] = "9"
    os.environ["DEVMEM_COMPILE_HEADROOM"] = "0.5"
    again = checkpoint.knobs()
    return {
        "policy": first.policy,
        "interval": first.interval,
        "headroom": first.headroom,
        "same": again is first,
    }


def knobs_policy() -> str:
    """This process's ``DEVMEM_CKPT_POLICY``, as the knobs read it."""
    return checkpoint.knobs().policy


def train(argv: list, mutant: str | None = None) -> None:
    """``python -m runtime.pipeline`` with ``argv`` in this process: ``train`` replaces the
    process image at each restart and exits from the last one."""
    _mutants.apply(mutant)
    raise SystemExit(pipeline.main(argv))


def commit_writes(path: str, writes: list) -> None:
    """Open the state file ``path`` and commit ``writes`` (``[offset, hex bytes]`` pairs) with
    its header unchanged; with ``DEVMEM_PIPELINE_KILL_AT`` set, the commit dies where it says."""
    with pipeline.StateFile.open(path) as state:
        state.commit(state.header, [(offset, bytes.fromhex(data)) for offset, data in writes])


def executor_over_fake_cupy(latency: int) -> dict:
    """The executor on the ``cuda`` backend over the allocator suites' fake CuPy (no GPU):
    every policy's run against its prediction, and blocks freed while a kernel used them."""
    fake = _fake_cupy.install(total_bytes=1 << 24, latency=latency)
    config = allocator.AllocatorConfig(backend="cuda", arena_debug="raise")
    mismatches = []
    for policy, interval in [("all", None), ("sqrt", None), ("none", None), ("every_n", 3),
                             ("sequential", 4), ("revolve", 3)]:  # fmt: skip
        plan = checkpoint.checkpoint_plan(policy, 20, interval=interval, group_starts=[0])
        alloc = allocator.Allocator(config)
        run = checkpoint.run_checkpointed(alloc, plan, elems=32)
        predicted = plan.predict()
        if (run.forward_calls, run.peak_bytes, run.kept, run.result) != (
            predicted.forward_calls,
            predicted.peak_bytes(32),
            plan.saved,
            checkpoint.chain_result(20),
        ):
            mismatches.append(policy)
        alloc.empty_cache()
    return {"mismatches": mismatches, "violations": len(fake.violations), "backend": alloc.backend}


def executor_under_gc() -> dict:
    """The executor with the cyclic collector run at (nearly) every allocation, each run
    reference-cycled so finalizers fire mid-run: predictions must still hold, nothing leak."""
    collections = []
    gc.callbacks.append(lambda phase, info: phase == "stop" and collections.append(1))
    gc.set_threshold(1, 1, 1)
    mismatches, leaks = [], []
    for policy, interval in [("sqrt", None), ("sequential", 3), ("revolve", 2), ("none", None)]:
        plan = checkpoint.checkpoint_plan(policy, 24, interval=interval)
        alloc = allocator.Allocator()  # fresh, from this process's DEVMEM_* configuration
        cycle: list = []
        cycle.append(cycle)  # garbage for the collector to find during the run
        run = checkpoint.run_checkpointed(alloc, plan, elems=8)
        predicted = plan.predict()
        if (run.forward_calls, run.peak_bytes) != (
            predicted.forward_calls,
            predicted.peak_bytes(8),
        ):
            mismatches.append(policy)
        del cycle
        gc.collect()
        stats = alloc.stats()
        if stats.live_bytes or stats.arena_depth:
            leaks.append(policy)
        alloc.empty_cache()
    return {"mismatches": mismatches, "leaks": leaks, "collections": len(collections) > 100}


def main_with_file_size_limit(limit: int, argv: list) -> None:
    """``python -m runtime.pipeline argv`` with files limited to ``limit`` bytes
    (``RLIMIT_FSIZE``, ``SIGXFSZ`` ignored): the kernel then refuses to grow a file past it with
    ``EFBIG``, as a full disk refuses with ``ENOSPC``, without filling a shared disk."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    raise SystemExit(pipeline.main(argv))
