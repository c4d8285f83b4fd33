"""The project's ``memory_history`` fixture, from outside (pytester, the project's own conftest).

A failing test, and a passing one whose teardown leak check fails, show the path of the
snapshot dumped beside their temporary directory and the blocks still live with the frames that
allocated them; a passing test shows nothing and dumps nothing.
"""

from __future__ import annotations

import gc
import os
import pickle
import re
from pathlib import Path

import pytest

from allocator import Allocator, AllocatorConfig
from suites._memory_history import MemoryHistory

ROOT = Path(__file__).resolve().parents[2]

TESTS = """
import allocator

LEAKED = []


def test_fails(make_alloc, memory_history):
    alloc = make_alloc()
    kept = [alloc.full(4096, 1.0)]
    assert False, "boom"


def test_leaks(make_alloc, memory_history):
    alloc = make_alloc()
    LEAKED.append(alloc.full(16, 1.0))


def test_alloc_first(alloc, memory_history):
    LEAKED.append(alloc.full(32, 1.0))


def test_passes(make_alloc, memory_history):
    alloc = make_alloc()
    alloc.release(alloc.full(16, 1.0))


def test_default_allocator(memory_history):
    memory_history.watch(allocator.get_allocator())
    buf = allocator.full(8, 1.0)
    assert buf.size == 0
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the conftest's helpers (suites._*)
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    pytester.makepyfile(test_leaky=TESTS)
    return pytester


def line_of(text: str) -> int:
    return next(i for i, line in enumerate(TESTS.splitlines()) if text in line)


@pytest.mark.skipif(
    "MUTANT_UNDER_TEST" in os.environ,
    reason="under mutmut the pytest subprocess imports the mutated allocator outside mutmut's"
    " folder, where its trampolines cannot find their configuration",
)
def test_failures_show_the_snapshot_and_the_live_blocks(project):
    result = project.runpytest_subprocess("--backend", "sim", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=2, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*_ ERROR at teardown of test_leaks[[]sim[]] _*",
            "*leak check: 1 buffers (64 bytes) still live*",
            "*- devmem memory history -*",
            "open a snapshot with: python -m allocator.memory summary|plot SNAPSHOT, or drop it on"
            " https://pytorch.org/memory_viz",
            "allocator 1 (backend=sim live=64 B peak=64 B allocs=1 frees=0 cache=0 B"
            " cache_cap=unbounded): snapshot */test_leaks_sim_0-memory.pickle",
            "  1 live blocks, 64 B:",
            "  0x*: 64 bytes on stream 0, allocated at",
            f"      */test_leaky.py:{line_of('LEAKED.append')} in test_leaks",
            "      ... * more frames",
            "*_ test_fails[[]sim[]] _*",
            "*AssertionError: boom*",
            "*- devmem memory history -*",
            "open a snapshot with: *",
            "allocator 1 (backend=sim live=16.00 KiB peak=16.00 KiB *): snapshot"
            " */test_fails_sim_0-memory.pickle",
            "  1 live blocks, 16.00 KiB:",
            "  0x*: 16384 bytes on stream 0, allocated at",
            f"      */test_leaky.py:{line_of('kept = [')} in test_fails",
            "      ... * more frames",
            "*_ test_default_allocator _*",
            "*- devmem memory history -*",
            "open a snapshot with: *",
            "allocator 1 (backend=cpu *): snapshot */test_default_allocator0-memory.pickle",
            "  1 live blocks, 32 B:",
            "  0x*: 32 bytes on stream 0, allocated at",
            f"      */test_leaky.py:{line_of('buf = allocator.full')} in test_default_allocator",
            "      ... * more frames",
            "*= 2 failed, 3 passed, 2 errors in *",
        ]
    )
    # an allocator built before the fixture (the ``alloc`` fixture first) is watched as well
    result.stdout.fnmatch_lines(
        [
            "*_ ERROR at teardown of test_alloc_first[[]sim[]] _*",
            "*leak check: 1 buffers (128 bytes) still live*",
            "*- devmem memory history -*",
            "open a snapshot with: *",
            "allocator 1 (backend=sim *): snapshot */test_alloc_first_sim_0-memory.pickle",
            "  1 live blocks, 128 B:",
            "  0x*: 128 bytes on stream 0, allocated at",
            f"      */test_leaky.py:{line_of('LEAKED.append(alloc.full(32')} in test_alloc_first",
        ]
    )
    assert "_pytest" not in result.stdout.str().split("devmem memory history")[1]
    assert "test_passes" not in "\n".join(
        line for line in result.outlines if "memory.pickle" in line
    )
    dumped = sorted(path.name for path in project.path.parent.rglob("*-memory.pickle"))
    paths = re.findall(r"snapshot (\S+-memory\.pickle)", result.stdout.str())
    assert len(paths) == 4 == len(dumped)
    (failed,) = [path for path in paths if "test_fails" in path]
    snapshot = pickle.loads(Path(failed).read_bytes())
    (live,) = [s for s in snapshot["segments"] if s["blocks"][0]["state"] == "active_allocated"]
    assert live["blocks"][0]["frames"][0]["name"] == "test_fails"


def test_watching_puts_back_the_recording_it_found(tmp_path):
    alloc = Allocator(AllocatorConfig(backend="sim", history="on"))  # DEVMEM_HISTORY=1
    history = MemoryHistory(tmp_path / "test_x0")
    assert history.watch(alloc) is alloc and history.watch(alloc) is alloc
    assert history.allocators == [alloc] and alloc._history.stacks
    history.stop()
    assert alloc._history.recording and not alloc._history.stacks
    assert history.snapshot_path(1) == tmp_path / "test_x0-memory-2.pickle"
    with pytest.raises(TypeError, match=r"^alloc must be an allocator\.Allocator, got int$"):
        history.watch(3)


def test_a_snapshot_that_cannot_be_written_is_reported_so(tmp_path):
    alloc = Allocator(AllocatorConfig(backend="sim"))
    history = MemoryHistory(tmp_path / "missing" / "test_x0")  # no such folder
    history.watch(alloc)
    keep = alloc.full(4, 1.0)
    report = history.report()
    assert "snapshot not written ([Errno 2] No such file or directory" in report
    assert "1 live blocks, 16 B:" in report and history.report() is report
    alloc.release(keep)


def test_stopping_collects_first_so_a_cycles_buffer_is_freed_while_recording(tmp_path):
    alloc = Allocator(AllocatorConfig(backend="sim"))
    history = MemoryHistory(tmp_path / "test_x0")
    history.watch(alloc)
    gc.disable()  # no collection before stop's own
    try:
        cycle: list = [alloc.full(4, 1.0)]
        cycle.append(cycle)
        del cycle
        history.stop()
    finally:
        gc.enable()
    snapshot = alloc.snapshot()
    actions = [event["action"] for event in snapshot["device_traces"][0]]
    assert actions == ["segment_alloc", "alloc", "free_requested", "free_completed"]
    assert snapshot["devmem"]["reconciled"] == 0  # nothing happened after the stop
    assert alloc.live_blocks() == []


def test_the_report_shows_small_byte_counts_and_says_what_it_does_not_watch(tmp_path):
    alloc = Allocator(AllocatorConfig(backend="sim"))
    other = Allocator(AllocatorConfig(backend="sim"))  # built directly: not watched
    history = MemoryHistory(tmp_path / "test_x0")
    history.watch(alloc)
    keep = [alloc.full(16, 1.0), other.full(4, 1.0)]
    report = history.report()
    assert (
        "allocator 1 (backend=sim live=64 B peak=64 B allocs=1 frees=0 cache=0 B"
        " cache_cap=unbounded): snapshot " in report
    )
    unwatched = re.search(
        r"^(\d+) other allocators are alive and not watched \(built without"
        r" make_alloc, e\.g\. allocator\.Allocator\(\.\.\.\), or the default"
        r" allocator\): pass them to memory_history\.watch\(alloc\) to record"
        r" them$",
        report,
        re.M,
    )
    assert unwatched and int(unwatched[1]) >= 1
    alloc.release(keep[0])
    other.release(keep[1])
    history.stop()
