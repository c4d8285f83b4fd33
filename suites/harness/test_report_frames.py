"""A failure shows the child's stacks down to the target's caller, not pytest's frames below
it (issue 41, item 5); ``Outcome.stderr`` keeps them whole."""

from __future__ import annotations

import re

import pytest

import harness
from harness._report import cut_entry_frames
from suites.harness import _targets

CUT = re.compile(
    r"  \[\.\.\. devmem-harness cut (\d+) frames? here: the target's caller in the harness and "
    r"those below it \(Outcome\.stderr has them\) \.\.\.\]"
)
ENTRY = re.compile(r'  File ".*/harness/_child\.py", line \d+ in run_child')


def _frames_from_entry(stderr: str) -> int:
    """Frame lines from the entry frame down to the end of its stack, in ``stderr``."""
    lines = stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if ENTRY.fullmatch(line))
    end = start
    while end < len(lines) and lines[end].startswith('  File "'):
        end += 1
    return end - start


def _failure(check) -> str:
    with pytest.raises(harness.DeathTestFailure) as failure:
        check()
    return str(failure.value)


def test_a_segfault_s_failure_shows_the_target_s_frames_not_pytest_s(run, style):
    outcome = run(_targets.segfault)
    message = _failure(outcome.assert_aborted)

    shown = [line.removeprefix("[  DEATH   ] ") for line in message.splitlines()]
    assert any(line.endswith(" in segfault") for line in shown), message
    assert any(line.endswith(" in string_at") for line in shown), message
    assert not any(ENTRY.fullmatch(line) for line in shown), message
    assert "_pytest" not in message and "pluggy" not in message
    (cut,) = [CUT.fullmatch(line) for line in shown if CUT.fullmatch(line)]
    assert int(cut.group(1)) == _frames_from_entry(outcome.stderr)
    if style == "fork":  # the copy of the test process: pytest's frames, kept in the stderr
        assert int(cut.group(1)) > 20
        assert "pluggy" in outcome.stderr and "_pytest" in outcome.stderr
    assert ENTRY.search(outcome.stderr)


def test_a_hang_s_failure_shows_the_target_s_frames_not_pytest_s(run, style):
    # 3 s: an exec child on a loaded machine must get into the target before the deadline
    outcome = run(_targets.hang_forever, timeout=3).assert_timed_out()
    message = _failure(outcome.assert_died)

    shown = [line.removeprefix("[  DEATH   ] ") for line in message.splitlines()]
    assert any(line.endswith(" in hang_forever") for line in shown), message
    assert "pluggy" not in message and not any(ENTRY.fullmatch(line) for line in shown)
    assert [int(m.group(1)) for m in map(CUT.fullmatch, shown) if m] == [
        _frames_from_entry(outcome.stderr)
    ]


def _stack(*frames: str) -> str:
    lines = [f'  File "{path}", line {n} in {name}' for n, (path, name) in enumerate(frames, 1)]
    return "\n".join(["Current thread 0x0000 (most recent call first):", *lines]) + "\n"


TARGET = ("/p/t.py", "target")
ENTRY_FRAME = ("/p/harness/_child.py", "run_child")
PYTEST = ("/v/_pytest/main.py", "_main")


def test_cut_entry_frames_cuts_from_the_entry_to_the_end_of_each_stack():
    text = "before\n" + _stack(TARGET, ENTRY_FRAME, PYTEST, PYTEST) + "\nafter\n"
    shown = cut_entry_frames(text).splitlines()
    assert shown[:3] == ["before", "Current thread 0x0000 (most recent call first):", shown[2]]
    assert shown[2].endswith("in target")
    assert CUT.fullmatch(shown[3]).group(1) == "3"
    assert shown[4:] == ["", "after"]
    # two stacks (a thread dump), each cut on its own
    two = cut_entry_frames(_stack(TARGET, ENTRY_FRAME, PYTEST) + _stack(TARGET, ENTRY_FRAME))
    assert [m.group(1) for m in map(CUT.fullmatch, two.splitlines()) if m] == ["2", "1"]
    assert "1 frame here" in two


def test_cut_entry_frames_keeps_what_is_not_an_entry_frame():
    kept = [
        _stack(TARGET, PYTEST),  # no entry
        _stack(TARGET, ("/p/harness/_child.py", "_leave")),  # the harness, not its entry
        _stack(TARGET, ("/p/other/_child.py", "run_child")),  # another package's run_child
        '  File "/p/harness/_child.py", line 3, in run_child\n    x()\n',  # a Python traceback
        "say run_child in harness/_child.py\n",
        _stack(TARGET) + 'said: "/p/harness/_child.py", line 3 in run_child\n',  # no frame
        "",
    ]
    for text in kept:
        assert cut_entry_frames(text) == text


def test_cut_entry_frames_keeps_a_top_entry_frame_and_counts_faulthandler_s_dots():
    top = cut_entry_frames(_stack(ENTRY_FRAME, PYTEST) + "  ...\n").splitlines()
    assert top[1].endswith("in run_child")
    assert "cut 1 and more frames here" in top[2]
    alone = _stack(ENTRY_FRAME)
    assert cut_entry_frames(alone) == alone
    no_newline = cut_entry_frames(_stack(TARGET, ENTRY_FRAME).rstrip("\n"))
    assert not no_newline.endswith("\n") and CUT.fullmatch(no_newline.splitlines()[-1])
