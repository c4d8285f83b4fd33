"""The TensorMap of the task-runtime seed (``../shared/seeds/pto-ring-heap-and-tensormap.txt``):
which earlier tasks produced the bytes a new task reads, exactly (DESIGN 5.3).

A package of its own, not ``runtime.ring.tensormap``: it is a data structure with its own
contract (every overlapping producer, exact strided overlap, bounded fan-in), its own suite and
benchmark, and no knowledge of the ring; the ring (:mod:`runtime.ring`) uses it through these
public names, and it imports nothing of the ring.

Its modules (private; everything public is re-exported here):

- ``_map``: :class:`Region`, :class:`TensorMap`, :class:`Overlap`, :class:`Producer`,
  :func:`classify`, :func:`gather_fanin` (and :func:`gather_spans`, its form for
  contiguous accesses) and :class:`FaninExceeded`;
- ``_strided``: exact overlap of strided byte sets (:class:`ByteSet`, :func:`covers`,
  :func:`intersects`), which ``_map`` classifies with.
"""

from __future__ import annotations

from ._map import (
    FaninExceeded,
    Overlap,
    Producer,
    Region,
    TensorMap,
    classify,
    gather_fanin,
    gather_spans,
)
from ._strided import ByteSet, covers, intersects

__all__ = [
    "ByteSet",
    "FaninExceeded",
    "Overlap",
    "Producer",
    "Region",
    "TensorMap",
    "classify",
    "covers",
    "gather_fanin",
    "gather_spans",
    "intersects",
]
