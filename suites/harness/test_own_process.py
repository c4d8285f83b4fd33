"""``@pytest.mark.own_process``: a whole test in a fork child, so that what it does to its
process (CUDA initialized: fork unsafe) does not reach the fork-style tests after it."""

from __future__ import annotations

import pytest

TESTS = """
import os

import pytest

import harness

FIRST_PID = []


def pid():
    return os.getpid()


@pytest.fixture
def resource(request):
    # a function-scoped fixture: set up and torn down in the test's own process
    yield {"pid": os.getpid()}
    print("teardown ran in", os.getpid(), "not", request.config.stash.get(TEST_PID, 0))


TEST_PID = pytest.StashKey[int]()


@pytest.fixture(scope="module")
def shared():
    return {"made_in": os.getpid()}


def test_0_before(request, shared):
    request.config.stash[TEST_PID] = os.getpid()
    FIRST_PID.append(os.getpid())


@pytest.mark.own_process{marker_args}
def test_1_initializes_cuda(resource, shared, record_property):
    # what a cuda allocator does to the process it is built in
    harness.mark_fork_unsafe("pretend: the cuda backend initialized CUDA on device 0")
    assert resource["pid"] == os.getpid() != FIRST_PID[0]
    assert shared["made_in"] == FIRST_PID[0]  # the test process's module fixture, copied
    record_property("child_pid", os.getpid())
    print("output of the test's own process")


def test_2_forks_after_it(shared):
    outcome = harness.run_child(pid, style="fork", timeout=30).assert_clean()
    assert outcome.style == "fork" and outcome.returned != os.getpid()
    assert harness.fork_unsafe_reason() is None
    assert os.getpid() == FIRST_PID[0]  # the same process as the first test
"""


@pytest.mark.parametrize("mode", [pytest.param([], id="plain"), ["-n", "1"]], ids=str)
def test_a_fork_style_test_after_an_own_process_test_forks(pytester, runpytest, mode):
    pytester.makepyfile(test_cuda_then_fork=TESTS.replace("{marker_args}", ""))

    result = runpytest("-rA", "-s", "--junitxml=report.xml", *mode)

    result.assert_outcomes(passed=3)
    xml = (pytester.path / "report.xml").read_text()
    assert 'name="child_pid"' in xml  # the child's user properties reach the report
    if not mode:  # (an xdist worker's -s output does not reach the controller's terminal)
        result.stdout.fnmatch_lines(["*output of the test's own process*", "teardown ran in *"])


def test_without_the_marker_the_fork_style_test_is_refused(pytester, runpytest):
    # the teeth of the test above: the same tests with the marker removed
    pytester.makepyfile(
        test_cuda_then_fork=TESTS.replace("@pytest.mark.own_process{marker_args}\n", "").replace(
            "!= FIRST_PID[0]", "== FIRST_PID[0]"
        )
    )

    result = runpytest("-rA", "-n", "1")

    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_2_forks_after_it*", "*style='fork' is refused*"])


CRASHES = """
import os
import signal

import pytest


@pytest.mark.own_process
def test_segfaults():
    print("about to die")
    os.kill(os.getpid(), signal.SIGSEGV)


@pytest.mark.own_process(timeout=2)
def test_hangs():
    import time

    time.sleep(60)


@pytest.mark.own_process
@pytest.mark.parametrize("n", [1, 2])
def test_ordinary(n, tmp_path):
    assert n == 1, "only one"


@pytest.mark.own_process
@pytest.mark.skip(reason="skipped in its own process")
def test_skipped():
    pass


@pytest.mark.own_process(2)
def test_bad_marker():
    pass
"""


def test_failures_crashes_and_hangs_are_reported_as_in_process(pytester, runpytest):
    pytester.makepyfile(test_crashes=CRASHES)

    result = runpytest("-rA")

    result.assert_outcomes(passed=1, failed=3, skipped=1, errors=1)
    result.stdout.fnmatch_lines_random(
        [
            "the test's own process (@pytest.mark.own_process: pid *, a fork of the test"
            " process) killed by SIGSEGV before it reported, after * s",
            "*its stdout*",
            "about to die",
            "*its stderr*",
            "Fatal Python error: Segmentation fault",
            "the test's own process * timed out after 2 s*",
            "*in test_hangs*",
            "*AssertionError: only one*",
            "SKIPPED * skipped in its own process",
            "*own_process takes the keyword argument timeout= only, got (2,)*",
        ]
    )
