"""The snapshots PyTorch itself wrote on an H200 (``data/``), read as memory_viz reads them
(issue 38, items 1, 2 and 5).

memory_viz's own logic is the oracle, ported here from ``torch/utils/viz/MemoryViz.js``
independently of the reader: ``frameFilter`` (which frames it shows) and ``process_alloc_data``
with ``annotate_snapshot``'s merge of a ``free_requested`` and its ``free_completed`` (the
Active Memory Timeline's levels). The interop tests hold our port of the filter to PyTorch's own
Python copy of it, ``torch.cuda._memory_viz._frame_filter``.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import pytest

from allocator import Allocator, AllocatorConfig, memory
from allocator._timeline import (
    BEFORE_TRACE,
    NO_STACK,
    memory_viz_shows,
    overview,
    site_of,
    timeline,
)

DATA = Path(__file__).parent / "data"


def real(name: str) -> dict:
    with open(DATA / f"{name}.pickle", "rb") as f:
        return pickle.load(f)  # PyTorch's own file, checked in: trusted


TORCH = real("torch-train-step")  # stacks="python"
GPT2 = real("gpt2-train-steps")  # stacks="all": C++ and Python frames

# frameFilter, as torch/utils/viz/MemoryViz.js writes it (PyTorch's repository, as of 2.13)
FRAME_FILTER_JS = """
function frameFilter({name, filename}) {
  const omitFunctions = [
    'unwind::unwind',
    'CapturedTraceback::gather',
    'gather_with_cpp',
    '_start',
    '__libc_start_main',
    'PyEval_',
    'PyObject_',
    'PyFunction_',
  ];

  const omitFilenames = [
    'core/boxing',
    '/Register',
    '/Redispatch',
    'pythonrun.c',
    'Modules/main.c',
    'Objects/call.c',
    'Objects/methodobject.c',
    'pycore_ceval.h',
    'ceval.c',
    'cpython/abstract.h',
  ];

  for (const of of omitFunctions) {
    if (name.includes(of)) {
      return false;
    }
  }

  for (const of of omitFilenames) {
    if (filename.includes(of)) {
      return false;
    }
  }

  return true;
}
"""


def _js_list(name: str) -> list[str]:
    body = re.search(rf"const {name} = \[(.*?)\];", FRAME_FILTER_JS, re.S).group(1)
    return re.findall(r"'([^']*)'", body)


def js_shows(frame: dict) -> bool:
    """frameFilter, run as the JavaScript above runs it: its two lists, ``includes``."""
    return not any(part in frame["name"] for part in _js_list("omitFunctions")) and not any(
        part in frame["filename"] for part in _js_list("omitFilenames")
    )


def memory_viz_timeline(snapshot: dict, device: int = 0) -> tuple[int, list[int]]:
    """memory_viz's Active Memory Timeline (``process_alloc_data`` with ``plot_segments``
    false, after ``annotate_snapshot``): the bytes allocated before its first action and after
    each action (an allocation, or a free: a ``free_requested`` merged with the
    ``free_completed`` right after it, else the ``free_completed`` alone)."""
    trace: list[dict] = []
    for event in snapshot["device_traces"][device]:
        last = trace[-1] if trace else None
        if (
            event["action"] == "free_completed"
            and last
            and last["action"] == "free_requested"
            and last["addr"] == event["addr"]
        ):
            trace[-1] = {**last, "action": "free"}
            continue
        trace.append(event)
    elements, initially, actions, addr_to_alloc = [], [], [], {}
    for event in trace:
        if event["action"] == "alloc":
            elements.append(event)
            addr_to_alloc[event["addr"]] = len(elements) - 1
            actions.append(len(elements) - 1)
        elif event["action"] in ("free", "free_completed"):
            if event["addr"] in addr_to_alloc:
                actions.append(addr_to_alloc.pop(event["addr"]))
            else:
                elements.append(event)
                initially.append(len(elements) - 1)
                actions.append(len(elements) - 1)
    for segment in snapshot["segments"]:
        if segment["device"] != device:
            continue
        addr = segment["address"]
        for block in segment["blocks"]:
            if block["state"] == "active_allocated" and addr not in addr_to_alloc:
                elements.append({"size": block["requested_size"]})
                initially.append(len(elements) - 1)
            addr += block["size"]
    current = set(initially)
    total = sum(elements[i]["size"] for i in initially)
    start, levels = total, []
    for elem in actions:
        if elem in current:
            current.remove(elem)
            total -= elements[elem]["size"]
        else:
            current.add(elem)
            total += elements[elem]["size"]
        levels.append(total)
    return start, levels


# -- item 2: the levels memory_viz draws, in the bytes the events carry -------------------------


@pytest.mark.parametrize("snapshot", [TORCH, GPT2], ids=["torch-train-step", "gpt2-train-steps"])
def test_the_live_levels_are_memory_vizs_after_every_allocation_and_free(snapshot):
    trace = snapshot["device_traces"][0]
    for i, event in enumerate(trace):  # no record_stream here: each free completes at once
        if event["action"] == "free_requested":
            assert trace[i + 1]["action"] == "free_completed"
            assert trace[i + 1]["addr"] == event["addr"]
    start, levels = memory_viz_timeline(snapshot)
    line = timeline(snapshot)
    ours = [
        line.live[i + 1] for i, e in enumerate(trace) if e["action"] in ("alloc", "free_requested")
    ]
    assert start == 0 and line.live[0] == 0  # recorded from the first allocation
    assert ours == levels
    assert min(line.cached) >= 0  # was -2,396 B at the start
    summary = overview(snapshot)
    assert summary.peak[0] == max(levels)
    assert summary.live == levels[-1]
    assert BEFORE_TRACE not in {site.name for site in summary.sites}


def test_the_end_levels_are_the_requested_bytes_of_the_live_blocks():
    summary = overview(TORCH)
    blocks = [b for s in TORCH["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert summary.live == sum(b["requested_size"] for b in blocks)
    assert sum(b["size"] for b in blocks) - summary.live == 2396  # what PyTorch rounded up
    assert summary.reserved == sum(s["total_size"] for s in TORCH["segments"])
    assert summary.cached == summary.reserved - summary.live


# -- item 1: sites among the frames memory_viz shows, less the allocator's own ------------------


def test_the_port_of_memory_vizs_frame_filter_is_its_javascript():
    from allocator import _timeline

    assert list(_timeline.MEMORY_VIZ_OMIT_FUNCTIONS) == _js_list("omitFunctions")
    assert list(_timeline.MEMORY_VIZ_OMIT_FILENAMES) == _js_list("omitFilenames")
    frames = [f for e in GPT2["device_traces"][0] for f in e.get("frames", ())]
    assert len(frames) > 10_000
    assert [memory_viz_shows(f) for f in frames] == [js_shows(f) for f in frames]
    assert not all(map(js_shows, frames)) and any(map(js_shows, frames))


def _allocs(snapshot: dict) -> list[dict]:
    return [e for e in snapshot["device_traces"][0] if e["action"] == "alloc"]


def _python(frames: list[dict]) -> list[dict]:
    return [f for f in frames if f["filename"].endswith(".py") and js_shows(f)]


@pytest.mark.parametrize("snapshot", [TORCH, GPT2], ids=["torch-train-step", "gpt2-train-steps"])
def test_an_allocation_with_a_python_frame_is_named_by_the_first_memory_viz_shows(snapshot):
    named = 0
    for event in _allocs(snapshot):
        python = _python(event["frames"])
        if python:
            first = python[0]
            expected = f"{os.path.basename(first['filename'])}:{first['line']} in {first['name']}"
            assert site_of(event["frames"], short=True).startswith(expected)
            named += 1
    assert named == {id(TORCH): 89, id(GPT2): 290}[id(snapshot)]


def test_an_autograd_thread_allocation_is_named_by_its_op_and_node():
    native = [e for e in _allocs(GPT2) if not _python(e["frames"])]
    assert len(native) == 205  # every one in the autograd engine's thread
    nodes = set()
    for event in native:
        shown = [f["name"] for f in event["frames"] if js_shows(f)]
        assert any("torch::autograd::Engine::thread_main" in name for name in shown)
        node = next(
            (m.group(1) for n in shown if (m := re.search(r"::(\w+Backward\d*)::apply\(", n))),
            None,
        )
        op = next(
            (
                m.group(1)
                for n in shown
                if (m := re.match(r"at::_ops::(\w+)::(call|redispatch)\(", n))
                and not m.group(1).startswith("empty")
            ),
            None,
        )
        site = site_of(event["frames"])
        assert site == " < ".join(p for p in (op and f"at::_ops::{op}", node) if p)
        nodes.add(node)
    assert {"MulBackward0", "NllLossBackward0", "MmBackward0", "AddmmBackward0"} <= nodes


def test_the_top_sites_of_the_gpt2_steps_are_where_memory_viz_points():
    sites = overview(GPT2).sites
    hidden = ("unwind", "CapturedTraceback", "gather_with_cpp", "CachingAllocator", "empty_")
    for site in sites:
        assert not any(part in site.name for part in hidden), site.name
    assert sum(s.allocs for s in sites) == 495
    assert [(s.name.rsplit("/", 1)[-1], s.peak_bytes >> 20, s.allocs) for s in sites[:3]] == [
        ("pytorch_utils.py:119 in forward", 48, 18),
        ("at::_ops::mm < MmBackward0", 41, 5),
        ("functional.py:3504 in cross_entropy", 32, 6),
    ]
    assert sites[0].peak_bytes < 96 << 20  # the unwinder's frame was the top site, 96 MiB


@pytest.mark.parametrize(
    ("frames", "site"),
    [
        ([], NO_STACK),
        # memory_viz hides the unwinder; the allocator's frames name no site
        (
            [
                {"filename": "??", "line": 0, "name": "torch::unwind::unwind()"},
                {
                    "filename": "CUDACachingAllocator.cpp",
                    "line": 0,
                    "name": "c10::cuda::CUDACachingAllocator::malloc(int)",
                },
                {"filename": "eng.cpp", "line": 3, "name": "run_it(int, char**)"},
            ],
            "eng.cpp:3 in run_it",
        ),
        # torch/cuda/memory.py is the allocator's API: its caller is the site
        (
            [
                {
                    "filename": "/t/torch/cuda/memory.py",
                    "line": 9,
                    "name": "caching_allocator_alloc",
                },
                {"filename": "/src/train.py", "line": 4, "name": "step"},
            ],
            "train.py:4 in step",
        ),
        # every frame hidden: the first one
        ([{"filename": "ceval.c", "line": 1, "name": "x"}], "ceval.c:1 in x"),
        # a node without an op, an op without a node
        (
            [{"filename": "??", "line": 0, "name": "torch::autograd::AccumulateGrad::apply(a)"}],
            "AccumulateGrad",
        ),
        ([{"filename": "??", "line": 0, "name": "at::_ops::cat::call(x)"}], "at::_ops::cat"),
    ],
)
def test_site_rules_at_their_edges(frames, site):
    assert site_of(frames, short=True) == site


# -- item 5: record_stream, where memory_viz frees at free_completed ----------------------------


def test_a_block_awaiting_another_stream_is_live_to_memory_viz_and_said_so(tmp_path, capsys):
    alloc = Allocator(AllocatorConfig(backend="sim", sim_latency_us=10))
    side = alloc.new_stream("side")
    with alloc.history():
        with alloc.use_stream(side):
            on_side = alloc.full(2, 0.0)  # 8 B, a kernel on side until t=10
        buf = alloc.full(256, 1.0)  # 1 KiB
        buf.record_stream(side)
        alloc.release(buf)  # free_requested: awaits side's kernel
        small = alloc.full(16, 1.0)  # 64 B more while it waits
        alloc.device.advance(10)
        alloc.release(alloc.full(4, 1.0))  # finds it reusable: its free_completed
        alloc.release(small)
        alloc.release(on_side)
    snapshot = alloc.snapshot()
    start, levels = memory_viz_timeline(snapshot)
    summary = overview(snapshot)
    assert summary.peak[0] == 8 + 1024 == max(timeline(snapshot).live)  # live_bytes' peak
    assert summary.viz_peak[0] == 8 + 1024 + 64 == start + max(levels, default=0)
    path = tmp_path / "s.pickle"
    alloc.dump_snapshot(path)
    assert memory.main(["summary", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("peak live 1.01 KiB after event")
    assert lines[2].startswith("memory_viz's peak: 1.07 KiB after event") and lines[2].endswith(
        "(it counts a freed block as live until its free_completed: blocks that awaited"
        " another stream's work)"
    )
    assert lines[3].startswith("arena exits 0")


# -- interop: PyTorch's own copy of the filter ---------------------------------------------------


@pytest.mark.interop
def test_the_filter_is_pytorchs_own_frame_filter(memory_viz_module):
    frames = [f for s in (TORCH, GPT2) for e in s["device_traces"][0] for f in e.get("frames", ())]
    theirs = [memory_viz_module._frame_filter(f["name"], f["filename"]) for f in frames]
    assert [memory_viz_shows(f) for f in frames] == theirs


@pytest.mark.interop
def test_each_python_site_is_the_first_python_frame_pytorchs_helpers_show(memory_viz_module):
    for event in _allocs(GPT2) + _allocs(TORCH):
        shown = memory_viz_module._frames_fmt(event["frames"])  # "file:line:name", filtered
        python = [text for text in shown if ".py:" in text]
        site = site_of(event["frames"], short=True)
        if python:
            name, line, func = python[0].split(":", 2)
            assert site.startswith(f"{name}:{line} in {func}")
        elif event["frames"]:
            assert ".py:" not in site and site != NO_STACK


@pytest.fixture
def memory_viz_module():
    return pytest.importorskip("torch.cuda._memory_viz")


# -- teeth: each check above, run on the defect patched back in (DESIGN 4) -----------------------


def _old_site_of(frames, short=False, files=None):
    """The site before issue 38: the first ``.py`` frame, else the first frame whatever it is."""
    python = [f for f in frames if f["filename"].endswith(".py")]
    chosen = python or frames
    return NO_STACK if not chosen else f"{chosen[0]['filename']}:0 in {chosen[0]['name']}"


def test_teeth_the_unwinders_frame_as_a_site_is_caught(monkeypatch):
    from allocator import _timeline

    monkeypatch.setattr(_timeline, "site_of", _old_site_of)  # what TraceScan names sites by
    with pytest.raises(AssertionError, match="unwind"):
        test_the_top_sites_of_the_gpt2_steps_are_where_memory_viz_points()


def test_teeth_end_levels_in_block_sizes_are_caught(monkeypatch):
    from allocator import _timeline

    def block_sizes(snapshot, device):  # the defect: rounded block sizes, not requested bytes
        live = reserved = 0
        for segment in snapshot["segments"]:
            reserved += segment["total_size"]
            live += sum(b["size"] for b in segment["blocks"] if b["state"] == "active_allocated")
        return live, reserved

    monkeypatch.setattr(_timeline, "_end_levels", block_sizes)
    with pytest.raises(AssertionError):
        test_the_live_levels_are_memory_vizs_after_every_allocation_and_free(TORCH)


def test_teeth_a_summary_without_memory_vizs_peak_is_caught(tmp_path, capsys, monkeypatch):
    from allocator import _timeline

    real_overview_of = _timeline.overview_of

    def without(snapshot, device, scan):  # the defect: memory_viz's peak never computed
        line = real_overview_of(snapshot, device, scan)
        return _timeline.dataclasses.replace(line, viz_peak=line.peak)

    monkeypatch.setattr(memory, "overview_of", without)  # what summary(path) prints from
    with pytest.raises(AssertionError):
        test_a_block_awaiting_another_stream_is_live_to_memory_viz_and_said_so(tmp_path, capsys)
