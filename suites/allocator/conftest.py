"""Fixtures of the allocator suites."""

from __future__ import annotations

import functools

import pytest

from .._sim_abort import raise_in_process
from ._knobs import pinned_env


@pytest.fixture(autouse=True)
def _simulator_aborts_raise(monkeypatch):
    """A simulator abort in this process fails the test with its line (``suites/_sim_abort``)
    instead of killing the session; death tests' children still abort."""
    raise_in_process(monkeypatch)


@pytest.fixture
def pin(backend: str):
    """``pin(**knobs)``: :func:`pinned_env` for the backend under test."""
    return functools.partial(pinned_env, backend)


@pytest.fixture
def drawn(monkeypatch):
    """The figures :func:`allocator.memory.plot` draws, kept for ``describe``
    (``test_memory_cli``); skips without matplotlib (the plot extra)."""
    pytest.importorskip("matplotlib", reason="the plot extra: pip install 'devmem-harness[plot]'")
    from matplotlib.figure import Figure

    from allocator import memory

    figures = []

    class Kept(Figure):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            figures.append(self)

    monkeypatch.setattr(memory, "_figure", lambda: Kept)
    return figures


@pytest.fixture
def blocks_per_1000_events(monkeypatch) -> list[int]:
    """``sys.getallocatedblocks()`` sampled at every 1,000th event a
    :class:`allocator._timeline.TraceScan` adds, appended to the list returned (clear it
    between reads): flat where a one-pass reader holds nothing per event."""
    import sys

    from allocator import _timeline

    blocks: list[int] = []
    add = _timeline.TraceScan.add

    def sampled(scan, event):
        if scan.events % 1000 == 0:
            blocks.append(sys.getallocatedblocks())
        add(scan, event)

    monkeypatch.setattr(_timeline.TraceScan, "add", sampled)
    return blocks
