"""``python -m allocator.memory plot|summary``: the timeline and the top allocation sites.

The levels are checked against the allocator's own counters; the picture is drawn for real (the
``plot`` extra: ``ci/check.sh`` installs it) and read back; PyTorch-made snapshots (C++ frames,
no ``devmem`` key) and traces that start late are read too.
"""

from __future__ import annotations

import copy
import dataclasses
import html
import pickle
import re
import subprocess
import sys
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from allocator import memory
from allocator._timeline import (
    BEFORE_TRACE,
    NO_STACK,
    Marker,
    Site,
    Timeline,
    device_of,
    format_bytes,
    overview,
    site_of,
    sites,
    timeline,
)

from . import _stress

HERE = __file__
LINES = {
    name: number
    for number, text in enumerate(Path(__file__).read_text(encoding="utf-8").splitlines(), 1)
    for name in ("kept", "released")
    if f'# LINES["{name}"]' in text and "LINES = " not in text
}
SIM_ONLY = pytest.mark.backends("sim")  # a capacity to run out of, a cache to cap
PNG = b"\x89PNG\r\n\x1a\n"


def in_comprehension(function: str) -> str:
    """How a site in a list comprehension in ``function`` is named: the comprehension is a
    frame of its own up to Python 3.11, inlined into its function from 3.12 (PEP 709)."""
    return f"in <listcomp> < {function}" if sys.version_info < (3, 12) else f"in {function}"


def recorded(make_alloc, **config):
    """A sim allocator that ran the small arena stress, a cache-cap round and an OOM while
    recording, with 3 buffers still live."""
    alloc = make_alloc(**config)
    with alloc.history():
        _stress.arena_stress(alloc, n=256, k=8, arenas=2)
        kept = [alloc.full(1024, 1.0) for _ in range(3)]  # LINES["kept"]
        for buf in [alloc.full(1024, 1.0) for _ in range(6)]:  # LINES["released"]
            alloc.release(buf)
        with pytest.raises(MemoryError):
            alloc.full(1 << 22, 1.0)
    return alloc, kept


@pytest.fixture
def snapshot(make_alloc, backend):
    alloc, kept = recorded(make_alloc, cache_cap_bytes=8192, sim_capacity_bytes=1 << 22)
    yield alloc.snapshot()
    for buf in kept:
        alloc.release(buf)


@SIM_ONLY
def test_the_timeline_follows_the_counters(snapshot):
    line = timeline(snapshot)
    stats = snapshot["devmem"]["stats"]
    assert line.events == len(snapshot["device_traces"][0])
    assert (line.live[0], line.reserved[0]) == (0, 0)  # recording started on an empty allocator
    assert line.live[-1] == stats["live_bytes"] == 3 * 4096
    assert line.cached[-1] == stats["cache_bytes"]
    assert line.peak[0] == stats["peak_bytes"]
    kinds = [marker.kind for marker in line.markers]
    assert kinds.count("arena_exit") == 5 and kinds.count("release") == 7  # 2 + 1 + 2 exits
    assert kinds.count("oom") == 1 and kinds.count("cap_evict") == stats["cap_evictions"]


@SIM_ONLY
def test_sites_are_the_allocating_lines_by_peak(snapshot):
    found = sites(snapshot)
    assert [site.peak_bytes for site in found] == sorted(
        (site.peak_bytes for site in found), reverse=True
    )
    released, kept, rounds = found[0], found[1], found[2]  # 6 x 4 KiB, 3 x 4 KiB, 8 x 1 KiB
    here = "suites/allocator/test_memory_cli.py"
    assert released.name == f"{here}:{LINES['released']} {in_comprehension('recorded')}"
    assert (released.peak_bytes, released.allocs, released.live_end_bytes) == (6 * 4096, 6, 0)
    assert kept.name == f"{here}:{LINES['kept']} {in_comprehension('recorded')}"
    assert (kept.peak_bytes, kept.allocs, kept.live_end_bytes) == (3 * 4096, 3, 3 * 4096)
    assert rounds.name.endswith(f"_stress.py:27 {in_comprehension('arena_round')}")
    assert (rounds.peak_bytes, rounds.allocs, rounds.largest_bytes) == (8 * 1024, 16, 1024)
    assert sum(site.live_end_bytes for site in found) == 3 * 4096


