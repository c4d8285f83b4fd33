"""Failure messages: target, config, env, expected vs actual, [  DEATH   ] lines, repro."""

from __future__ import annotations

import functools
import operator
import os
import re
import signal
import traceback

import pytest

import harness
from harness._protocol import Raised
from suites.harness import _targets

LIVELY = harness.Config("lively", {"OUTCOME_FLAG": "1", "OUTCOME_GONE": None})


def test_a_child_that_lives_fails_a_death_assertion_and_says_so_plainly():
    outcome = harness.run_child(_targets.lives, config=LIVELY, style="fork")

    with pytest.raises(harness.DeathTestFailure) as failure:
        outcome.assert_aborted("boom")
    message = str(failure.value)
    lines = message.splitlines()

    assert isinstance(failure.value, AssertionError)
    assert lines[0] == "death test failed: the child did not die: it exited with status 0"
    assert lines[1].startswith("  target:   suites.harness._targets:lives  (style fork, pid ")
    assert "  config:   lively" in lines
    assert "  env:      OUTCOME_FLAG=1, OUTCOME_GONE unset" in lines
    assert "  expected: killed by SIGABRT, with stderr matching 'boom'" in lines
    assert "  actual:   exited with status 0" in lines
    assert "[  DEATH   ] still alive" in lines
    assert lines[-2:] == ["repro:", f"  {outcome.repro}"]
    assert "env -u OUTCOME_GONE OUTCOME_FLAG=1 DEVMEM_DEATH_CHILD=1 " in outcome.repro


def test_right_ending_wrong_stderr():
    outcome = harness.run_child(_targets.abort_with, "fatal: the real message", style="fork")
    outcome.assert_aborted("real message")

    with pytest.raises(harness.DeathTestFailure) as failure:
        outcome.assert_aborted("use-after-free")
    message = str(failure.value)
    assert message.startswith(
        "death test failed: the child ended as expected, but its stderr does not match "
        "'use-after-free'"
    )
    assert "[  DEATH   ] fatal: the real message" in message.splitlines()


def test_a_timeout_is_not_a_death():
    outcome = harness.run_child(_targets.hang_forever, style="fork", timeout=0.4)

    assert outcome.kind == "timed_out"
    with pytest.raises(harness.DeathTestFailure, match="the child did not die: it timed out"):
        outcome.assert_died()
    with pytest.raises(harness.DeathTestFailure, match=r"timed out after 0\.4 s"):
        outcome.assert_exited(0)


def test_wrong_death():
    outcome = harness.run_child(_targets.exit_with, 3, style="fork")

    with pytest.raises(harness.DeathTestFailure) as failure:
        outcome.assert_aborted()
    assert str(failure.value).startswith("death test failed: the child exited with status 3\n")
    with pytest.raises(harness.DeathTestFailure, match="expected: killed by SIGSEGV"):
        outcome.assert_died(signal=signal.SIGSEGV)

    aborted = harness.run_child(_targets.abort_with, "x", style="fork")
    with pytest.raises(harness.DeathTestFailure) as failure:
        aborted.assert_exited(0)
    assert str(failure.value).startswith("death test failed: the child was killed by SIGABRT\n")


def _outcome(**fields) -> harness.Outcome:
    values = {
        "kind": "signaled",
        "exit_code": None,
        "signal": signal.SIGABRT,
        "stdout": "",
        "stderr": "",
        "returned": None,
        "raised": None,
        "duration_s": 0.0123,
        "style": "forkserver",
        "pid": 4242,
        "repro": "env DEVMEM_DEATH_CHILD=1 python _exec_runner.py --request '{}'",
        "target": "pkg.mod:fn",
    }
    values.update(fields)
    return harness.Outcome(**values)


