"""The memory history and snapshots (issue 11, DESIGN 2.10), in-process on every backend.

What each event records and when, the stacks, the finalizer's frees, the annotations, the ring,
blocks awaiting their event, the snapshot's structure against PyTorch's, live blocks, the
knob, and that recording off leaves the allocator's stack exactly as it was. PyTorch's own
readers run in ``test_memory_interop.py``; the checks used here are in ``_snapshot_checks``.
"""

from __future__ import annotations

import gc
import inspect
import pickle
import re
import threading
import weakref

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

import allocator as dm
from allocator import LiveBlock, StackFrame
from allocator._history import ACTIONS, FREED, DeviceHistoryLayer, HistoryLayer, expanded
from allocator._stacks import FINALIZED

from . import _history_probes, _snapshot_checks, _stress

HERE = __file__


def actions(alloc) -> list[str]:
    return [event["action"] for event in alloc.snapshot()["device_traces"][0]]


def notes(alloc) -> list[dict]:
    return alloc.snapshot()["devmem"]["annotations"]


def line_of_next_statement() -> int:
    return inspect.currentframe().f_back.f_lineno + 1


# -- recording off costs nothing: the stack is the plain one -----------------------------------


def test_recording_puts_two_layers_in_the_stack_and_takes_them_out(make_alloc):
    alloc = make_alloc()
    plain = [layer._upstream for layer in alloc._layers()[:-1]]
    alloc.record_history(True)
    registry, stats = alloc._arenas, alloc._stats
    lower = stats if alloc._cache is None else alloc._cache
    assert type(registry._upstream) is HistoryLayer and registry._upstream._upstream is stats
    assert type(lower._upstream) is DeviceHistoryLayer
    assert lower._upstream._upstream is alloc._device_layer
    alloc.record_history(False)
    assert [layer._upstream for layer in alloc._layers()[:-1]] == plain
    with alloc.history():
        assert type(registry._upstream) is HistoryLayer
    assert [layer._upstream for layer in alloc._layers()[:-1]] == plain


def test_nothing_is_recorded_while_off(make_alloc):
    alloc = make_alloc()
    alloc.release(alloc.full(16, 1.0))
    assert actions(alloc) == []
    with alloc.history():
        alloc.release(alloc.full(16, 1.0))
    alloc.release(alloc.full(16, 1.0))
    assert actions(alloc).count("alloc") == 1


# -- the events ------------------------------------------------------------------------------


def test_a_round_trip_records_pytorchs_events_in_order(make_alloc, backend):
    alloc = make_alloc()
    with alloc.history():
        alloc.release(alloc.full(16, 1.0))
        buf = alloc.full(16, 1.0)
        alloc.release(buf)
        alloc.empty_cache()
    trace = alloc.snapshot()["device_traces"][0]
    if backend == "cpu":  # no reuse cache: every free goes to the device
        expected = ["segment_alloc", "alloc", "free_requested", "free_completed", "segment_free"]
        assert [event["action"] for event in trace] == expected * 2
    else:
        assert [event["action"] for event in trace] == [
            "segment_alloc",
            "alloc",
            "free_requested",
            "free_completed",
            "alloc",  # the cached block, reused
            "free_requested",
            "free_completed",
            "segment_free",  # empty_cache
        ]
        assert len({event["addr"] for event in trace}) == 1
    assert {event["size"] for event in trace} == {64}
    assert {event["stream"] for event in trace} == {0}
    assert all(
        set(event) == {"action", "addr", "size", "stream", "time_us", "frames"} for event in trace
    )


def test_stacks_start_at_the_callers_line(make_alloc):
    alloc = make_alloc()
    with alloc.history():
        line = line_of_next_statement()
        buf = alloc.add(alloc.full(4, 1.0), alloc.full(4, 2.0))
    alloc.release(buf)
    event = [e for e in alloc.snapshot()["device_traces"][0] if e["action"] == "alloc"][-1]
    assert event["frames"][0] == {
        "filename": HERE,
        "line": line,
        "name": "test_stacks_start_at_the_callers_line",
    }
    allocator_dir = dm.__file__.rsplit("/", 1)[0] + "/"
    assert not any(frame["filename"].startswith(allocator_dir) for frame in event["frames"])


def test_without_stacks_events_have_no_frames(make_alloc):
    alloc = make_alloc()
    with alloc.history(stacks=False):
        alloc.release(alloc.full(4, 1.0))
    snapshot = alloc.snapshot()
    assert all(event["frames"] == [] for event in snapshot["device_traces"][0])
    assert snapshot["devmem"]["stacks"] is False


def test_a_finalized_free_is_recorded_at_the_next_call_under_a_marker_frame(make_alloc):
    alloc = make_alloc()
    with alloc.history():
        buf = alloc.full(4, 1.0)
        del buf  # the finalizer only queues the block: nothing is recorded yet
        assert alloc._history.ring[-1][0] == "alloc"
        line = line_of_next_statement()
        alloc.full(8, 1.0)  # this call drains the queue
    free = next(e for e in alloc.snapshot()["device_traces"][0] if e["action"] == "free_requested")
    marker, caller = free["frames"][:2]
    assert (marker["filename"], marker["line"], marker["name"]) == FINALIZED
    assert (caller["filename"], caller["line"]) == (HERE, line)


def test_releases_carry_their_reason(make_alloc):
    alloc = make_alloc()
    with alloc.history():
        alloc.release(alloc.full(4, 1.0))
        alloc.full(4, 1.0).storage.resize_(0, "release_param")
    releases = [note for note in notes(alloc) if note["action"] == "release"]
    assert [(note["reason"], note["size"]) for note in releases] == [
        ("release()", 16),
        ("release_param", 16),
    ]
    assert all(note["frames"][0]["filename"] == HERE for note in releases)


def test_arena_exits_carry_depth_and_reclaimed_count(make_alloc):
    alloc = make_alloc()
    with alloc.history(), alloc.arena():
        held = [alloc.full(4, 1.0)]
        with alloc.arena() as inner:
            held += [alloc.full(8, 1.0) for _ in range(3)]
            inner.keep(held[-1])
    exits = [note for note in notes(alloc) if note["action"] == "arena_exit"]
    assert [(n["depth"], n["reclaimed"], n["bytes"]) for n in exits] == [(1, 2, 64), (0, 2, 48)]
    trace = alloc.snapshot()["device_traces"][0]
    for note in exits:  # each exit's frees follow its annotation
        frees = trace[note["trace_index"] : note["trace_index"] + 2 * note["reclaimed"]]
        assert [e["action"] for e in frees].count("free_requested") == note["reclaimed"]


@pytest.mark.backends("sim", "cuda")  # the cpu stub keeps no cache: nothing to evict
def test_cap_evictions_are_annotated_before_their_segment_free(make_alloc):
    alloc = make_alloc(cache_cap_bytes=4096)
    with alloc.history():
        for buf in [alloc.full(1024, 1.0) for _ in range(3)]:
            alloc.release(buf)
    evictions = [note for note in notes(alloc) if note["action"] == "cap_evict"]
    assert len(evictions) == alloc.stats().cap_evictions == 2
    trace = alloc.snapshot()["device_traces"][0]
    for note in evictions:
        after = trace[note["trace_index"]]
        assert (after["action"], after["addr"]) == ("segment_free", note["addr"])
    # a release's free completes as the cache takes the block, before the eviction it causes
    a, b, c = (event["addr"] for event in trace if event["action"] == "alloc")
    assert [(e["action"], e["addr"]) for e in trace[6:]] == [
        ("free_requested", a),
        ("free_completed", a),
        ("free_requested", b),
        ("free_completed", b),
        ("segment_free", a),
        ("free_requested", c),
        ("free_completed", c),
        ("segment_free", b),
    ]
    alloc.empty_cache()


