"""How a child ends, in every style: signals, exit statuses, returned values, exceptions."""

from __future__ import annotations

import re
import signal

import pytest

import harness
from suites.harness import _targets
from suites.harness._procs import deadline_s


def test_abort_with_message(run, style):
    outcome = run(_targets.abort_with, "devmem: fatal: the arena was freed twice")

    assert outcome.kind == "signaled"
    assert outcome.signal is signal.SIGABRT
    assert outcome.exit_code is None
    assert outcome.style == style
    assert "devmem: fatal: the arena was freed twice" in outcome.stderr
    assert "killed by SIGABRT" in repr(outcome)
    outcome.assert_aborted(r"freed twice").assert_died(signal=signal.SIGABRT)


def test_segfault_is_named_sigsegv(run):
    outcome = run(_targets.segfault)

    assert outcome.kind == "signaled"
    assert outcome.signal is signal.SIGSEGV
    assert outcome.signal.name == "SIGSEGV"
    assert "killed by SIGSEGV" in outcome.ending
    # faulthandler runs on the child's own stderr and shows the Python stack
    assert "Segmentation fault" in outcome.stderr
    assert "in segfault" in outcome.stderr
    outcome.assert_died(match="address 0", signal="SIGSEGV")
    with pytest.raises(harness.DeathTestFailure, match="killed by SIGABRT"):
        outcome.assert_aborted()


def test_exit_code_three(run):
    outcome = run(_targets.exit_with, 3)

    assert (outcome.kind, outcome.exit_code, outcome.signal) == ("exited", 3, None)
    assert outcome.stdout == "exiting 3\n"
    assert "exited with status 3" in repr(outcome)
    outcome.assert_exited(3).assert_died()
    with pytest.raises(harness.DeathTestFailure, match="exited with status 3"):
        outcome.assert_clean()


def test_system_exit_code(run):
    outcome = run(_targets.system_exit, 4)

    assert (outcome.kind, outcome.exit_code, outcome.raised) == ("exited", 4, None)


def test_returned_value(run, style):
    outcome = run(_targets.give_back, 1, 2.5, "three", [None, True], {"k": {"n": [4]}})

    assert outcome.assert_clean() is outcome
    assert outcome.returned["args"] == [1, 2.5, "three", [None, True], {"k": {"n": [4]}}]
    assert outcome.returned["flag"] == "1"
    assert outcome.returned["pid"] == outcome.pid
    assert outcome.stdout == "giving back 5\n"
    assert outcome.raised is None
    assert outcome.target == "suites.harness._targets:give_back"
    assert outcome.duration_s > 0


def test_raised_exception(run):
    outcome = run(_targets.raise_error, "no more arenas")

    assert (outcome.kind, outcome.exit_code) == ("exited", 1)
    raised = outcome.raised
    assert raised is not None
    assert raised.type == "suites.harness._targets.TargetError"
    assert raised.message == "no more arenas"
    assert str(raised) == "suites.harness._targets.TargetError: no more arenas"
    assert raised.traceback.startswith("Traceback (most recent call last):")
    assert "in _deeper" in raised.traceback
    assert "_child.py" not in raised.traceback  # the harness frame is left out
    assert raised.traceback in outcome.stderr  # as an uncaught exception would print it
    assert raised.bases == ("Exception", "BaseException")
    assert outcome.ending == (
        "exited with status 1 after its target raised suites.harness._targets.TargetError: "
        "no more arenas"
    )
    with pytest.raises(harness.DeathTestFailure, match="a raise is not an exit"):
        outcome.assert_exited(1, match="TargetError: no more arenas")  # though its status is 1
    outcome.assert_raised(_targets.TargetError, match="TargetError: no more arenas")
    outcome.assert_raised("suites.harness._targets.TargetError").assert_raised(Exception)
    with pytest.raises(harness.DeathTestFailure, match=r"raised:   suites\.harness"):
        outcome.assert_clean()


# Issue 9, case 2: a target that raises is not a death (GoogleTest: "threw an exception").
RAISERS = [
    pytest.param(_targets.typo, "NameError: name 'undefined_name' is not defined", id="typo"),
    pytest.param(
        _targets.raise_use_after_free,
        "suites.harness._targets.ArenaError: use-after-arena-free: buffer_add lhs was reclaimed"
        " by arena_exit at depth 0",
        id="use-after-free-raise",
    ),
]


@pytest.mark.parametrize(("target", "raised"), RAISERS)
def test_a_target_that_raises_did_not_die(run, target, raised):
    outcome = run(target)
    assert (outcome.kind, outcome.exit_code) == ("exited", 1)

    for check in (
        outcome.assert_died,
        lambda: outcome.assert_died("use-after-arena-free"),
        outcome.assert_aborted,
        lambda: outcome.assert_exit(lambda o: True),
    ):
        with pytest.raises(harness.DeathTestFailure) as failure:
            check()
        lines = str(failure.value).splitlines()
        assert lines[0] == f"death test failed: the child did not die: its target raised {raised}"
        assert f"  raised:   {raised}" in lines
        assert "[  DEATH   ] Traceback (most recent call last):" in lines  # with its traceback
    outcome.assert_raised(match=re.escape(raised))


# Issue 9, case 3: a returned value the child cannot deliver is a harness error, not None.
@pytest.mark.parametrize(
    "target",
    [
        _targets.limit_file_size_and_return,
        _targets.close_descriptors_and_return,
        _targets.reuse_descriptors_and_return,
    ],
)
def test_a_status_the_child_could_not_deliver_is_a_harness_error(run, target):
    outcome = run(target)

    assert outcome.kind == "harness_error", outcome
    assert outcome.returned is None
    assert "could not deliver its status record (returned)" in outcome.error
    with pytest.raises(harness.DeathTestFailure, match="the harness failed"):
        outcome.assert_clean()


