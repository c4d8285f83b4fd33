"""pytest glue for the death-test harness (entry point ``devmem_death``); the work is elsewhere.

Declares ``--death-style``, ``--death-timeout``, ``--gpus`` and the ini option
``death_preload``; pins each xdist worker to one GPU when ``--gpus`` is given; provides
the ``death`` fixture; expands :func:`harness.matrix` into one item per config; and prints one
summary line of the children run (by style, median and slowest duration).

The summary works under ``pytest -n`` and ``pytest --forked``: each test's children travel in
its teardown report's ``user_properties`` (which xdist and pytest-forked both carry to the
controlling process), and the controlling process sums them up from the reports it logs.
"""

from __future__ import annotations

import argparse
import os

import pytest

import harness
from harness._config import MATRIX_ATTR
from harness._errors import HarnessError
from harness._forkserver import forkserver_preload
from harness._gpus import VISIBLE, gpu_for_worker, resolve_gpus
from harness._report import format_summary
from harness._request import check_timeout
from harness._run import add_observer, remove_observer

PROPERTY = "devmem_death_children"
"""Name of the ``user_properties`` entry that carries a test's children: [[style, seconds]]."""

_recorder_key = pytest.StashKey["_Recorder"]()
_preload_key = pytest.StashKey[tuple]()


def _seconds(text: str) -> float:
    """Parse ``--death-timeout``: the same rule as ``run_child(timeout=...)``."""
    try:
        return check_timeout(float(text))
    except (ValueError, HarnessError):
        raise argparse.ArgumentTypeError(
            f"expected a positive finite number of seconds, got {text!r}"
        ) from None


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("devmem_death", "death tests (devmem-harness)")
    group.addoption(
        "--death-style",
        choices=harness.STYLES,
        default="auto",
        help="how the `death` fixture starts children: fork, forkserver, exec, or auto (fork "
        "when safe, else forkserver). Default: auto.",
    )
    group.addoption(
        "--death-timeout",
        type=_seconds,
        default=60.0,
        metavar="SECONDS",
        help="default deadline of a death-test child, in seconds. Default: 60.",
    )
    group.addoption(
        "--gpus",
        default=None,
        metavar="SPEC",
        help="pin each xdist worker to one GPU through CUDA_VISIBLE_DEVICES, chosen from its "
        "worker id: 'auto' (every GPU nvidia-smi lists), a count N, or ids like 0,2. Death-test "
        "children inherit it. Default: no pinning.",
    )
    parser.addini(
        "death_preload",
        type="linelist",
        default=[],
        help="modules the forkserver zygote imports before forking children (e.g. numpy)",
    )


def _pin_gpu(config: pytest.Config) -> None:
    """Set CUDA_VISIBLE_DEVICES for this process from ``--gpus``, before any test runs.

    An xdist worker takes the GPU of its worker id, from the GPUs of its own machine; a run
    without xdist takes the first; the xdist controller runs no test and pins nothing, so the
    workers it starts still see every GPU.
    """
    spec = config.getoption("gpus")
    if spec is None:
        return
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None and config.getoption("dist", "no") != "no":
        return
    try:
        gpus = resolve_gpus(spec)
        worker = None if workerinput is None else workerinput["workerid"]
        os.environ[VISIBLE] = gpu_for_worker(worker, gpus)
    except HarnessError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_configure(config: pytest.Config) -> None:
    _pin_gpu(config)
    config.stash[_preload_key] = forkserver_preload()
    preload = config.getini("death_preload")
    if preload:
        harness.set_forkserver_preload(list(preload))
    recorder = _Recorder()
    config.stash[_recorder_key] = recorder
    config.pluginmanager.register(recorder, "devmem_death_recorder")
    add_observer(recorder.observe)


def pytest_unconfigure(config: pytest.Config) -> None:
    recorder = config.stash.get(_recorder_key, None)
    if recorder is not None:
        remove_observer(recorder.observe)
        config.pluginmanager.unregister(recorder)
    if _preload_key in config.stash:
        harness.set_forkserver_preload(list(config.stash[_preload_key]))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    configs = getattr(metafunc.function, MATRIX_ATTR, None)
    if configs is not None:
        metafunc.parametrize("config", configs, ids=[config.id for config in configs])


@pytest.fixture
def death(pytestconfig: pytest.Config) -> harness.DeathRunner:
    """Runs death-test children: ``death.run(target, *args, env=, config=, timeout=, style=)``.

    Bound to ``--death-style`` and ``--death-timeout``; returns a :class:`harness.Outcome`.
    """
    return harness.DeathRunner(
        style=pytestconfig.getoption("death_style"),
        timeout=pytestconfig.getoption("death_timeout"),
    )


class _Recorder:
    """Per-run state: the children of the running test, and every child seen in a report."""

    def __init__(self) -> None:
        self.pending: list[list] = []  # [style, seconds] of the running test's children
        self.children: list[tuple[str, float, str]] = []  # (style, seconds, nodeid)

    def observe(self, outcome: harness.Outcome) -> None:
        self.pending.append([outcome.style, round(outcome.duration_s, 6)])

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> None:
        """Before the teardown report is made: attach the test's children to it."""
        if call.when == "teardown" and self.pending:
            item.user_properties.append((PROPERTY, list(self.pending)))
            self.pending.clear()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":
            return
        for name, value in report.user_properties:
            if name == PROPERTY:
                self.children.extend(
                    (str(style), float(seconds), report.nodeid) for style, seconds in value
                )

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        line = format_summary(self.children)
        if line is not None:
            terminalreporter.write_line(line)
