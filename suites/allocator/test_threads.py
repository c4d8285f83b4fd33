"""Thread safety and fork safety of one allocator shared by several threads."""

from __future__ import annotations

import contextlib
import os
import random
import sys
import threading
import time

import pytest

from allocator import Allocator, AllocatorConfig

CAP = 64 << 10
SIZES = (256, 1024, 4096, 8192)  # elements: 1, 4, 16 and 32 KiB blocks


def test_four_threads_keep_every_invariant():
    alloc = Allocator(AllocatorConfig(backend="sim", cache_cap_bytes=CAP, sim_latency_us=3))
    errors: list[BaseException] = []
    violations: list[str] = []
    done = threading.Event()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            held = []
            for _ in range(5000):
                buf = alloc.empty(rng.choice(SIZES))
                if rng.random() < 0.5:
                    alloc.release(buf)
                elif rng.random() < 0.5:
                    held.append(buf)
                    if len(held) > 8:
                        held.pop(0)  # finalized here
                # else: dropped at once, finalized by refcounting
            held.clear()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def monitor() -> None:
        while not done.is_set():
            stats = alloc.stats()
            if not stats.cache_bytes <= CAP:
                violations.append(f"cache over the cap: {stats}")
            if stats.live_bytes < 0 or stats.live_buffers < 0:
                violations.append(f"negative live counts: {stats}")
            time.sleep(0.001)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    watcher = threading.Thread(target=monitor)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, inside critical sections too
    try:
        watcher.start()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        done.set()
        watcher.join()
        sys.setswitchinterval(interval)
    assert not any(thread.is_alive() for thread in threads), "a worker did not finish"
    assert errors == []
    assert violations == []
    stats = alloc.stats()
    assert (stats.live_bytes, stats.live_buffers) == (0, 0)
    assert stats.alloc_count == stats.free_count == 4 * 5000
    assert stats.alloc_count == stats.cache_hits + stats.cache_misses
    assert stats.device_mallocs == stats.cache_misses
    assert stats.cache_bytes <= CAP
    # every block is either cached or handed back to the device
    assert alloc.device.used_bytes == stats.cache_bytes
    assert stats.device_mallocs - stats.device_frees == len(alloc._cache)


def _wait_child(pid: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child did not finish within {timeout_s} s (deadlocked on the lock?)")


@pytest.mark.parametrize("hold_s", [0.2, 3.0], ids=["released-soon", "held-past-fork"])
def test_a_fork_child_can_allocate_while_another_thread_holds_the_lock(hold_s):
    alloc = Allocator(AllocatorConfig(backend="sim"))
    kept = alloc.full(16, 1.0)
    holding = threading.Event()

    def hold() -> None:  # every layer's lock, and the device's, in the documented order
        locks = [layer._lock for layer in alloc._layers()] + [alloc.device._lock]
        with contextlib.ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            holding.set()
            time.sleep(hold_s)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait()
    pid = os.fork()
    if pid == 0:  # the child: allocate, compute, release, exit without running pytest's atexit
        code = 1
        try:
            buf = alloc.full(16, 2.0)
            ok = alloc.sum(alloc.add(buf, kept)) == 48.0 and alloc.release(buf) == 1
            code = 0 if ok and alloc.stats().live_buffers == 1 else 2
        finally:
            os._exit(code)
    try:
        assert _wait_child(pid, timeout_s=30) == 0
    finally:
        holder.join()
    assert alloc.stats().live_buffers == 1
