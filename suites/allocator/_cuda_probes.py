"""Death-test targets for the ``cuda`` backend's logic, run over the fake CuPy of
:mod:`suites.allocator._fake_cupy` (or with CuPy hidden), so they need no GPU.

Each runs in its own child: building a CUDA device marks the process fork-unsafe, which must not
leak into the test process. Each hands ``allocator.fork_unsafe_reason`` to the harness, as the
project's conftest does in the test process, so fork refusal is checked through that seam.
"""

from __future__ import annotations

import dataclasses
import gc
import pickle
import sys

import harness
from allocator import (
    Allocator,
    AllocatorConfig,
    BackendUnavailable,
    DeviceOutOfMemory,
    fork_unsafe_reason,
)
from allocator import get_allocator as default_allocator
from allocator.cuda import cupy_allocator
from allocator.device import Device, backend_unavailable_reason
from allocator.device import cuda as cuda_backend
from allocator.device.cuda import CudaDevice

from . import _fake_cupy, _probes

MIB = 1 << 20

harness.add_fork_safety_check(fork_unsafe_reason)


def without_cupy() -> dict:
    """CuPy hidden (``import cupy`` fails): the reason, and the error choosing ``cuda`` gives."""
    sys.modules["cupy"] = None  # type: ignore[assignment]
    try:
        Allocator(AllocatorConfig(backend="cuda"))
    except BackendUnavailable as exc:
        error = str(exc)
    else:
        error = None
    return {
        "reason": backend_unavailable_reason("cuda"),
        "error": error,
        "fork_unsafe": harness.fork_unsafe_reason(),
    }


def no_device() -> dict:
    """CuPy present but no device: ``BackendUnavailable`` carries CuPy's reason."""
    _fake_cupy.install(device_count=0)
    try:
        Allocator(AllocatorConfig(backend="cuda"))
    except BackendUnavailable as exc:
        return {"error": str(exc), "fork_unsafe": harness.fork_unsafe_reason()}
    return {"error": None}


def without_nvrtc() -> dict:
    """CuPy and a device present, NVRTC missing: the probe kernel makes the backend
    unavailable with CuPy's reason (CUDA was initialized by then)."""
    _fake_cupy.install(nvrtc=False)
    try:
        Allocator(AllocatorConfig(backend="cuda"))
    except BackendUnavailable as exc:
        return {"error": str(exc), "fork_unsafe": harness.fork_unsafe_reason()}
    return {"error": None}


