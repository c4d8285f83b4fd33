"""An allocator's lifetime: dropping the last reference frees it and its device blocks at once.

No layer refers back to the allocator that built it, so an allocator is never in a reference
cycle and reference counting frees it without waiting for ``gc.collect()`` (issue 8, defect 5:
``self._empty = Storage(self, ...)`` and ``Detector(self)`` were cycles, so a dropped allocator
kept its cached blocks, on ``cuda`` device memory, until the collector ran). These tests run
with the collector disabled.
"""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest

from allocator import Allocator, AllocatorConfig


@contextlib.contextmanager
def collector_off():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _workout(alloc: Allocator) -> None:
    """Every layer used: cache hits and evictions, ops, a detector-off slip, an arena with a
    keep, a release, a resize_, and a finalized buffer still queued when the caller drops the
    allocator."""
    a, b = alloc.full(16, 1.0), alloc.full(16, 2.0)
    alloc.release(alloc.add(a, b))
    with alloc.arena() as scope:
        c = alloc.mul(a, b)
        alloc.full(64, 0.0)
        scope.keep(c)
    alloc.release(a)
    assert alloc.add(a, a).size == 0  # freed operands, detector off: the silent slip
    c.storage.resize_(0, "test")
    for _ in range(3):
        alloc.release(alloc.empty(256))
    b = None  # finalized: its block is queued, freed at the allocator's next call
    assert alloc.stats().arena_depth == 0 and alloc.stats().live_buffers == 0


@pytest.mark.parametrize("cap", [0, 1024], ids=["unbounded", "capped"])
def test_dropping_an_allocator_frees_it_and_its_blocks_without_the_collector(cap):
    with collector_off():
        alloc = Allocator(AllocatorConfig(backend="sim", cache_cap_bytes=cap))
        _workout(alloc)
        queued = alloc.full(32, 1.0)
        del queued  # its block waits in the finalizers' queue when the allocator is dropped
        device = alloc.device
        assert device.used_bytes > 0
        layers = [weakref.ref(layer) for layer in alloc._layers()]
        dropped = weakref.ref(alloc)
        del alloc
        assert dropped() is None, "the allocator is kept alive by a reference cycle"
        assert [layer() for layer in layers] == [None] * len(layers)
        assert device.used_bytes == 0, "cached or queued blocks were not handed back"


def test_a_cpu_allocator_is_freed_too():
    with collector_off():
        alloc = Allocator(AllocatorConfig(backend="cpu"))
        _workout(alloc)
        dropped = weakref.ref(alloc)
        del alloc
        assert dropped() is None


def test_a_live_buffer_keeps_the_layers_it_needs():
    with collector_off():
        alloc = Allocator(AllocatorConfig(backend="sim"))
        buf = alloc.full(16, 1.0)
        device = alloc.device
        dropped = weakref.ref(alloc)
        del alloc
        assert dropped() is None  # the front end goes; the layers under the buffer stay
        assert device.used_bytes == 64 and buf.size == 16
        assert buf.storage.resize_(0, "after the allocator") == 1
        assert device.used_bytes == 64  # cached by the surviving caching layer
        del buf
        assert device.used_bytes == 0
