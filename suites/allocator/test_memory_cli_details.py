"""``python -m allocator.memory``: details the broader tests in ``test_memory_cli`` leave open.

The snapshots PyTorch took drawn as marks, ``plot --top 0``, the exact words of the help, of a
refused pickle, of a thinned picture's axis and of every structural check of a snapshot; a
file's summary at its edges (no event, a full ring counted on device 0); the peak's point; and
what the readers promise about their cost: a well-formed event never takes the slow check, a
frame list checked and freed while streaming never vouches for a later one, ``overview`` and
``sites`` keep no level per event, and a file name is made relative once per scan.
"""

from __future__ import annotations

import os
import pickle

import pytest

from allocator import _timeline, memory
from allocator._timeline import (
    ACTIONS,
    check_snapshot,
    overview,
    scan_device,
    sites,
    timeline,
    timeline_of,
)

from .test_memory_cli import describe

SNAPSHOT_MARKS = {
    "segments": [
        {
            "total_size": 4096,
            "blocks": [
                {"size": 1024, "state": "active_allocated"},
                {"size": 1024, "state": "active_allocated"},
                {"size": 2048, "state": "inactive"},
            ],
        }
    ],
    "device_traces": [
        [
            {"action": "segment_alloc", "addr": 0, "size": 4096},
            {"action": "alloc", "addr": 0, "size": 1024},
            {"action": "snapshot", "addr": 0, "size": 0},  # after event 2: x 2
            {"action": "alloc", "addr": 1024, "size": 1024},
            {"action": "snapshot", "addr": 0, "size": 0},  # after event 4: x 3
        ]
    ],
}


def test_each_snapshot_pytorch_took_is_a_dashed_green_line_counted_once(drawn, tmp_path):
    memory.plot(SNAPSHOT_MARKS, tmp_path / "t.png")
    seen = describe(drawn[-1])
    dashed = ["#1a9641", "--", 0.8, "None", 6.0, True, "default"]
    assert seen["lines"][1:] == [
        ["snapshot taken (2)", *dashed, [2.0, 2.0], [0.0, 1.0]],
        [None, *dashed, [3.0, 3.0], [0.0, 1.0]],  # the first one names them
    ]
    assert seen["legend"][-1][-1] == "snapshot taken (2)"  # one legend entry for both