@pytest.mark.backends("sim")
def test_an_oom_is_recorded_with_the_device_free_bytes(make_alloc):
    alloc = make_alloc(sim_capacity_bytes=4096)
    held = alloc.full(256, 1.0)
    with alloc.history(), pytest.raises(dm.DeviceOutOfMemory):
        alloc.full(2048, 1.0)
    oom = alloc.snapshot()["device_traces"][0][-1]
    assert oom["action"] == "oom" and "addr" not in oom
    assert (oom["size"], oom["device_free"], oom["stream"]) == (8192, 3072, 0)
    assert oom["frames"][0]["filename"] == HERE
    alloc.release(held)


@pytest.mark.backends("sim")
def test_time_is_the_simulated_clock_on_sim(make_alloc):
    alloc = make_alloc(sim_latency_us=5)
    with alloc.history():
        a = alloc.full(4, 1.0)
        alloc.device.advance(40)
        alloc.release(a)
    times = [event["time_us"] for event in alloc.snapshot()["device_traces"][0]]
    assert times == [0, 0, 40, 40]
    assert alloc.snapshot()["devmem"]["clock"] == "sim"


# -- blocks awaiting their event -----------------------------------------------------------


@pytest.mark.backends("sim")
def test_a_block_used_on_another_stream_awaits_its_event(make_alloc):
    # Freed on its own stream only, a block is reusable at once (stream order makes it safe):
    # free_completed follows free_requested. Recorded on a stream whose kernel is still in
    # flight, it waits for that stream's event: active_pending_free until then.
    alloc = make_alloc(sim_latency_us=10)
    side = alloc.new_stream("side")
    with alloc.history():
        alloc.release(alloc.full(4, 1.0))  # its fill completes at t=10; now t=0
        assert actions(alloc)[-2:] == ["free_requested", "free_completed"]
        with alloc.use_stream(side):
            on_side = alloc.full(2, 0.0)  # a kernel on side, until t=10
        buf = alloc.full(4, 1.0)  # the cached 16 B block, reused on its own stream
        buf.record_stream(side)
        alloc.release(buf)
        snapshot = alloc.snapshot()
        states = {s["total_size"]: s["blocks"][0]["state"] for s in snapshot["segments"]}
        assert states == {16: "active_pending_free", 8: "active_allocated"}
        segment = next(s for s in snapshot["segments"] if s["total_size"] == 16)
        assert (segment["allocated_size"], segment["active_size"]) == (0, 16)
        assert segment["stream"] == 0 and snapshot["device_traces"][0][-1]["stream"] == 0
        assert [e["stream"] for e in snapshot["device_traces"][0] if e["size"] == 8] == [1, 1]
        assert snapshot["device_traces"][0][-1]["action"] == "free_requested"
        _snapshot_checks.check_accounts(snapshot)  # TOTAL MEM counts it until it completes
        alloc.device.advance(10)
        kept = alloc.full(8, 1.0)  # an allocation finds it reusable first, as PyTorch's malloc
    assert actions(alloc)[-3:] == ["free_completed", "segment_alloc", "alloc"]
    states = {s["total_size"]: s["blocks"][0]["state"] for s in alloc.snapshot()["segments"]}
    assert states == {16: "inactive", 8: "active_allocated", 32: "active_allocated"}
    alloc.release(on_side)
    alloc.release(kept)


@pytest.mark.backends("sim")
def test_a_block_used_on_another_stream_completes_at_once_when_its_events_did(make_alloc):
    # record_stream on a stream with nothing in flight: the cache takes the block reusable, so
    # its free_completed follows at once, with the free's own time and stack
    alloc = make_alloc(sim_latency_us=10)
    side = alloc.new_stream("side")
    with alloc.history():
        buf, other = alloc.full(4, 1.0), alloc.full(2, 1.0)
        alloc.device.advance(10)
        buf.record_stream(side)
        alloc.release(buf)
        alloc.release(other)
    trace = alloc.snapshot()["device_traces"][0]
    assert [(e["action"], e["size"]) for e in trace[4:]] == [
        ("free_requested", 16),
        ("free_completed", 16),
        ("free_requested", 8),
        ("free_completed", 8),
    ]
    requested, completed = trace[4], trace[5]
    assert completed["time_us"] == requested["time_us"] == 10
    assert completed["frames"] == requested["frames"] != trace[1]["frames"]  # not the alloc's
    assert completed["frames"][0]["filename"] == HERE


@pytest.mark.backends("sim")
def test_a_pending_block_allocated_before_recording_has_no_frames(make_alloc):
    alloc = make_alloc(sim_latency_us=10)
    side = alloc.new_stream("side")
    before = alloc.full(4, 1.0)  # allocated while history was off: no frames
    with alloc.history():
        recorded = alloc.full(2, 1.0)  # one block with frames, so the frames map is not empty
        with alloc.use_stream(side):
            on_side = alloc.full(2, 0.0)  # a kernel on side, until t=10
        before.record_stream(side)
        alloc.release(before)
        snapshot = alloc.snapshot()
    pending = [s["blocks"][0] for s in snapshot["segments"] if s["total_size"] == 16]
    assert [(block["state"], block["frames"]) for block in pending] == [("active_pending_free", [])]
    alloc.device.advance(10)
    alloc.release(recorded)
    alloc.release(on_side)


@pytest.mark.backends("sim")
def test_a_flush_completes_a_pending_free_after_the_wait(make_alloc):
    alloc = make_alloc(sim_latency_us=10)
    side = alloc.new_stream("side")
    with alloc.history():
        with alloc.use_stream(side):
            alloc.release(alloc.full(2, 0.0))  # a kernel on side, until t=10
        buf = alloc.full(4, 1.0)
        buf.record_stream(side)
        alloc.release(buf)
        alloc.empty_cache()
    trace = alloc.snapshot()["device_traces"][0]
    # the flush frees the free lists first (waiting for side's fill), then the awaiting block
    assert [(e["action"], e["size"], e["time_us"]) for e in trace[-3:]] == [
        ("segment_free", 8, 10),
        ("free_completed", 16, 10),
        ("segment_free", 16, 10),
    ]


# -- the ring ---------------------------------------------------------------------------------


@pytest.mark.backends("sim")
def test_a_free_completed_at_once_is_one_ring_entry_and_all_its_events_in_entries(make_alloc):
    # what recording costs per free (issue 22, item 6): a free no other stream used is one
    # entry of the ring for its free_requested, its release annotation and its free_completed
    alloc = make_alloc()
    alloc.release(alloc.full(4, 1.0))  # cached: the round trips below reuse it
    with alloc.history():
        alloc.empty(4).storage.resize_(0, "release_param")
        buf = alloc.empty(4)
        del buf  # finalized: no release annotation
        alloc.release(alloc.empty(4))  # this call drains the queue first
        recorder = alloc._history
        assert [entry[0] for entry in recorder.ring] == ["alloc", FREED] * 3
        release, finalized, plain = (entry for entry in recorder.ring if entry[0] is FREED)
        assert release[6].reason == "release_param" and finalized[6] is None
        assert plain[6].reason == "release()"
        assert [(entry[0], entry[6]) for entry in recorder.entries()] == [
            ("alloc", None),
            ("free_requested", None),
            ("release", release[6]),
            ("free_completed", None),
            ("alloc", None),
            ("free_requested", None),
            ("free_completed", None),
            ("alloc", None),
            ("free_requested", None),
            ("release", plain[6]),
            ("free_completed", None),
        ]
        # every expanded entry has its FREED entry's fields
        assert {entry[1:6] for entry in recorder.entries()[1:4]} == {release[1:6]}
        alloc.record_history(True, max_entries=2)  # the ring keeps its newest 2 entries...
        assert [entry[0] for entry in recorder.ring] == ["alloc", FREED]
        # ... and max_entries counts events and annotations: the newest 2 of the 4 they are
        assert [entry[0] for entry in recorder.entries()] == ["release", "free_completed"]
    assert [(note["action"], note["reason"]) for note in notes(alloc)] == [("release", "release()")]


