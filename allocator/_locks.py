"""The allocator's locks: one per layer, the one order they nest in, and what a fork does to them.

This is the one place the lock order is written. Outermost first; a thread that holds one lock
may take only locks further down the list:

1. ``REGISTRY`` (:class:`~allocator._arena.ArenaRegistry`): the epoch stack and the epochs'
   registries. Taken only while an arena is open (to register a new storage, or to untrack a
   freed one) and by ``arena_enter``/``arena_exit``; held across an arena exit's frees.
2. ``STATISTICS`` (:class:`~allocator._statistics.Statistics`): the counters and the epoch
   counters.
3. ``CACHE`` (:class:`~allocator._cache.CachingLayer`): the reuse cache and its counters.
4. ``DEVICE_LAYER`` (:class:`~allocator._device_layer.DeviceLayer`): two counters.
5. ``HISTORY`` (:class:`~allocator._history.Recorder`): the memory history's ring and maps.
   Taken by the history layers (also under the registry lock, during an arena exit); under it
   only a backend's ``ready``, its streams' queries and its clock are called.
6. ``BACKEND``: a backend's own state (:class:`~allocator.device.SimDevice`'s host clock,
   its streams' clocks and vector clocks, its blocks' accesses and its capacity,
   :class:`~allocator.device.cuda.CudaDevice`'s event pool).

Streams add no lock: the current stream is per thread (``threading.local``), the per-stream
free lists and the blocks awaiting other streams' events are the reuse cache's, under
``CACHE``; the ids of dropped streams go into a deque that a weak reference's callback appends
to (atomic) and the cache drains with no lock held.

Rules that keep this order safe under the garbage collector, threads and fork:

- Finalizers take no lock. ``Storage.__del__`` only appends a block to a deque (an atomic
  operation); the next public call frees it with no lock held. The cyclic collector can run at
  any allocation, inside any critical section, so nothing else would be safe.
- A layer calls its upstream with its own lock released (the registry during an arena exit is
  the one exception, so its epochs stay in step with the statistics epochs). ``gc.collect()``
  (the out-of-memory path) and the drain of the finalizers' queue run with no lock held.
- Layer locks (1 to 5) are plain, non-reentrant locks: a re-entry could only come from a
  finalizer running allocator logic, a bug, and it shows as a hang that the suites' deadlines
  catch, never as a silently half-updated counter.
- Backend locks (6) are re-entrant, and their critical sections call nothing outside the
  backend, so a callback can neither run allocator logic inside one nor deadlock on one (the
  simulator's vector clocks are small dicts that may allocate, and so run the collector: safe,
  since a finalizer takes no lock).
- Fork: before a fork every lock is taken in this order (waiting at most
  :data:`FORK_LOCK_TIMEOUT_S` each, so a thread stuck holding one cannot block the fork), so no
  counter is half-updated in the child; the parent releases them afterwards, and the child
  replaces every lock by a fresh one, so it can allocate even if another thread held a lock when
  the process forked.
"""

from __future__ import annotations

import os
import threading
import weakref

__all__ = [
    "BACKEND",
    "CACHE",
    "DEVICE_LAYER",
    "FORK_LOCK_TIMEOUT_S",
    "HISTORY",
    "ORDER",
    "REGISTRY",
    "STATISTICS",
    "new_lock",
]

ORDER = ("arena registry", "statistics", "reuse cache", "device layer", "memory history", "backend")
"""The lock ranks' names, outermost first."""
REGISTRY, STATISTICS, CACHE, DEVICE_LAYER, HISTORY, BACKEND = range(len(ORDER))

FORK_LOCK_TIMEOUT_S = 1.0
"""How long the at-fork hook waits for each lock before forking without it."""

_owners: tuple[weakref.WeakSet, ...] = tuple(weakref.WeakSet() for _ in ORDER)
_held: list = []


def _make(rank: int):
    return threading.RLock() if rank == BACKEND else threading.Lock()


def new_lock(owner: object, rank: int):
    """A new lock of ``rank`` for ``owner``, which keeps it in its ``_lock`` attribute.

    The owner is registered (weakly) for the at-fork hooks, which take its lock before a fork
    and give it a fresh one in the child.

    Returns:
        A ``threading.Lock`` for the layers, a ``threading.RLock`` for ``BACKEND``.

    Raises:
        ValueError: ``rank`` is not one of the ranks above.
    """
    if rank not in range(len(ORDER)):
        raise ValueError(f"rank={rank!r}: expected 0 to {len(ORDER) - 1} ({', '.join(ORDER)})")
    _owners[rank].add(owner)
    return _make(rank)


def _before_fork() -> None:
    for owners in _owners:
        for owner in list(owners):
            lock = owner._lock
            if lock.acquire(timeout=FORK_LOCK_TIMEOUT_S):
                _held.append(lock)


def _after_fork_in_parent() -> None:
    while _held:
        _held.pop().release()


def _after_fork_in_child() -> None:
    _held.clear()
    for rank, owners in enumerate(_owners):
        for owner in list(owners):
            owner._lock = _make(rank)


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)