def test_plot_with_top_0_bands_every_site_as_others(drawn, tmp_path, capsys):
    memory.plot(SNAPSHOT_MARKS, tmp_path / "t.png", top=0)
    cached = "cached (reuse cache, blocks awaiting their event)"
    bands = [(band[0], band[3]) for band in describe(drawn[-1])["bands"]]
    assert bands == [("other sites", 2.0), (cached, 4.0)]  # KiB: 2 live, 4 reserved
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(SNAPSHOT_MARKS))
    out = tmp_path / "u.png"
    assert memory.main(["plot", str(path), "-o", str(out), "--top", "0"]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    assert [(band[0], band[3]) for band in describe(drawn[-1])["bands"]] == bands


def test_a_persistent_id_is_refused_in_these_words(tmp_path):
    path = tmp_path / "s.pickle"
    path.write_bytes(b"\x80\x04P0\n.")  # PERSID "0"
    with pytest.raises(ValueError) as info:
        memory.load(path)
    assert str(info.value) == (
        f"{path}: not a pickled memory snapshot (it holds a persistent id; a snapshot has none)"
    )


def test_the_plot_help_describes_the_picture_in_these_words(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        memory.main(["plot", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "Draw the live bytes over time, stacked by allocation site (the largest sites by peak in"
        " bands of their own), the cached bytes on top, and marks: arena exits, releases, cap"
        " evictions, OOMs, and the snapshots PyTorch took." in out
    )


def test_a_thinned_picture_says_so_on_its_axis_in_these_words(drawn, tmp_path):
    count = memory.MAX_POINTS + 1
    trace = [{"action": "alloc", "addr": i, "size": 8} for i in range(count)]
    snapshot = {"segments": [], "device_traces": [trace]}
    line = timeline(snapshot)
    kept = len(memory.thinned(line.live, line.reserved))
    memory.plot(snapshot, tmp_path / "t.png")
    assert drawn[-1].axes[0].get_xlabel() == (
        f"{memory.EVENT_AXIS}; {count:,} events drawn as {kept:,} points (each stretch's first,"
        " lowest and highest levels)"
    )


def test_no_command_is_a_usage_error_naming_the_commands(capsys):
    with pytest.raises(SystemExit) as info:
        memory.main([])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.endswith(
        "python -m allocator.memory: error: the following arguments are required: {plot,summary}\n"
    )


def test_one_event_on_the_time_axis_says_the_clock_never_moved(drawn, tmp_path):
    one = {"segments": [], "device_traces": [[{"action": "oom", "size": 0, "time_us": 7}]]}
    memory.plot(one, tmp_path / "t.png", use_time=True)
    assert drawn[-1].axes[0].get_xlabel() == memory.STILL_CLOCK_AXIS
    memory.plot(one, tmp_path / "t.png")  # not asked for time: the plain event axis
    assert drawn[-1].axes[0].get_xlabel() == memory.EVENT_AXIS


def test_thinned_keeps_every_point_up_to_exactly_as_many_as_asked():
    live = list(range(8))
    assert memory.thinned(live, live, 8) == list(range(8))
    assert len(memory.thinned([*live, 8], [*live, 8], 8)) < 9  # one more: thinned


def test_thinned_to_9_points_keeps_the_extremes_of_two_stretches():
    # (9 - 1) // 4 = 2 stretches of 4 points at most, and the last point: 9 at most
    live = [5, 0, 5, 5, 9, 5, 5, 1, 5, 5]  # the second half's lowest, 1 at 7, is no extreme
    reserved = [3, 3, 3, 3, 3, 3, 3, 3, 3, 8]  # of the whole
    assert memory.thinned(live, reserved, 9) == [0, 1, 4, 5, 7, 9]


def _ring(device0: int, device1: int, notes: int, max_entries: int) -> dict:
    """A snapshot whose ring held ``device0`` events of device 0 and ``notes`` annotations."""

    def allocs(count):
        return [{"action": "alloc", "addr": i, "size": 8} for i in range(count)]

    return {
        "segments": [],
        "device_traces": [allocs(device0), allocs(device1)],
        "devmem": {
            "max_entries": max_entries,
            "annotations": [{"action": "release", "trace_index": 0}] * notes,
        },
    }


FULL = " (the ring is full: older events were dropped)"


@pytest.mark.parametrize(
    ("snapshot", "device", "head"),
    [
        # the segments alone: what was live before a trace with no event
        (
            {
                "segments": [
                    {"total_size": 64, "blocks": [{"size": 24, "state": "active_allocated"}]}
                ],
                "device_traces": [[], []],
                "devmem": {"annotations": [{"action": "release", "trace_index": 0}]},
            },
            None,
            [
                "backend torch: 0 events",
                "peak live 24 B after event 0; at the end: live 24 B, cached 40 B, reserved 64 B",
                "arena exits 0, releases 1, cap evictions 0, OOMs 0",
            ],
        ),
        # the ring counts device 0's events (and the annotations), whichever device is read
        (_ring(3, 1, 1, 4), None, [f"backend torch: 3 events{FULL}"]),
        (_ring(3, 1, 1, 4), 1, [f"backend torch: 1 events{FULL}"]),
        (_ring(1, 3, 1, 4), 1, ["backend torch: 3 events"]),
        (_ring(0, 3, 2, 3), None, ["backend torch: 3 events"]),  # 2 of 3 held: not full
    ],
)
def test_summary_of_a_file_at_the_edges_is_the_summary_of_its_snapshot(
    tmp_path, snapshot, device, head
):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    text = memory.summary(path, device=device)
    assert text == memory.summary(snapshot, device=device)
    assert text.splitlines()[: len(head)] == head


def _alloc(**fields) -> dict:
    return {"action": "alloc", "addr": 0, "size": 0, **fields}


FRAME = {"filename": "a.py", "line": 1, "name": "f"}


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (
            _alloc(action="bogus"),
            "action is str 'bogus', expected one of alloc, free_requested, free_completed,"
            " segment_alloc, segment_free, segment_map, segment_unmap, snapshot, oom",
        ),
        (
            _alloc(action=["alloc"]),  # unhashable: never looked up in a set
            "action is list ['alloc'], expected one of alloc, free_requested, free_completed,"
            " segment_alloc, segment_free, segment_map, segment_unmap, snapshot, oom",
        ),
        ({"action": "alloc", "addr": 0}, "size is missing, expected an int"),
        ({"action": "alloc", "size": 0}, "addr is missing, expected an int"),
        (_alloc(addr="x"), "addr is str 'x', expected an int"),
        (_alloc(stream="s"), "stream is str 's', expected an int"),
        (_alloc(device_free="x"), "device_free is str 'x', expected an int"),
        (_alloc(time_us="1"), "time_us is str '1', expected a number"),
        (_alloc(compile_context=1), "compile_context is int 1, expected a str"),
        (_alloc(user_metadata=1), "user_metadata is int 1, expected a str"),
        (_alloc(frames=3), "frames is int 3, expected a list of frames"),
        (_alloc(frames=[3]), "frames[0] is int 3, expected a dict {filename, line, name}"),
        (_alloc(frames=[{"filename": 3}]), "frames[0].filename is int 3, expected a str"),
        (_alloc(frames=[FRAME, {"name": 3}]), "frames[1].name is int 3, expected a str"),
        # every field that is right is let through on the way to the one that is wrong
        (
            _alloc(stream=7, device_free=0, time_us=1, frames=[FRAME], compile_context="fwd")
            | {"user_metadata": None},
            "user_metadata is None, expected a str",
        ),
        (_alloc(time_us=1.5, user_metadata=2), "user_metadata is int 2, expected a str"),
    ],
)
def test_an_event_that_is_not_what_a_snapshot_holds_is_named_in_these_words(
    tmp_path, event, message
):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[_alloc(), event]]}))
    expected = f"{path}: not a memory snapshot: device_traces[0][1].{message}"
    for read in (memory.load, memory.summary):
        with pytest.raises(ValueError) as info:
            read(path)
        assert str(info.value) == expected, read


