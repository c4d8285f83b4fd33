"""``python -m allocator.memory plot|summary``: the timeline and the top allocation sites.

The levels are checked against the allocator's own counters; the picture is drawn for real (the
``plot`` extra: ``ci/check.sh`` installs it) and read back; PyTorch-made snapshots (C++ frames,
no ``devmem`` key) and traces that start late are read too.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from allocator import memory
from allocator._timeline import BEFORE_TRACE, NO_STACK, format_bytes, site_of, sites, timeline

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
    assert released.name == f"{here}:{LINES['released']} in <listcomp> < recorded"
    assert (released.peak_bytes, released.allocs, released.live_end_bytes) == (6 * 4096, 6, 0)
    assert kept.name == f"{here}:{LINES['kept']} in <listcomp> < recorded"
    assert (kept.peak_bytes, kept.allocs, kept.live_end_bytes) == (3 * 4096, 3, 3 * 4096)
    assert rounds.name.endswith("_stress.py:27 in <listcomp> < arena_round")
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
    assert "_stress.py:27 in &lt;listcomp&gt; &lt; arena_round" in text


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