def test_long_stderr_shows_its_head_and_tail():
    stderr = "".join(f"line {i}\n" for i in range(100))
    with pytest.raises(harness.DeathTestFailure) as failure:
        _outcome(stderr=stderr).assert_exited(0)
    lines = str(failure.value).splitlines()

    assert "stderr (first 20 and last 50 of 100 lines):" in lines
    death_lines = [line for line in lines if line.startswith("[  DEATH   ] ")]
    assert death_lines == [
        *(f"[  DEATH   ] line {i}" for i in range(20)),
        "[  DEATH   ] [... 30 lines ...]",
        *(f"[  DEATH   ] line {i}" for i in range(50, 100)),
    ]
    assert "  target:   pkg.mod:fn  (style forkserver, pid 4242, 12.3 ms)" in lines
    assert "  config:   (none)" in lines
    assert "  env:      (no overrides)" in lines


def test_empty_stderr_and_a_raised_exception_are_shown():
    raised = Raised("ValueError", "bad size", "Traceback ...\nValueError: bad size\n")
    outcome = _outcome(kind="exited", exit_code=1, signal=None, raised=raised)
    with pytest.raises(harness.DeathTestFailure) as failure:
        outcome.assert_clean()
    lines = str(failure.value).splitlines()
    assert "  raised:   ValueError: bad size" in lines
    assert "stderr: (empty)" in lines


def test_repr_says_how_it_ended_in_words():
    assert repr(_outcome()) == "<Outcome pkg.mod:fn: killed by SIGABRT (style forkserver, 12.3 ms)>"
    exited = _outcome(kind="exited", exit_code=3, signal=None, config_id="capped", duration_s=1.5)
    assert repr(exited) == (
        "<Outcome pkg.mod:fn: exited with status 3 (style forkserver, config 'capped', 1.50 s)>"
    )
    error = _outcome(kind="harness_error", signal=None, error="the zygote died")
    assert error.ending == "harness error (not a crash): the zygote died"


def test_assert_died_takes_a_signal_by_enum_number_or_name():
    segv = _outcome(signal=signal.SIGSEGV)
    for wanted in (signal.SIGSEGV, int(signal.SIGSEGV), "SIGSEGV", "segv"):
        assert segv.assert_died(signal=wanted) is segv
    with pytest.raises(harness.DeathTestFailure, match="expected: killed by SIGSEGV"):
        _outcome(kind="exited", exit_code=11, signal=None).assert_died(signal="SIGSEGV")


# Issue 9, case 4: every assertion has teeth. Each test below fails on a mutant of
# harness/_outcome.py that a mutation run found surviving (an `and` turned `or`, a default or a
# bound moved, a message cut): an assertion is checked where it must fail, and where it must not.
EXITED_0 = {"kind": "exited", "exit_code": 0, "signal": None}
EXITED_1 = {"kind": "exited", "exit_code": 1, "signal": None}
EXITED_3 = {"kind": "exited", "exit_code": 3, "signal": None}
SEGV = {"kind": "signaled", "exit_code": None, "signal": signal.SIGSEGV}
TIMED_OUT = {"kind": "timed_out", "exit_code": None, "signal": signal.SIGTERM, "timeout_s": 2.0}
RAISED = Raised(
    "ValueError",
    "bad size",
    "Traceback (most recent call last):\nValueError: bad size\n",
    ("Exception", "BaseException"),
)


def _failure(outcome: harness.Outcome, check) -> list[str]:
    """The lines of the DeathTestFailure that ``check(outcome)`` must raise."""
    with pytest.raises(harness.DeathTestFailure) as failure:
        check(outcome)
    return str(failure.value).splitlines()


def test_assert_exited_checks_kind_and_code_both():
    _outcome(**EXITED_3).assert_exited(3)
    assert _failure(_outcome(**EXITED_3), lambda o: o.assert_exited(4))[0] == (
        "death test failed: the child exited with status 3"
    )
    timed_out_with_a_code = {**TIMED_OUT, "exit_code": 0, "signal": None}
    lines = _failure(_outcome(**timed_out_with_a_code), lambda o: o.assert_exited(0))
    assert lines[0] == "death test failed: the child timed out after 2 s, then exited with status 0"


def test_assert_exited_expects_status_0_by_default():
    assert _outcome(**EXITED_0).assert_exited().exit_code == 0
    lines = _failure(_outcome(**EXITED_1), lambda o: o.assert_exited())
    assert "  expected: exited with status 0" in lines


