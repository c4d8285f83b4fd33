"""pytest glue for the death-test harness (entry point ``devmem_death``); the work is elsewhere.

Declares ``--death-style``, ``--death-timeout``, ``--gpus``, the ini options ``death_style``,
``death_timeout`` and ``death_preload`` and the ``death`` marker; pins each xdist worker to one
GPU when ``--gpus`` is given; provides the ``death`` fixture; expands :func:`harness.matrix`
into one item per config; runs a test marked ``own_process`` whole in a fork child
(``harness._own_process``); and prints one summary line of the children run (by style, median
and slowest duration).

The ``death`` fixture's defaults, most specific first: the test's ``@pytest.mark.death(...)``
marker, then the command line, then the ini file, then ``auto`` and 60 s.

The summary works under ``pytest -n`` and ``pytest --forked``: each test's children travel in
an attribute of its teardown report (which xdist and pytest-forked both carry to the
controlling process, and which a JUnit XML report does not show), and the controlling process
sums them up from the reports it logs.
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

import pytest

import harness
from harness._config import MATRIX_ATTR
from harness._errors import HarnessError
from harness._forkserver import ZygoteFailure, connection, forkserver_preload
from harness._gpus import VISIBLE, gpu_for_worker, resolve_gpus
from harness._own_process import MARKER as OWN_PROCESS_MARKER
from harness._own_process import run_in_own_process
from harness._report import format_summary
from harness._repro import set_request_dir
from harness._request import check_timeout
from harness._run import add_observer, remove_observer
from harness._styles import check_style

REPORT_ATTR = "devmem_death_children"
"""Attribute of a teardown report that carries its test's children: ``[[style, seconds]]``."""

DEFAULT_STYLE = "auto"
DEFAULT_TIMEOUT_S = 60.0
MARKER = (
    "death(style=None, timeout=None): defaults of the `death` fixture for this test: a style "
    "(auto, fork, forkserver, exec) and a timeout in seconds (None: no deadline)"
)

_recorder_key = pytest.StashKey["_Recorder"]()
_preload_key = pytest.StashKey[tuple]()
_defaults_key = pytest.StashKey[tuple]()
_gpu_problem_key = pytest.StashKey[str]()
_reltoroot_key = pytest.StashKey[tuple]()


def parse_timeout(text: str) -> float | None:
    """Parse a ``--death-timeout`` or ``death_timeout`` value: seconds, or ``0``/``none``
    for no deadline.

    Raises:
      ValueError: anything else (the message says what is accepted).
    """
    word = text.strip().lower()
    if word in ("none", "0", "0.0"):
        return None
    try:
        return check_timeout(float(word))
    except (ValueError, HarnessError):
        raise ValueError(
            f"expected a positive finite number of seconds, or 0 or 'none' for no deadline, "
            f"got {text!r}"
        ) from None