def test_expanded_keeps_the_newest_maxlen_events_and_annotations():
    freed = (FREED, 16, 4, 0, 7, (), None)
    alloc = ("alloc", 16, 4, 0, 5, (), None)
    assert [entry[0] for entry in expanded([alloc, freed], 9)] == [
        "alloc",
        "free_requested",
        "free_completed",
    ]
    assert [entry[0] for entry in expanded([alloc, freed], 1)] == ["free_completed"]
    assert expanded([alloc, freed], 0) == []
    assert expanded([], 3) == []


def test_entries_are_expanded_outside_the_recorder_s_lock(make_alloc, monkeypatch):
    # a snapshot of a big ring expands it in Python: other threads' allocations must not wait
    # on the recorder's lock meanwhile (it is held only to copy the ring)
    alloc = make_alloc()
    held = []

    def spy(ring, maxlen):
        held.append(alloc._history._lock.locked())
        return expanded(ring, maxlen)

    monkeypatch.setattr(dm._history, "expanded", spy)
    with alloc.history():
        alloc.release(alloc.full(4, 1.0))
        assert [entry[0] for entry in alloc._history.entries()][-1] in (
            "free_completed",
            "segment_free",
        )
    assert held == [False]


def test_the_ring_keeps_the_newest_events(make_alloc):
    alloc = make_alloc()
    with alloc.history(max_entries=3):  # annotations count too: release, arena_exit ...
        for _ in range(4):
            alloc.release(alloc.full(4, 1.0))
    snapshot = alloc.snapshot()
    kept = snapshot["device_traces"][0] + snapshot["devmem"]["annotations"]
    assert len(kept) == 3 and snapshot["devmem"]["max_entries"] == 3
    assert actions(alloc)[-1] in ("free_completed", "segment_free")
    alloc.record_history(True, max_entries=10)
    alloc.release(alloc.full(4, 1.0))
    before = alloc._history.entries()
    alloc.record_history(True, max_entries=2)  # while recording: keeps the newest two
    assert alloc._history.entries() == before[-2:]
    alloc.record_history(False)
    alloc.record_history(True)  # off to on: a fresh history
    assert actions(alloc) == []
    alloc.record_history(False)


def test_history_scopes_restore_the_recording_they_found(make_alloc):
    alloc = make_alloc()
    alloc.record_history(True, max_entries=50, stacks=False)
    with alloc.history(max_entries=500) as same:
        assert same is alloc and alloc._history.stacks and alloc._history.ring.maxlen == 500
    assert alloc._history.recording and not alloc._history.stacks
    assert alloc._history.ring.maxlen == 50
    alloc.record_history(False)
    with pytest.raises(KeyError), alloc.history():
        raise KeyError("inside")
    assert not alloc._history.recording


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"enabled": 1}, TypeError, "enabled must be a bool, got int 1"),
        ({"stacks": "yes"}, TypeError, "stacks must be a bool, got str 'yes'"),
        ({"max_entries": 1.5}, TypeError, "max_entries must be an integer, got float 1.5"),
        ({"max_entries": True}, TypeError, "max_entries must be an integer, got bool True"),
        ({"max_entries": 0}, ValueError, "max_entries must be >= 1, got 0"),
    ],
)
def test_bad_arguments_are_refused_and_change_nothing(make_alloc, kwargs, error, message):
    alloc = make_alloc()
    with pytest.raises(error) as info:
        alloc.record_history(**kwargs)
    assert str(info.value) == message
    assert not alloc._history.recording
    with pytest.raises(TypeError, match=r"^path must be a str or os\.PathLike, got int$"):
        alloc.dump_snapshot(3)
    with pytest.raises(TypeError, match=r"^path must be a str or os\.PathLike, got bytes$"):
        alloc.dump_snapshot(b"s.pickle")


# -- snapshots ----------------------------------------------------------------------------------

SEGMENT_KEYS = {
    "device",
    "address",
    "total_size",
    "allocated_size",
    "active_size",
    "requested_size",
    "stream",
    "segment_type",
    "segment_pool_id",
    "is_expandable",
    "frames",
    "blocks",
}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}


def test_a_snapshot_has_pytorchs_structure_and_adds_up(make_alloc, backend):
    alloc = make_alloc(cache_cap_bytes=1 << 20)
    with alloc.history():
        _stress.arena_stress(alloc, n=64, k=4, arenas=2)
        held = [alloc.full(n, 1.0) for n in (16, 300000)]  # a small and a large segment
        alloc.release(alloc.full(16, 1.0))
    snapshot = alloc.snapshot()
    assert set(snapshot) == {"segments", "device_traces", "devmem"}
    for segment in snapshot["segments"]:
        assert set(segment) == SEGMENT_KEYS
        assert all(set(block) == BLOCK_KEYS for block in segment["blocks"])
    types = {s["total_size"]: s["segment_type"] for s in snapshot["segments"]}
    assert (types[64], types[1200000]) == ("small", "large")
    states = [s["blocks"][0]["state"] for s in snapshot["segments"]]
    assert states.count("active_allocated") == 2
    assert states.count("inactive") == (0 if backend == "cpu" else len(states) - 2)
    assert own_part(snapshot["devmem"]["stats"]) == own_part(dataclass_dict(alloc.stats()))
    _snapshot_checks.check_accounts(snapshot)
    _snapshot_checks.check_segments(snapshot)
    _snapshot_checks.check_page_readable(pickle.dumps(snapshot, protocol=4))
    del held
    alloc.empty_cache()


def dataclass_dict(stats) -> dict:
    return {field: getattr(stats, field) for field in stats.__dataclass_fields__}


def own_part(stats: dict) -> dict:
    """``stats`` less ``device_free_bytes``: cudaMemGetInfo is device-wide, and other processes
    on the GPU (xdist workers, death-test children) move it between two reads; the rest is
    this allocator's own, and compares exactly."""
    assert 0 <= stats["device_free_bytes"] <= stats["device_total_bytes"], stats
    return {name: value for name, value in stats.items() if name != "device_free_bytes"}


def test_a_dumped_snapshot_is_the_snapshot_in_protocol_4(make_alloc, tmp_path):
    alloc = make_alloc()
    with alloc.history():
        keep = alloc.full(4, 1.0)
        alloc.dump_snapshot(tmp_path / "s.pickle")
    data = (tmp_path / "s.pickle").read_bytes()
    assert data[:2] == b"\x80\x04"
    _snapshot_checks.check_page_readable(data)
    loaded = pickle.loads(data)
    assert [e["action"] for e in loaded["device_traces"][0]] == ["segment_alloc", "alloc"]
    assert loaded["segments"][0]["blocks"][0]["frames"][0]["filename"] == HERE
    alloc.release(keep)


def test_live_blocks_list_every_live_storage_with_its_frames(make_alloc):
    alloc = make_alloc()
    before = alloc.full(8, 1.0)  # allocated while history was off
    with alloc.history():
        line = line_of_next_statement()
        during = alloc.full(4, 1.0)
        view = during.view(1, 2)
        alloc.release(alloc.full(16, 1.0))
    blocks = alloc.live_blocks()
    assert sorted(block.size for block in blocks) == [16, 32]
    assert blocks == sorted(blocks, key=lambda block: block.address)
    by_size = {block.size: block for block in blocks}
    assert by_size[32].frames == ()
    assert by_size[16].frames[0] == StackFrame(HERE, line, inspect.currentframe().f_code.co_name)
    assert by_size[16].stream == 0 and isinstance(by_size[16], LiveBlock)
    assert "allocated while history was off" in by_size[32].format()
    assert by_size[16].format().splitlines()[1].strip().startswith(f"{HERE}:{line} in test_")
    del view
    alloc.release(before)
    alloc.release(during)
    assert alloc.live_blocks() == []


