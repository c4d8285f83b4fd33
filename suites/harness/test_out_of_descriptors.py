"""A test process out of file descriptors gets a HarnessError that says so, not a raw
``FileNotFoundError`` from :mod:`tempfile`, and no descriptor is left open by the attempt."""

from __future__ import annotations

import resource

import pytest

import harness
from suites.harness import _procs, _targets


def _limit_with_room_for(free: int) -> int:
    """The RLIMIT_NOFILE under which exactly ``free`` more descriptors can be opened (a new
    descriptor takes the lowest free number, which must be below the limit)."""
    used, limit = set(_procs.open_fds()), 0
    while free or limit in used:
        free -= limit not in used
        limit += 1
    return limit


@pytest.mark.own_process  # it lowers this process's descriptor limit for good
@pytest.mark.parametrize("child_style", ["fork", "forkserver", "exec"])
def test_no_descriptor_left_is_a_harness_error_that_says_so(child_style):
    harness.run_child(_targets.give_back, style=child_style).assert_clean()  # zygote and table
    before = _procs.open_fds()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (_limit_with_room_for(2), hard))  # one pipe

    with pytest.raises(harness.HarnessError, match="cannot open a child's channels") as excinfo:
        harness.run_child(_targets.give_back, style=child_style)

    assert "RLIMIT_NOFILE" in str(excinfo.value)
    assert _procs.open_fds() == before  # the pipe it did open is closed again
