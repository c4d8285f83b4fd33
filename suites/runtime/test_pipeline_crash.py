"""Crash safety of the state file: SIGKILL the writer at every point of a commit, resume, and
compare the result byte for byte with an uninterrupted run (DESIGN 5.2, issue 21 item 1).

The kill comes from the test knob ``DEVMEM_PIPELINE_KILL_AT=GEN:POINT`` (it survives
``exec()``: generations are counted in the file). A resumed run must end with the very tensors
of the uninterrupted run, at the same step, with the same forward, backward and update actions
committed; only compiles and restarts may differ (a crash is a restart the scheduler did not
plan). The mutants put back the bugs of main at 6c47d36: a header written at ``EXEC_RESTART``
only (the seed's ``MmapState``), a commit without the journal, a header rewritten in place.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile

import pytest

from harness import DeathTestFailure
from runtime.pipeline import (
    HEADER_BYTES,
    KILL_POINTS,
    SLOT_OFFSETS,
    Action,
    StateFile,
    main,
    preset,
    simulate,
)

from . import _targets
from ._knobs import pinned_env

# Two layers, one group, everything fits one process: 41 commits per step (10 passes of
# compile/forward/compile/backward, then the update), two steps.
FAST = ["train", "--layers", "2", "--budget", "1000", "--steps", "2", "--dry-run", "--sparse"]
# One layer, seven compiles per process: two exec() restarts in the step.
RESTARTS = ["train", "--layers", "1", "--budget", "50", "--steps", "1", "--dry-run", "--sparse"]
WRITES = {Action.RUN_BACKWARD_GROUP, Action.WEIGHT_UPDATE}


def _commits(argv: list[str]) -> list[Action]:
    """The action each commit records: generation ``g`` is ``commits[g - 1]``."""
    layers, budget, steps = (
        int(argv[argv.index(o) + 1]) for o in ("--layers", "--budget", "--steps")
    )
    config = preset("stories110m", n_layers=layers, compile_budget=budget, headroom_pct=0.1)
    return simulate(config, steps)[:-1]


def _points(action: Action) -> tuple[str, ...]:
    """The kill points a commit of ``action`` passes (a header-only commit has no journal)."""
    return KILL_POINTS if action in WRITES else ("header", "committed")


@pytest.fixture(scope="module")
def scratch():
    """A directory on tmpfs when there is one (msync is then cheap; SIGKILL semantics are the
    same: the page cache is what a killed process leaves)."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    path = tempfile.mkdtemp(prefix="devmem-crash-", dir=base)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _run(death, argv, path, kill_at=None, mutant=None):
    env = pinned_env("cpu")
    env["DEVMEM_PIPELINE_KILL_AT"] = kill_at
    return death.run(_targets.train, [*argv, "--state", path], mutant, env=env, style="fork")


def _nonzero_pages(path: str, start: int, end: int) -> dict[int, bytes]:
    """The file's bytes in ``[start, end)`` as its pages that are not all zeros: two files
    have the same bytes there iff these are equal. Reads only the data, not the holes, of a
    sparse file (``SEEK_DATA``), so a 648 MB file with a few pages written reads in no time."""
    pages = {}
    with open(path, "rb") as f:
        fd = f.fileno()
        at = start
        while at < end:
            try:
                data = os.lseek(fd, at, os.SEEK_DATA)
                hole = os.lseek(fd, data, os.SEEK_HOLE)
            except OSError as exc:
                if exc.errno != errno.ENXIO:  # no SEEK_DATA here: every page is data
                    data, hole = at, end
                else:  # no data after `at`
                    break
            data -= data % 4096
            for page in range(max(data, start - start % 4096), min(hole, end), 4096):
                chunk = os.pread(fd, 4096, page)
                first, last = max(page, start), min(page + 4096, end)
                chunk = chunk[first - page : last - page]
                if chunk.count(0) != len(chunk):
                    pages[first] = chunk
            at = max(hole, at + 1)
    return pages