def test_dropping_a_recording_allocator_records_nothing_and_frees_at_once():
    alloc = dm.Allocator(dm.AllocatorConfig(backend="sim"))
    alloc.record_history(True)
    for cached in [alloc.full(16, 1.0) for _ in range(3)]:
        alloc.release(cached)
    del cached
    queued = alloc.full(16, 1.0)
    alloc.full(32, 1.0)  # dropped at once: queued for the next call, which never comes
    device, recorder, registry = alloc.device, alloc._history, weakref.ref(alloc._arenas)
    events = len(recorder.ring)
    gc.disable()
    try:
        del alloc
        assert registry() is not None  # the queued buffer's storage keeps it
        del queued
        assert registry() is None and device.used_bytes == 0  # freed at once, no collection
    finally:
        gc.enable()
    assert len(recorder.ring) == events  # the teardown recorded nothing


# -- default allocator and knob (in children: the default allocator is per process) -----------


def test_the_module_level_forms_act_on_the_default_allocator(death, pin):
    report = death.run(_history_probes.default_allocator, "functions", env=pin()).returned
    assert report["recording"] is False
    assert report["actions"] == [
        "segment_alloc",
        "alloc",
        "segment_alloc",
        "alloc",
        "free_requested",
        "free_completed",
        *(["segment_free"] if report["actions"][-1] == "segment_free" else []),
    ]
    assert report["frames"][:2] == [True, True] and not any(report["frames"][2:])
    assert [size for size, _ in report["live"]] == [64]
    assert report["live"][0][1][0] == "default_allocator"


@pytest.mark.parametrize(("value", "frames"), [("1", False), ("stacks", True)])
def test_devmem_history_records_from_the_first_allocation(death, pin, value, frames):
    report = death.run(
        _history_probes.default_allocator, "knob", env=pin(DEVMEM_HISTORY=value)
    ).returned
    assert report["recording"] is True
    assert report["actions"][:2] == ["segment_alloc", "alloc"]
    assert set(report["frames"]) == {frames}


def test_devmem_history_off_records_nothing(death, pin):
    report = death.run(_history_probes.default_allocator, "knob", env=pin(DEVMEM_HISTORY="0"))
    assert report.returned["actions"] == [] and report.returned["recording"] is False


def test_a_bad_devmem_history_is_an_error_naming_the_variable(death, pin):
    outcome = death.run(_history_probes.default_allocator, "knob", env=pin(DEVMEM_HISTORY="yes"))
    assert outcome.raised is not None and outcome.raised.type == "allocator.ConfigError"
    assert "ValueError" in outcome.raised.bases
    assert outcome.raised.message == "DEVMEM_HISTORY='yes': expected 0, 1 or stacks"


# -- the checks have teeth ------------------------------------------------------------------


def test_the_workloads_pass_every_check(death, backend, pin):
    report = death.run(_history_probes.workloads, backend, env=pin()).returned
    assert report["verdicts"] == {"accounts": None, "segments": None, "page": None}
    assert report["live"] == 8 * 65536 * 4  # the 8 buffers not released


@pytest.mark.backends("sim", "cuda")  # cpu frees to the device: no cache to miscount
@pytest.mark.parametrize(
    ("mutant", "check", "message"),
    [
        ("history_skips_free_completed", "accounts", "alloc - free_completed (trace's TOTAL MEM)"),
        ("snapshot_counts_cache_as_live", "segments", "active_allocated blocks hold"),
    ],
)
def test_teeth_a_history_or_snapshot_that_miscounts_is_caught(
    death, backend, pin, mutant, check, message
):
    report = death.run(_history_probes.workloads, backend, mutant, env=pin()).returned
    assert report["verdicts"][check].startswith(message), report["verdicts"]


def overfill(snapshot: dict) -> None:
    """A block past the end of the first segment (its blocks no longer add up to it)."""
    segment = snapshot["segments"][0]
    end = segment["address"] + segment["total_size"]
    block = {"address": end, "size": 8, "requested_size": 8, "state": "inactive", "frames": []}
    segment["blocks"].append(block)


@pytest.mark.parametrize(
    ("check", "snapshot_change", "message"),
    [
        ("accounts", lambda s: s["device_traces"][0].pop(), "alloc - free_requested"),
        ("segments", overfill, "Segment size mismatch"),
        ("page", lambda s: s["segments"][0].update(device=1), "segments[0]: device 1"),
        ("page", lambda s: s["device_traces"][0][0].pop("addr"), "device_traces[0][0]"),
        ("page", lambda s: s["devmem"].update(bad={1, 2}), "pickle opcode EMPTY_SET"),
    ],
)
def test_teeth_each_check_fails_on_a_broken_snapshot(make_alloc, check, snapshot_change, message):
    alloc = make_alloc()
    with alloc.history():
        keep = alloc.full(4, 1.0)
    snapshot = alloc.snapshot()
    snapshot_change(snapshot)
    with pytest.raises(AssertionError, match=re.escape(message)):
        if check == "accounts":
            _snapshot_checks.check_accounts(snapshot)
        elif check == "segments":
            _snapshot_checks.check_segments(snapshot)
        else:
            _snapshot_checks.check_page_readable(pickle.dumps(snapshot, protocol=4))
    alloc.release(keep)


def test_teeth_the_page_check_refuses_protocol_5():
    with pytest.raises(AssertionError, match="pickle protocol 5: the page reads 2 to 4"):
        _snapshot_checks.check_page_readable(pickle.dumps({"segments": []}, protocol=5))


# -- the DeepSpeed seed's question: when was each gathered parameter finally released? ------


@pytest.mark.backends("sim")
def test_a_zero3_release_is_recorded_with_its_stack_and_awaits_the_compute_stream(make_alloc):
    from runtime.zero3 import Zero3
    from runtime.zero3_graph import run_graph

    alloc = make_alloc(sim_latency_us=5)
    zero3 = Zero3(alloc, 2)
    zero3.register("w", 4097)  # padded to 4098
    with alloc.history():
        x = alloc.full(4097, 1.0)
        out = run_graph(zero3, [("w",)], x).output
    (release,) = [n for n in notes(alloc) if n["action"] == "release"]
    assert (release["reason"], release["size"]) == ("release_param", 4098 * 4)
    assert [f["name"] for f in release["frames"][:2]] == ["_free", "release"]
    here = inspect.currentframe().f_code.co_name
    assert here in [f["name"] for f in release["frames"]]
    # gathered on the all-gather stream, recorded on the compute stream whose op is in flight
    gathered = [s for s in alloc.snapshot()["segments"] if s["total_size"] == 4098 * 4]
    assert [(s["stream"], s["blocks"][0]["state"]) for s in gathered] == [
        (1, "active_pending_free")
    ]
    alloc.release(x)
    alloc.release(out)


# -- what the mutation run asked for: times, frames and maps of completed frees -----------------


def awaiting_block(alloc):
    """Free a 16-byte block recorded on a side stream whose kernel runs until t=10 (sim,
    latency 10): it awaits that stream's event. Returns the lines of its allocation and free,
    and the side stream."""
    side = alloc.new_stream("side")
    with alloc.use_stream(side):
        on_side = alloc.full(2, 0.0)  # a kernel on side, until t=10
    alloc_line = line_of_next_statement()
    buf = alloc.full(4, 1.0)
    buf.record_stream(side)
    free_line = line_of_next_statement()
    alloc.release(buf)
    alloc.release(on_side)
    return alloc_line, free_line, side