def _timeout_option(text: str) -> float | None:
    try:
        return parse_timeout(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("devmem_death", "death tests (devmem-harness)")
    group.addoption(
        "--death-style",
        choices=harness.STYLES,
        default=None,
        help="how the `death` fixture starts children: fork, forkserver, exec, or auto (fork "
        "when safe, else forkserver). Default: the death_style ini option, else auto.",
    )
    group.addoption(
        "--death-timeout",
        type=_timeout_option,
        default=False,  # not given (None means no deadline)
        metavar="SECONDS",
        help="default deadline of a death-test child, in seconds; 0 or 'none' for no deadline. "
        "Default: the death_timeout ini option, else 60.",
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
        "death_style",
        type="string",
        default="",
        help="default style of the `death` fixture (auto, fork, forkserver, exec)",
    )
    parser.addini(
        "death_timeout",
        type="string",
        default="",
        help="default deadline of a death-test child in seconds (0 or 'none': no deadline)",
    )
    parser.addini(
        "death_preload",
        type="linelist",
        default=[],
        help="modules the forkserver zygote imports before forking children (e.g. numpy)",
    )


def _session_defaults(config: pytest.Config) -> tuple[str, float | None]:
    """``(style, timeout)`` from the command line, else the ini file, else the defaults."""
    style = config.getoption("death_style")
    if style is None:
        ini = config.getini("death_style").strip()
        try:
            style = check_style(ini, "the death_style ini option") if ini else DEFAULT_STYLE
        except HarnessError as exc:
            raise pytest.UsageError(str(exc)) from None
    timeout = config.getoption("death_timeout")
    if timeout is False:
        ini = config.getini("death_timeout").strip()
        try:
            timeout = parse_timeout(ini) if ini else DEFAULT_TIMEOUT_S
        except ValueError as exc:
            raise pytest.UsageError(f"the death_timeout ini option: {exc}") from None
    return style, timeout


def _local_workers(config: pytest.Config) -> bool:
    """Whether every xdist worker runs on this machine (``-n``, ``--tx popen``)."""
    specs = [spec.split("*", 1)[-1] for spec in config.getoption("tx", None) or []]
    return bool(specs) and all(
        spec.split("//", 1)[0] == "popen" and "via=" not in spec for spec in specs
    )


def _pin_gpu(config: pytest.Config) -> None:
    """Set CUDA_VISIBLE_DEVICES for this process from ``--gpus``, before any test runs.

    An xdist worker takes the GPU of its worker id, from the GPUs of its own machine; a run
    without xdist takes the first. The xdist controller runs no test and pins nothing (so the
    workers it starts still see every GPU), but when its workers are local it checks the
    value first, so that a bad one fails once, with one line, and not once per worker.
    """
    spec = config.getoption("gpus")
    if spec is None:
        return
    workerinput = getattr(config, "workerinput", None)
    distributing = config.getoption("dist", "no") != "no" and config.getoption("tx", None)
    try:
        if workerinput is None and distributing:
            if _local_workers(config):
                resolve_gpus(spec)
            return
        gpus = resolve_gpus(spec)
        worker = None if workerinput is None else workerinput["workerid"]
        os.environ[VISIBLE] = gpu_for_worker(worker, gpus)
    except HarnessError as exc:
        if workerinput is None:
            raise pytest.UsageError(str(exc)) from None
        # A worker (a remote one: local ones were checked by the controller) must not crash
        # while configuring, or xdist replaces it again and again: its tests fail instead,
        # each with this one line (see pytest_runtest_setup).
        config.stash[_gpu_problem_key] = (
            f"{exc} (on xdist worker {workerinput.get('workerid', '?')}, host "
            f"{socket.gethostname()})"
        )


def _remote_args_from_rootdir(config: pytest.Config) -> None:
    """Let xdist workers that run elsewhere (``--tx ssh=...``, or any ``chdir=``) take path
    arguments relative to the rootdir, when no rsync root is configured.

    xdist rewrites every path argument relative to an rsync root for such workers, and with
    none configured (``--rsyncdir`` is deprecated; the project is deployed at the same layout
    on each host, the worker's ``chdir=`` being its root) it fails with ``INTERNALERROR ...
    not relative to an rsync root``. xdist has no hook there, so its function is replaced for
    this run (and put back at unconfigure).
    """
    if getattr(config, "workerinput", None) is not None:
        return
    if config.getoption("dist", "no") == "no" or not config.getoption("tx", None):
        return
    try:
        if config.getoption("rsyncdir", None) or config.getini("rsyncdirs"):
            return  # xdist's own way: rsync the roots
        from xdist import workermanage
    except (ImportError, ValueError):
        return
    original = workermanage.make_reltoroot
    root = Path(config.rootpath).resolve()

    def make_reltoroot(roots: object, args: list[str]) -> list[str]:
        result = []
        for arg in args:
            path, sep, rest = arg.partition("::")
            try:
                local = Path(path).resolve() if Path(path).exists() else None
            except OSError:
                local = None
            if local is None:
                result.append(arg)
                continue
            try:
                relative = local.relative_to(root)
            except ValueError:
                raise ValueError(
                    f"arg {arg} is outside the rootdir {root}: a remote xdist worker, which runs "
                    "in its chdir= (the project's root on its host), cannot find it"
                ) from None
            result.append(f"{relative.as_posix() if relative.parts else '.'}{sep}{rest}")
        return result

    workermanage.make_reltoroot = make_reltoroot
    config.stash[_reltoroot_key] = (workermanage, original)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    config.addinivalue_line("markers", OWN_PROCESS_MARKER)
    _pin_gpu(config)
    _remote_args_from_rootdir(config)
    config.stash[_defaults_key] = _session_defaults(config)
    config.stash[_preload_key] = forkserver_preload()
    preload = config.getini("death_preload")
    if preload:
        harness.set_forkserver_preload(list(preload))
    recorder = _Recorder()
    config.stash[_recorder_key] = recorder
    config.pluginmanager.register(recorder, "devmem_death_recorder")
    add_observer(recorder.observe)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _reltoroot_key in config.stash:
        module, original = config.stash[_reltoroot_key]
        module.make_reltoroot = original
    recorder = config.stash.get(_recorder_key, None)
    if recorder is not None:
        remove_observer(recorder.observe)
        config.pluginmanager.unregister(recorder)
    if _preload_key in config.stash:
        harness.set_forkserver_preload(list(config.stash[_preload_key]))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that :func:`harness.matrix` marked without its parametrize mark (pytest could
    not be imported when it was decorated) is parametrized here."""
    configs = getattr(metafunc.function, MATRIX_ATTR, None)
    if configs is None:
        return
    marked = any(
        mark.args and mark.args[0] == "config"
        for mark in metafunc.definition.iter_markers("parametrize")
    )
    if not marked:
        metafunc.parametrize("config", configs, ids=[config.id for config in configs])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-forked, start the zygote in this process before any test forks from it,
    so that every forked test shares it (and it is this process's to reap)."""
    forked = config.getoption("forked", False) or any(
        item.get_closest_marker("forked") for item in items
    )
    if forked:
        try:
            connection()
        except ZygoteFailure:
            pass  # the first child that needs it says why, as a harness error


def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """A test marked ``own_process`` runs, whole, in a fork child (``harness._own_process``).
    Under pytest-forked, whose hook runs first, every test is in a fork child already."""
    if item.get_closest_marker("own_process") is None:
        return None
    run_in_own_process(item, nextitem)
    return True


def pytest_runtest_setup(item: pytest.Item) -> None:
    """On a worker where ``--gpus`` found no GPU, fail each test with one line."""
    problem = item.config.stash.get(_gpu_problem_key, None)
    if problem is not None:
        pytest.fail(problem, pytrace=False)


def _marker_defaults(item: pytest.Item, style: str, timeout: float | None):
    marker = item.get_closest_marker("death")
    if marker is None:
        return style, timeout
    unknown = set(marker.kwargs) - {"style", "timeout"}
    if marker.args or unknown:
        raise HarnessError(
            "@pytest.mark.death takes the keyword arguments style= and timeout= only, got "
            f"{marker.args!r} {sorted(unknown)}"
        )
    if "style" in marker.kwargs:
        style = check_style(marker.kwargs["style"], "@pytest.mark.death(style=...)")
    if "timeout" in marker.kwargs:
        timeout = check_timeout(marker.kwargs["timeout"], "@pytest.mark.death(timeout=...)")
    return style, timeout


@pytest.fixture
def death(request: pytest.FixtureRequest) -> harness.DeathRunner:
    """Runs death-test children: ``death.run(target, *args, env=, config=, timeout=, style=)``.

    Its defaults: the test's ``@pytest.mark.death(style=..., timeout=...)``, else
    ``--death-style``/``--death-timeout``, else the ``death_style``/``death_timeout`` ini
    options, else ``auto`` and 60 s. Returns a :class:`harness.Outcome` per child.
    """
    __tracebackhide__ = True
    style, timeout = _marker_defaults(request.node, *request.config.stash[_defaults_key])
    return harness.DeathRunner(style=style, timeout=timeout)


class _Recorder:
    """Per-run state: the children of the running test, and every child seen in a report."""

    def __init__(self) -> None:
        self.pending: list[list] = []  # [style, seconds] of the running test's children
        self.children: list[tuple[str, float, str]] = []  # (style, seconds, nodeid)

    def observe(self, outcome: harness.Outcome) -> None:
        self.pending.append([outcome.style, round(outcome.duration_s, 6)])

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        """While a test runs, a long repro request goes to a file in a temporary directory of
        its own (made at the first one), under pytest's base temporary directory."""
        made: list[str] = []

        def directory() -> str:
            if not made:
                factory = getattr(item.config, "_tmp_path_factory", None)  # the tmp_path plugin's
                name = "".join(c if c.isalnum() else "_" for c in item.name)[:30] or "test"
                if factory is not None:
                    made.append(str(factory.mktemp(f"repro-{name}", numbered=True)))
                else:
                    import tempfile

                    made.append(tempfile.mkdtemp(prefix=f"devmem-repro-{name}-"))
            return made[0]

        set_request_dir(directory)
        try:
            return (yield)
        finally:
            set_request_dir(None)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):
        """Attach the test's children to its teardown report."""
        report = yield
        if call.when == "teardown" and self.pending:
            setattr(report, REPORT_ATTR, list(self.pending))
            self.pending.clear()
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":
            return
        for style, seconds in getattr(report, REPORT_ATTR, None) or ():
            self.children.append((str(style), float(seconds), report.nodeid))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        line = format_summary(self.children)
        if line is not None:
            terminalreporter.write_line(line)
