"""Project fixtures: backend selection, fresh allocators with a leak check, stress scale, and
memory histories for failing tests.

Every allocator suite runs on every available backend: ``cpu`` and ``sim`` always, ``cuda`` when
a GPU is visible (otherwise its items skip with the reason). ``--backend cpu,sim`` (or
``DEVMEM_BACKEND``) narrows the list. Stress sizes scale with ``--stress-scale``. Tests marked
``interop`` (PyTorch as the client or the oracle) run only with ``--interop``.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import importlib.util
import os
import shlex

import pytest

import harness
from allocator import BACKENDS, Allocator, AllocatorConfig, fork_unsafe_reason
from allocator.device import backend_unavailable_reason
from suites import _skips
from suites._memory_history import MemoryHistory
from suites.allocator import _knobs

pytest_plugins = ["pytester", "suites._mutmut"]  # the second is inert outside mutmut


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("devmem", "devmem-harness suites")
    group.addoption(
        "--backend",
        default=None,
        help="comma-separated backends to run the suites on (default: DEVMEM_BACKEND, else"
        " cpu,sim,cuda; cuda skips with a reason where no GPU is visible)",
    )
    group.addoption(
        "--strict-backends",
        action="store_true",
        help="fail, instead of skip, the items of a requested backend that cannot run here"
        " (ci/check.sh --cuda uses it)",
    )
    group.addoption(
        "--interop",
        action="store_true",
        help="run the tests marked interop, which need PyTorch (pip install torch==2.13.0, a"
        " CPU build; ci/check.sh --interop installs it); without it they skip with the reason",
    )
    group.addoption(
        "--multihost",
        action="store_true",
        help="run the tests marked multihost: a throwaway sshd on 127.0.0.1 and xdist workers"
        " over ssh (needs openssh-server; ci/check.sh --multihost installs it); without it they"
        " skip with the reason",
    )
    group.addoption(
        "--sim-latency-us",
        type=int,
        default=SIM_LATENCY_US,
        metavar="US",
        help="the simulated kernel latency on sim of the allocators make_alloc builds and of the"
        " children suites.allocator._knobs.pinned_env pins (default"
        f" {SIM_LATENCY_US}: the race check on, so a missing stream wait aborts the test; 0: every"
        " kernel completes at once and no race can be seen). A test passes sim_latency_us="
        " itself where it needs another",
    )
    group.addoption(
        "--stress-scale",
        type=int,
        default=1,
        help="multiply stress sizes (buffer counts, arena counts) by this factor (default 1)",
    )


SIM_LATENCY_US = _knobs.SIM_LATENCY_US
"""The suites' default ``sim_latency_us`` on ``sim`` (``--sim-latency-us``): with a latency the
simulator's race check sees a read of another stream's unwaited write, which on a GPU reads
stale data once in a while (the first H200 run's zero3 gather)."""


def _backends(config: pytest.Config) -> list[str]:
    """The backends to run on, from ``--backend``, else ``DEVMEM_BACKEND``, else all.

    Raises:
        pytest.UsageError: a name that is not a backend, naming the option or the variable it
            came from.
    """
    value = config.getoption("backend")
    source = "--backend"
    if value is None:
        value, source = os.environ.get("DEVMEM_BACKEND") or ",".join(BACKENDS), "DEVMEM_BACKEND"
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in BACKENDS]
    if unknown or not names:
        raise pytest.UsageError(
            f"{source}={value!r}: expected a comma-separated list of {', '.join(BACKENDS)}"
        )
    return names