def test_returned_value_that_is_not_plain_data_is_a_harness_error(run):
    outcome = run(_targets.return_tuple)

    assert outcome.kind == "harness_error"
    assert "has type tuple" in outcome.error
    assert outcome.returned is None

    outcome = run(_targets.return_object)
    assert outcome.kind == "harness_error"
    assert "_thread.lock" in outcome.error


def test_target_module_failing_to_import_is_a_harness_error_not_a_crash(run):
    outcome = run("suites.harness._no_such_module:target")

    assert outcome.kind == "harness_error"
    assert "could not import the target 'suites.harness._no_such_module:target'" in outcome.error
    assert "ModuleNotFoundError" in outcome.error
    with pytest.raises(harness.DeathTestFailure) as failure:
        outcome.assert_died()
    message = str(failure.value)
    assert "harness failed" in message
    assert "not a crash" in message
    assert "killed by" not in message.split("\n")[0]


def test_missing_attribute_is_a_harness_error(run):
    outcome = run("suites.harness._targets:no_such_function")

    assert outcome.kind == "harness_error"
    assert "no_such_function" in outcome.error


# Issue 18, item 2: a returned value that cannot be encoded is a harness error, not an exit.
@pytest.mark.parametrize(
    ("target", "args", "reason"),
    [
        (_targets.return_huge_int, (), r"is an int of 16610 bits, too long to send as JSON"),
        (_targets.return_deep_list, (100_000,), r"\[0\]\[0\].*\[\.\.\.\] nests lists and dicts"),
        (_targets.return_deep_list, (101,), "nests lists and dicts more than 100 deep"),
        (_targets.return_unencodable_key, (), "has a key <int object> of type int"),
    ],
    ids=["huge-int", "deep-100000", "deep-101", "unprintable-key"],
)
def test_a_returned_value_that_cannot_be_encoded_is_a_harness_error(run, target, args, reason):
    outcome = run(target, *args)

    assert outcome.kind == "harness_error", outcome
    assert re.search(r"the value returned by the target.*" + reason, outcome.error), outcome.error
    assert outcome.returned is None
    with pytest.raises(harness.DeathTestFailure, match="the harness failed"):
        outcome.assert_died()


def test_a_returned_value_100_deep_comes_back(run):
    outcome = run(_targets.return_deep_list, 99)

    outcome.assert_clean()
    assert outcome.returned == _targets.deep_list(99)


# Issue 18, item 6: a raise is not an exit, whatever status it gives.
def test_assert_exited_fails_when_the_target_raised(run):
    outcome = run(_targets.exit_with_a_typo, 1)

    assert (outcome.kind, outcome.exit_code) == ("exited", 1)
    for check in (
        lambda: outcome.assert_exited(1),
        lambda: outcome.assert_exited(1, match="leaving with 1"),
        lambda: outcome.assert_died(),
    ):
        with pytest.raises(harness.DeathTestFailure) as failure:
            check()
        first = str(failure.value).splitlines()[0]
        assert "AttributeError: module 'sys' has no attribute 'exti'" in first
    with pytest.raises(harness.DeathTestFailure) as failure:
        outcome.assert_exited(1)
    assert str(failure.value).splitlines()[0] == (
        "death test failed: a raise is not an exit (assert_raised checks a raise): the child "
        "exited with status 1 after its target raised AttributeError: module 'sys' has no "
        "attribute 'exti'"
    )
    outcome.assert_raised(AttributeError, match="exti")
    run(_targets.system_exit, 1).assert_exited(1)  # sys.exit(1) is an exit


def test_assert_timed_out(run, style):
    outcome = run(_targets.hang_forever, timeout=deadline_s(style, 0.5))

    assert outcome.assert_timed_out() is outcome
    outcome.assert_timed_out(match="in hang_forever")  # its stacks, dumped at the deadline
    with pytest.raises(harness.DeathTestFailure, match="does not match 'devmem-harness'"):
        outcome.assert_timed_out(match="devmem-harness")  # the harness's notes are not stderr
    for ended in (run(_targets.abort_with, "quick"), run(_targets.give_back)):
        with pytest.raises(harness.DeathTestFailure) as failure:
            ended.assert_timed_out()
        assert "  expected: timed out" in str(failure.value).splitlines()


# Issue 18, item 9: real-time signals are signals.
def test_a_real_time_signal_is_asserted_by_number_or_name(run):
    number = signal.SIGRTMIN + 6
    outcome = run(_targets.kill_self_with, int(number))

    assert (outcome.kind, outcome.signal) == ("signaled", number)
    assert outcome.ending == f"killed by signal {number} (SIGRTMIN+6)"
    for wanted in (int(number), "SIGRTMIN+6", "rtmin+6", f"SIGRTMAX-{signal.SIGRTMAX - number}"):
        assert outcome.assert_died(signal=wanted) is outcome
    with pytest.raises(harness.DeathTestFailure, match=r"killed by signal \d+ \(SIGRTMIN\+7\)"):
        outcome.assert_died(signal=int(number) + 1)
    for bad in (0, 65, 1000, "SIGRTMIN+x", "SIGNOPE", -6):
        refused = re.escape(f"signal={bad!r} is not a signal")
        with pytest.raises(harness.HarnessError, match=refused):
            outcome.assert_died(signal=bad)