def test_check_snapshot_names_a_snapshot_that_is_not_a_dict():
    with pytest.raises(ValueError) as info:
        check_snapshot([3])
    assert str(info.value) == "the snapshot is list [3], expected a dict"


def test_a_peak_of_one_byte_is_a_peak():
    one = {
        "segments": [{"total_size": 8, "blocks": [{"size": 1, "state": "active_allocated"}]}],
        "device_traces": [[{"action": "alloc", "addr": 0, "size": 1}]],
    }
    assert overview(one).peak == (1, 1)
    assert memory.summary(one).splitlines()[1].startswith("peak live 1 B after event 1;")


def test_the_peak_is_the_first_point_that_reaches_it():
    trace = [
        {"action": "alloc", "addr": 0, "size": 8},
        {"action": "free_requested", "addr": 0, "size": 8},
        {"action": "alloc", "addr": 0, "size": 8},  # the same level again: not the peak's point
    ]
    snapshot = {
        "segments": [{"total_size": 8, "blocks": [{"size": 8, "state": "active_allocated"}]}],
        "device_traces": [trace],
    }
    assert overview(snapshot).peak == (8, 1) == timeline(snapshot).peak
    assert memory.summary(snapshot).splitlines()[1].startswith("peak live 8 B after event 1;")


def test_timeline_of_a_scan_bands_6_sites_by_default():
    trace = [
        {"action": "alloc", "addr": i, "size": 8 + i, "frames": [{"filename": f"f{i}.py"}]}
        for i in range(8)
    ]
    snapshot = {"segments": [], "device_traces": [[], trace]}
    line = timeline_of(snapshot, 1, scan_device(snapshot, 1, short=True, series=True))
    assert line == timeline(snapshot)
    assert list(line.by_site) == [f"f{i}.py:? in ?" for i in range(7, 1, -1)]  # by peak


