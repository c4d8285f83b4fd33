"""Workloads for the heap-ring runtime: orchestration programs, as functions of an
:class:`~runtime.ring._program.Orchestrator` and their sizes.

- :func:`paged_attention`: the seed's workload, a paged-attention decode step: per (batch, query
  tile) a scope with an ``alloc_tensors`` of the online-softmax state (``m``, ``l``, ``o``),
  then per KV block ``qk`` (a heap score tile), ``softmax`` (reads it, updates ``m`` and ``l``,
  a heap probability tile) and ``pv`` (updates ``o``), and a final ``normalize`` into the
  external output. Recorded kernel times are those of the seed's busy-wait replay path in
  spirit: microseconds per kernel, much longer than replaying one submit.
- :func:`long_span`: a scope whose accumulator is updated by ``span`` kernels and read at the
  end, so its last reader is ``span + 1`` tasks after its producer (window mode's H breaks).
- :func:`tiles`: k producers write k disjoint tiles of one buffer, then one task reads it whole
  (fan-in k; the seed's TensorMap found only the last tile's producer).
"""

from __future__ import annotations

from .._checks import integer
from ._program import Orchestrator

__all__ = ["WORKLOADS", "long_span", "paged_attention", "task_count", "tiles"]

ROWS = 16
"""Rows of a query tile: the sizes of the softmax state ``m`` and ``l``."""

PAGED_ATTENTION_NS = {"qk": 24_000, "softmax": 9_000, "pv": 24_000, "normalize": 6_000}
"""Recorded kernel times (ns) replayed by busy-wait."""


def paged_attention(
    rt: Orchestrator, *, batch: int, q_tiles: int = 2, kv_blocks: int = 2, tile: int = 256
) -> None:
    """A paged-attention decode step (the seed's ``paged_attention_unroll``).

    Args:
        rt: the orchestrator.
        batch: sequences, >= 1.
        q_tiles: query tiles per sequence, >= 1.
        kv_blocks: KV-cache blocks per sequence, >= 1.
        tile: float32 elements per tile, >= ROWS.

    Tasks: ``batch * q_tiles * (2 + 3 * kv_blocks)``. Heap per scope: the state
    (``2 * ROWS + tile`` elements) plus two tiles per KV block.
    """
    batch, q_tiles = integer(batch, "batch"), integer(q_tiles, "q_tiles")
    kv_blocks, tile = integer(kv_blocks, "kv_blocks"), integer(tile, "tile", ROWS)
    ns = PAGED_ATTENTION_NS
    q = rt.external("q", batch * q_tiles * tile)
    k = rt.external("k", batch * kv_blocks * tile)
    v = rt.external("v", batch * kv_blocks * tile)
    out = rt.external("out", batch * q_tiles * tile)
    for b in range(batch):
        for t in range(q_tiles):
            row = (b * q_tiles + t) * tile
            with rt.scope():
                state = rt.alloc_tensors(ROWS, ROWS, tile)
                m, ell, o = state.get_ref(0), state.get_ref(1), state.get_ref(2)
                q_tile = q.view(row, (tile,))
                for j in range(kv_blocks):
                    block = (b * kv_blocks + j) * tile
                    k_block, v_block = k.view(block, (tile,)), v.view(block, (tile,))
                    s = rt.submit(
                        "qk", inputs=[q_tile, k_block], outputs=[tile], cost_ns=ns["qk"]
                    ).get_ref(0)
                    p = rt.submit(
                        "softmax",
                        inputs=[s],
                        inouts=[m, ell],
                        outputs=[tile],
                        cost_ns=ns["softmax"],
                    ).get_ref(0)
                    rt.submit("pv", inputs=[p, v_block], inouts=[o], cost_ns=ns["pv"])
                rt.submit(
                    "normalize",
                    inputs=[o, ell],
                    writes=[out.view(row, (tile,))],
                    cost_ns=ns["normalize"],
                )


def long_span(
    rt: Orchestrator, *, scopes: int = 8, span: int = 100, tile: int = 256, cost_ns: int = 2000
) -> None:
    """Scopes whose accumulator outlives a long chain of updates.

    Each scope: ``alloc_tensors(tile)``; ``span`` kernels each read an external block and
    update the accumulator in place (no heap outputs); a last kernel reads the accumulator into
    the external output. The accumulator's last reader is ``span + 1`` tasks after the alloc,
    so window mode needs ``H >= span + 1``, while exact reclaim needs a ring of one accumulator
    (``tile`` float32, rounded up to the alignment): the true live set.

    Args:
        rt: the orchestrator.
        scopes: repetitions, >= 1. span: updates per scope, >= 1. tile: accumulator elements.
        cost_ns: each kernel's recorded time.
    """
    scopes, span, tile = integer(scopes, "scopes"), integer(span, "span"), integer(tile, "tile")
    x = rt.external("x", span * tile)
    out = rt.external("out", scopes * tile)
    for s in range(scopes):
        with rt.scope():
            acc = rt.alloc_tensors(tile).get_ref(0)
            for j in range(span):
                block = x.view(j * tile, (tile,))
                rt.submit("update", inputs=[block], inouts=[acc], cost_ns=cost_ns)
            rt.submit("store", inputs=[acc], writes=[out.view(s * tile, (tile,))], cost_ns=cost_ns)


def tiles(rt: Orchestrator, *, k: int = 100, tile: int = 64, cost_ns: int = 5000) -> None:
    """k producers each write one of k disjoint tiles of a heap buffer, then one task reads
    the whole buffer: its fan-in must be k + 1 (the tiles' producers and the allocation)."""
    k, tile = integer(k, "k"), integer(tile, "tile")
    with rt.scope():
        whole = rt.alloc_tensors(k * tile).get_ref(0)
        for i in range(k):
            # the earlier producers are slower: a consumer that waits only for the newest would
            # run before the others finish
            rt.submit("fill", writes=[whole.view(i * tile, (tile,))], cost_ns=cost_ns * (k - i))
        rt.submit("reduce", inputs=[whole], cost_ns=cost_ns)


WORKLOADS = {"paged_attention": paged_attention, "long_span": long_span, "tiles": tiles}
"""Workloads by name (the CLI's ``--workload``)."""


def task_count(workload: str, **sizes: int) -> int:
    """The number of tasks ``workload`` submits with ``sizes`` (its defaults for the rest),
    without planning it: O(1).

    Raises:
        ValueError: ``workload`` is not in :data:`WORKLOADS`.
    """
    if workload not in WORKLOADS:
        raise ValueError(f"workload={workload!r}: expected one of {', '.join(WORKLOADS)}")
    if workload == "paged_attention":
        q_tiles, kv_blocks = sizes.get("q_tiles", 2), sizes.get("kv_blocks", 2)
        return sizes["batch"] * q_tiles * (2 + 3 * kv_blocks)
    if workload == "long_span":
        return sizes.get("scopes", 8) * (sizes.get("span", 100) + 2)
    return sizes.get("k", 100) + 2