def _result(path: str) -> tuple[dict[int, bytes], dict]:
    """The tensors' bytes and what must match in the header."""
    with StateFile.open(path, readonly=True) as state:
        header = state.header
        assert state.rolled_back == 0
    tensors = _nonzero_pages(path, HEADER_BYTES, header.layout.journal)
    counts = dict(zip(Action, header.action_counts, strict=True))
    return tensors, {
        "scheduler": header.scheduler,
        "forward": counts[Action.RUN_FORWARD_GROUP],
        "backward": counts[Action.RUN_BACKWARD_GROUP],
        "updates": counts[Action.WEIGHT_UPDATE],
    }


@pytest.fixture(scope="module")
def reference(scratch, request):
    """The uninterrupted runs' results, per argv."""
    cache = {}

    def get(death, argv):
        key = tuple(argv)
        if key not in cache:
            path = os.path.join(scratch, f"reference-{len(cache)}")
            _run(death, [*argv, "--keep-state"], path).assert_exited(0)
            cache[key] = _result(path)
            os.unlink(path)
            assert cache[key][0], "the reference run wrote no tensor bytes: nothing to compare"
        return cache[key]

    return get


def check_kill_and_resume(death, reference, scratch, argv, generation, point, mutant=None):
    """Kill a run at ``generation:point``, resume it, and compare with the reference."""
    __tracebackhide__ = True
    path = os.path.join(scratch, f"run-{generation}-{point}")
    tensors, expected = reference(death, argv)
    try:
        killed = _run(death, [*argv, "--keep-state"], path, f"{generation}:{point}", mutant)
        killed.assert_died(signal="SIGKILL")
        if generation == 0:  # killed before the os.replace: no file, a clear refusal
            assert not os.path.exists(path)
            assert [n for n in os.listdir(scratch) if n.startswith(".run-0-")], "no temp file"
            for name in os.listdir(scratch):
                if name.startswith(".run-0-"):
                    os.unlink(os.path.join(scratch, name))
            refused = _run(death, [*argv, "--keep-state", "--resume"], path)
            refused.assert_exited(1, match="cannot open state file .*No such file")
            return
        resumed = _run(death, [*argv, "--keep-state", "--resume"], path, None, mutant)
        resumed.assert_exited(0)
        summary = json.loads(resumed.stdout.strip().splitlines()[-1])
        assert summary["steps_done"] == expected["scheduler"].total_steps
        got_tensors, got = _result(path)
        assert got == expected, f"killed at {generation}:{point}: the resumed run differs"
        assert got_tensors == tensors, f"killed at {generation}:{point}: the tensors differ"
    finally:
        if os.path.exists(path):
            os.unlink(path)


def _sample(commits: list[Action]) -> list[tuple[int, str]]:
    """Every kill point of the first compile and forward commits, of the first backward pass
    that adds to a gradient already there, and of the first weight update (the exhaustive
    test below covers the rest)."""
    backward = [g for g, a in enumerate(commits, 1) if a is Action.RUN_BACKWARD_GROUP]
    chosen = [
        commits.index(Action.COMPILE_GROUP) + 1,
        commits.index(Action.RUN_FORWARD_GROUP) + 1,
        backward[1],
        commits.index(Action.WEIGHT_UPDATE) + 1,
    ]
    return [(g, p) for g in chosen for p in _points(commits[g - 1])]


FAST_CASES = [(0, "create"), *_sample(_commits(FAST))]


@pytest.mark.parametrize(("generation", "point"), FAST_CASES)
def test_a_kill_anywhere_resumes_bit_identically(death, reference, scratch, generation, point):
    check_kill_and_resume(death, reference, scratch, FAST, generation, point)


@pytest.mark.skipif(
    not os.environ.get("DEVMEM_CRASH_EXHAUSTIVE"),
    reason="every kill point of the run (DEVMEM_CRASH_EXHAUSTIVE=1; about 250 children pairs)",
)
def test_every_kill_point_resumes_bit_identically(death, reference, scratch):
    commits = _commits(FAST)
    cases = [(g, p) for g, a in enumerate(commits, 1) for p in _points(a)]
    for generation, point in cases:
        check_kill_and_resume(death, reference, scratch, FAST, generation, point)