@pytest.mark.parametrize("code", [0, 255])
def test_assert_exited_takes_codes_0_to_255(code):
    _outcome(kind="exited", exit_code=code, signal=None).assert_exited(code)


def test_assert_died_with_a_signal_wants_that_signal():
    _outcome(**SEGV).assert_died(signal=signal.SIGSEGV)
    lines = _failure(_outcome(), lambda o: o.assert_died(signal=signal.SIGSEGV))  # SIGABRT
    assert lines[0] == "death test failed: the child was killed by SIGABRT"
    assert "  expected: killed by SIGSEGV" in lines
    exit_11 = {"kind": "exited", "exit_code": 11, "signal": None}
    assert _failure(_outcome(**exit_11), lambda o: o.assert_died(signal=11))[0] == (
        "death test failed: the child exited with status 11"
    )


def test_assert_died_counts_any_non_zero_status_and_not_zero():
    _outcome(**EXITED_1).assert_died()
    _outcome(**EXITED_3).assert_died()
    lines = _failure(_outcome(**EXITED_0), lambda o: o.assert_died())
    assert lines[0] == "death test failed: the child did not die: it exited with status 0"
    assert "  expected: killed by a signal, or exited with a non-zero status" in lines


@pytest.mark.parametrize(
    "check",
    [
        pytest.param(lambda o: o.assert_died("boom"), id="died"),
        pytest.param(lambda o: o.assert_died("boom", signal="SIGABRT"), id="died-signal"),
        pytest.param(lambda o: o.assert_aborted("boom"), id="aborted"),
        pytest.param(lambda o: o.assert_exit(lambda _: True, "boom"), id="exit"),
    ],
)
def test_every_death_assertion_checks_match(check):
    check(_outcome(stderr="it went boom\n"))
    lines = _failure(_outcome(stderr="it went bang\n"), check)
    assert lines[0] == (
        "death test failed: the child ended as expected, but its stderr does not match 'boom'"
    )
    assert lines[4].endswith(", with stderr matching 'boom'")


def test_match_on_a_cut_stderr_says_so():
    cut = _outcome(stderr="head\n[... cut ...]\ntail\n", stderr_cut_bytes=5000)
    lines = _failure(cut, lambda o: o.assert_aborted("middle"))
    assert lines[0] == (
        "death test failed: the child ended as expected, but its stderr does not match 'middle' "
        "(the match ran on a cut stream: 5000 bytes in the middle of its stderr were not kept)"
    )
    assert "cut stream" not in _failure(_outcome(), lambda o: o.assert_aborted("x"))[0]
    cut.assert_aborted("tail")  # what was kept still matches


@pytest.mark.parametrize(
    ("check", "expected"),
    [
        (lambda o: o.assert_aborted(), "killed by SIGABRT"),
        (lambda o: o.assert_died(), "killed by a signal, or exited with a non-zero status"),
        (lambda o: o.assert_died(signal="SIGTERM"), "killed by SIGTERM"),
        (lambda o: o.assert_exited(3), "exited with status 3"),
    ],
)
def test_a_child_that_lived_or_timed_out_did_not_die(check, expected):
    lines = _failure(_outcome(**EXITED_0), check)
    assert lines[0] == "death test failed: the child did not die: it exited with status 0"
    assert f"  expected: {expected}" in lines
    lines = _failure(_outcome(**TIMED_OUT), check)  # SIGTERM ended it, after the deadline
    assert lines[0] == (
        "death test failed: the child did not die: it timed out after 2 s, then killed by SIGTERM"
    )
    assert "  actual:   timed out after 2 s, then killed by SIGTERM" in lines


@pytest.mark.parametrize(
    ("check", "first"),
    [
        (lambda o: o.assert_exited(0), "the child timed out after 2 s, then killed by SIGTERM"),
        (lambda o: o.assert_clean(), "the child timed out after 2 s, then killed by SIGTERM"),
        (lambda o: o.assert_raised(), "the target did not raise: the child timed out after 2 s,"),
    ],
)
def test_a_timeout_fails_the_other_assertions_without_did_not_die(check, first):
    assert _failure(_outcome(**TIMED_OUT), check)[0].startswith(f"death test failed: {first}")