@pytest.mark.backends("sim")
@pytest.mark.parametrize("free", ["release", "arena_exit"])
def test_a_free_completes_its_own_blocks_not_others_found_ready(make_alloc, free):
    # PyTorch processes events at malloc: a block whose awaited event completed meanwhile is
    # completed by the next allocation (or a snapshot), not by another block's free
    alloc = make_alloc(sim_latency_us=10)
    with alloc.history():
        if free == "arena_exit":
            alloc.arena_enter()
        kept = alloc.empty(32)
        awaiting_block(alloc)  # 16 bytes awaiting the side stream until t=10
        alloc.device.advance(10)  # its event is done; no allocation has looked since
        if free == "arena_exit":
            alloc.arena_exit()
        else:
            alloc.release(kept)
        events = [
            entry
            for entry in expanded(alloc._history.ring, alloc._history.ring.maxlen)
            if entry[0] in ACTIONS
        ]
        tail = [(entry[0], entry[2]) for entry in events][-2:]
        assert tail == [("free_requested", 128), ("free_completed", 128)]
        assert [block.nbytes for block in alloc._history.pending] == [16]
    assert event_of(alloc, "free_completed", 16)["time_us"] == 10  # the snapshot's look


def event_of(alloc_or_trace, action: str, size: int) -> dict:
    trace = alloc_or_trace
    if not isinstance(trace, list):
        trace = alloc_or_trace.snapshot()["device_traces"][0]
    (event,) = [e for e in trace if (e["action"], e["size"]) == (action, size)]
    return event


@pytest.mark.backends("sim")
@pytest.mark.parametrize("when", ["snapshot", "allocation", "stop"])
def test_a_completed_free_is_stamped_when_found_with_its_free_stack(make_alloc, when):
    alloc = make_alloc(sim_latency_us=10)
    alloc.record_history(True)
    _, free_line, _ = awaiting_block(alloc)
    assert alloc._history.pending
    alloc.device.advance(25)  # the side stream's event completed at t=10; now t=25
    if when == "snapshot":  # a snapshot while recording records the completions first
        trace = alloc.snapshot()["device_traces"][0]
        alloc.record_history(False)
    elif when == "allocation":  # the next allocation, before its own events
        alloc.release(alloc.full(8, 1.0))
        trace = alloc.snapshot()["device_traces"][0]
        assert [(e["action"], e["size"]) for e in trace[-5:-2]] == [
            ("free_completed", 16),
            ("segment_alloc", 32),
            ("alloc", 32),
        ]
        alloc.record_history(False)
    else:  # stopping records them too
        alloc.record_history(False)
        trace = alloc.snapshot()["device_traces"][0]
    completed = event_of(trace, "free_completed", 16)
    requested = event_of(trace, "free_requested", 16)
    assert (completed["time_us"], requested["time_us"]) == (25, 0)
    assert completed["frames"] == requested["frames"]
    assert (completed["frames"][0]["filename"], completed["frames"][0]["line"]) == (HERE, free_line)
    assert not alloc._history.pending
    alloc.empty_cache()


@pytest.mark.backends("sim")
def test_a_free_completed_during_an_allocation_is_recorded_before_its_alloc(
    make_alloc, monkeypatch
):
    # On a GPU, time passes during a device malloc: the awaited event may complete after the
    # allocation's first look. The simulator's clock moves only when told: here, in malloc.
    alloc = make_alloc(sim_latency_us=10)
    device = alloc.device
    malloc = device.malloc

    def slow_malloc(nbytes):
        device.advance(30)
        return malloc(nbytes)

    with alloc.history():
        _, free_line, _ = awaiting_block(alloc)
        monkeypatch.setattr(device, "malloc", slow_malloc)
        kept = alloc.full(32, 1.0)  # a cache miss: the device malloc takes the clock to 30
        monkeypatch.undo()
    trace = alloc.snapshot()["device_traces"][0]
    assert [(e["action"], e["size"], e["time_us"]) for e in trace[-3:]] == [
        ("segment_alloc", 128, 30),
        ("free_completed", 16, 30),
        ("alloc", 128, 30),
    ]
    assert trace[-2]["frames"][0]["line"] == free_line
    alloc.release(kept)
    alloc.empty_cache()


@pytest.mark.backends("sim")
def test_a_flushed_awaiting_block_completes_with_its_free_stack(make_alloc):
    alloc = make_alloc(sim_latency_us=10)
    with alloc.history():
        _, free_line, _ = awaiting_block(alloc)
        alloc.empty_cache()
    trace = alloc.snapshot()["device_traces"][0]
    completed = event_of(trace, "free_completed", 16)
    assert completed["time_us"] == 10 and completed["frames"][0]["line"] == free_line
    assert completed["frames"] == event_of(trace, "free_requested", 16)["frames"]


@pytest.mark.backends("sim")
def test_an_awaiting_block_shows_the_stack_it_was_allocated_with(make_alloc):
    alloc = make_alloc(sim_latency_us=10)
    before = alloc.full(8, 1.0)  # allocated while history was off
    with alloc.history():
        alloc_line, _, side = awaiting_block(alloc)
        before.record_stream(side)  # side's kernel runs until t=10
        alloc.release(before)  # freed while recording: it had no frames
        snapshot = alloc.snapshot()
    blocks = {s["total_size"]: s["blocks"][0] for s in snapshot["segments"]}
    assert (blocks[16]["state"], blocks[32]["state"]) == ("active_pending_free",) * 2
    assert (blocks[16]["frames"][0]["filename"], blocks[16]["frames"][0]["line"]) == (
        HERE,
        alloc_line,
    )
    assert blocks[32]["frames"] == []
    assert alloc._history.alloc_frames == {}  # a freed block's frames moved to its free
    alloc.empty_cache()


def test_the_recorder_forgets_the_blocks_the_device_got_back(make_alloc):
    alloc = make_alloc()
    before = alloc.full(8, 1.0)  # allocated (its segment too) while history was off
    if alloc._cache is not None:
        alloc.release(before)
    with alloc.history():
        if alloc._cache is None:
            alloc.release(before)  # no cache: freed to the device at once
        alloc.release(alloc.full(4, 1.0))
        alloc.empty_cache()
        recorder = alloc._history
        assert (recorder.alloc_frames, recorder.segment_frames, recorder.addresses) == ({}, {}, {})
        assert recorder.pending == {}
    trace = alloc.snapshot()["device_traces"][0]
    assert [e["size"] for e in trace if e["action"] == "segment_free"] == [32, 16]


def test_block_stream_is_the_default_streams_until_the_block_is_handed_out():
    from allocator._history import block_stream

    alloc = dm.Allocator(dm.AllocatorConfig(backend="sim"))
    block = alloc.device.malloc(16)
    assert block.stream is None and block_stream(block) == 0
    side = alloc.new_stream("side")
    block.stream, block.stream_id = side, side.id  # what the device layer does
    assert block_stream(block) == 1
    block.stream = None  # the reuse cache drops the reference while it holds the block
    assert block_stream(block) == 1
    alloc.device.free(block)


def test_a_fresh_allocator_reports_the_history_defaults(make_alloc):
    devmem = make_alloc().snapshot()["devmem"]
    assert (devmem["recording"], devmem["stacks"], devmem["max_entries"]) == (False, True, 100_000)


