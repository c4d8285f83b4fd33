"""A hypothesis state machine that drives the allocator against a reference model.

Rules: allocate, release, drop a reference (finalization), take a view, ``resize_(0)``, arena
enter and exit with a random keep, and binary ops (which the detector, in ``raise`` mode, must
refuse exactly when an operand was freed). After every step the invariants hold: ``live_bytes``
equals the bytes of the model's live storages, ``cache_bytes <= cap``, every freed buffer has
size 0, and the counts agree. Each epoch's peak is checked against its definition: the most
bytes live at once since it opened, above what was live when it opened (DESIGN 2.5).
"""

from __future__ import annotations

import dataclasses

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from allocator import Allocator, AllocatorConfig, SizeMismatchError, UseAfterFreeError


@dataclasses.dataclass(eq=False)
class ModelStorage:
    nbytes: int
    epoch: int | None  # index of the tracking epoch, None when untracked
    live: bool = True
    handles: int = 0  # buffers the test holds on it


@dataclasses.dataclass(eq=False)
class Handle:
    buffer: object
    storage: ModelStorage
    size: int


class AllocatorMachine(RuleBasedStateMachine):
    """Subclasses set ``config``."""

    config: AllocatorConfig
    handles = Bundle("handles")

    @initialize()
    def start(self):
        self.alloc = Allocator(self.config)
        self.storages: list[ModelStorage] = []
        self.depth = 0
        self.allocs = 0
        self.frees = 0
        self.held: list[Handle] = []  # the handles not yet dropped (hypothesis keeps others)
        self.marks: list[list[int]] = []  # per open epoch: [live at its open, most live since]

    # -- helpers ---------------------------------------------------------------------------

    def _new_handle(self, buffer, nbytes):
        storage = ModelStorage(nbytes, self.depth - 1 if self.depth else None)
        self.storages.append(storage)
        self.allocs += 1
        return self._handle(buffer, storage, nbytes // 4)

    def _handle(self, buffer, storage, size):
        storage.handles += 1
        handle = Handle(buffer, storage, size)
        self.held.append(handle)
        return handle

    def _free(self, storage):
        if storage.live:
            storage.live = False
            storage.epoch = None
            self.frees += 1

    # -- rules -------------------------------------------------------------------------------

    @rule(target=handles, n=st.integers(1, 64), value=st.floats(-4, 4, width=32))
    def allocate(self, n, value):
        return self._new_handle(self.alloc.full(n, value), 4 * n)

    @rule(target=handles, h=handles)
    def copy(self, h):
        if not h.storage.live:
            with pytest.raises(UseAfterFreeError):
                self.alloc.copy(h.buffer)
            return self._handle(h.buffer, h.storage, h.size)
        return self._new_handle(self.alloc.copy(h.buffer), 4 * h.size)

    @rule(target=handles, a=handles, b=handles)
    def add(self, a, b):
        if not a.storage.live or not b.storage.live:
            with pytest.raises(UseAfterFreeError):
                self.alloc.add(a.buffer, b.buffer)
            return self._handle(a.buffer, a.storage, a.size)
        if a.size != b.size:
            with pytest.raises(SizeMismatchError):
                self.alloc.add(a.buffer, b.buffer)
            return self._handle(a.buffer, a.storage, a.size)
        return self._new_handle(self.alloc.add(a.buffer, b.buffer), 4 * a.size)

    @rule(h=handles)
    def read_back(self, h):
        if not h.storage.live:
            with pytest.raises(UseAfterFreeError):
                self.alloc.sum(h.buffer)
            return
        assert self.alloc.to_numpy(h.buffer).shape == (h.size,)

    @rule(target=handles, h=handles, data=st.data())
    def view(self, h, data):
        if not h.storage.live:
            return self._handle(h.buffer, h.storage, h.size)
        offset = data.draw(st.integers(0, h.size - 1))
        n = data.draw(st.integers(1, h.size - offset))
        return self._handle(h.buffer.view(offset, n), h.storage, n)

    @rule(h=handles)
    def release(self, h):
        expected = 1 if h.storage.live else 0
        assert self.alloc.release(h.buffer) == expected
        self._free(h.storage)

    @rule(h=handles)
    def resize_to_zero(self, h):
        expected = 1 if h.storage.live else 0
        assert h.buffer.storage.resize_(0, "model") == expected
        self._free(h.storage)

    @rule(h=consumes(handles))
    def drop(self, h):
        h.storage.handles -= 1
        if h.storage.handles == 0:
            self._free(h.storage)  # refcounting finalizes it now
        h.buffer = None  # hypothesis keeps the Handle itself; drop the buffer reference
        self.held.remove(h)

    @rule()
    def arena_enter(self):
        live = self.alloc.stats().live_bytes
        assert self.alloc.arena_enter() == self.depth
        self.depth += 1
        self.marks.append([live, live])

    @precondition(lambda self: self.depth > 0)
    @rule(data=st.data())
    def arena_exit(self, data):
        inner = self.depth - 1
        tracked = [s for s in self.storages if s.live and s.epoch == inner]
        # keep = a random subset of the live handles on tracked storages (plus possibly others)
        live = [s for s in self.storages if s.live]
        kept = data.draw(st.lists(st.sampled_from(live), unique=True) if live else st.just([]))
        keep_buffers = [self._any_buffer(s) for s in kept]
        stats = self.alloc.arena_exit(keep=keep_buffers)
        reclaimed = [s for s in tracked if s not in kept]
        for s in reclaimed:
            self._free(s)
        for s in tracked:
            if s in kept:
                s.epoch = inner - 1 if inner else None
        assert stats.reclaimed_buffers == len(reclaimed)
        assert stats.reclaimed_bytes == sum(s.nbytes for s in reclaimed)
        opened_at, most = self.marks.pop()
        assert stats.peak_bytes == most - opened_at
        self.depth -= 1

    def _any_buffer(self, storage):
        for handle in self.held:
            if handle.storage is storage:
                return handle.buffer
        raise AssertionError("a live storage with no handle")

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def counters_match_the_model(self):
        stats = self.alloc.stats()
        live = [s for s in self.storages if s.live]
        assert stats.live_bytes == sum(s.nbytes for s in live)
        assert stats.live_buffers == len(live)
        assert stats.alloc_count == self.allocs
        assert stats.free_count == self.frees
        assert stats.arena_depth == self.depth
        assert stats.peak_bytes >= stats.live_bytes

    @invariant()
    def epochs_see_the_most_live_bytes(self):
        live = self.alloc.stats().live_bytes
        for mark in self.marks:
            mark[1] = max(mark[1], live)

    @invariant()
    def cache_stays_under_the_cap(self):
        stats = self.alloc.stats()
        if stats.cache_cap_bytes:
            assert stats.cache_bytes <= stats.cache_cap_bytes
        if self.alloc.backend == "cpu":
            assert stats.cache_bytes == 0

    @invariant()
    def freed_buffers_have_size_zero(self):
        for handle in self.held:
            expected = handle.size if handle.storage.live else 0
            assert handle.buffer.size == expected

    def teardown(self):
        while self.depth:
            self.alloc.arena_exit()
            self.depth -= 1


class SimMachine(AllocatorMachine):
    config = AllocatorConfig(
        backend="sim", cache_cap_bytes=512, arena_debug="raise", sim_latency_us=2
    )


class CpuMachine(AllocatorMachine):
    config = AllocatorConfig(backend="cpu", arena_debug="raise")


_settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSimWithCap = SimMachine.TestCase
TestSimWithCap.settings = _settings
TestCpuStub = CpuMachine.TestCase
TestCpuStub.settings = _settings