def test_timed_out_without_a_deadline_and_harness_errors():
    no_deadline = _outcome(**{**TIMED_OUT, "timeout_s": None})
    assert no_deadline.ending == "timed out, then killed by SIGTERM"
    error = _outcome(kind="harness_error", signal=None, error="the zygote died")
    for check in (
        lambda o: o.assert_aborted(),
        lambda o: o.assert_died(),
        lambda o: o.assert_exited(0),
        lambda o: o.assert_clean(),
        lambda o: o.assert_raised(),
        lambda o: o.assert_exit(lambda _: True),
    ):
        assert _failure(error, check)[0] == (
            "death test failed: the harness failed, so how the child ends is unknown: "
            "the zygote died"
        )


def test_assert_aborted_wants_sigabrt_and_a_signal():
    lines = _failure(_outcome(**SEGV), lambda o: o.assert_aborted())
    assert lines[0] == "death test failed: the child was killed by SIGSEGV"
    exit_134 = {"kind": "exited", "exit_code": 134, "signal": None}
    assert _failure(_outcome(**exit_134), lambda o: o.assert_aborted())[0] == (
        "death test failed: the child exited with status 134"
    )


def test_assert_clean_wants_status_0_and_nothing_raised():
    _outcome(**EXITED_0).assert_clean()
    lines = _failure(_outcome(**EXITED_0, raised=RAISED), lambda o: o.assert_clean())
    assert lines[0] == (
        "death test failed: the child exited with status 0 after its target raised "
        "ValueError: bad size"
    )
    assert "  expected: exited with status 0, nothing raised" in lines
    assert _failure(_outcome(**SEGV), lambda o: o.assert_clean())[0] == (
        "death test failed: the child was killed by SIGSEGV"
    )


class BadSize(ValueError):
    """A subclass, to check that assert_raised counts bases."""


def test_assert_raised_by_type_name_base_or_tuple():
    raised = Raised(
        "suites.harness.test_outcome.BadSize",
        "bad size",
        "Traceback ...\nsuites.harness.test_outcome.BadSize: bad size\n",
        ("ValueError", "Exception", "BaseException"),
    )
    outcome = _outcome(**EXITED_1, raised=raised, stderr=raised.traceback)
    for exc_type in (None, BadSize, ValueError, Exception, "ValueError", (KeyError, ValueError)):
        assert outcome.assert_raised(exc_type) is outcome
    outcome.assert_raised(ValueError, match=r"BadSize: bad size$")
    lines = _failure(outcome, lambda o: o.assert_raised(KeyError))
    assert lines[0] == (
        "death test failed: the target raised suites.harness.test_outcome.BadSize, not KeyError: "
        "the child exited with status 1 after its target raised "
        "suites.harness.test_outcome.BadSize: bad size"
    )
    assert "  expected: its target raised KeyError" in lines
    lines = _failure(outcome, lambda o: o.assert_raised((KeyError, "OSError")))
    assert lines[0].startswith(
        "death test failed: the target raised suites.harness.test_outcome.BadSize, not KeyError "
        "or OSError: the child exited with status 1"
    )
    assert "  expected: its target raised KeyError or OSError" in lines
    lines = _failure(outcome, lambda o: o.assert_raised(match="no such text"))
    assert lines[0].endswith("but its stderr does not match 'no such text'")


def test_assert_raised_on_a_child_that_did_not_raise():
    lines = _failure(_outcome(**EXITED_0), lambda o: o.assert_raised())
    assert lines[0] == (
        "death test failed: the target did not raise: the child exited with status 0"
    )
    assert "  expected: its target raised an exception" in lines
    lines = _failure(_outcome(), lambda o: o.assert_raised(ValueError))
    assert (
        lines[0] == "death test failed: the target did not raise: the child was killed by SIGABRT"
    )