def pytest_configure(config: pytest.Config) -> None:
    # The allocator never imports the harness: it says why forking is unsafe (its cuda backend
    # initialized CUDA) through its own check, which the harness consults before each fork.
    harness.add_fork_safety_check(fork_unsafe_reason)
    _backends(config)
    if config.getoption("sim_latency_us") < 0:
        raise pytest.UsageError(
            f"--sim-latency-us must be >= 0, got {config.getoption('sim_latency_us')}"
        )
    _knobs.SIM_LATENCY_US = config.getoption("sim_latency_us")  # sim children's, pinned_env
    if config.getoption("stress_scale") < 1:
        raise pytest.UsageError(
            f"--stress-scale must be >= 1, got {config.getoption('stress_scale')}"
        )
    config.addinivalue_line("markers", "no_leak_check: do not check allocators for live buffers")
    config.addinivalue_line(
        "markers",
        "backends(*names): run this test only on these backends (e.g. those with a reuse cache)",
    )
    config.addinivalue_line(
        "markers",
        "interop: checks against a real third-party library (PyTorch); runs only with --interop"
        " (ci/check.sh --interop installs torch==2.13.0 and passes it), else skips saying so",
    )
    config.addinivalue_line(
        "markers",
        "multihost: runs suites through xdist workers over ssh to a throwaway sshd on 127.0.0.1;"
        " runs only with --multihost (ci/check.sh --multihost), else skips saying so",
    )
    _fold_skip_lines(config)
    if config.getoption("interop") and importlib.util.find_spec("torch") is None:
        raise pytest.UsageError(
            "--interop: PyTorch is not installed; pip install torch==2.13.0 (the CPU build;"
            " ci/check.sh --interop installs it)"
        )


class _SkipSummary:
    """The run's report ends with one line per missing capability (cuda, interop, multihost)
    and how to get it, and one that counts the other skips (``suites/_skips.py``), instead of
    pytest's ``SKIPPED`` line per reason; ``-rs`` on the command line lists them all again."""

    def __init__(self) -> None:
        self.active = False

    @pytest.hookimpl(trylast=True)  # the terminal reporter is there by then
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        config = session.config
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None or "s" not in getattr(reporter, "reportchars", ""):
            return  # an xdist worker, or no skip report asked for
        args = [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))]
        if _skips.asks_for_skip_report([str(arg) for arg in args]):
            return  # -rs (or -ra, -rA) given: pytest lists every skip with its reason
        reporter.reportchars = reporter.reportchars.replace("s", "")
        self.active = True

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # around the terminal's: after its summary
    def pytest_terminal_summary(self, terminalreporter):
        result = yield
        if not self.active:
            return result
        reasons = [
            str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else ""
            for report in terminalreporter.stats.get("skipped", [])
        ]
        lines = _skips.summary_lines(reasons)
        if lines:
            terminalreporter.write_sep("=", "skipped: what it takes to run them", yellow=True)
            for line in lines:
                terminalreporter.write_line(line)
        return result