@SIM_ONLY
def test_summary_prints_levels_and_the_top_sites(snapshot, tmp_path, capsys):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    assert memory.main(["summary", str(path), "--top", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    stats = snapshot["devmem"]["stats"]
    assert out[0] == f"backend {stats['backend']}: {len(snapshot['device_traces'][0])} events"
    assert out[1].startswith(f"peak live {format_bytes(stats['peak_bytes'])} after event ")
    assert "live 12.00 KiB" in out[1]
    assert out[2] == "arena exits 5, releases 7, cap evictions" + (
        f" {stats['cap_evictions']}, OOMs 1"
    )
    assert out[4:6] == [
        "top allocation sites by peak live bytes:",
        "   peak live   allocs      largest  live at end  site",
    ]
    more = len(sites(snapshot)) - 2
    assert len(out) == 9 and out[-1] == f"... and {more} more sites (--top to see more)"


@SIM_ONLY
def test_plot_draws_a_png_with_every_marker(snapshot, tmp_path, capsys):
    matplotlib = pytest.importorskip(
        "matplotlib", reason="the plot extra: pip install 'devmem-harness[plot]'"
    )
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    out = tmp_path / "timeline.png"
    assert memory.main(["plot", str(path), "-o", str(out), "--top", "3"]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    data = out.read_bytes()
    assert data.startswith(PNG) and 10_000 < len(data) < 150_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1100, 520)
    svg = tmp_path / "timeline.svg"
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as text, not glyph paths
        memory.plot(snapshot, svg, use_time=True, title="a title")
    text = svg.read_text()
    for label in ("a title", "arena exit (5)", "release (7)", "cap eviction", "OOM (1)", "cached"):
        assert label in text, label
    assert html.escape(f"_stress.py:27 {in_comprehension('arena_round')}") in text


@SIM_ONLY
def test_plot_without_matplotlib_says_how_to_install_it(snapshot, tmp_path, capsys, monkeypatch):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails
    assert memory.main(["plot", str(path), "-o", str(tmp_path / "t.png")]) == 1
    err = capsys.readouterr().err
    assert err == (
        "python -m allocator.memory plot: error: allocator.memory plot needs matplotlib:"
        " pip install 'devmem-harness[plot]' (or pip install 'matplotlib>=3.7')\n"
    )
    assert not (tmp_path / "t.png").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "No such file or directory"),
        (b"not a pickle", "not a pickled memory snapshot"),
        (pickle.dumps({"traces": []}), "not a memory snapshot: expected a dict with 'segments'"),
        (pickle.dumps(3), "(the format of torch.cuda.memory._snapshot()), got int"),
    ],
)
def test_unreadable_snapshots_are_errors_that_say_why(tmp_path, capsys, content, message):
    path = tmp_path / "s.pickle"
    if content is not None:
        path.write_bytes(content)
    assert memory.main(["summary", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("python -m allocator.memory summary: error: ") and message in err


@pytest.mark.parametrize(
    "argv",
    [["plot"], ["summary", "x", "--top", "0"], ["plot", "x", "--top", "-1"], ["draw", "x"], []],
)
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        memory.main(argv)
    assert info.value.code == 2
    assert "usage: python -m allocator.memory" in capsys.readouterr().err


def test_the_module_runs_as_a_script(tmp_path):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps([], protocol=4))  # a bare list of segments, as torch reads it
    done = subprocess.run(
        [sys.executable, "-m", "allocator.memory", "summary", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:1] == ["backend torch: 0 events"]
    assert "(no allocation in the trace)" in done.stdout


@pytest.mark.backends("cpu")  # every free goes to the device: a fixed sequence of events
def test_a_history_started_late_counts_what_was_live_before(make_alloc):
    alloc = make_alloc()
    early = alloc.full(256, 1.0)  # 1 KiB, live before the trace
    with alloc.history(max_entries=6):  # and the ring keeps only the newest six entries
        for _ in range(3):
            alloc.release(alloc.full(64, 1.0))
        late = alloc.full(16, 1.0)
    snapshot = alloc.snapshot()
    kept = [event["action"] for event in snapshot["device_traces"][0]]
    # the last release lost its segment_alloc and alloc to the ring (its annotation is kept)
    assert kept == ["free_requested", "free_completed", "segment_free", "segment_alloc", "alloc"]
    line = timeline(snapshot, top=2)
    assert line.live[0] == 1024 + 256 and line.live[-1] == 1024 + 64 == alloc.stats().live_bytes
    assert line.reserved[0] == 1024 + 256 and line.by_site[BEFORE_TRACE][0] == 1024 + 256
    before = next(site for site in sites(snapshot) if site.name == BEFORE_TRACE)
    assert (before.peak_bytes, before.allocs, before.live_end_bytes) == (1280, 0, 1024)
    alloc.release(early)
    alloc.release(late)


def test_pytorch_made_snapshots_are_read_too():
    cpp = {"filename": "CUDACachingAllocator.cpp", "line": 0, "name": "malloc"}
    frames = [cpp, {"filename": "/work/model.py", "line": 7, "name": "<lambda>"}]
    frames.append({"filename": "/work/model.py", "line": 9, "name": "forward"})
    event = {"addr": 4096, "size": 512, "stream": 0, "frames": frames}
    torch_snapshot = {
        "segments": [
            {
                "device": 0,
                "address": 4096,
                "total_size": 2 << 20,
                "stream": 0,
                "blocks": [
                    {"address": 4096, "size": 512, "state": "active_allocated", "frames": []},
                    {"address": 4608, "size": (2 << 20) - 512, "state": "inactive"},
                ],
            }
        ],
        "device_traces": [
            [
                {"action": "segment_alloc", "addr": 4096, "size": 2 << 20, "stream": 0},
                {"action": "alloc", **event},
                {"action": "oom", "size": 1 << 30, "device_free": 0, "stream": 0},
            ]
        ],
    }
    line = timeline(torch_snapshot)
    assert (line.backend, line.live, line.cached[-1]) == (
        "torch",
        [0, 0, 512, 512],
        (2 << 20) - 512,
    )
    assert [marker.label for marker in line.markers] == ["OOM 1.00 GiB"]
    assert site_of(frames) == "/work/model.py:7 in <lambda> < forward"
    assert site_of(frames, short=True) == "model.py:7 in <lambda> < forward"
    assert site_of([cpp]) == "CUDACachingAllocator.cpp:0 in malloc"
    assert site_of([]) == NO_STACK


def test_format_bytes_and_bad_arguments():
    assert [format_bytes(n) for n in (0, 1023, 1536, 3 << 20)] == [
        "0 B",
        "1023 B",
        "1.50 KiB",
        "3.00 MiB",
    ]
    empty = {"segments": [], "device_traces": [[]]}
    with pytest.raises(ValueError, match=r"^top must be >= 0, got -1$"):
        timeline(empty, top=-1)
    with pytest.raises(ValueError, match=r"^top must be >= 1, got 0$"):
        memory.summary(empty, top=0)
    with pytest.raises(ValueError, match=r"^device=2: the snapshot has traces for devices 0 to 0$"):
        timeline(empty, device=2)


# -- the timeline's arithmetic on a snapshot written by hand (every default a reader meets) ------


def src(name: str, line: int) -> dict:
    return {"filename": "/src/app/model.py", "line": line, "name": name}


LOAD, OTHER = src("load", 5), src("other", 9)
BUILD = [src("<listcomp>", 7), src("build", 6)]
BY_HAND = {
    "segments": [
        {
            "device": 1,
            "total_size": 1024,
            "blocks": [  # device 1 listed first: device 0 reads on past it
                {"size": 512, "state": "active_allocated"},
                {"size": 1, "state": "active_allocated"},
            ],
        },
        {
            "device": 0,
            "total_size": 4096,
            "blocks": [
                {"size": 24, "state": "active_allocated"},
                {"size": 500, "state": "active_allocated"},
                {"state": "active_allocated"},  # no size: counts 0
            ],
        },
        {"total_size": 2048, "blocks": [{"size": 1, "state": "active_allocated"}]},  # device 0
        {"device": 0},  # no size, no blocks
    ],
    "device_traces": [
        [
            {"action": "segment_alloc", "addr": 0, "size": 4096, "time_us": 100},
            {"action": "alloc", "addr": 16, "size": 1000, "frames": [LOAD], "time_us": 110},
            {"action": "alloc", "addr": 32, "size": 24, "frames": BUILD, "time_us": 120},
            {"action": "free_requested", "addr": 16, "size": 1000, "time_us": 130},
            {"action": "alloc", "addr": 48, "size": 500, "frames": [LOAD]},  # no time: 130
            {"action": "free_requested", "addr": 99, "size": 64, "time_us": 140},  # from before
            {"action": "oom", "size": 2048, "device_free": 0, "time_us": 150},
            {"action": "segment_free", "addr": 4096, "size": 1024, "time_us": 160},
            {"action": "oom", "time_us": 170},  # no size
        ],
        [
            {"action": "alloc", "addr": 1, "size": 512, "frames": [OTHER], "time_us": 5},
            {"action": "alloc", "addr": 2, "size": 1},  # no frames, no time
            {"action": "segment_alloc", "time_us": 9},  # no size
        ],
    ],
    "devmem": {
        "annotations": [
            {"action": "mystery", "trace_index": 1},  # not ours to mark: skipped
            {"action": "arena_exit", "trace_index": 2, "depth": 0, "reclaimed": 3},
            {"action": "release", "trace_index": 4},  # no reason
            {"action": "cap_evict", "trace_index": 7, "size": 1024},
            {"action": "release", "reason": "release_param"},  # no trace_index
            {"action": "cap_evict", "trace_index": 8},  # no size
        ]
    },
}


def well_formed(snapshot: dict) -> dict:
    """``snapshot`` with every field that ``load`` requires and that BY_HAND leaves out (to test
    the defaults of the readers given a dict) set to what the readers default it to: 0."""
    out = copy.deepcopy(snapshot)
    for segment in out["segments"]:
        segment.setdefault("total_size", 0)
        for block in segment.setdefault("blocks", []):
            block.setdefault("size", 0)
    for trace in out["device_traces"]:
        for event in trace:
            event.setdefault("size", 0)
            if event["action"] != "oom":
                event.setdefault("addr", 0)
    return out


def test_the_timeline_of_a_snapshot_written_by_hand():
    load, build = "model.py:5 in load", "model.py:7 in <listcomp> < build"
    assert timeline(BY_HAND) == Timeline(
        time_us=[100, 100, 110, 120, 130, 130, 140, 150, 160, 170],
        live=[65, 65, 1065, 1089, 89, 589, 525, 525, 525, 525],
        reserved=[3072] + [7168] * 7 + [6144] * 2,
        by_site={
            load: [0, 0, 1000, 1000, 0, 500, 500, 500, 500, 500],
            BEFORE_TRACE: [65] * 6 + [1] * 4,
            build: [0, 0, 0, 24, 24, 24, 24, 24, 24, 24],
        },
        markers=[
            Marker(0, "release", "release_param"),
            Marker(2, "arena_exit", "exit d0: 3 buffers"),
            Marker(4, "release", "release"),
            Marker(6, "oom", "OOM 2.00 KiB"),
            Marker(7, "cap_evict", "cap evict 1.00 KiB"),
            Marker(8, "oom", "OOM 0 B"),
            Marker(8, "cap_evict", "cap evict 0 B"),
        ],
        backend="torch",
    )
    assert sites(BY_HAND) == [
        Site("/src/app/model.py:5 in load", 1000, 2, 1000, 500),  # peak before the second
        Site(BEFORE_TRACE, 65, 0, 0, 1),
        Site("/src/app/model.py:7 in <listcomp> < build", 24, 1, 24, 24),
    ]
    assert [site.name for site in sites(BY_HAND, short=True)] == [load, BEFORE_TRACE, build]


def test_the_timeline_of_another_device():
    assert device_of(BY_HAND) == 0 and device_of(BY_HAND, 1) == 1
    line = timeline(BY_HAND, device=1)
    assert (line.time_us, line.live, line.reserved, line.by_site, line.backend) == (
        [5, 5, 5, 9],
        [0, 512, 513, 513],
        [1024] * 4,
        {"model.py:9 in other": [0, 512, 512, 512], NO_STACK: [0, 0, 1, 1]},
        "torch",
    )
    assert "oom" not in {marker.kind for marker in line.markers}  # device 0's OOMs
    assert sites(BY_HAND, device=1) == [  # nothing live from before: no such site
        Site("/src/app/model.py:9 in other", 512, 1, 512, 512),
        Site(NO_STACK, 1, 1, 1, 1),
    ]
    assert timeline(BY_HAND, device=1, top=1, short=False).by_site == {
        "/src/app/model.py:9 in other": [0, 512, 512, 512]
    }


def test_devices_traces_and_sites_at_their_edges():
    two = {"segments": [], "device_traces": [[], [{"action": "alloc", "size": 8}]]}
    assert device_of(two) == 1 and device_of({"device_traces": [[], []]}) == 0
    assert device_of({}) == 0 and device_of({}, 0) == 0
    for snapshot, device, last in ((two, 2, 1), ({"device_traces": []}, 1, -1)):
        with pytest.raises(ValueError, match=rf"^device={device}: .* devices 0 to {last}$"):
            device_of(snapshot, device)
    assert timeline({"segments": []}) == Timeline([0], [0], [0], {}, [], "torch")
    assert sites({}) == []
    one_byte = {"segments": [{"blocks": [{"size": 1, "state": "active_allocated"}]}]}
    assert sites(one_byte) == [Site(BEFORE_TRACE, 1, 0, 0, 1)]
    untimed = {"device_traces": [[{"action": "segment_alloc", "size": 8}]]}
    assert timeline(untimed).time_us == [0, 0]
    many = [
        {"action": "alloc", "addr": i, "size": 8, "frames": [src(f"f{i}", i)]} for i in range(8)
    ]
    line = timeline({"segments": [], "device_traces": [many]})
    assert list(line.by_site) == [f"model.py:{i} in f{i}" for i in range(6)]  # 6 by default


def test_site_names_when_frames_lack_fields():
    assert site_of([{"name": "f"}]) == "?:? in f"  # no file: the first frame, not Python's
    assert site_of([{"filename": "", "line": 1, "name": "f"}]) == ":1 in f"  # relpath refuses ""
    assert site_of([{"filename": "a.py", "line": 3}]) == "a.py:3 in ?"
    assert site_of([src("f", 1), src("g", 2)], short=True) == "model.py:1 in f"  # no caller
    assert site_of([{"filename": "a.py", "line": 3, "name": "<lambda>"}]) == "a.py:3 in <lambda>"
    assert site_of([src("<listcomp>", 3), {"filename": "b.py"}], True) == (
        "model.py:3 in <listcomp> < ?"
    )


def test_format_bytes_at_each_unit_boundary():
    assert [format_bytes(n) for n in (1023, 1024, -1023, -1024)] == [
        "1023 B",
        "1.00 KiB",
        "-1023 B",
        "-1.00 KiB",
    ]
    assert format_bytes(1 << 40) == "1.00 TiB"
    assert format_bytes(1 << 50) == "1024.00 TiB"  # no unit past TiB


SUMMARY_HEAD = """\
top allocation sites by peak live bytes:
   peak live   allocs      largest  live at end  site
"""


def test_summary_of_the_snapshot_written_by_hand():
    assert (
        memory.summary(BY_HAND, top=3)
        == memory.summary(BY_HAND)
        == (
            "backend torch: 9 events\n"
            "peak live 1.06 KiB after event 3; at the end: live 525 B, cached 5.49 KiB, reserved"
            " 6.00 KiB\n"
            # its frees are requested and never completed: memory_viz counts them live
            "memory_viz's peak: 1.55 KiB after event 5 (it counts a freed block as live until"
            " its free_completed: blocks that awaited another stream's work)\n"
            "arena exits 1, releases 2, cap evictions 2, OOMs 2\n"
            "\n" + SUMMARY_HEAD + "      1000 B        2       1000 B        500 B"
            "  /src/app/model.py:5 in load\n"
            "        65 B        0          0 B          1 B  <live before the trace>\n"
            "        24 B        1         24 B         24 B"
            "  /src/app/model.py:7 in <listcomp> < build\n"
        )
    )
    # the annotations count device 0's events: none on device 1
    assert memory.summary(BY_HAND, device=1, top=1) == (
        "backend torch: 3 events\n"
        "peak live 513 B after event 2; at the end: live 513 B, cached 511 B, reserved 1.00 KiB\n"
        "arena exits 0, releases 0, cap evictions 0, OOMs 0\n"
        "\n" + SUMMARY_HEAD + "       512 B        1        512 B        512 B"
        "  /src/app/model.py:9 in other\n"
        "... and 1 more sites (--top to see more)\n"
    )


@pytest.mark.backends("sim")
def test_a_ring_full_of_events_and_annotations_is_said_to_be_full(make_alloc):
    # the ring keeps events and annotations (here a release per round trip) together
    alloc = make_alloc()
    with alloc.history(max_entries=10):
        for _ in range(20):
            alloc.release(alloc.full(4, 1.0))
    snapshot = alloc.snapshot()
    assert snapshot["devmem"]["annotations"] and len(snapshot["device_traces"][0]) < 10
    head = memory.summary(snapshot).splitlines()[0]
    assert head.endswith(" events (the ring is full: older events were dropped)"), head


def test_summary_of_the_last_event_a_full_ring_and_an_empty_trace():
    allocs = [
        {"action": "alloc", "addr": i, "size": 8, "frames": [src(f"f{i}", i)]} for i in range(11)
    ]
    trace = [{"action": "segment_alloc", "size": 4096}, *allocs]
    segment = {"total_size": 4096, "blocks": [{"size": 88, "state": "active_allocated"}]}
    full = {"segments": [segment], "device_traces": [trace], "devmem": {"max_entries": 12}}
    text = memory.summary(full).splitlines()
    assert text[:2] == [
        "backend torch: 12 events (the ring is full: older events were dropped)",
        "peak live 88 B after event 12; at the end: live 88 B, cached 3.91 KiB, reserved 4.00 KiB",
    ]
    assert len(text) == 6 + 10 + 1 and text[-1] == "... and 1 more sites (--top to see more)"
    full["devmem"]["max_entries"] = 13
    assert memory.summary(full, top=1).splitlines()[0] == "backend torch: 12 events"
    freed = {
        "segments": [],
        "device_traces": [[*trace[:2], {"action": "segment_free", "size": 4096}]],
    }
    assert memory.summary(freed).splitlines()[1] == (
        "peak live 0 B after event 2; at the end: live 0 B, cached 0 B, reserved 0 B"
    )
    assert memory.summary({"segments": [], "device_traces": [[]]}).endswith(
        SUMMARY_HEAD + "             (no allocation in the trace)\n"
    )


def test_plot_units_and_time_axes():
    assert memory._unit(2047) == (1, "bytes")
    assert [memory._unit(2 << shift) for shift in (10, 20, 30)] == [
        (1 << 10, "KiB"),
        (1 << 20, "MiB"),
        (1 << 30, "GiB"),
    ]
    assert [memory._unit((2 << shift) - 1)[1] for shift in (20, 30)] == ["KiB", "MiB"]
    line = timeline(BY_HAND)
    # the oom at 6 and 8 changes no level: no step of their own (nor would a free_completed)
    steps = [0, 1, 2, 3, 4, 5, 6, 6, 7, 7]
    assert memory._x_axis(line, False, BY_HAND) == (steps, memory.EVENT_AXIS)
    still = dataclasses.replace(line, time_us=[5] * 10)  # a clock that never moved: events
    assert memory._x_axis(still, True, BY_HAND) == (steps, memory.STILL_CLOCK_AXIS)
    assert memory.STILL_CLOCK_AXIS.endswith("; --time: the clock never moved")
    seconds, label = memory._x_axis(line, True, BY_HAND)  # no clock named: the host's
    assert label == "time (s since the first event)"
    assert seconds == [(t - 100) / 1e6 for t in line.time_us]  # exactly: 1e6 us a second
    sim = {**BY_HAND, "devmem": {"clock": "sim"}}
    assert memory._x_axis(line, True, sim) == (
        [t - 100 for t in line.time_us],
        "time (us of the simulated clock)",
    )


def test_load_takes_a_bare_list_of_segments(tmp_path):
    path = tmp_path / "segments.pickle"
    segments = well_formed(BY_HAND)["segments"]
    path.write_bytes(pickle.dumps(segments))
    assert memory.load(path) == {"segments": segments, "device_traces": []}
    path.write_bytes(pickle.dumps({"device_traces": [], 3: None}))
    with pytest.raises(ValueError, match=re.escape("got keys ['3', 'device_traces']")):
        memory.load(path)


def test_the_command_line_help_says_what_each_option_does(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    for command, helps in (
        (
            "plot",
            [
                "snapshot    the pickled snapshot",
                # argparse names an option's value once from Python 3.13
                (
                    "-o, --output OUTPUT"
                    if sys.version_info >= (3, 13)
                    else "-o OUTPUT, --output OUTPUT"
                )
                + "  the picture: .png, .svg or .pdf (default timeline.png)",
                "--top TOP   allocation sites drawn in their own band (default 6)",
                "--time      x is the events' time_us (default: allocations and frees, each"
                " free one step; also when the clock never moved)",
                "--title TITLE  the picture's title",
                "--device DEVICE  the device to read (default: the first with events)",
            ],
        ),
        (
            "summary",
            [
                "snapshot    the pickled snapshot",
                "--top TOP   sites to list (default 10)",
                "--device DEVICE  the device to read (default: the first with events)",
            ],
        ),
        (
            None,
            [
                "usage: python -m allocator.memory [-h] {plot,summary} ...",
                "Read a memory snapshot (Allocator.dump_snapshot, or PyTorch's"
                " torch.cuda.memory._dump_snapshot): a timeline picture, or the top allocation"
                " sites.",
                "plot      draw live and cached bytes over time (matplotlib)",
                "summary   print the top allocation sites by peak bytes",
            ],
        ),
    ):
        with pytest.raises(SystemExit):
            memory.main([command, "--help"] if command else ["--help"])
        out = " ".join(capsys.readouterr().out.split())
        for text in helps:
            assert " ".join(text.split()) in out, (command, text)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["summary", "s", "--top", "0"], "--top: expected a whole number >= 1, got '0'"),
        (["summary", "s", "--top", "x"], "--top: expected a whole number >= 1, got 'x'"),
        (["plot", "s", "--top", "-1"], "--top: expected a whole number >= 0, got '-1'"),
        (["plot", "s", "--device", "-1"], "--device: expected a whole number >= 0, got '-1'"),
        (["plot", "s", "--top", "x"], "--top: expected a whole number >= 0, got 'x'"),
    ],
)
def test_counts_on_the_command_line_say_what_they_expect(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        memory.main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_summary_on_the_command_line_reads_the_device_and_top(tmp_path, capsys):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(well_formed(BY_HAND)))
    assert memory.main(["summary", str(path), "--device", "1", "--top", "1"]) == 0
    assert capsys.readouterr().out == memory.summary(BY_HAND, device=1, top=1)
    assert memory.main(["summary", str(path), "--top", "1"]) == 0  # 1 is a count it takes
    assert capsys.readouterr().out == memory.summary(BY_HAND, top=1)
    allocs = [
        {"action": "alloc", "addr": i, "size": 8, "frames": [src(f"f{i}", i)]} for i in range(11)
    ]
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [allocs]}))
    assert memory.main(["summary", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "... and 1 more sites (--top to see more)"


# -- the picture, artist by artist ----------------------------------------------------------------


def describe(fig) -> dict:
    """What a drawn figure shows, artist by artist (values rounded to 4 decimals; labels that
    matplotlib leaves out of legends, ``_child<n>``, as ``None``)."""
    from matplotlib.colors import to_hex

    def r(values):
        return [round(float(v), 4) for v in values]

    def label(artist):
        text = artist.get_label()
        return None if text.startswith("_") else text

    (ax,) = fig.axes
    grid = ax.yaxis.get_gridlines()[0]
    legend = fig.legends[0]
    return {
        "figure": [r(fig.get_size_inches()), fig.dpi, type(fig.get_layout_engine()).__name__],
        "axes": [
            r(ax.get_xlim()),
            r(ax.get_ylim()),
            ax.get_xlabel(),
            ax.get_ylabel(),
            ax.get_title(),
            ax.title.get_fontsize(),
        ],
        "grid": [grid.get_visible(), grid.get_linewidth(), grid.get_alpha()],
        "x grid": ax.xaxis.get_gridlines()[0].get_visible(),
        "bands": [  # label, color, edge width, top of the stack, vertices (a step: 4 a point)
            [
                label(c),
                to_hex(c.get_facecolor()[0]),
                r(c.get_linewidth()),
                round(float(c.get_paths()[0].vertices[:, 1].max()), 4),
                len(c.get_paths()[0].vertices),
            ]
            for c in ax.collections
        ],
        "lines": [
            [
                label(line),
                to_hex(line.get_color()),
                line.get_linestyle(),
                line.get_linewidth(),
                line.get_marker(),
                line.get_markersize(),
                line.get_clip_on(),
                line.get_drawstyle(),
                r(line.get_xdata()),
                r(line.get_ydata()),
            ]
            for line in ax.lines
        ],
        "texts": [
            [
                t.get_text(),
                r(t.get_position()),
                t.get_rotation(),
                t.get_fontsize(),
                t.get_va(),
                t.get_ha(),
                to_hex(t.get_color()),
            ]
            for t in ax.texts
        ],
        "arrows": [[r(a.xy), a.anncoords, a.arrowprops] for a in ax.texts if hasattr(a, "xyann")],
        "legend": [
            legend._loc,
            legend._outside_loc,
            legend.get_frame_on(),
            {t.get_fontsize() for t in legend.get_texts()},
            [t.get_text() for t in legend.get_texts()],
        ],
    }


def test_the_picture_of_the_snapshot_written_by_hand(drawn, tmp_path):
    memory.plot(BY_HAND, tmp_path / "t.png")
    # KiB (7168 B reserved at most); markers at the top: max level 7.0 KiB
    load, before, build = "model.py:5 in load", BEFORE_TRACE, "model.py:7 in <listcomp> < build"
    bands = [f"peak 1000 B: {load}", f"peak 65 B: {before}", f"peak 24 B: {build}"]
    cached = "cached (reuse cache, blocks awaiting their event)"
    assert describe(drawn[-1]) == {
        "figure": [[11.0, 5.2], 100, "ConstrainedLayoutEngine"],
        "axes": [
            [0.0, 7.0],  # 9 events, 7 of them change a level (the OOMs do not)
            [0.0, 7.84],  # 7 KiB and 12 % above it
            memory.EVENT_AXIS,
            "KiB",
            "devmem memory timeline (torch): 9 events, peak live 1.06 KiB",
            11.0,
        ],
        "grid": [True, 0.4, 0.5],
        "x grid": False,
        "bands": [
            [bands[0], "#4e79a7", [0.0], 0.9766, 41],  # 1000 B
            [bands[1], "#c7c7c7", [0.0], 1.04, 41],  # + 65 B from before the trace
            [bands[2], "#f28e2c", [0.0], 1.0635, 41],  # + 24 B: the peak, 1089 B
            [cached, "#d6e6f5", [0.0], 7.0, 41],  # up to the reserved bytes
        ],
        "lines": [
            [
                "live bytes",
                "#222222",
                "-",
                0.8,
                "None",
                6.0,
                True,
                "steps-post",
                [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 6.0, 7.0, 7.0],
                [0.0635, 0.0635, 1.04, 1.0635, 0.0869, 0.5752, 0.5127, 0.5127, 0.5127, 0.5127],
            ],
            [
                "arena exit (1)",
                "#555555",
                ":",
                0.8,
                "None",
                6.0,
                True,
                "default",
                [2.0, 2.0],
                [0.0, 1.0],
            ],
            [
                "release (2)",  # on the live bytes each left
                "#7b3294",
                "None",
                1.5,
                "v",
                7.0,
                False,
                "default",
                [0.0, 4.0],
                [0.0635, 0.0869],
            ],
            [
                "cap eviction (2)",
                "#e66101",
                "None",
                1.5,
                "v",
                7.0,
                False,
                "default",
                [6.0, 7.0],
                [7.42, 7.42],
            ],
            ["OOM (2)", "#d7191c", "-", 1.4, "None", 6.0, True, "default", [6.0, 6.0], [0.0, 1.0]],
            [None, "#d7191c", "-", 1.4, "None", 6.0, True, "default", [7.0, 7.0], [0.0, 1.0]],
        ],
        "texts": [
            ["exit d0: 3 buffers ", [2.0, 7.7], 90.0, 6.5, "top", "right", "#555555"],
            ["OOM 2.00 KiB ", [6.0, 6.65], 0.0, 7.0, "baseline", "right", "#d7191c"],
            ["OOM 0 B ", [7.0, 6.65], 0.0, 7.0, "baseline", "right", "#d7191c"],
            ["peak live 1.06 KiB", [14.0, -24.0], 0.0, 8.0, "baseline", "left", "#000000"],
        ],
        "arrows": [[[3.0, 1.0635], "offset points", {"arrowstyle": "->", "lw": 0.8}]],
        "legend": [
            1,
            "right",
            False,
            {8.0},
            [
                *bands,
                cached,
                "live bytes",
                "arena exit (1)",
                "release (2)",
                "cap eviction (2)",
                "OOM (2)",
            ],
        ],
    }


def test_the_picture_on_the_simulated_clock_with_long_names_and_many_exits(drawn, tmp_path):
    def frame(name):
        return {"filename": "/src/m.py", "line": 1, "name": name}

    n58, n59 = "f" * 48, "g" * 49  # site names of 58 and 59 characters
    trace = [
        {"action": "segment_alloc", "size": 3 << 20, "time_us": 1000},
        {"action": "alloc", "addr": 1, "size": 2 << 20, "frames": [frame(n58)], "time_us": 1010},
        {"action": "alloc", "addr": 2, "size": 1 << 20, "frames": [frame(n59)], "time_us": 1030},
    ]
    exits = [
        {"action": "arena_exit", "trace_index": i % 4, "depth": i, "reclaimed": 1}
        for i in range(12)
    ]
    snapshot = {
        "segments": [
            {"total_size": 3 << 20, "blocks": [{"size": 3 << 20, "state": "active_allocated"}]}
        ],
        "device_traces": [trace],
        "devmem": {"clock": "sim", "backend": "sim", "annotations": exits},
    }
    memory.plot(snapshot, tmp_path / "t.png", top=2, use_time=True, title="a title")
    seen = describe(drawn[-1])
    assert seen["axes"] == [
        [0.0, 30.0],
        [0.0, 3.36],
        "time (us of the simulated clock)",
        "MiB",
        "a title",
        11.0,
    ]
    assert seen["lines"][0][-2:] == [[0.0, 0.0, 10.0, 30.0], [0.0, 0.0, 2.0, 3.0]]
    assert (
        [band[:2] for band in seen["bands"]]
        == [
            [f"peak 2.00 MiB: m.py:1 in {n58}", "#4e79a7"],  # 58 characters: whole
            [f"peak 1.00 MiB: m.py:1 in {n59[:45]}...", "#f28e2c"],  # 59: cut to 55 and "..."
            ["cached (reuse cache, blocks awaiting their event)", "#d6e6f5"],
        ]
    )
    assert len(seen["texts"]) == 12 + 1  # 12 exits still get their labels
    assert seen["texts"][0] == [
        "exit d0: 1 buffers ",
        [0.0, 3.3],
        90.0,
        6.5,
        "top",
        "right",
        "#555555",
    ]
    assert seen["lines"][1][0] == "arena exit (12)" and seen["lines"][2][0] is None
    exits.append({"action": "arena_exit", "trace_index": 0, "depth": 12, "reclaimed": 1})
    memory.plot(snapshot, tmp_path / "t.png", top=1)  # 13 exits: no labels; one site
    seen = describe(drawn[-1])
    assert seen["axes"][2:5] == [
        memory.EVENT_AXIS,
        "MiB",
        "devmem memory timeline (sim): 3 events, peak live 3.00 MiB",
    ]
    assert len(seen["texts"]) == 1 and seen["lines"][1][0] == "arena exit (13)"
    assert [band[:2] for band in seen["bands"]][1] == ["other sites", "#9c9c9c"]
    assert [band[3] for band in seen["bands"]] == [2.0, 3.0, 3.0]  # MiB: the site, others, cache


def test_annotations_mark_device_0_only():
    # their trace_index counts device 0's events; on device 1 they would point past its trace
    assert [m.kind for m in timeline(BY_HAND, device=1).markers] == []
    assert {m.kind for m in timeline(BY_HAND, device=0).markers} >= {"arena_exit", "release"}


def test_plot_on_the_command_line_passes_every_option(drawn, tmp_path, monkeypatch, capsys):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(well_formed(BY_HAND)))  # annotations index device 0's
    monkeypatch.chdir(tmp_path)
    argv = ["plot", str(path), "--device", "1", "--top", "1", "--time", "--title", "T"]
    assert memory.main(argv) == 0
    assert (
        capsys.readouterr().out == "wrote timeline.png\n" and (tmp_path / "timeline.png").exists()
    )
    seen = describe(drawn[-1])
    assert seen["axes"][2:5] == ["time (s since the first event)", "bytes", "T"]
    assert [band[0] for band in seen["bands"]][:2] == [
        "peak 512 B: model.py:9 in other",
        "other sites",
    ]
    assert memory.main(["plot", str(path)]) == 0  # the defaults: device 0, 6 sites, events
    seen = describe(drawn[-1])
    assert seen["axes"][2] == memory.EVENT_AXIS and len(seen["bands"]) == 4


def test_the_picture_keeps_its_size_and_floors_at_its_edges(drawn, tmp_path):
    import matplotlib

    out = tmp_path / "t.png"
    with matplotlib.rc_context({"figure.dpi": 50}):  # a user's settings: the picture's own dpi
        memory.plot({"segments": [], "device_traces": [[]]}, out, use_time=True)
    assert describe(drawn[-1])["figure"] == [[11.0, 5.2], 100, "ConstrainedLayoutEngine"]
    assert describe(drawn[-1])["axes"][:4] == [
        [0.0, 1.0],
        [0.0, 1.12],
        memory.EVENT_AXIS,  # no event: no time to show
        "bytes",
    ]
    # nothing held, one OOM: the levels floor at 1 byte, the OOM's label just below it
    memory.plot({"segments": [], "device_traces": [[{"action": "oom", "time_us": 7}]]}, out)
    seen = describe(drawn[-1])
    assert (seen["axes"][:2], seen["texts"][0][:2]) == (
        [[0.0, 1.0], [0.0, 1.12]],
        ["OOM 0 B ", [0.0, 0.95]],
    )
    # a clock that never moved: the event axis, saying so; live above reserved sets the top
    held = {"segments": [{"blocks": [{"size": 4096, "state": "active_allocated"}]}]}
    trace = [
        {"action": "alloc", "addr": 1, "size": 4096, "time_us": 5},
        {"action": "oom", "time_us": 5},
    ]
    memory.plot({**held, "device_traces": [trace], "devmem": {"clock": "sim"}}, out, use_time=True)
    seen = describe(drawn[-1])
    assert seen["axes"][:3] == [[0.0, 1.0], [0.0, 4.48], memory.STILL_CLOCK_AXIS]  # KiB
    assert seen["texts"][0][:2] == ["OOM 0 B ", [1.0, 3.8]]  # 0.95 of 4 KiB, after the alloc
    # the clock moved at the last event only
    trace += [{"action": "segment_alloc", "size": 8192, "time_us": 9}]
    memory.plot({**held, "device_traces": [trace], "devmem": {"clock": "sim"}}, out, use_time=True)
    assert describe(drawn[-1])["axes"][0] == [0.0, 4.0]
    # below zero: a trace that frees more than the segments held starts below 0; the axis not
    freed = [
        {"action": "alloc", "addr": 1, "size": 8},
        {"action": "free_requested", "addr": 1, "size": 16},
    ]
    memory.plot({"segments": [], "device_traces": [freed]}, out)
    assert describe(drawn[-1])["axes"][1][0] == 0.0
    # reserved exactly live: no cached bytes, not even one
    both = [{"action": "segment_alloc", "size": 8}, {"action": "alloc", "addr": 1, "size": 8}]
    segment = {"total_size": 8, "blocks": [{"size": 8, "state": "active_allocated"}]}
    memory.plot({"segments": [segment], "device_traces": [both]}, out)
    assert [band[3] for band in describe(drawn[-1])["bands"]] == [8.0, 8.0]  # the site, cached


def test_the_picture_colors_six_sites_and_bands_the_others(drawn, tmp_path):
    many = [
        {"action": "alloc", "addr": i, "size": 8 << i, "frames": [src(f"f{i}", i)]}
        for i in range(8)
    ]
    snapshot = {"segments": [], "device_traces": [many]}
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    memory.plot(snapshot, tmp_path / "t.png")
    assert memory.main(["plot", str(path), "-o", str(tmp_path / "u.png")]) == 0
    for fig in drawn[-2:]:  # the function's default and the command line's: 6 sites
        bands = describe(fig)["bands"]
        assert [band[1] for band in bands] == [
            "#4e79a7",
            "#f28e2c",
            "#59a14f",
            "#e15759",
            "#76b7b2",
            "#edc949",
            "#9c9c9c",
            "#d6e6f5",
        ]  # by peak: f7 first; then the other sites (f1, f0), then the cache
        assert bands[0][0] == "peak 1.00 KiB: model.py:7 in f7"
        assert bands[6][0] == "other sites"


# -- untrusted files (issue 22, item 4) ----------------------------------------------------------


class _Opens:
    """Pickles as a call of ``open(path, "w")``: loading it creates ``path`` if anything calls
    what a pickle names."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("command", ["summary", "plot"])
def test_a_malicious_pickle_runs_nothing_and_is_one_error_line(tmp_path, capsys, command):
    if command == "plot":
        pytest.importorskip("matplotlib")  # without it, plot stops before reading the file
    marker = tmp_path / "pwned"
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]], "x": _Opens(marker)}))
    picture = tmp_path / "t.png"
    assert memory.main([command, str(path), *(["-o", str(picture)] * (command == "plot"))]) == 1
    assert not marker.exists() and not picture.exists()
    err = capsys.readouterr().err
    # the global as pickle names it: io.open up to Python 3.11, _io.open from 3.12
    named = f"{open.__module__}.{open.__qualname__}"
    assert named in ("io.open", "_io.open")
    assert err == (
        f"python -m allocator.memory {command}: error: {path}: not a pickled memory snapshot (it"
        f" names the global {named}; a snapshot holds only dicts, lists, tuples, strings,"
        " numbers, booleans and None, so nothing is ever imported or called)\n"
    )


def test_the_unpickler_refuses_every_global_and_persistent_id(tmp_path):
    import collections

    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(collections.OrderedDict(segments=[])))
    with pytest.raises(ValueError, match=r"names the global collections\.OrderedDict;"):
        memory.load(path)
    path.write_bytes(b"\x80\x04P0\n.")  # PERSID "0"
    with pytest.raises(ValueError, match=r"it holds a persistent id; a snapshot has none"):
        memory.load(path)


def _event(**fields) -> dict:
    return {"action": "alloc", "addr": 0, "size": 8, **fields}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "segments[0] is int 1, expected a dict"),
        ({"segments": [], "device_traces": "abc"}, "device_traces is str 'abc', expected a list"),
        ({"segments": [], "device_traces": ["abc"]}, "device_traces[0] is str 'abc', expected"),
        ({"segments": [], "device_traces": [[3]]}, "device_traces[0][0] is int 3, expected a dict"),
        ({"segments": [], "device_traces": [[_event(size="12")]]}, "[0][0].size is str '12'"),
        ({"segments": [], "device_traces": [[_event(size=True)]]}, "[0][0].size is bool True"),
        ({"segments": [], "device_traces": [[_event(frames=None)]]}, "[0][0].frames is None,"),
        ({"segments": [], "device_traces": [[_event(frames=[3])]]}, "[0][0].frames[0] is int 3"),
        (
            {"segments": [], "device_traces": [[_event(frames=[{"line": "7"}])]]},
            "device_traces[0][0].frames[0].line is str '7', expected an int",
        ),
        ({"segments": [], "device_traces": [[{"action": "alloc", "addr": 0}]]}, "size is missing"),
        ({"segments": [], "device_traces": [[{"action": "free_requested", "size": 4}]]}, ".addr"),
        ({"segments": [], "device_traces": [[_event(action="allocate")]]}, "action is str"),
        ({"segments": [], "device_traces": [[{"size": 4}]]}, "[0][0].action is missing"),
        ({"segments": [], "device_traces": [[_event(stream="s")]]}, "[0][0].stream is str 's'"),
        ({"segments": [], "device_traces": [[_event(time_us="1")]]}, "time_us is str '1'"),
        ({"segments": [], "device_traces": [[_event(user_metadata=1)]]}, "user_metadata is int"),
        ({"segments": [{"blocks": []}]}, "segments[0].total_size is missing, expected an int"),
        ({"segments": [{"total_size": 8}]}, "segments[0].blocks is missing, expected a list"),
        ({"segments": [{"total_size": 8, "blocks": [{"size": 8}]}]}, "blocks[0].state is missing"),
        ({"segments": [{"total_size": 8, "blocks": [{"state": "inactive"}]}]}, "[0].size is"),
        ({"segments": [{"total_size": 8, "blocks": [], "device": "0"}]}, "[0].device is str"),
        ({"segments": [], "devmem": []}, "devmem is list [], expected a dict"),
        ({"segments": [], "devmem": {"annotations": [1]}}, "devmem.annotations[0] is int 1"),
    ],
)
def test_a_file_that_is_not_a_snapshot_is_one_error_line_naming_the_field(
    tmp_path, capsys, data, message
):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(data))
    for command in ("summary", "plot"):
        assert (
            memory.main(
                [command, str(path), *(["-o", str(tmp_path / "t.png")] * (command == "plot"))]
            )
            == 1
        )
        err = capsys.readouterr().err
        assert err.startswith(f"python -m allocator.memory {command}: error: {path}: not a memory")
        assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "t.png").exists()


def test_every_pytorch_action_and_field_is_accepted(tmp_path):
    from allocator._timeline import ACTIONS

    trace = [{"action": action, "addr": 0, "size": 0, "stream": 0} for action in ACTIONS]
    trace[0].update(compile_context="fwd", user_metadata="step 1", time_us=1.5, frames=[])
    snapshot = {"segments": [], "device_traces": [trace, []]}
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    assert memory.load(path) == snapshot


@pytest.mark.backends("sim")
def test_events_added_after_the_stop_do_not_make_the_ring_full(make_alloc):
    alloc = make_alloc()
    with alloc.history(max_entries=4):
        buf = alloc.full(4, 1.0)  # segment_alloc, alloc: 2 of 4
    alloc.release(buf)  # after the stop: the snapshot adds free_requested, free_completed
    snapshot = alloc.snapshot()
    assert snapshot["devmem"]["reconciled"] == 2 and len(snapshot["device_traces"][0]) == 4
    assert memory.summary(snapshot).splitlines()[0] == "backend sim: 4 events"


@pytest.mark.backends("sim")
def test_each_free_of_an_arena_exit_is_one_step_of_the_event_axis(make_alloc):
    alloc = make_alloc()
    with alloc.history(), alloc.arena():
        bufs = [alloc.full(4, 1.0) for _ in range(4)]
    del bufs  # freed by the exit already
    snapshot = alloc.snapshot()
    actions = [event["action"] for event in snapshot["device_traces"][0]]
    assert (
        actions == ["segment_alloc", "alloc"] * 4 + ["free_requested"] * 4 + ["free_completed"] * 4
    )
    line = timeline(snapshot)
    x, label = memory._x_axis(line, False, snapshot)
    assert label == memory.EVENT_AXIS
    # 8 allocation steps, then 4 frees of one step each (free_completed takes none)
    assert x[:9] == list(range(9))
    assert x[8:] == [8, 9, 10, 11, 12, 12, 12, 12, 12]
    assert line.live[8:] == [64, 48, 32, 16, 0, 0, 0, 0, 0]
    alloc.empty_cache()


# -- PyTorch's own snapshots, every action and field it writes (issue 22, item 3) --------------

MIB = 1 << 20
HANDLE = 0x5581_2A3C_41F0  # a stream given as its cudaStream_t handle, as PyTorch may write it
BASE = 0x7F00_0000_0000


def torch_event(action: str, addr: int, size: int, t: int, **more) -> dict:
    """An event as torch 2.13's memory_snapshot.cpp writes it: every key, always."""
    event = {"action": action, "addr": addr, "size": size, "stream": HANDLE, "time_us": t}
    event.update(compile_context="", user_metadata="", frames=[])
    event.update(more)
    return event


def torch_block(address: int, size: int, state: str) -> dict:
    return {"address": address, "size": size, "requested_size": size, "state": state, "frames": []}


# device 1: one expandable segment that maps 2 MiB, grows to 4 MiB, unmaps its second page
EXPANDABLE = [
    torch_event("segment_map", BASE, 2 * MIB, 10),
    torch_event("alloc", BASE, MIB // 2, 11, compile_context="fwd", frames=[LOAD]),
    torch_event("alloc", BASE + MIB // 2, MIB, 12, user_metadata="step 1", frames=BUILD),
    torch_event("segment_map", BASE + 2 * MIB, 2 * MIB, 13),
    torch_event("alloc", BASE + 3 * MIB // 2, 2 * MIB, 14, frames=[OTHER]),
    torch_event("free_requested", BASE, MIB // 2, 15),
    torch_event("free_completed", BASE, MIB // 2, 15),
    torch_event("snapshot", 0, 3 * MIB, 16),
    torch_event("free_requested", BASE + MIB // 2, MIB, 17),
    torch_event("free_completed", BASE + MIB // 2, MIB, 17),
    torch_event("free_requested", BASE + 3 * MIB // 2, 2 * MIB, 18),
    torch_event("free_completed", BASE + 3 * MIB // 2, 2 * MIB, 18),
    torch_event("segment_unmap", BASE + 2 * MIB, 2 * MIB, 19),
    torch_event("alloc", BASE, MIB // 4, 20, frames=[LOAD]),
]
TORCH_MADE = {
    "segments": [
        {  # device 0: a private pool's segment (a CUDA graph's), one block live
            "device": 0,
            "address": 0x1000,
            "total_size": 2 * MIB,
            "allocated_size": 4096,
            "active_size": 4096,
            "requested_size": 4096,
            "stream": 0,
            "segment_type": "large",
            "segment_pool_id": (1, 2),
            "is_expandable": False,
            "frames": [],
            "blocks": [
                torch_block(0x1000, 4096, "active_allocated"),
                torch_block(0x2000, 2 * MIB - 4096, "inactive"),
            ],
        },
        {  # device 1: the expandable segment's mapped range at the end
            "device": 1,
            "address": BASE,
            "total_size": 2 * MIB,
            "allocated_size": MIB // 4,
            "active_size": MIB // 4,
            "requested_size": MIB // 4,
            "stream": HANDLE,
            "segment_type": "large",
            "segment_pool_id": (0, 0),
            "is_expandable": True,
            "frames": [],
            "blocks": [
                torch_block(BASE, MIB // 4, "active_allocated"),
                torch_block(BASE + MIB // 4, 2 * MIB - MIB // 4, "inactive"),
            ],
        },
    ],
    "device_traces": [
        [
            torch_event("segment_alloc", 0x1000, 2 * MIB, 1, stream=0),
            torch_event("alloc", 0x1000, 4096, 2, stream=0, frames=[LOAD]),
        ],
        EXPANDABLE,
    ],
    "allocator_settings": {"expandable_segments": True, "PYTORCH_CUDA_ALLOC_CONF": ""},
    "external_annotations": [{"device": 1, "time_us": 16, "stage": "forward"}],
}


def test_a_pytorch_snapshot_with_an_expandable_segment_is_read_in_full(tmp_path, capsys):
    path = tmp_path / "torch.pickle"
    path.write_bytes(pickle.dumps(TORCH_MADE, protocol=4))
    assert memory.load(path) == TORCH_MADE
    line = timeline(TORCH_MADE, device=1)
    half, quarter = MIB // 2, MIB // 4
    assert line.reserved == [0, *[2 * MIB] * 3, *[4 * MIB] * 9, *[2 * MIB] * 2]
    assert line.live == [
        *[0, 0, half, 3 * half, 3 * half, 7 * half, 3 * MIB],  # the free lowers it at request
        *[3 * MIB, 3 * MIB, 2 * MIB, 2 * MIB, 0, 0, 0, quarter],
    ]
    assert all(live <= reserved for live, reserved in zip(line.live, line.reserved, strict=True))
    assert [(m.index, m.kind, m.label) for m in line.markers] == [(7, "snapshot", "snapshot")]
    device_0 = timeline(TORCH_MADE)  # the first device with events
    assert (device_0.live, device_0.reserved) == ([0, 0, 4096], [0, 2 * MIB, 2 * MIB])
    assert memory.main(["summary", str(path), "--device", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [
        "backend torch: 14 events",
        "peak live 3.50 MiB after event 5; at the end: live 256.00 KiB, cached 1.75 MiB, reserved"
        " 2.00 MiB",
    ]
    assert memory.main(["plot", str(path), "--device", "1", "-o", str(tmp_path / "t.png")]) == 0
    assert (tmp_path / "t.png").stat().st_size > 0


# -- the one-pass reader against the straightforward one (issue 22, item 5) ----------------------


def reference_sites_and_levels(snapshot: dict, short: bool) -> tuple[list, list, list]:
    """Brute force: replay the trace event by event from the levels worked back from the
    segments, naming every allocation's site afresh. Returns the sites (as ``sites`` sorts
    them), and the live and reserved bytes after each event."""
    from allocator._timeline import Site

    trace = snapshot["device_traces"][0]
    end_live = sum(
        b["size"]
        for seg in snapshot["segments"]
        for b in seg["blocks"]
        if b["state"] == "active_allocated"
    )
    end_reserved = sum(seg["total_size"] for seg in snapshot["segments"])
    sign = {"alloc": 1, "free_requested": -1}
    grow = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
    d_live = sum(sign.get(e["action"], 0) * e["size"] for e in trace)
    d_reserved = sum(grow.get(e["action"], 0) * e["size"] for e in trace)
    live, reserved = [end_live - d_live], [end_reserved - d_reserved]
    by_site = {BEFORE_TRACE: [live[0]]}
    owner, stats = {}, {}
    for e in trace:
        live.append(live[-1] + sign.get(e["action"], 0) * e["size"])
        reserved.append(reserved[-1] + grow.get(e["action"], 0) * e["size"])
        if e["action"] == "alloc":
            name = site_of(e["frames"], short)
            owner[e["addr"]] = name
            s = stats.setdefault(name, [0, 0, 0])  # allocs, largest, live
            s[0], s[1] = s[0] + 1, max(s[1], e["size"])
        elif e["action"] == "free_requested":
            name = owner.pop(e["addr"], BEFORE_TRACE)
        else:
            continue
        for series in by_site.values():
            series.append(series[-1])
        by_site.setdefault(name, [0] * len(live))
        by_site[name][-1] += sign[e["action"]] * e["size"]
    out = []
    for name, series in by_site.items():
        if name == BEFORE_TRACE and live[0] <= 0:
            continue
        allocs, largest = stats.get(name, [0, 0])[:2]
        out.append(Site(name, max(series), allocs, largest, series[-1]))
    return sorted(out, key=lambda s: (-s.peak_bytes, s.name)), live, reserved


_FILES = ["/src/a.py", "/src/b.py", "lib.cpp", "<devmem history off>"]
_NAMES = ["f", "g", "<listcomp>", "<lambda>", "h"]


@st.composite
def random_snapshots(draw):
    frames_pool = [
        [
            {
                "filename": draw(st.sampled_from(_FILES)),
                "line": i,
                "name": draw(st.sampled_from(_NAMES)),
            }
            for i in range(draw(st.integers(0, 4)))
        ]
        for _ in range(draw(st.integers(1, 5)))
    ]
    live, trace, segments = {}, [], {}
    for _ in range(draw(st.integers(0, 40))):
        address = draw(st.integers(0, 7)) * 64
        size = draw(st.sampled_from([4, 8, 64]))
        kind = draw(st.sampled_from(["alloc", "free", "segment", "unsegment", "oom"]))
        if kind == "alloc" and address not in live:
            live[address] = size
            frames = draw(st.sampled_from(frames_pool))
            trace.append({"action": "alloc", "addr": address, "size": size, "frames": list(frames)})
        elif kind == "free" and address in live:
            size = live.pop(address)
            trace.append({"action": "free_requested", "addr": address, "size": size})
            trace.append({"action": "free_completed", "addr": address, "size": size})
        elif kind == "segment":
            action = draw(st.sampled_from(["segment_alloc", "segment_map"]))
            segments[address] = segments.get(address, 0) + size
            trace.append({"action": action, "addr": address, "size": size})
        elif kind == "unsegment" and segments.get(address, 0) >= size:
            action = draw(st.sampled_from(["segment_free", "segment_unmap"]))
            segments[address] -= size
            trace.append({"action": action, "addr": address, "size": size})
        elif kind == "oom":
            trace.append({"action": "oom", "device_free": 0, "size": size})
    start = draw(st.integers(0, len(trace)))  # the ring dropped the oldest events
    held = [
        {"total_size": n, "blocks": [{"size": 0, "state": "inactive"}]} for n in segments.values()
    ]
    held += [
        {"total_size": 0, "blocks": [{"size": n, "state": "active_allocated"}]}
        for n in live.values()
    ]
    return {"segments": held, "device_traces": [trace[start:]]}


@settings(max_examples=150, deadline=None)
@given(snapshot=random_snapshots(), short=st.booleans())
def test_the_one_pass_reader_agrees_with_a_replay_of_every_event(snapshot, short):
    expected_sites, live, reserved = reference_sites_and_levels(snapshot, short)
    assert sites(snapshot, short=short) == expected_sites
    line = timeline(snapshot, top=3, short=short)
    assert (line.live, line.reserved) == (live, reserved)
    ours = overview(snapshot)
    assert ours.sites == sites(snapshot)
    assert ours.peak == (max(live), live.index(max(live)))
    assert (ours.live, ours.reserved, ours.events) == (live[-1], reserved[-1], len(live) - 1)
    for name, series in line.by_site.items():  # each chosen site's own series, replayed
        assert series[-1] == next(
            s.live_end_bytes for s in sites(snapshot, short=short) if s.name == name
        )
        assert max(series) == next(
            s.peak_bytes for s in sites(snapshot, short=short) if s.name == name
        )


# --- a long timeline is drawn thinned: every stretch's extremes, the peak and the end exact ---


@settings(max_examples=200, deadline=None)
@given(
    levels=st.lists(st.tuples(st.integers(-5, 50), st.integers(0, 60)), min_size=1, max_size=300),
    points=st.integers(8, 40),
)
def test_thinned_keeps_each_stretchs_extremes_in_order(levels, points):
    live = [a for a, _ in levels]
    reserved = [b for _, b in levels]
    keep = memory.thinned(live, reserved, points)
    if len(live) <= points:
        assert keep == list(range(len(live)))
        return
    assert len(keep) <= points
    assert keep == sorted(set(keep)) and keep[0] == 0 and keep[-1] == len(live) - 1
    stretches = (points - 1) // 4
    for k in range(stretches):  # brute force: each stretch's extremes are among the kept
        part = range(k * len(live) // stretches, (k + 1) * len(live) // stretches)
        kept = [i for i in keep if i in part]
        assert max(live[i] for i in kept) == max(live[i] for i in part)
        assert min(live[i] for i in kept) == min(live[i] for i in part)
        assert max(reserved[i] for i in kept) == max(reserved[i] for i in part)
    assert live.index(max(live)) in keep  # the peak, where the picture's arrow points


@pytest.mark.parametrize(
    "live, reserved, points, message",
    [
        ([1, 2], [1, 2], 7, "points must be >= 8, got 7"),
        ([1, 2], [1], 8, "live has 2 points but reserved has 1"),
    ],
)
def test_thinned_refuses_what_it_cannot_thin(live, reserved, points, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        memory.thinned(live, reserved, points)


def test_a_long_timeline_is_drawn_thinned_with_its_peak_and_end(drawn, tmp_path):
    trace, held = [], []
    for i in range(30_000):  # a saw: up for 40 events (64 bytes each, one 4160), then down
        if (i // 40) % 2 == 0 or not held:
            held.append((i, 4160 if i == 21_001 else 64))
            trace.append({"action": "alloc", "addr": i, "size": held[-1][1]})
        else:
            address, size = held.pop()
            trace.append({"action": "free_requested", "addr": address, "size": size})
    snapshot = {"segments": [], "device_traces": [trace]}
    line = timeline(snapshot)
    memory.plot(snapshot, tmp_path / "long.png")
    (ax,) = drawn[-1].axes
    live_line = next(artist for artist in ax.lines if artist.get_label() == "live bytes")
    xs, ys = live_line.get_data()
    assert len(xs) <= memory.MAX_POINTS < len(line.live)
    scale = 1 << 10  # KiB
    peak, at = line.peak
    # every event moves the level: the event axis's x is the event's index
    assert max(ys) == peak / scale and xs[list(ys).index(max(ys))] == at
    assert ys[-1] == line.live[-1] / scale and min(ys) == min(line.live) / scale
    assert "30,000 events drawn as" in ax.get_xlabel()
    doc = Path(__file__).parents[2] / "docs" / "memory-history.md"
    assert f"`memory.MAX_POINTS` ({memory.MAX_POINTS:,})" in doc.read_text()  # what it says
    memory.plot({"segments": [], "device_traces": [trace[:100]]}, tmp_path / "short.png")
    assert "drawn as" not in drawn[-1].axes[0].get_xlabel()