@pytest.mark.parametrize("bad", [int, 3, "", (ValueError, 3), [ValueError]])
def test_assert_raised_refuses_what_names_no_exception(bad):
    message = (
        r"^assert_raised\(exc_type=\.\.\.\) takes an exception class, its qualified name, a "
        rf"tuple of those, or None, not {re.escape(repr(bad))}$"
    )
    with pytest.raises(harness.HarnessError, match=message):
        _outcome(**EXITED_1, raised=RAISED).assert_raised(bad)
    with pytest.raises(
        harness.HarnessError, match=r"^assert_raised\(exc_type=\(\)\) names no excep"
    ):
        _outcome(**EXITED_1, raised=RAISED).assert_raised(())


def test_assert_exit_asks_the_predicate_and_names_it():
    seen = []

    def exited_3_or_4(outcome):
        seen.append(outcome)
        return outcome.exit_code in (3, 4)

    outcome = _outcome(**EXITED_3)
    assert outcome.assert_exit(exited_3_or_4) is outcome
    assert seen == [outcome]
    _outcome(**SEGV).assert_exit(lambda o: o.signal == signal.SIGSEGV)
    lines = _failure(_outcome(**EXITED_1), lambda o: o.assert_exit(exited_3_or_4))
    assert lines[0] == (
        "death test failed: exited_3_or_4(outcome) is false: the child exited with status 1"
    )
    assert lines[4] == "  expected: an ending for which exited_3_or_4(outcome) is true"
    _outcome(**EXITED_0).assert_exit(lambda o: o.exit_code == 0)  # status 0 is its to judge
    lines = _failure(_outcome(**EXITED_1), lambda o: o.assert_exit(exited_3_or_4, "boom"))
    assert lines[4] == (
        "  expected: an ending for which exited_3_or_4(outcome) is true, with stderr matching "
        "'boom'"
    )
    lines = _failure(_outcome(**TIMED_OUT), lambda o: o.assert_exit(lambda _: True))
    assert lines[0] == (
        "death test failed: the child did not die: it timed out after 2 s, then killed by SIGTERM"
    )
    lines = _failure(_outcome(**SEGV), lambda o: o.assert_exit(lambda _: 0))
    assert (
        lines[0] == "death test failed: <lambda>(outcome) is false: the child was killed by SIGSEGV"
    )
    with pytest.raises(harness.HarnessError, match=r"assert_exit\(predicate\) needs a callable"):
        outcome.assert_exit("exited")  # type: ignore[arg-type]


def test_a_predicate_without_a_name_is_shown_by_its_repr():
    predicate = functools.partial(operator.eq, 4)  # no __name__
    lines = _failure(_outcome(**EXITED_3), lambda o: o.assert_exit(predicate))
    assert lines[0] == (
        f"death test failed: {predicate!r}(outcome) is false: the child exited with status 3"
    )


HIDDEN_CHECKS = [
    pytest.param(lambda: _outcome(**EXITED_0).assert_aborted(), id="aborted"),
    pytest.param(lambda: _outcome(**EXITED_0).assert_died(), id="died"),
    pytest.param(lambda: _outcome(**EXITED_0).assert_exit(operator.not_), id="exit"),
    pytest.param(lambda: _outcome(**EXITED_0).assert_exited(3), id="exited"),
    pytest.param(lambda: _outcome(**EXITED_1, raised=RAISED).assert_clean(), id="clean"),
    pytest.param(lambda: _outcome(**EXITED_0).assert_raised(), id="raised"),
    pytest.param(lambda: _outcome(**EXITED_0).assert_timed_out(), id="timed-out"),
    pytest.param(lambda: _outcome().assert_aborted(match="("), id="bad-regex"),
    pytest.param(lambda: _outcome().assert_died(signal="SIGNOPE"), id="bad-signal"),
    pytest.param(lambda: _outcome().assert_raised(3), id="bad-exception"),
]


@pytest.mark.parametrize("check", HIDDEN_CHECKS)
def test_every_harness_frame_of_a_failure_is_hidden_from_pytest(check):
    with pytest.raises((harness.DeathTestFailure, harness.HarnessError)) as failure:
        check()
    harness_dir = os.path.dirname(harness.__file__)
    frames = [
        frame
        for frame, _ in traceback.walk_tb(failure.value.__traceback__)
        if os.path.dirname(frame.f_code.co_filename) == harness_dir
        and "__tracebackhide__" in frame.f_code.co_varnames  # not a wrapper's (mutmut's)
    ]
    assert frames, "the failure went through no function of the harness"
    for frame in frames:
        assert frame.f_locals["__tracebackhide__"] is True, frame.f_code.co_name


