"""A pytest plugin for running these suites under mutmut (``ci/mutation.py``); inert otherwise.

mutmut runs the tests in-process, with every mutated function behind a trampoline: once
unmutated to map which tests reach which function (``MUTANT_UNDER_TEST=stats``), then once per
mutant with only the tests that reach it. What keeps that map and those runs true here:

- Death-test children report the functions they reached. A child's trampoline hits stay in
  the child, which leaves with ``os._exit``, so without this a function reached only in
  children (the CuPy interop, the simulator's fatal checks) would have "no tests", and a death
  test would never be run against any mutant. After a fork, the child's set of hits writes
  each new name to a file; at the test's teardown the parent adds them to the test's hits.
  The forkserver zygote, a fresh interpreter, runs ``harness/_zygote.py`` under its module
  name (``suites/_mutmut_zygote.py``), so that its mutants apply, and reports its hits and
  its children's the same way; each pytest process mutmut runs has zygotes of its own. An
  inner pytest that a test starts with ``-p suites._mutmut`` (``_scenarios``) reports its
  children's and its zygote's hits to that test. The zygote and the exec runner load
  ``harness/_child.py`` as ``harness._child`` (as a fork child has it), so its mutants apply
  in every style; children started by exec do not report hits, though (a test that only
  starts exec children is not mapped to what they reach).
- mutmut's call stack lives in a thread-local instead of a ``ContextVar``: its trampolines set
  it on every call, also inside the allocator's teardown finalizers, which the collector runs,
  and CPython 3.11 crashes (SIGSEGV) when a finalizer run by the collector sets a ``ContextVar``
  while other threads do too, as the thread tests do.
- The memory history's stacks leave out mutmut's trampolines, as they leave out the
  allocator's own frames.
- A test that ran a forkserver child (:data:`FORKSERVER_RUN` or :data:`ZYGOTE_RUN` among its
  hits) is mapped to the zygote's start-up and loop too (:data:`ZYGOTE_START`): they run
  once, in the test that started the zygote, so mutmut's map would tie them to that test
  alone, and a mutant of them would be run against it alone.
- The first run, which mutmut runs in its own process, ends with its zygotes shut down and
  every ended child reaped: mutmut then waits for its workers with ``os.wait()``, and took a
  zygote that ended later for a worker (``KeyError``).
- Where ``harness/_child.py`` is mutated, the tests that count a child's frames below its
  target (:data:`FRAME_COUNTING`) are deselected: mutmut's trampolines add frames there.
- In a mutant's run, tests run fastest first (by the durations mutmut measured), so ``-x``
  stops a killed mutant early.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from suites import _mutmut_zygote

_UNDER_TEST = os.environ.get("MUTANT_UNDER_TEST")


class _ThreadLocalCallStack(threading.local):
    """mutmut's call stack (``get``/``set``/``reset``, as its ContextVar) kept per thread."""

    value: tuple[str | None, int] = (None, 0)

    def get(self) -> tuple[str | None, int]:
        return self.value

    def set(self, value: tuple[str | None, int]) -> tuple[str | None, int]:
        previous, self.value = self.value, value
        return previous

    def reset(self, previous: tuple[str | None, int]) -> None:
        self.value = previous


FORKSERVER_RUN = "harness._forkserver.xǁConnectionǁrun"
"""mutmut's name for :meth:`harness._forkserver.Connection.run` (a forkserver child ran)."""

ZYGOTE_RUN = "harness._zygote.xǁZygoteǁ_run"
"""mutmut's name for the zygote's handling of a run request (a forkserver child was asked
for): in a run where only ``harness/_zygote.py`` is mutated, :data:`FORKSERVER_RUN` has no
trampoline and is never recorded."""

ZYGOTE_START = (
    "harness._forkserver.x__start",
    "harness._forkserver.x__hello",
    "harness._zygote.x_main",
    "harness._zygote.x__start_coverage",
    "harness._zygote.x__load_child",
    "harness._zygote.xǁZygoteǁ__init__",
    "harness._zygote.xǁZygoteǁserve",
)
"""The functions that start a zygote and run its loop: called once, by the test that started
it, but every test whose child the zygote forked depends on them."""