def _segment(**fields) -> dict:
    return {"total_size": 8, "blocks": [], **fields}


def _block(**fields) -> dict:
    return {"size": 8, "state": "active_allocated", **fields}


@pytest.mark.parametrize(
    ("snapshot", "message"),
    [
        ({}, "segments is missing, expected a list of segments"),
        ({"segments": 1}, "segments is int 1, expected a list of segments"),
        ({"segments": [_segment(address="x")]}, "segments[0].address is str 'x', expected an int"),
        ({"segments": [_segment(stream=1.5)]}, "segments[0].stream is float 1.5, expected an int"),
        (
            {"segments": [_segment(frames=3)]},
            "segments[0].frames is int 3, expected a list of frames",
        ),
        ({"segments": [_segment(blocks=[1])]}, "segments[0].blocks[0] is int 1, expected a dict"),
        (
            {"segments": [_segment(blocks=[{"state": "inactive"}])]},
            "segments[0].blocks[0].size is missing, expected an int",
        ),
        (
            {"segments": [_segment(blocks=[_block(size="8")])]},
            "segments[0].blocks[0].size is str '8', expected an int",
        ),
        (
            {"segments": [_segment(blocks=[_block(state=1)])]},
            "segments[0].blocks[0].state is int 1, expected a str",
        ),
        (
            {"segments": [_segment(blocks=[_block(), _block(frames=[3])])]},
            "segments[0].blocks[1].frames[0] is int 3, expected a dict {filename, line, name}",
        ),
        ({"segments": [], "devmem": []}, "devmem is list [], expected a dict"),
        (
            {"segments": [], "devmem": {"annotations": 3}},
            "devmem.annotations is int 3, expected a list",
        ),
        (
            {"segments": [], "devmem": {"annotations": [{}, 1]}},
            "devmem.annotations[1] is int 1, expected a dict",
        ),
        (
            {"segments": [], "device_traces": "abc"},
            "device_traces is str 'abc', expected a list of lists of events",
        ),
        (
            {"segments": [], "device_traces": [[], "abc"]},
            "device_traces[1] is str 'abc', expected a list of events",
        ),
    ],
)
def test_check_snapshot_names_the_first_wrong_field_in_these_words(snapshot, message):
    with pytest.raises(ValueError) as info:
        check_snapshot(snapshot)
    assert str(info.value) == message


# --- the fast check: a well-formed event is read once, never sent to the slow check -----------


def _well_formed_events() -> list[dict]:
    """Every action, and every optional field present and absent, all of the right type."""
    events = [_alloc(action=action) for action in ACTIONS if action != "oom"]
    events += [
        {"action": "oom", "size": 8, "device_free": 0},  # an OOM has no address
        {"action": "oom", "size": 8},
        _alloc(stream=7, time_us=5),
        _alloc(stream=1 << 40, device_free=3, time_us=5.5),
        _alloc(compile_context="fwd", user_metadata="step 1", frames=[FRAME]),
        _alloc(frames=[]),
    ]
    return events