def test_the_returned_line_of_a_failure():
    def returned_line(value) -> list[str]:
        lines = _failure(_outcome(returned=value), lambda o: o.assert_clean())
        return [line for line in lines if line.startswith("  returned: ")]

    assert returned_line(None) == []
    assert returned_line(0) == ["  returned: 0"]
    assert returned_line("") == ["  returned: ''"]
    exactly = "x" * 198  # its repr is 200 characters: shown whole
    assert returned_line(exactly) == [f"  returned: {exactly!r}"]
    longer = "x" * 199  # 201: cut at 200
    assert returned_line(longer) == [f"  returned: {repr(longer)[:200]} [...]"]


def test_a_raise_is_shown_with_the_end_of_its_traceback():
    frames = "".join(f'  File "m.py", line {i}, in f{i}\n    f{i + 1}()\n' for i in range(40))
    traceback = f"Traceback (most recent call last):\n{frames}ValueError: bad size\n"
    raised = Raised("ValueError", "bad size", traceback, ("Exception", "BaseException"))
    lines = _failure(_outcome(**EXITED_1, raised=raised), lambda o: o.assert_clean())
    start = lines.index("  raised:   ValueError: bad size")
    shown = traceback.splitlines()[-30:]
    assert lines[start + 1 : start + 31] == [f"    {line}" for line in shown]
    assert lines[start + 31] == "stderr: (empty)"


def test_a_traceback_the_stderr_shows_whole_is_not_shown_twice():
    traceback = RAISED.traceback
    for stderr, twice in (
        (traceback, False),
        ("note\n" + traceback, False),
        ("x\n" * 68 + traceback, False),  # 70 lines: shown whole
        ("x\n" * 69 + traceback, True),  # 71 lines: the stderr shown is cut
        (traceback[:-10], True),  # the child's stderr lost its end
    ):
        lines = _failure(
            _outcome(**EXITED_1, raised=RAISED, stderr=stderr), lambda o: o.assert_died()
        )
        assert ("    Traceback (most recent call last):" in lines) is twice, stderr


# Issue 18, item 3: a match never spans the cut, and the failure marks the cut.
def test_a_match_searches_head_and_tail_each_on_its_own():
    cut = _outcome(stderr="head line\ntail line\n", stderr_cut_at=10, stderr_cut_bytes=99)
    cut.assert_aborted("^head line\n$").assert_aborted("^tail line")  # each part alone
    with pytest.raises(harness.DeathTestFailure) as failure:
        cut.assert_aborted("line\ntail")  # only across the cut
    lines = str(failure.value).splitlines()
    at = lines.index("[  DEATH   ] head line")
    assert lines[at + 1] == "[  DEATH   ] [... devmem-harness cut 99 bytes here (see notes) ...]"
    assert lines[at + 2] == "[  DEATH   ] tail line"
    unmarked = _outcome(stderr="no newline", stderr_cut_at=2, stderr_cut_bytes=5)
    assert _failure(unmarked, lambda o: o.assert_aborted("x"))[-5:-2] == [
        "[  DEATH   ] no",
        "[  DEATH   ] [... devmem-harness cut 5 bytes here (see notes) ...]",
        "[  DEATH   ]  newline",
    ]
    whole = _outcome(stderr="line\ntail\n")  # nothing cut: one text
    whole.assert_aborted("line\ntail")
    beyond = _outcome(stderr="ab", stderr_cut_at=3)  # a bad index: searched whole, shown as is
    beyond.assert_aborted("ab")
    assert "cut" not in "\n".join(_failure(beyond, lambda o: o.assert_aborted("x"))[6:])


