"""A ``match`` searches only what the child wrote: never the harness's own notes, never across
the bytes cut from the middle of a long stderr (issue 18, item 3)."""

from __future__ import annotations

import pytest

import harness
from harness._capture import HEAD_BYTES, TAIL_BYTES
from suites.harness import _targets
from suites.harness._procs import deadline_s


def test_the_cut_notice_is_not_matched(run):
    outcome = run(_targets.write_z_and_exit, 2)

    assert (outcome.kind, outcome.exit_code) == ("exited", 3)
    assert set(outcome.stderr) == {"z"}  # only what the child wrote
    assert outcome.stderr_cut_bytes == 2 * 2**20 - HEAD_BYTES - TAIL_BYTES
    cut = outcome.stderr_cut_bytes
    assert outcome.notes == (
        f"devmem-harness cut {cut} bytes (0.9 MiB) of stderr: it wrote {2 * 2**20} bytes; kept "
        f"the first {HEAD_BYTES} and the last {TAIL_BYTES}",
    )
    outcome.assert_died("^z+$")
    for pattern in (r"\d+\.\d MiB", "devmem-harness", "kept the first"):
        with pytest.raises(harness.DeathTestFailure) as failure:
            outcome.assert_died(pattern)
        message = str(failure.value)
        assert "the match ran on a cut stream" in message
        # the failure still shows the note, and where the cut was
        assert f"[  NOTE    ] devmem-harness cut {cut} bytes" in message
        assert f"[... devmem-harness cut {cut} bytes here (see notes) ...]" in message


def test_a_match_never_spans_the_cut(run):
    outcome = run(_targets.straddle_the_cut_and_exit, HEAD_BYTES, TAIL_BYTES)

    assert outcome.stderr_cut_at == HEAD_BYTES
    assert outcome.stderr[HEAD_BYTES - 1 : HEAD_BYTES + 1] == "AB"  # joined, but never written so
    outcome.assert_died(r"\.A$").assert_died(r"^B\.")
    with pytest.raises(harness.DeathTestFailure, match="does not match 'AB'"):
        outcome.assert_died("AB")


def test_the_timeout_notes_are_not_in_the_stderr(run, style):
    outcome = run(_targets.hang_forever, timeout=deadline_s(style, 0.5))

    assert outcome.kind == "timed_out"
    assert "devmem-harness" not in outcome.stderr
    assert any("timeout has passed; its Python stacks follow" in note for note in outcome.notes)
    assert "in hang_forever" in outcome.stderr
