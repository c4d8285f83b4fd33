"""Targets for the heap ring's death-test children: each runs one simulation on the default
allocator (``DEVMEM_BACKEND``, pinned by the parent) and returns plain data. No pytest import:
children start fast.
"""

from __future__ import annotations

from runtime import ring

from . import _ring_mutants


def paged_attention(
    batch: int,
    replay: str,
    lag: float,
    election: bool,
    reclaim: str = "window",
    seed: int = 0,
    mutant: str | None = None,
    ns_per_element: float = 0.5,
) -> dict:
    """The seed's workload (``q_tiles=2, kv_blocks=2``) on 4 cores, core 3 lagging by ``lag``
    (1.0: none); returns the run's summary and the trace checker's violations. The pre-fix
    path (``election=False``) aborts where the seed's runtime did. ``ns_per_element``: the
    ``kernel`` replay's modelled cost per element (default 0.5 ns)."""
    _ring_mutants.apply(mutant)
    config = ring.RingConfig(
        cores=4,
        seed=seed,
        replay=replay,
        lag=((3, lag),) if lag > 1 else (),
        reclaim=reclaim,
        alloc_election=election,
        ns_per_element=ns_per_element,
    )
    result = ring.run("paged_attention", config, batch=batch, q_tiles=2, kv_blocks=2)
    return {**result.summary(), "violations": ring.check_trace(result)}


def nested_allocs(election: bool, ring_bytes: int = 2048) -> dict:
    """A genuinely too-small ring on one core: an outer scope's 1024-byte tensor stays live
    (its reader comes after the inner scope) while an inner scope allocates 1024 + 64 bytes;
    one core cannot replay past that allocation (two cores can: the second runs the reader).
    Returns the fatal and the outputs the result holds."""
    config = ring.RingConfig(cores=1, ring_bytes=ring_bytes, alloc_election=election)
    result = ring.run(nested_scopes, config)
    outputs = result.fatal_outputs
    return {
        "fatal": result.fatal,
        "fatal_task": result.fatal_task,
        "outputs": None if outputs is None else [b.size for b in outputs.outputs],
        "violations": ring.check_trace(result),
    }


def nested_scopes(rt) -> None:
    """Outer scope: alloc 256 floats, read by a kernel at the end; inner scope: alloc 256 and
    16 floats (a kernel reads them)."""
    with rt.scope():
        outer = rt.alloc_tensors(256).get_ref(0)
        with rt.scope():
            inner = rt.alloc_tensors(256, 16)
            rt.submit("use", inputs=[inner.get_ref(0), inner.get_ref(1)], cost_ns=100)
        rt.submit("use", inputs=[outer], cost_ns=100)


def empty_get_ref() -> None:
    """``get_ref(0)`` on an empty ``alloc_tensors`` result: the seed's assertion."""
    ring.TaskOutputTensors(7).get_ref(0)


def cli(*argv: str) -> int:
    """``python -m runtime.ring`` in the child (its exit status is returned)."""
    return ring.main(list(argv))