def test_well_formed_events_are_checked_by_the_fast_check_alone(tmp_path, monkeypatch):
    def slow(event, where):
        raise AssertionError(f"{where} went to the slow check: {event}")

    snapshot = {"segments": [], "device_traces": [_well_formed_events()]}
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    monkeypatch.setattr(_timeline, "_check_event", slow)
    assert check_snapshot(snapshot) is snapshot
    assert memory.summary(path) == memory.summary(snapshot)  # streamed: checked one by one
    monkeypatch.undo()
    bad = {"segments": [], "device_traces": [[{**_alloc(), "size": "8"}]]}
    with pytest.raises(ValueError, match=r"size is str '8'"):  # the slow check names it
        check_snapshot(bad)


def test_overview_and_sites_keep_no_level_per_event(blocks_per_1000_events):
    # one pass, without the series a picture needs: the allocated blocks stay flat while
    # 40,000 events go by (a level kept per event is a new int, and more, each)
    trace = []
    for i in range(20_000):
        trace.append({"action": "alloc", "addr": i, "size": 1000 + i})
        trace.append({"action": "free_requested", "addr": i, "size": 1000 + i})
    snapshot = {"segments": [], "device_traces": [trace]}
    blocks = blocks_per_1000_events
    for read in (overview, sites):
        blocks.clear()
        read(snapshot)
        assert len(blocks) == 40
        assert max(blocks[5:]) - min(blocks[5:]) < 4_000, (read, blocks)
    blocks.clear()
    timeline(snapshot)  # the series: what the others do not hold
    assert blocks[-1] - blocks[5] > 12_000


def test_a_wrong_frame_after_a_right_one_is_named():
    trace = [_alloc(frames=[FRAME]), _alloc(frames=[{**FRAME, "line": "7"}])]
    with pytest.raises(ValueError) as info:
        check_snapshot({"segments": [], "device_traces": [trace]})
    assert str(info.value) == "device_traces[0][1].frames[0].line is str '7', expected an int"


def test_a_streamed_frame_list_checked_and_freed_never_vouches_for_a_later_one(tmp_path):
    # the frames of a free's request are no site's: the streaming reader drops them once
    # checked, and later frames reuse their ids; the cache of frame lists checked must hold
    # them, or a later wrong frame at a reused id would pass unchecked
    trace = []
    for i in range(3000):
        frames = [{"filename": "/src/m.py", "line": "7" if i >= 1500 else i, "name": "f"}]
        trace.append({"action": "alloc", "addr": i * 64, "size": 64})
        trace.append({"action": "free_requested", "addr": i * 64, "size": 64, "frames": frames})
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4))
    with pytest.raises(ValueError) as info:
        memory.summary(path)
    assert str(info.value) == (
        f"{path}: not a memory snapshot: device_traces[0][3001].frames[0].line is str '7',"
        " expected an int"
    )


@pytest.mark.parametrize(
    ("size", "shown"),
    [
        ("x" * 38, "'" + "x" * 38 + "'"),  # a repr of 40 characters: whole
        ("x" * 39, "'" + "x" * 36 + "..."),  # 41: its first 37 and "..."
    ],
)
def test_a_long_value_is_shown_cut_to_40_characters(size, shown):
    with pytest.raises(ValueError) as info:
        check_snapshot({"segments": [_segment(blocks=[_block(size=size)])]})
    assert str(info.value) == f"segments[0].blocks[0].size is str {shown}, expected an int"


def test_each_file_name_is_made_relative_once_per_scan(monkeypatch):
    # a relative path costs a getcwd: 300 frame lists of their own in 3 files cost 3
    trace = [
        _alloc(addr=i, frames=[{"filename": f"/src/m{i % 3}.py", "line": i, "name": "f"}])
        for i in range(300)
    ]
    snapshot = {"segments": [], "device_traces": [trace]}
    made: list[str] = []
    relpath = os.path.relpath

    def counted(path, *args):
        made.append(path)
        return relpath(path, *args)

    monkeypatch.setattr(os.path, "relpath", counted)
    assert len(sites(snapshot)) == 300
    assert sorted(made) == ["/src/m0.py", "/src/m1.py", "/src/m2.py"]