def test_a_cut_at_either_end_of_the_kept_stderr_is_a_cut():
    # The bounds are part of the rule: a cut at index 0 (an empty head) or at the end (an
    # empty tail) still splits the stderr in two parts, each searched on its own and marked.
    marker = "[  DEATH   ] [... devmem-harness cut 7 bytes here (see notes) ...]"
    at_start = _outcome(stderr="tail line\n", stderr_cut_at=0, stderr_cut_bytes=7)
    at_start.assert_aborted(r"^$")  # the empty head, alone
    assert _failure(at_start, lambda o: o.assert_aborted("x"))[-4:-2] == [
        marker,
        "[  DEATH   ] tail line",
    ]
    at_end = _outcome(stderr="head line\n", stderr_cut_at=10, stderr_cut_bytes=7)
    at_end.assert_aborted(r"^$")  # the empty tail, alone
    assert _failure(at_end, lambda o: o.assert_aborted("x"))[-4:-2] == [
        "[  DEATH   ] head line",
        marker,
    ]
    whole = _outcome(stderr="tail line\n")  # the same text uncut has no empty part
    with pytest.raises(harness.DeathTestFailure, match="does not match '\\^\\$'"):
        whole.assert_aborted(r"^$")


def test_a_raise_fails_assert_exited_with_the_match_it_was_given():
    raised = _outcome(**EXITED_1, raised=RAISED, stderr="ValueError: bad size\n")
    lines = _failure(raised, lambda o: o.assert_exited(1, match="bad size"))
    assert lines[0].startswith("death test failed: a raise is not an exit (assert_raised checks")
    assert "  expected: exited with status 1, with stderr matching 'bad size'" in lines
    with pytest.raises(harness.HarnessError, match=r"^match='\(' is not a valid regex"):
        raised.assert_exited(1, match="(")


def test_a_bad_signal_is_refused_with_the_ways_to_name_one():
    with pytest.raises(harness.HarnessError) as refused:
        _outcome().assert_died(signal="SIGNOPE")
    assert str(refused.value) == (
        "signal='SIGNOPE' is not a signal (use e.g. signal.SIGSEGV, 11, 'SIGSEGV', or a "
        "real-time one such as 40 or 'SIGRTMIN+6')"
    )


def test_notes_and_host_are_shown_after_the_stderr():
    outcome = _outcome(stderr="boom\n", notes=("devmem-harness: a note",), host="gpu7")
    lines = _failure(outcome, lambda o: o.assert_died(signal="SIGSEGV"))
    assert lines[1].endswith(", 12.3 ms, host gpu7)")
    assert lines[-3:] == ["[  NOTE    ] devmem-harness: a note", "repro:", f"  {outcome.repro}"]
    assert _failure(_outcome(), lambda o: o.assert_died(signal="SIGSEGV"))[1].endswith(" ms)")


def test_assert_timed_out_on_outcomes():
    assert _outcome(**TIMED_OUT).assert_timed_out().kind == "timed_out"
    for fields in (EXITED_0, EXITED_1, SEGV):
        lines = _failure(_outcome(**fields), lambda o: o.assert_timed_out())
        assert "  expected: timed out" in lines
    error = _outcome(kind="harness_error", signal=None, error="the zygote died")
    assert "the harness failed" in _failure(error, lambda o: o.assert_timed_out())[0]


@pytest.mark.parametrize("style", ["fork", "forkserver", "exec"])
def test_a_raised_class_of_the_parent_s_script_is_named_both_ways_where_the_child_reloaded_it(
    style,
):
    # forkserver and exec children load the parent's script again as __mp_main__: one class,
    # two names, and the failure says so; a fork child has the parent's __main__ itself
    raised = Raised("__main__.Other", "no", "Traceback ...\n__main__.Other: no\n")
    outcome = _outcome(kind="exited", exit_code=1, signal=None, raised=raised, style=style)
    with pytest.raises(harness.DeathTestFailure) as failure:
        outcome.assert_raised(KeyError)

    named = "__main__.Other"
    if style != "fork":
        named += (
            " (in the child also __mp_main__.Other, the parent's script loaded again: one class,"
            " two names)"
        )
    assert f"the target raised {named}, not KeyError: the child " in str(failure.value)