@pytest.mark.backends("sim")
def test_a_segment_has_every_field_pytorch_writes(make_alloc):
    alloc = make_alloc()
    name = inspect.currentframe().f_code.co_name
    with alloc.history():
        line = line_of_next_statement()
        small = alloc.full(1 << 18, 1.0)  # exactly 1 MiB: still PyTorch's small pool
        large = alloc.full((1 << 18) + 1, 1.0)
        alloc.release(large)
    by_size = {s["total_size"]: s for s in alloc.snapshot()["segments"]}
    here = [{"filename": HERE, "line": line, "name": name}]
    below = [{"filename": HERE, "line": line + 1, "name": name}]

    def segment(size, address, sizes, segment_type, frames, state, block_frames):
        allocated, active, requested = sizes  # literal: a wrong formula must not pass twice
        return {
            "device": 0,
            "address": address,
            "total_size": size,
            "allocated_size": allocated,
            "active_size": active,
            "requested_size": requested,
            "stream": 0,
            "segment_type": segment_type,
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": frames,
            "blocks": [
                {
                    "address": address,
                    "size": size,
                    "requested_size": size,
                    "state": state,
                    "frames": block_frames,
                }
            ],
        }

    small_address, large_address = (by_size[n]["address"] for n in (1 << 20, (1 << 20) + 4))
    trimmed = {  # the innermost frame of each stack: the rest is pytest's
        n: {
            **s,
            "frames": s["frames"][:1],
            "blocks": [{**b, "frames": b["frames"][:1]} for b in s["blocks"]],
        }
        for n, s in by_size.items()
    }
    assert trimmed == {
        1 << 20: segment(
            1 << 20, small_address, (1 << 20,) * 3, "small", here, "active_allocated", here
        ),
        (1 << 20) + 4: segment(
            (1 << 20) + 4, large_address, (0, 0, 0), "large", below, "inactive", []
        ),
    }
    alloc.release(small)
    alloc.empty_cache()


def test_record_history_starts_by_default_and_takes_a_ring_of_one(make_alloc):
    alloc = make_alloc()
    alloc.record_history()  # enabled=True is the default
    assert alloc._history.recording and alloc._history.stacks
    alloc.record_history(True, max_entries=1)  # the smallest ring: the newest entry alone
    alloc.release(alloc.full(4, 1.0))
    assert len(alloc._history.entries()) == 1
    alloc.record_history(False)
    assert not alloc._history.recording


@pytest.mark.parametrize("recording", [False, True])
def test_the_devmem_part_says_how_it_was_recorded(make_alloc, backend, recording):
    alloc = make_alloc()
    if recording:
        alloc.record_history(True, max_entries=7, stacks=False)
    devmem = alloc.snapshot()["devmem"]
    devmem["stats"] = own_part(devmem["stats"])
    assert devmem == {
        "format": 1,
        "backend": backend,
        "clock": "sim" if backend == "sim" else "host",
        "recording": recording,
        "stacks": not recording,  # the default, until a recording says otherwise
        "max_entries": 7 if recording else 100_000,
        "reconciled": 0,
        "stats": own_part(dataclass_dict(alloc.stats())),
        "annotations": [],
    }
    alloc.record_history(False)


@pytest.mark.backends("sim")
def test_an_annotation_has_its_time_stream_and_reason(make_alloc):
    alloc = make_alloc()
    side = alloc.new_stream("side")
    name = inspect.currentframe().f_code.co_name
    with alloc.use_stream(side):
        buf = alloc.full(4, 1.0)
    alloc.device.advance(40)
    with alloc.history():
        line = line_of_next_statement()
        alloc.release(buf)
    (note,) = notes(alloc)
    note["frames"] = note["frames"][:1]
    assert note == {
        "action": "release",
        "trace_index": 1,  # after its free_requested
        "time_us": 40,
        "addr": note["addr"],
        "size": 16,
        "stream": 1,
        "reason": "release()",
        "frames": [{"filename": HERE, "line": line, "name": name}],
    }
    alloc.empty_cache()


@pytest.mark.backends("sim")
def test_after_recording_stopped_a_snapshot_forgets_the_freed_blocks(make_alloc):
    alloc = make_alloc(sim_latency_us=10)
    alloc.record_history(True)
    awaiting_block(alloc)  # a 16-byte block awaiting side's event until t=10
    kept = alloc.full(8, 1.0)
    alloc.record_history(False)
    assert alloc._history.pending  # still awaiting when recording stopped
    alloc.device.advance(10)
    (block,) = [s["blocks"][0] for s in alloc.snapshot()["segments"] if s["total_size"] == 16]
    assert (block["state"], block["frames"]) == ("inactive", [])  # reusable: no frames
    alloc.release(kept)  # freed while off: the recorder hears nothing of it
    alloc.empty_cache()
    assert alloc.snapshot()["segments"] == []
    recorder = alloc._history
    assert (recorder.alloc_frames, recorder.segment_frames, recorder.addresses) == ({}, {}, {})


def test_live_block_format_lists_its_frames_up_to_a_limit():
    frames = tuple(StackFrame(f"{c}.py", n, c) for n, c in enumerate("fgh", start=1))
    block = LiveBlock(0x1000, 64, 2, frames)
    full = (
        "0x1000: 64 bytes on stream 2, allocated at\n"
        "    f.py:1 in f\n    g.py:2 in g\n    h.py:3 in h"
    )
    assert block.format() == full == block.format(max_frames=3)
    assert block.format("  ", 1) == (
        "  0x1000: 64 bytes on stream 2, allocated at\n      f.py:1 in f\n      ... 2 more frames"
    )
    assert LiveBlock(0x10, 8, 0, ()).format("> ") == (
        "> 0x10: 8 bytes on stream 0, allocated while history was off (or without stacks)"
    )


def test_dump_writes_the_snapshot_to_a_str_path(tmp_path):
    from allocator import _snapshot

    _snapshot.dump({"segments": []}, str(tmp_path / "s.pickle"))
    assert pickle.loads((tmp_path / "s.pickle").read_bytes()) == {"segments": []}


# -- issue 22: a snapshot is self-consistent whenever it is taken; frames are a storage's --------

KIB16 = 16 << 10