def _fold_skip_lines(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the xdist controller, or a run without xdist
        config.pluginmanager.register(_SkipSummary(), "devmem-skip-summary")


_folded_skip = pytest.StashKey[bool]()
"""Set on an item whose skip is reported at this file's location (see makereport below)."""

INTEROP_SKIP = (
    "interop test (PyTorch as client or oracle): run with --interop; ci/check.sh --interop"
    " installs torch==2.13.0 (CPU) and runs them"
)


MULTIHOST_SKIP = (
    "multihost test (xdist workers over ssh to a throwaway sshd): run with --multihost;"
    " ci/check.sh --multihost installs openssh-server and runs them"
)


CUDA_PRELOAD = ("cupy", "allocator.device.cuda")
"""What the forkserver's zygote imports besides the ``death_preload`` ini list where the cuda
backend runs: nothing of it initializes CUDA or starts a thread at import."""


def _initializes_cuda(item: pytest.Item) -> bool:
    """Whether ``item`` runs on the ``cuda`` backend (its test process may build a CUDA
    allocator: ``make_alloc``, ``alloc``, or its own)."""
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("backend") == "cuda"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Every cuda item runs whole in a fork child of the test process (the harness's
    # own_process marker), so that no pytest process or xdist worker ever creates a CUDA
    # context: the fork-style tests it runs afterwards still fork (docs/gpus.md). Where cuda
    # cannot run, its items skip in the backend fixture, in the test process.
    cuda_items = [item for item in items if _initializes_cuda(item)]
    if cuda_items and _unavailable("cuda") is None:
        for item in cuda_items:
            item.add_marker(pytest.mark.own_process)
        # the forkserver's zygote imports CuPy (which creates no context at import), so that
        # a cuda death-test child pays for its context, not for the import (about 0.5 s on
        # the first H200 run)
        preload = list(harness.forkserver_preload())
        harness.set_forkserver_preload(
            preload + [name for name in CUDA_PRELOAD if name not in preload]
        )
    for option, marker, reason in (
        ("interop", "interop", INTEROP_SKIP),
        ("multihost", "multihost", MULTIHOST_SKIP),
    ):
        if config.getoption(option):
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if item.get_closest_marker(marker):
                item.add_marker(skip)
                item.stash[_folded_skip] = True


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        names = _backends(metafunc.config)
        only = metafunc.definition.get_closest_marker("backends")
        if only is not None:
            names = [name for name in names if name in only.args]
        metafunc.parametrize("backend", names, ids=names, indirect=True)


@functools.cache
def _unavailable(backend: str) -> str | None:
    return backend_unavailable_reason(backend)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The backend under test (``cpu``, ``sim`` or ``cuda``); skips with the reason if it
    cannot run here."""
    name = request.param
    request.node.user_properties.append(("backend", name))  # for the nightly summary
    reason = _unavailable(name)
    if reason is not None:
        if request.config.getoption("strict_backends"):
            pytest.fail(f"{name} backend unavailable (--strict-backends): {reason}")
        request.node.stash[_folded_skip] = True
        pytest.skip(f"{name} backend unavailable: {reason}")
    return name


@pytest.fixture
def stress_scale(request: pytest.FixtureRequest) -> int:
    """The ``--stress-scale`` factor (1 in CI)."""
    return request.config.getoption("stress_scale")


_call_failed = pytest.StashKey[bool]()
_memory_history = pytest.StashKey[MemoryHistory]()
_made = pytest.StashKey[list]()  # the allocators make_alloc built for this test


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.failed and report.when in ("call", "teardown"):
        history = item.stash.get(_memory_history, None)
        if history is not None and history.allocators:
            report.sections.append(("devmem memory history", history.report()))
    if report.when == "call":
        item.stash[_call_failed] = report.failed
    elif report.skipped and item.stash.get(_folded_skip, False):
        # One location for every item an unavailable backend or a missing --interop skips, so
        # that pytest's short summary folds them into one line per reason, not one per test:
        # "SKIPPED [106] conftest.py: cuda backend unavailable: CuPy is not installed ..."
        report.longrepr = (__file__, None, report.longrepr[2])
    return report


_NOTE = "devmem_note"


@pytest.fixture
def note(record_property):
    """``note(text)``: a line the terminal summary prints under "devmem notes" for this test
    (e.g. that a check held only trivially); it also lands in the JUnit XML."""

    def add(text: str) -> None:
        record_property(_NOTE, text)

    return add


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    lines = [
        f"{report.nodeid}: {value}"
        for outcome in ("passed", "failed")
        for report in terminalreporter.stats.get(outcome, [])
        for name, value in getattr(report, "user_properties", ())
        if name == _NOTE
    ]
    if not lines:
        return
    if config.get_verbosity() < 1:
        terminalreporter.write_line(
            f"devmem notes: {len(lines)} (measured values, and checks that held only trivially,"
            " e.g. a cache cap on cpu, which keeps no cache); -v lists them, as does the JUnit XML"
        )
        return
    terminalreporter.write_sep("=", "devmem notes")
    for line in sorted(lines):
        terminalreporter.write_line(line)


@pytest.fixture
def make_alloc(backend: str, request: pytest.FixtureRequest):
    """A factory of fresh allocators on the backend under test, checked for leaks.

    ``make_alloc(**overrides)`` builds ``Allocator(AllocatorConfig(backend=..., **overrides))``;
    on ``sim`` with ``sim_latency_us`` from ``--sim-latency-us`` (default
    :data:`SIM_LATENCY_US`, so the race check runs) unless ``overrides`` names it; on ``cuda``
    with the stream check on (``stream_check="abort"``) unless ``overrides`` names it.
    After a passing test every allocator it built must have no live buffers and no open arena
    (mark a test ``no_leak_check`` to opt out).
    """
    made: list[Allocator] = []
    request.node.stash[_made] = made  # memory_history watches those built before it, too
    base = AllocatorConfig(backend=backend)
    if backend == "sim":
        base = dataclasses.replace(base, sim_latency_us=request.config.getoption("sim_latency_us"))
    elif backend == "cuda":  # the stream check: a racy test cannot pass on a GPU by luck
        base = dataclasses.replace(base, stream_check="abort")

    def make(**overrides) -> Allocator:
        alloc = Allocator(dataclasses.replace(base, **overrides))
        made.append(alloc)
        history = request.node.stash.get(_memory_history, None)
        if history is not None:
            history.watch(alloc)
        return alloc

    yield make
    if made:  # for the nightly summary: the most bytes any of them held at once
        peak = max(alloc.stats().peak_bytes for alloc in made)
        request.node.user_properties.append(("peak_live_bytes", peak))
    if request.node.get_closest_marker("no_leak_check") or request.node.stash.get(
        _call_failed, True
    ):
        return
    gc.collect()
    for alloc in made:
        stats = alloc.stats()
        assert stats.live_buffers == 0 and stats.live_bytes == 0, (
            f"leak check: {stats.live_buffers} buffers ({stats.live_bytes} bytes) still live"
            f" after the test: {stats.format()}"
        )
        assert stats.arena_depth == 0, f"leak check: {stats.arena_depth} arenas left open"
        alloc.empty_cache()  # hand cached device blocks back now, not at garbage collection


@pytest.fixture(autouse=True)
def _leaves_the_process_fork_safe(request: pytest.FixtureRequest):
    """Fail a test that made the test process unsafe to fork (it initialized CUDA there): every
    fork-style death test after it in this process (xdist worker) would be refused. A cuda
    item runs in its own process (``own_process``, see pytest_collection_modifyitems); a test
    that builds a cuda allocator another way must take the ``backend`` fixture, or the
    ``own_process`` marker, itself."""
    before = fork_unsafe_reason()
    yield
    after = fork_unsafe_reason()
    if after != before and request.node.get_closest_marker("own_process") is None:
        pytest.fail(
            f"this test made the pytest process unsafe to fork ({after}): the fork-style death"
            " tests after it in this process would be refused. Run it in a process of its own"
            " (@pytest.mark.own_process, or the backend fixture, whose cuda items are)",
            pytrace=False,
        )


@pytest.fixture
def alloc(make_alloc) -> Allocator:
    """A fresh allocator on the backend under test, detector in ``raise`` mode, leak-checked."""
    return make_alloc(arena_debug="raise")


@pytest.fixture
def memory_history(request: pytest.FixtureRequest, tmp_path):
    """Record the memory history, with stacks, of the allocators this test builds with
    ``make_alloc`` and of any it passes to ``memory_history.watch(alloc)`` (e.g. the default
    allocator, ``allocator.get_allocator()``). If the test or its teardown (the leak check)
    fails, a snapshot of each is dumped beside the test's ``tmp_path``
    (``<name>-memory.pickle``) and the failure report gets a "devmem memory history" section:
    the snapshot paths and the blocks still live, with the frames that allocated them.
    """
    history = MemoryHistory(tmp_path)
    request.node.stash[_memory_history] = history
    for alloc in request.node.stash.get(_made, ()):  # e.g. ``def test(alloc, memory_history)``
        history.watch(alloc)
    yield history
    history.stop()