def backend_logic(latency: int = 0, mutant: str | None = None) -> dict:
    """Ops, the cap, events, the OOM flush, error propagation and interop on the fake CuPy.

    The allocator is built on device 1, then device 0 is made current: every operation must
    still run on device 1 (``wrong_device`` counts those that did not).
    """
    fake = _fake_cupy.install(total_bytes=10 * MIB, latency=latency, device_count=2, current=1)
    if mutant == "evict_without_wait":
        CudaDevice.wait = lambda self, block: None
    if mutant == "kernels_on_the_current_device":
        CudaDevice.fill = Device.fill
        CudaDevice.add = Device.add
    alloc = Allocator(AllocatorConfig(backend="cuda", cache_cap_bytes=MIB, arena_debug="raise"))
    sys.modules["cupy"].cuda.runtime.setDevice(0)
    report: dict = {
        "fork_unsafe": harness.fork_unsafe_reason(),
        "allocator_fork_unsafe": fork_unsafe_reason(),
        "device_id": alloc.device.device_id,
    }
    try:
        harness.run_child(_probes.stats, style="fork")
    except harness.HarnessError as exc:
        report["fork_refused"] = str(exc)

    a, b = alloc.full(16, 3.0), alloc.full(16, 5.0)
    report["add"] = alloc.to_numpy(alloc.add(a, b)).tolist()
    report["fma_sum"] = alloc.sum(alloc.fma(a, b, a))
    del a, b
    alloc.empty_cache()  # start the cap workload from an empty cache

    # the seed's cap workload: 32 blocks of 256 KiB returned under a 1 MiB cap
    buffers = [alloc.full(65536, 1.0) for _ in range(32)]
    for buf in buffers:
        alloc.release(buf)
    report["cap"] = dataclasses.asdict(alloc.stats())
    report["events_made"] = fake.events_made

    # the cached blocks are reused, with their events (no new event per return)
    again = [alloc.full(65536, 2.0) for _ in range(4)]
    for buf in again:
        alloc.release(buf)
    report["events_made_after_reuse"] = fake.events_made
    report["hits"] = alloc.stats().cache_hits

    # OOM: 1 MiB cached + 8.5 MiB held on a 10 MiB device; 1 MiB more fits only after the flush
    held = alloc.empty(17 * MIB // 8)
    big = alloc.empty(MIB // 4)
    report["oom"] = dataclasses.asdict(alloc.stats())
    del held, big

    # any other CUDA error propagates with its name, without a flush
    fake.fail_next = [_fake_cupy.ILLEGAL_ADDRESS]
    flushes = alloc.stats().oom_flushes
    try:
        alloc.empty(12345)
    except DeviceOutOfMemory:
        report["other_error"] = "DeviceOutOfMemory"
    except Exception as exc:
        report["other_error"] = f"{type(exc).__name__}: {exc}"
    report["flushes_on_other_error"] = alloc.stats().oom_flushes - flushes

    # CuPy interop: memory drawn through cupy_allocator counts, and returns to the cache
    allocate = cupy_allocator(alloc)
    live = alloc.stats().live_bytes
    pointer = allocate(1001)
    report["interop_live_delta"] = alloc.stats().live_bytes - live
    report["interop_owner"] = type(pointer.mem.owner).__name__
    report["interop_device"] = pointer.mem.device_id
    report["interop_memory"] = [
        pointer.mem.size,
        pointer.ptr == pointer.mem.owner.storage.block.ptr,
    ]
    del pointer
    report["interop_after_drop"] = alloc.stats().live_bytes - live
    zero = allocate(0)
    report["interop_zero"] = [zero.ptr, zero.mem.size, zero.mem.device_id]
    try:
        cupy_allocator(Allocator(AllocatorConfig(backend="sim")))
    except ValueError as exc:
        report["interop_wrong_backend"] = str(exc)

    # OOM through the interop: the error is also CuPy's, so CuPy's own fallbacks catch it
    try:
        allocate(64 * MIB)
    except MemoryError as exc:
        cupy_oom = sys.modules["cupy"].cuda.memory.OutOfMemoryError
        report["interop_oom"] = {
            "is_cupy_oom": isinstance(exc, cupy_oom),
            "is_device_oom": isinstance(exc, DeviceOutOfMemory),
            "message": str(exc),
            "reason": exc.reason,
            "cupy_fields": [exc._size, exc._total, exc._limit],
            "pickles_as": type(pickle.loads(pickle.dumps(exc))).__name__,
        }

    # the OOM path collects cyclic garbage before the flush: 6 MiB held only by a cycle fits
    # again once collected (the flush alone, of a 1 MiB cache, could not make room for 7 MiB)
    gc.disable()
    try:
        cycle = [alloc.empty(6 * MIB // 4)]
        cycle.append(cycle)
        del cycle
        flushes = alloc.stats().oom_flushes
        report["after_collect"] = alloc.empty(7 * MIB // 4).size * 4
        report["flushes_after_collect"] = alloc.stats().oom_flushes - flushes
    finally:
        gc.enable()

    report["memory_info"] = list(alloc.device.memory_info())
    report["violations"] = len(fake.violations)
    report["wrong_device"] = [list(entry) for entry in fake.wrong_device[:5]]
    return report


def teardown(at_exit: bool = False) -> dict:
    """Drop an allocator holding cached blocks with the collector off: its blocks are freed at
    once (``cudaFree``), except after the exit handlers ran (interpreter shutdown)."""
    fake = _fake_cupy.install()
    gc.disable()
    alloc = Allocator(AllocatorConfig(backend="cuda"))
    for buf in [alloc.full(256, 1.0) for _ in range(3)]:
        alloc.release(buf)
    del buf  # a live buffer, freed or not, keeps its allocator's layers alive
    dropped = alloc.full(512, 1.0)
    before = {"cached": alloc.stats().cache_bytes, "device_blocks": len(fake.memory)}
    del dropped  # queued by its finalizer, not yet freed
    if at_exit:
        cuda_backend._at_exit()  # what the interpreter runs before it finalizes
    del alloc
    return {**before, "device_blocks_after": len(fake.memory), "frees": fake.frees}


def interop_on_the_default_allocator() -> dict:
    """``cupy_allocator()`` with no argument draws from the default allocator
    (``DEVMEM_BACKEND=cuda`` in the child's environment)."""
    _fake_cupy.install()
    allocate = cupy_allocator()
    pointer = allocate(64)
    return {
        "owner_is_default": pointer.mem.owner.storage._home is default_allocator()._arenas,
        "live": default_allocator().stats().live_bytes,
    }


def history_on_cuda(latency: int = 0) -> dict:
    """The memory history on the fake CuPy: releases under a 1 MiB cap, an OOM after the
    flush, and more releases of buffers recorded on a second stream, while recording; what the
    snapshot checks say, and whether its addresses are the device pointers (the cuda backend's
    block address is ``ptr``)."""
    from . import _history_probes

    _fake_cupy.install(total_bytes=4 * MIB, latency=latency)
    alloc = Allocator(AllocatorConfig(backend="cuda", cache_cap_bytes=MIB))
    with alloc.history():
        held = [alloc.full(65536, 1.0) for _ in range(12)]
        pointers = sorted(buf.storage.block.ptr for buf in held[:4])
        for buf in held[4:8]:
            alloc.release(buf)
        try:
            alloc.empty(8 * MIB)  # never fits: the cache is flushed, then an oom
        except DeviceOutOfMemory:
            pass
        side = alloc.new_stream("side")
        with alloc.use_stream(side):
            held.append(alloc.full(16, 0.0))  # a fill in flight on the side stream
        for buf in [alloc.full(65536, 3.0), *held[8:11]]:
            buf.record_stream(side)  # used on the side stream: its event there is awaited
            alloc.release(buf)  # cached again, under the cap: pending while that event runs
        snapshot = alloc.snapshot()
    live = sorted(
        segment["address"]
        for segment in snapshot["segments"]
        if segment["blocks"][0]["state"] == "active_allocated"
    )
    return {
        "verdicts": _history_probes.verdicts(snapshot),
        "pointers_are_addresses": set(pointers) <= set(live),
        "states": sorted({s["blocks"][0]["state"] for s in snapshot["segments"]}),
        "actions": sorted({e["action"] for e in snapshot["device_traces"][0]}),
    }


def streams_logic(latency: int = 0, mutant: str | None = None) -> dict:
    """Streams on the fake CuPy: a new stream is a non-blocking ``cupy.cuda.Stream`` made on the
    backend's device (1, while device 0 is current), kernels of a ``use_stream`` block run with
    it current, ``wait_stream`` records an event on the other stream and waits on it, and a
    block recorded on another stream records an event there at its free and is reused by its
    own stream once that event is done."""
    fake = _fake_cupy.install(latency=latency, device_count=2, current=1)

    def log() -> list:  # what happened since the last call: [what, stream] each
        entries = [list(entry[:2]) for entry in fake.log]
        fake.log.clear()
        return entries

    if mutant == "free_ignores_record_stream":
        record = CudaDevice.record

        def null_only(self, block):
            block.stream_uses = None
            record(self, block)

        CudaDevice.record = null_only
    alloc = Allocator(AllocatorConfig(backend="cuda"))
    cupy = sys.modules["cupy"]
    cupy.cuda.runtime.setDevice(0)
    side = alloc.new_stream("side")
    report: dict = {
        "default_is_null": alloc.default_stream.handle is cupy.cuda.Stream.null,
        "side": [side.handle.name, side.handle.non_blocking, side.handle.device],
    }
    log()
    scope = alloc.use_stream(side)  # held past its block: its exit alone restores CuPy's
    with scope:
        a = alloc.full(16, 1.0)
        report["current_inside"] = [cupy.cuda.get_current_stream() is side.handle, fake.current]
    report["current_after"] = [
        cupy.cuda.get_current_stream() is cupy.cuda.Stream.null,
        fake.current,
    ]
    with scope:  # the same object entered again
        report["reentered"] = [cupy.cuda.get_current_stream() is side.handle, fake.current]
    report["after_reentry"] = [
        cupy.cuda.get_current_stream() is cupy.cuda.Stream.null,
        alloc.current_stream() is alloc.default_stream,
    ]
    del scope
    report["fill_log"] = log()
    alloc.default_stream.wait_stream(side)
    report["wait_log"] = log()
    b = alloc.mul(a, a)  # on the default (null) stream
    report["mul_log"] = log()
    a.record_stream(alloc.default_stream)
    block = a.storage.block
    alloc.release(a)  # an event on side (its own) and one on the null stream (recorded)
    report["free_log"] = log()
    report["awaiting"] = [[s.name for s in streams] for _, streams in alloc._cache.awaiting()]
    with alloc.use_stream(side):
        again = alloc.empty(16)  # the null stream's event queried again: done after `latency`
    report["reused"] = again.storage.block is block
    report["sum"] = alloc.sum(b)
    del again, b
    alloc.empty_cache()
    report["violations"] = len(fake.violations)
    report["wrong_device"] = [list(entry) for entry in fake.wrong_device[:5]]
    return report


def events_logic() -> dict:
    """Events on the fake CuPy: ``alloc.new_event()`` is a timing-free ``cupy.cuda.Event`` made
    on the backend's device (1, while device 0 is current); ``record_event``,
    ``wait_event``, ``query`` and ``synchronize`` call CuPy's on that device."""
    fake = _fake_cupy.install(latency=1, device_count=2, current=1)
    alloc = Allocator(AllocatorConfig(backend="cuda"))
    cupy = sys.modules["cupy"]
    cupy.cuda.runtime.setDevice(0)
    side = alloc.new_stream("side")
    made = fake.events_made
    event = alloc.new_event()
    report: dict = {"made": fake.events_made - made, "device": event.handle.device}
    with alloc.use_stream(side):
        a = alloc.full(16, 1.0)
    fake.log.clear()
    side.record_event(event)
    alloc.default_stream.wait_event(event)
    report["log"] = [list(entry[:3]) for entry in fake.log]
    report["first_query"] = event.query()  # the fill is in flight for one more query
    event.synchronize()
    report["after_sync"] = event.query()
    report["sum"] = alloc.sum(alloc.mul(a, a))
    report["wrong_device"] = [list(entry) for entry in fake.wrong_device[:5]]
    report["violations"] = len(fake.violations)
    return report


def what_the_zygote_imported() -> dict:
    """In a forkserver child, before anything of it touches CuPy: whether the zygote had
    imported CuPy (the project's conftest preloads it where cuda runs), and whether CUDA is
    initialized in this process (it must not be: importing CuPy creates no context)."""
    return {
        "cupy": "cupy" in sys.modules,
        "fork_unsafe": fork_unsafe_reason(),
        "cupy_initialized_cuda": getattr(sys.modules.get("cupy"), "_fake", None) is not None
        and sys.modules["cupy"]._fake.initialized_in is not None,
    }


def fake_fork_after_init() -> dict:
    """The fake's CUDA in a forked child: a process forked before the first runtime call may
    use it; one forked after cannot (``cudaErrorInitializationError``), as with real CUDA."""
    import os

    fake = _fake_cupy.install()
    runtime = sys.modules["cupy"].cuda.runtime

    def in_a_fork() -> str:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                runtime.free(runtime.malloc(64))
                verdict = "ok"
            except Exception as exc:  # the fake's CUDARuntimeError
                verdict = f"{type(exc).__name__}: {exc}"
            os.write(write, verdict.encode())
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        with os.fdopen(read) as pipe:
            return pipe.read()

    before = in_a_fork()
    runtime.getDeviceCount()  # the first runtime call of this process: "CUDA" is initialized
    after = in_a_fork()
    return {
        "before": before,
        "after": after,
        "here": runtime.malloc(64) > 0,
        "initialized_in_this_process": fake.initialized_in == os.getpid(),
    }


def fake_stream_read(waits: str) -> float:
    """A buffer written on a side stream, read on the default stream: with ``waits`` "none"
    the read is unordered (the fake aborts); "wait_stream" and "synchronize" order it."""
    _fake_cupy.install()
    alloc = Allocator(AllocatorConfig(backend="cuda"))
    side = alloc.new_stream("side")
    with alloc.use_stream(side):
        written = alloc.full(16, 3.0)
    if waits == "wait_stream":
        alloc.default_stream.wait_stream(side)
    elif waits == "synchronize":
        side.synchronize()
    return alloc.sum(written)


def fake_memory_info(other_tenants: bool) -> dict:
    """``memGetInfo`` twice around nothing, and after a 1 MiB ``malloc``."""
    _fake_cupy.install(total_bytes=64 * MIB, other_tenants=other_tenants)
    runtime = sys.modules["cupy"].cuda.runtime
    first, second = runtime.memGetInfo(), runtime.memGetInfo()
    runtime.malloc(MIB)
    third = runtime.memGetInfo()
    return {"free": [first[0], second[0], third[0]], "total": third[1]}


def cupy_memory_read_on_another_stream(waits: bool) -> dict:
    """The stream check (raise mode) and the CuPy interop: memory handed to CuPy under
    ``use_stream(side)`` counts as written on ``side``; the allocator then reads it on the
    default stream, after ``default.wait_stream(side)`` or not."""
    from allocator import StreamRaceError

    _fake_cupy.install(race_check=False)  # only the allocator's check judges
    alloc = Allocator(AllocatorConfig(backend="cuda", stream_check="raise"))
    allocate = cupy_allocator(alloc)
    side = alloc.new_stream("side")
    with alloc.use_stream(side):
        pointer = allocate(64)  # CuPy would fill it on side, which the check cannot see
    buf = pointer.mem.owner
    if waits:
        alloc.default_stream.wait_stream(side)
    try:
        return {"sum": alloc.sum(buf), "error": None}
    except StreamRaceError as exc:
        return {"sum": None, "error": str(exc)}