def test_a_snapshot_after_recording_stopped_ends_at_its_segments(make_alloc, backend):
    from allocator._snapshot import OFF_FRAME
    from allocator._timeline import sites, timeline

    alloc = make_alloc()
    alloc.record_history(True)
    bufs = [alloc.full(KIB16 // 4, 1.0) for _ in range(6)]
    alloc.record_history(False)
    for buf in bufs[:4]:
        alloc.release(buf)
    snapshot = alloc.snapshot()
    _snapshot_checks.check_consistent(snapshot)
    _snapshot_checks.check_accounts(snapshot)
    line = timeline(snapshot)
    assert (line.peak[0], line.live[-1], min(line.live)) == (6 * KIB16, 2 * KIB16, 0)
    (site,) = sites(snapshot)
    assert (site.peak_bytes, site.live_end_bytes, site.allocs) == (6 * KIB16, 2 * KIB16, 6)
    added = snapshot["devmem"]["reconciled"]
    tail = snapshot["device_traces"][0][-added:]
    per_free = ["free_requested", "free_completed"] + (["segment_free"] if backend == "cpu" else [])
    assert [event["action"] for event in tail] == per_free * 4
    assert all(event["frames"] == [OFF_FRAME] for event in tail)
    alloc.record_history(True)  # a fresh history: nothing to reconcile
    assert alloc.snapshot()["devmem"]["reconciled"] == 0
    alloc.record_history(False)
    for buf in bufs[4:]:
        alloc.release(buf)


@pytest.mark.backends("sim")
def test_an_awaiting_free_completed_while_off_is_reconciled(make_alloc):
    alloc = make_alloc(sim_latency_us=10)
    alloc.record_history(True)
    awaiting_block(alloc)
    alloc.record_history(False)
    before = alloc.snapshot()
    _snapshot_checks.check_consistent(before)
    assert before["devmem"]["reconciled"] == 0  # still awaiting: as the trace left it
    alloc.device.advance(10)
    after = alloc.snapshot()
    _snapshot_checks.check_consistent(after)
    assert [e["action"] for e in after["device_traces"][0][-after["devmem"]["reconciled"] :]] == [
        "free_completed"
    ]
    alloc.empty_cache()


def test_a_block_allocated_again_while_off_has_no_frames_of_its_first_life(make_alloc, backend):
    alloc = make_alloc()
    alloc.record_history(True)
    first = alloc.full(4, 1.0)
    kept = alloc.full(8, 1.0)  # live across the stop and the next start: keeps its frames
    alloc.record_history(False)
    block = first._st.block
    alloc.release(first)
    second = alloc.full(4, 1.0)  # while off: the cached block again (not on cpu)
    assert (second._st.block is block) == (backend != "cpu")
    by_size = {live.size: live for live in alloc.live_blocks()}
    assert by_size[16].frames == () and by_size[32].frames != ()
    snapshot = alloc.snapshot()
    _snapshot_checks.check_consistent(snapshot)
    blocks = {s["total_size"]: s["blocks"][0] for s in snapshot["segments"]}
    assert blocks[16]["frames"] == [] and blocks[32]["frames"] != []
    if backend != "cpu":  # the reuse is reconstructed: a free and an allocation while off
        tail = snapshot["device_traces"][0][-snapshot["devmem"]["reconciled"] :]
        assert [e["action"] for e in tail] == ["free_requested", "free_completed", "alloc"]
    alloc.record_history(True)  # start forgets the frames of the block's first life
    by_size = {live.size: live for live in alloc.live_blocks()}
    assert by_size[16].frames == () and by_size[32].frames != ()
    alloc.record_history(False)
    alloc.release(second)
    alloc.release(kept)


_OPS = ("alloc", "alloc", "release", "drop", "side", "toggle", "advance", "empty", "snapshot")


@pytest.mark.backends("sim", "cpu")
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    ops=st.lists(st.tuples(st.sampled_from(_OPS), st.integers(0, 7)), max_size=40),
    max_entries=st.sampled_from([4, 100_000]),
    cap=st.sampled_from([0, 256]),  # a capped cache evicts: frees to the device while off
)
def test_every_snapshot_is_consistent_and_its_frames_are_its_storages(
    backend, ops, max_entries, cap
):
    # Random programs that switch recording on and off: every snapshot's trace, undone from its
    # segments, finds each block as its events left it (the memory_viz page's state history
    # view), and a live block has frames exactly when its storage was allocated while on.
    config = dm.AllocatorConfig(backend=backend, sim_latency_us=3, cache_cap_bytes=cap)
    alloc = dm.Allocator(config)
    side = alloc.new_stream("side")
    bufs: list = []  # (buffer, allocated while recording)
    for op, arg in [*ops, ("snapshot", 0)]:
        recording = alloc._history.recording
        if op == "alloc":
            bufs.append((alloc.full(1 << arg, 1.0), recording))
        elif op in ("release", "drop", "side") and bufs:
            buf, _ = bufs.pop(arg % len(bufs))
            if op == "side" and backend == "sim":
                with alloc.use_stream(side):
                    alloc.release(alloc.full(1, 0.0))  # a kernel on side until now + 3
                buf.record_stream(side)
            if op != "drop":
                alloc.release(buf)
            del buf
        elif op == "toggle":
            alloc.record_history(not recording, max_entries=max_entries)
        elif op == "advance" and backend == "sim":
            alloc.device.advance(arg)
        elif op == "empty":
            alloc.empty_cache()
        elif op == "snapshot":
            _snapshot_checks.check_consistent(alloc.snapshot())
            recorded = sorted((buf._st.block.address, on) for buf, on in bufs)
            found = sorted((block.address, bool(block.frames)) for block in alloc.live_blocks())
            assert found == recorded
    bufs.clear()
    alloc.empty_cache()


def test_teeth_the_consistency_check_fires_on_a_trace_left_at_the_stop(make_alloc):
    alloc = make_alloc()
    alloc.record_history(True)
    bufs = [alloc.full(4, 1.0) for _ in range(2)]
    alloc.record_history(False)
    alloc.release(bufs.pop())
    snapshot = alloc.snapshot()
    _snapshot_checks.check_consistent(snapshot)
    del snapshot["device_traces"][0][-snapshot["devmem"]["reconciled"] :]
    with pytest.raises(AssertionError, match=r"device_traces\[0\]\[\d+\] (alloc|segment_alloc)"):
        _snapshot_checks.check_consistent(snapshot)
    alloc.release(bufs.pop())


# -- paths the tests above leave aside -----------------------------------------------------------


@pytest.mark.backends("sim")
def test_a_block_cached_before_recording_is_allocated_at_its_address(make_alloc):
    alloc = make_alloc()
    alloc.release(alloc.full(4, 1.0))  # cached while history is off
    with alloc.history():
        buf = alloc.full(4, 1.0)  # the cached block, whose address history never read
        alloc.release(buf)
    (segment,) = alloc.snapshot()["segments"]
    trace = alloc.snapshot()["device_traces"][0]
    assert [(e["action"], e["addr"]) for e in trace] == [
        ("alloc", segment["address"]),
        ("free_requested", segment["address"]),
        ("free_completed", segment["address"]),
    ]


@pytest.mark.backends("sim")
def test_an_arena_exit_keeps_each_pending_blocks_allocation_frames(make_alloc):
    alloc = make_alloc(sim_latency_us=10)
    side = alloc.new_stream("side")
    with alloc.use_stream(side):
        on_side = alloc.full(2, 0.0)  # a kernel on side, until t=10
    alloc.arena_enter()
    unrecorded = alloc.full(4, 1.0)  # allocated while history was off: no frames
    with alloc.history():
        alloc_line = line_of_next_statement()
        recorded = alloc.full(16, 1.0)
        for buf in (unrecorded, recorded):
            buf.record_stream(side)
        exit_line = line_of_next_statement()
        alloc.arena_exit()  # both freed, awaiting side's event
        snapshot = alloc.snapshot()
    blocks = {s["total_size"]: s["blocks"][0] for s in snapshot["segments"]}
    assert [blocks[size]["state"] for size in (16, 64)] == ["active_pending_free"] * 2
    assert blocks[16]["frames"] == []
    assert (blocks[64]["frames"][0]["filename"], blocks[64]["frames"][0]["line"]) == (
        HERE,
        alloc_line,
    )
    (requested,) = [e for e in snapshot["device_traces"][0] if e["action"] == "free_requested"][:1]
    assert (requested["frames"][0]["filename"], requested["frames"][0]["line"]) == (
        HERE,
        exit_line,
    )  # the exit's own stack, not the finalizer's marker
    alloc.release(on_side)


@pytest.mark.backends("sim")
def test_a_device_free_that_did_not_move_the_clock_records_no_synchronize(make_alloc):
    alloc = make_alloc(sim_latency_us=10)
    with alloc.history():
        alloc.release(alloc.full(4, 1.0))  # its fill runs until t=10
        alloc.empty_cache()  # cudaFree: the host waits until t=10
        alloc.release(alloc.full(4, 1.0))  # t = 10..20
        alloc.device.advance(20)  # complete by now
        alloc.empty_cache()  # nothing to wait for
    syncs = [n for n in notes(alloc) if n["action"] == "device_synchronize"]
    assert [(n["from_us"], n["to_us"]) for n in syncs] == [(0, 10)]


@pytest.mark.backends("cpu")
def test_a_block_used_on_another_stream_is_freed_to_the_device_at_once_on_cpu(make_alloc):
    alloc = make_alloc()  # no cache: the device layer frees it, its events complete at once
    side = alloc.new_stream("side")
    with alloc.history():
        buf = alloc.full(4, 1.0)
        buf.record_stream(side)
        alloc.release(buf)
    assert actions(alloc) == [
        "segment_alloc",
        "alloc",
        "free_requested",
        "free_completed",
        "segment_free",
    ]


# -- reconcile: every way a block can change while recording is off -------------------------------

_A, _P, _I = "active_allocated", "active_pending_free", "inactive"


@pytest.mark.parametrize(
    ("then", "now", "reallocated", "expected"),
    [
        # the same segment (address and size): frees on the trace's stream, allocations on now's
        ((16, _A), (16, _A), True, ["free_requested@1", "free_completed@1", "alloc@2"]),
        ((16, _A), (16, _P), False, ["free_requested@1"]),
        ((16, _A), (16, _I), False, ["free_requested@1", "free_completed@1"]),
        ((16, _P), (16, _A), False, ["free_completed@1", "alloc@2"]),
        ((16, _P), (16, _I), False, ["free_completed@1"]),
        ((16, _I), (16, _A), False, ["alloc@2"]),
        ((16, _I), (16, _P), False, ["alloc@2", "free_requested@2"]),
        ((16, _A), (16, _A), False, []),
        ((16, _P), (16, _P), False, []),
        ((16, _I), (16, _I), False, []),
        # the trace's segment went back to the device
        ((16, _A), None, False, ["free_requested@1", "free_completed@1", "segment_free@1"]),
        ((16, _P), None, False, ["free_completed@1", "segment_free@1"]),
        ((16, _I), None, False, ["segment_free@1"]),
        # a segment the trace does not know of
        (None, (32, _I), False, ["segment_alloc@2"]),
        (None, (32, _A), False, ["segment_alloc@2", "alloc@2"]),
        (None, (32, _P), False, ["segment_alloc@2", "alloc@2", "free_requested@2"]),
        # another segment at the same address, in the same state
        ((16, _I), (32, _I), False, ["segment_free@1", "segment_alloc@2"]),
        (
            (16, _A),
            (32, _A),
            False,
            [
                "free_requested@1",
                "free_completed@1",
                "segment_free@1",
                "segment_alloc@2",
                "alloc@2",
            ],
        ),
    ],
)
def test_reconcile_adds_the_events_of_each_change_made_while_off(then, now, reallocated, expected):
    from allocator._snapshot import OFF_FRAME, reconcile

    address = 0x1000
    before = {} if then is None else {address: (*then, 1, None)}
    after = {} if now is None else {address: (*now, 2)}
    events = reconcile(before, after, {address} if reallocated else set(), 1234)
    assert [f"{e['action']}@{e['stream']}" for e in events] == expected
    for event in events:
        size = then[0] if event["stream"] == 1 else now[0]
        assert event == {
            "action": event["action"],
            "addr": address,
            "size": size,
            "stream": event["stream"],
            "time_us": 1234,
            "frames": [OFF_FRAME],
        }


def test_reconcile_orders_its_events_by_address():
    from allocator._snapshot import reconcile

    before = {0x3000: (8, "inactive", 0, None), 0x1000: (8, "inactive", 0, None)}
    events = reconcile(before, {0x2000: (8, "inactive", 0)}, set(), 5)
    assert [(e["action"], e["addr"]) for e in events] == [
        ("segment_free", 0x1000),
        ("segment_alloc", 0x2000),
        ("segment_free", 0x3000),
    ]


@pytest.mark.backends("sim")
def test_the_events_a_snapshot_adds_are_stamped_at_the_snapshot_on_the_blocks_stream(make_alloc):
    from allocator._snapshot import OFF_FRAME

    alloc = make_alloc(sim_latency_us=10)
    alloc.record_history(True)
    side = alloc.new_stream("side")
    with alloc.use_stream(side):
        buf = alloc.full(4, 1.0)
    alloc.record_history(False)
    alloc.release(buf)  # while off
    alloc.device.advance(25)
    now = alloc.device.clock_us()
    snapshot = alloc.snapshot()
    _snapshot_checks.check_page_readable(pickle.dumps(snapshot, protocol=4))
    tail = snapshot["device_traces"][0][-snapshot["devmem"]["reconciled"] :]
    (segment,) = snapshot["segments"]
    assert tail == [
        {
            "action": action,
            "addr": segment["address"],
            "size": 16,
            "stream": side.id,
            "time_us": now,
            "frames": [OFF_FRAME],
        }
        for action in ("free_requested", "free_completed")
    ]
    assert side.id != 0 and now > 0
    alloc.empty_cache()


class _Hold:
    """One point where another thread waits while this one acts (the races below): the code
    under test calls :meth:`here` in the other thread; :meth:`race` runs it."""

    def __init__(self) -> None:
        self.inside, self.go = threading.Event(), threading.Event()

    def here(self) -> None:
        """Called by the other thread at the held point: wait there until released."""
        self.inside.set()
        self.go.wait(10)

    def race(self, work, meanwhile) -> None:
        """Run ``work()`` in another thread; once it is held, run ``meanwhile()`` here; then let
        it go and join it. Fails if ``work`` raised (or never reached the held point)."""
        errors = []

        def run() -> None:
            try:
                work()
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        try:
            assert self.inside.wait(10)
            meanwhile()
        finally:
            self.go.set()
            thread.join(10)
        assert errors == []


def _restart(alloc) -> None:
    alloc.record_history(False)
    alloc.record_history(True)


@pytest.mark.backends("sim")
def test_a_device_free_in_flight_survives_another_thread_restarting_the_history(
    make_alloc, monkeypatch
):
    # empty_cache frees to the device with no allocator lock held; meanwhile another thread
    # stops and starts the history (which begins with a fresh address map): the free in flight
    # still completes and records its segment_free
    alloc = make_alloc()
    alloc.record_history(True)
    alloc.release(alloc.full(4, 1.0))  # cached
    hold, device_free = _Hold(), alloc.device.free

    def free(block):
        hold.here()
        device_free(block)

    monkeypatch.setattr(alloc.device, "free", free)
    hold.race(alloc.empty_cache, lambda: _restart(alloc))
    assert alloc.stats().cache_bytes == 0 and alloc.snapshot()["segments"] == []
    assert actions(alloc) == ["segment_free"]
    alloc.record_history(False)


@pytest.mark.backends("sim")
def test_a_snapshot_taken_while_another_thread_stops_the_history_is_whole(make_alloc, monkeypatch):
    # stop() ends recording, then walks what the allocator holds to keep the state the trace
    # ends in; a snapshot taken in between has no such state yet and reconciles nothing
    alloc = make_alloc()
    alloc.record_history(True)
    buf = alloc.full(4, 1.0)
    alloc.release(alloc.full(8, 1.0))  # cached
    hold, blocks, snapshots = _Hold(), type(alloc._cache).blocks, []
    stopper = []

    def paused_blocks(cache):
        if threading.get_ident() in stopper:
            hold.here()
        return blocks(cache)

    def stop():
        stopper.append(threading.get_ident())
        alloc.record_history(False)

    monkeypatch.setattr(type(alloc._cache), "blocks", paused_blocks)
    hold.race(stop, lambda: snapshots.append(alloc.snapshot()))
    (snapshot,) = snapshots
    assert not alloc._history.recording
    assert snapshot["devmem"]["recording"] is False and snapshot["devmem"]["reconciled"] == 0
    _snapshot_checks.check_consistent(snapshot)
    alloc.release(buf)


@pytest.mark.backends("sim", "cpu")
def test_an_allocation_in_flight_across_a_stop_lets_the_history_start_again(
    make_alloc, monkeypatch
):
    # another thread's allocation passes the history layer while recording stops: the frames it
    # leaves behind belong to no storage known at the stop, and the next start drops them
    alloc = make_alloc()
    alloc.record_history(True)
    hold, malloc, out = _Hold(), alloc.device.malloc, []

    def paused_malloc(nbytes):
        hold.here()
        return malloc(nbytes)

    monkeypatch.setattr(alloc.device, "malloc", paused_malloc)
    hold.race(lambda: out.append(alloc.full(4, 1.0)), lambda: alloc.record_history(False))
    monkeypatch.undo()
    alloc.record_history(True)
    (live,) = alloc.live_blocks()
    assert live.frames == ()  # its frames were recorded after the stop, for no known storage
    alloc.record_history(False)
    alloc.release(out.pop())