class _ChildHits:
    """Collects the hits of the death-test children forked during a test, and those of the
    forkserver zygote and its children (``suites/_mutmut_zygote.py``)."""

    def __init__(self, state) -> None:
        self.state = state
        inherited = os.environ.get(_mutmut_zygote.HITS_VARIABLE)
        self.owner = not inherited
        if inherited:  # an inner pytest (a scenario's): its hits go to the outer test's files
            self.directory = Path(inherited)
            _mutmut_zygote.spill_hits_to(inherited)  # mutmut's own recorder needs its config
            return
        self.directory = Path(tempfile.mkdtemp(prefix="devmem-mutmut-hits-"))
        os.environ[_mutmut_zygote.HITS_VARIABLE] = str(self.directory)
        os.register_at_fork(after_in_child=self._in_child)

    def _in_child(self) -> None:
        self.state()._stats = _mutmut_zygote.SpillingHits(str(self.directory / str(os.getpid())))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item, nextitem) -> None:
        if not self.owner:
            return
        hits = self.state()._stats
        for path in list(self.directory.iterdir()):
            hits.update(path.read_text(encoding="utf-8").split())
            path.unlink()
        if FORKSERVER_RUN in hits or ZYGOTE_RUN in hits:  # its child ran in a zygote: it
            # depends on how that zygote started
            hits.update(ZYGOTE_START)

    def pytest_unconfigure(self, config) -> None:
        if self.owner:
            os.environ.pop(_mutmut_zygote.HITS_VARIABLE, None)
            shutil.rmtree(self.directory, ignore_errors=True)


def _own_zygotes() -> None:
    """This pytest process's forkserver zygotes are its own, and run ``harness/_zygote.py``
    as ``harness._zygote`` (``suites/_mutmut_zygote.py``), so its mutants apply there.

    mutmut runs each mutant in a process forked from one that imported the harness: without
    this, that process would be the zygotes' root, and each mutant's run would share the
    zygote of another mutant, or of the unmutated run, and leave its own behind.
    """
    from harness import _forkserver

    _forkserver.ZYGOTE_PATH = _mutmut_zygote.__file__
    _forkserver.ROOT = (os.getpid(), _forkserver.start_ticks(os.getpid()) or "0")


def pytest_configure(config: pytest.Config) -> None:
    if _UNDER_TEST is None:
        return
    try:
        from mutmut.core import MutmutCallStack
        from mutmut.state import state
    except ImportError:
        return
    MutmutCallStack._ctx = _ThreadLocalCallStack()
    _own_zygotes()
    # the memory history leaves the allocator's own frames out of its stacks; the trampolines
    # that mutmut puts around each allocator function are the allocator's too
    import mutmut

    from allocator import _stacks

    _stacks.SKIPPED_PREFIXES += (os.path.dirname(os.path.abspath(mutmut.__file__)) + os.sep,)
    if _UNDER_TEST == "stats":
        config.pluginmanager.register(_ChildHits(state), "devmem-mutmut-child-hits")


FRAME_COUNTING = ("suites/harness/test_report_frames.py",)
"""Tests that count the frames between a child's target and ``harness._child.run_child``:
where ``harness/_child.py`` is mutated, mutmut's trampolines add frames of their own there, so
these run only in the modules' runs where it is not (they are deselected, and say so)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _UNDER_TEST is None:
        return
    from harness import _child

    if hasattr(_child, "x_run_child__mutmut_orig"):  # mutmut's name for the original
        dropped = [item for item in items if item.nodeid.startswith(FRAME_COUNTING)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if item not in dropped]
    if _UNDER_TEST in ("", "stats", "fail"):
        return
    try:
        from mutmut.state import state
    except ImportError:
        return
    durations = state().duration_by_test
    items.sort(key=lambda item: durations.get(item.nodeid, 0.0))


def pytest_unconfigure(config: pytest.Config) -> None:
    """After mutmut's first, unmutated run: shut down this run's zygotes and reap them.

    That run is in mutmut's own process, which then waits for its mutants' workers with
    ``os.wait()``: a zygote (or any child) of the run that ended later would be reaped there as
    a worker mutmut does not know, and the whole run stopped with a ``KeyError``.
    """
    if _UNDER_TEST != "stats":
        return
    from harness import _forkserver

    _forkserver._shutdown_at_exit()  # the root's goodbye: each zygote leaves and is reaped
    while True:  # any other child that ended meanwhile (a zygote started and lost mid-run)
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
