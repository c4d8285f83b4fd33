"""Exact geometry of strided byte sets: does one intersect another, does one cover another.

A strided region of ``shape`` and ``strides`` (in elements of ``elem_size`` bytes) starting at
``start_offset`` touches the bytes ``(start_offset + sum(i[d] * strides[d])) * elem_size + b``
for ``0 <= i[d] < shape[d]`` and ``0 <= b < elem_size``. :class:`ByteSet` is that set in a
canonical form: a base byte, a contiguous ``run`` of bytes, and the remaining dimensions as
``(count, byte_stride)`` pairs, smallest stride first, each stride larger than the run (a
dimension whose stride is at most the run merges into it, and a dimension that continues the
progression of the one below merges with it).

Both questions reduce to one primitive, :func:`hits`: does ``c + sum(k[m] * s[m])`` (with
``0 <= k[m] < n[m]``, strides of either sign) take a value in ``[lo, hi]``? It is a
branch-and-bound over the terms, largest ``|s|`` first, that keeps only the ``k`` whose value
can still be completed into the interval by the remaining terms, and prunes by the gcd of the
remaining strides. It is exact. For nested layouts (row-major or column-major tiles, transposes,
every view PyTorch's ``as_strided`` makes of a contiguous tensor) at most two values of each
``k`` survive, so a test costs O(dims); interleaved strides can cost up to the product of the
counts of the interleaved dimensions. No library decides this (PyTorch's ``MemoryOverlap.cpp``
answers "too hard" for anything but identical or contiguous layouts; the reference runtime of
``../shared/seeds/pto-ring-heap-and-tensormap.txt`` answers "other").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

__all__ = ["ByteSet", "covers", "hits", "intersects", "values_in"]

Terms = Sequence[tuple[int, int]]


@dataclass(frozen=True)
class ByteSet:
    """A strided set of byte addresses in canonical form.

    Attributes:
        base: the first byte.
        run: contiguous bytes per run, >= 1.
        dims: ``(count, stride)`` pairs in bytes, ``count >= 2``, ascending stride, every stride
            larger than ``run``. The runs start at ``base + sum(k[m] * stride[m])``.
        hi: one past the last byte (derived).
    """

    base: int
    run: int
    dims: tuple[tuple[int, int], ...]
    hi: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "hi", self.base + sum((n - 1) * s for n, s in self.dims) + self.run
        )

    @classmethod
    def of(cls, base: int, run: int, dims: Sequence[tuple[int, int]]) -> ByteSet:
        """The canonical form of ``{base + sum(k[m] * s[m]) + b : b < run}`` (``s[m] > 0``)."""
        rest = sorted((s, n) for n, s in dims if n > 1)
        merged: list[tuple[int, int]] = []
        for s, n in rest:
            if not merged and s <= run:  # overlapping or adjacent runs: one longer run
                run += (n - 1) * s
            elif merged and s == merged[-1][0] * merged[-1][1]:  # continues the progression
                merged[-1] = (merged[-1][0], merged[-1][1] * n)
            else:
                merged.append((s, n))
        return cls(base, run, tuple((n, s) for s, n in merged))

    @property
    def lo(self) -> int:
        """The first byte."""
        return self.base

    def run_starts(self) -> Iterator[int]:
        """Every run's first byte, in no particular order (repeats possible when runs
        coincide)."""
        if not self.dims:
            yield self.base
            return
        for ks in itertools.product(*(range(n) for n, _ in self.dims)):
            yield self.base + sum(k * s for k, (_, s) in zip(ks, self.dims, strict=True))


def _prepare(terms: Terms) -> tuple[list[tuple[int, int]], list[int], list[int], list[int]]:
    ordered = sorted(((n, s) for n, s in terms if n > 1 and s != 0), key=lambda t: -abs(t[1]))
    k = len(ordered)
    smin, smax, g = [0] * (k + 1), [0] * (k + 1), [0] * (k + 1)
    for i in range(k - 1, -1, -1):
        n, s = ordered[i]
        span = (n - 1) * s
        smin[i] = smin[i + 1] + min(0, span)
        smax[i] = smax[i + 1] + max(0, span)
        g[i] = math.gcd(g[i + 1], abs(s))
    return ordered, smin, smax, g


def _k_range(n: int, s: int, a: int, b: int) -> range:
    """The ``k`` in ``[0, n)`` with ``a <= k * s <= b``."""
    if s < 0:
        s, a, b = -s, -b, -a
    return range(max(0, -(-a // s)), min(n - 1, b // s) + 1)


def _search(c: int, terms: Terms, lo: int, hi: int, collect: list[int] | None) -> bool:
    ordered, smin, smax, g = _prepare(terms)
    depth = len(ordered)

    def visit(i: int, c: int) -> bool:
        if c + smax[i] < lo or c + smin[i] > hi:
            return False
        step = g[i]
        if step > 1 and lo + (c - lo) % step > hi:  # every value is c mod step
            return False
        if i == depth:
            if collect is None:
                return True
            collect.append(c)
            return False
        n, s = ordered[i]
        found = False
        for k in _k_range(n, s, lo - c - smax[i + 1], hi - c - smin[i + 1]):
            if visit(i + 1, c + k * s):
                found = True
                break
        return found

    return visit(0, c)


def hits(c: int, terms: Terms, lo: int, hi: int) -> bool:
    """Whether ``c + sum(k[m] * s[m])`` lies in ``[lo, hi]`` for some ``0 <= k[m] < n[m]``.

    Args:
        c: the constant term.
        terms: ``(n, s)`` pairs; ``n >= 1``, ``s`` any integer (``n == 1`` or ``s == 0`` terms
            contribute nothing).
        lo, hi: the closed interval.
    """
    return lo <= hi and _search(c, terms, lo, hi, None)


def values_in(c: int, terms: Terms, lo: int, hi: int) -> list[int]:
    """Every value of ``c + sum(k[m] * s[m])`` in ``[lo, hi]`` (repeats possible), as
    :func:`hits` enumerates them."""
    out: list[int] = []
    if lo <= hi:
        _search(c, terms, lo, hi, out)
    return out


def intersects(a: ByteSet, b: ByteSet) -> bool:
    """Whether the two byte sets share a byte (exact)."""
    if a.lo >= b.hi or b.lo >= a.hi:
        return False
    if not a.dims and not b.dims:
        return True
    # Runs [x, x + a.run) and [y, y + b.run) meet iff y - x lies in [1 - b.run, a.run - 1].
    terms = [*b.dims, *((n, -s) for n, s in a.dims)]
    return hits(b.base - a.base, terms, 1 - b.run, a.run - 1)


def _contains_byte(s: ByteSet, x: int) -> bool:
    return hits(s.base - x, s.dims, 1 - s.run, 0)


def _shortcut_covers(outer: ByteSet, inner: ByteSet) -> bool:
    """A sufficient test: every inner dimension matches an outer one of the same stride, and
    the inner base decomposes in the outer's digits so that the inner box fits inside."""
    strides = {s: i for i, (_, s) in enumerate(outer.dims)}
    counts = [1] * len(outer.dims)
    for n, s in inner.dims:
        i = strides.get(s)
        if i is None or counts[i] != 1:
            return False
        counts[i] = n
    rest = inner.base - outer.base
    for i in range(len(outer.dims) - 1, -1, -1):
        n, s = outer.dims[i]
        q = min(rest // s, n - counts[i])
        if q < 0:
            return False
        rest -= q * s
    return rest >= 0 and rest + inner.run <= outer.run


def _run_covered(outer: ByteSet, x: int, length: int) -> bool:
    """Whether the bytes ``[x, x + length)`` all lie in ``outer``."""
    starts = sorted(set(values_in(outer.base, outer.dims, x - outer.run + 1, x + length - 1)))
    reach = x
    for y in starts:
        if y > reach:
            return False
        reach = max(reach, y + outer.run)
        if reach >= x + length:
            return True
    return False  # the runs starting up to the range's last byte end before its end


def covers(outer: ByteSet, inner: ByteSet) -> bool:
    """Whether every byte of ``inner`` lies in ``outer`` (exact).

    Cost: O(dims**2) when ``outer`` is one run or shares ``inner``'s strides once ``inner``'s
    smallest dimensions are taken as one run (a tile, strided or not, inside a tile of the same
    tensor). Otherwise ``inner`` is checked block by block, a block being its
    smallest dimensions: a block whose whole bounding span ``outer`` covers needs no finer
    look (a strided tile inside a dense tile: one check per row), and only blocks that straddle
    a gap of ``outer`` are split, down to single runs in the worst case.
    """
    if inner.lo < outer.lo or inner.hi > outer.hi:
        return False
    if not outer.dims or outer == inner:
        return True
    for level in range(len(inner.dims) + 1):  # inner's smallest dimensions as one long run
        span = sum((n - 1) * s for n, s in inner.dims[:level]) + inner.run
        if _shortcut_covers(outer, ByteSet(inner.base, span, inner.dims[level:])):
            return True
    if not _contains_byte(outer, inner.lo) or not _contains_byte(outer, inner.hi - 1):
        return False
    return _block_covered(outer, inner, inner.base, len(inner.dims))


def _block_covered(outer: ByteSet, inner: ByteSet, x: int, level: int) -> bool:
    """Whether the block of ``inner`` made of its ``level`` smallest dimensions, starting at
    byte ``x``, lies in ``outer``: at once when ``outer`` covers the block's whole bounding
    span (a sufficient test), else block by block one dimension down, to single runs (exact)."""
    span = sum((n - 1) * s for n, s in inner.dims[:level]) + inner.run
    if _run_covered(outer, x, span):
        return True
    if level == 0:
        return False
    n, s = inner.dims[level - 1]
    return all(_block_covered(outer, inner, x + k * s, level - 1) for k in range(n))