def _restart_cases() -> list[tuple[int, str]]:
    commits = _commits(RESTARTS)
    first = commits.index(Action.EXEC_RESTART) + 1
    after = next(g for g in range(first + 1, len(commits) + 1) if commits[g - 1] in WRITES)
    return [(first, "header"), (first, "committed"), (after, "write")]


@pytest.mark.parametrize(("generation", "point"), _restart_cases())
def test_a_kill_around_an_exec_restart_resumes_bit_identically(
    death, reference, scratch, generation, point
):
    check_kill_and_resume(death, reference, scratch, RESTARTS, generation, point)


@pytest.mark.parametrize(
    ("mutant", "generation", "point"),
    [
        ("header_at_restart_only", 8, "committed"),  # the bug: a backward pass applied twice
        ("commit_without_journal", 8, "written"),
        ("header_in_place", 8, "header"),
    ],
)
def test_teeth_the_old_commits_are_caught(death, reference, scratch, mutant, generation, point):
    assert _commits(FAST)[generation - 1] is Action.RUN_BACKWARD_GROUP
    with pytest.raises((DeathTestFailure, AssertionError)):
        check_kill_and_resume(death, reference, scratch, FAST, generation, point, mutant)


@pytest.mark.parametrize("value", ["soon", "x:committed", "8:soon"])
def test_the_knob_ignores_a_malformed_value(death, scratch, value):
    path = os.path.join(scratch, "malformed")
    outcome = _run(death, FAST, path, value)
    outcome.assert_exited(0)
    assert (
        f"devmem: ignoring DEVMEM_PIPELINE_KILL_AT={value!r}: expected GEN:POINT with POINT one"
        " of create, journal, journaled, write, written, header, committed; not killing\n"
    ) in outcome.stderr
    assert not os.path.exists(path)  # created by the run, removed at its end


def test_without_the_knob_a_run_says_nothing_of_it(death, scratch):
    outcome = _run(death, FAST, os.path.join(scratch, "unset"))
    outcome.assert_exited(0)
    assert "DEVMEM_PIPELINE_KILL_AT" not in outcome.stderr


def test_a_resume_after_a_kill_says_what_it_undid(death, scratch, capsys):
    path = os.path.join(scratch, "undo")
    _run(death, FAST, path, "8:written").assert_died(signal="SIGKILL")
    assert main(["state", "show", path]) == 0
    assert "an interrupted change (8 bytes) will be undone by the next --resume" in (
        capsys.readouterr().out
    )
    assert main([*FAST, "--state", path, "--resume"]) == 0
    assert "undid an interrupted change (8 bytes restored from the journal)" in (
        capsys.readouterr().err
    )
    assert not os.path.exists(path)  # the run created it: removed at its end


def test_a_corrupt_newest_header_slot_falls_back_and_resumes_bit_identically(
    death, reference, scratch
):
    """A newest slot damaged at rest (not torn by a kill) is the older slot's generation plus
    the journal of the change between them: opening undoes that change, and the resumed run
    redoes it to the same bytes."""
    tensors, expected = reference(death, FAST)
    path = os.path.join(scratch, "rot")
    _run(death, [*FAST, "--keep-state"], path).assert_exited(0)
    with StateFile.open(path, readonly=True) as state:
        newest, slot = state.header.generation, state._slot
        assert state.header.action_counts[Action.WEIGHT_UPDATE] == 2  # the last commit
    with open(path, "r+b") as f:
        f.seek(SLOT_OFFSETS[slot] + 20)
        f.write(b"\xff")
    with StateFile.open(path, readonly=True) as state:
        assert state.header.generation == newest - 1
        assert state.rolled_back == 2 * 2 * 4  # two layers' weight and gradient floats
    resumed = _run(death, [*FAST, "--keep-state", "--resume"], path)
    resumed.assert_exited(0, match="undid an interrupted change")
    assert _result(path) == (tensors, expected)
    os.unlink(path)
