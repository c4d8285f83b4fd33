"""``run_child``: check the request, pick the style, launch, turn the ending into an Outcome."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from harness._capture import Capture
from harness._config import Config
from harness._env import path_variables, startup_variables
from harness._exec import launch_exec
from harness._fork import launch_fork
from harness._forkserver import current, launch_forkserver
from harness._guard import table
from harness._leaks import leak_notes
from harness._outcome import Outcome
from harness._protocol import Seal, Status, decode_seal, decode_status
from harness._reap import Ending
from harness._report import describe_ending
from harness._repro import repro_command
from harness._request import ChildRequest, check_timeout, make_request
from harness._styles import check_style, choose_style

_LAUNCHERS: dict[str, Callable[[ChildRequest, Capture], Ending]] = {
    "fork": launch_fork,
    "forkserver": launch_forkserver,
    "exec": launch_exec,
}

_observers: list[Callable[[Outcome], None]] = []

_HOST = socket.gethostname()
"""This host's name, for failure reports (read once: it does not change under a test run)."""


def add_observer(observer: Callable[[Outcome], None]) -> None:
    """Call ``observer(outcome)`` after every child this process runs (the plugin's summary)."""
    _observers.append(observer)


def remove_observer(observer: Callable[[Outcome], None]) -> None:
    """Undo :func:`add_observer` (no error if it was not added)."""
    if observer in _observers:
        _observers.remove(observer)


def run_child(
    target: Callable[..., Any] | str,
    *args: Any,
    env: Mapping[str, str | None] | None = None,
    config: Config | None = None,
    style: str = "auto",
    timeout: float | None = 60.0,
) -> Outcome:
    """Run ``target(*args)`` in a child process and report how the child ended.

    The child gets its own process group, no core dumps, stdin from ``/dev/null``, stdout and
    stderr captured at the descriptor level, ``faulthandler`` on its stderr, the environment
    ``DEVMEM_DEATH_CHILD=1``, and leaves through ``os._exit`` (no atexit handlers, no flushing
    of the parent's buffers). A target that raises makes the child exit with status 1 (the
    traceback goes to its stderr and into ``Outcome.raised``); ``sys.exit(n)`` exits with n.
    Nothing of the child's process group outlives this process, however this process ends:
    the forkserver's zygote, which outlives it, kills the group (only a grandchild that left
    the group, with ``setsid`` or ``setpgid``, escapes).

    Args:
      target: a module-level function, importable as ``module:qualname`` (or such a str,
        imported only in the child); a function whose module cannot be imported by name (a
        test module under pytest's ``--import-mode=importlib``) is loaded from its module's
        file. Closures, lambdas and bound methods only with ``style="fork"``.
      *args: its positional arguments: JSON plain data (None, bool, int, float, str, and lists
        and str-keyed dicts of those).
      env: variables for the child, applied after ``config.env``; a None value unsets the
        name. Applied before the target's module is imported, so module-level reads see it;
        in fork style the module was imported by the parent already, so only code that reads
        the environment at call time (or resets at fork) sees it. A variable that acts only
        at interpreter start-up (``PYTHONWARNINGS``, ``PYTHONDEVMODE``, ``PYTHONMALLOC``,
        ``LD_PRELOAD``, ``MALLOC_*``...) makes ``auto`` pick ``exec``.
      config: a :class:`~harness.Config`; its env is applied first and its id recorded.
      style: ``"fork"`` (fastest; the child is a copy of this process), ``"forkserver"`` (a
        fork of a clean zygote process), ``"exec"`` (a fresh interpreter) or ``"auto"`` (fork
        when safe, else forkserver; exec for a start-up variable in env; see
        :func:`harness.mark_fork_unsafe`).
      timeout: seconds the child may run (any positive finite number), or None for no
        deadline. Past it the child is ``timed_out``, whatever happens next: its Python stacks
        are dumped into its stderr (if it still handles SIGUSR2), then its process group gets
        SIGTERM, and SIGKILL 0.5 s later.

    Returns:
      The :class:`~harness.Outcome`; its ``notes`` say what of this process's state (umask,
      limits, nice value, warning filters) a forkserver or exec child could not take, and
      name a process that left the child's group still holding its output (a leak). A
      harness failure after the child started is an outcome of kind ``"harness_error"``
      (never reported as a crash): the target's module failing to import in the child, a
      returned value that is not plain data, a status the child could not deliver, a zygote
      that could not be started or died.

    Raises:
      HarnessError: before any child starts, for a bad argument (each message names it), or
        ``style="fork"`` after :func:`~harness.mark_fork_unsafe`.

    Warns:
      HarnessWarning: ``env`` sets a start-up variable and the style is fork or forkserver;
        or ``style="fork"`` while this process has other threads (the child runs: a lock
        one of them held at the fork stays held in it).
    """
    __tracebackhide__ = True
    outcome = run_unobserved(
        target, *args, env=env, config=config, style=style, timeout=timeout, warn_threads=True
    )
    for observer in list(_observers):
        observer(outcome)
    return outcome


def run_unobserved(
    target: Callable[..., Any] | str,
    *args: Any,
    env: Mapping[str, str | None] | None = None,
    config: Config | None = None,
    style: str = "auto",
    timeout: float | None = 60.0,
    warn_threads: bool = False,
) -> Outcome:
    """:func:`run_child` without telling the observers (the plugin's count of death-test
    children): for a child that is not a death test, such as a test item run in a process
    of its own (``harness._own_process``, which forks a pytest process, an xdist worker's
    threads and all, by design: so no warning about threads unless ``warn_threads``). Same
    arguments, result and errors."""
    __tracebackhide__ = True
    request = make_request(target, args, env=env, config=config, timeout=timeout)
    chosen = choose_style(
        style,
        importable=request.target.importable,
        startup=startup_variables(request.overrides),
        path=path_variables(request.overrides),
        warn_threads=warn_threads,
    )
    started = time.monotonic()
    with Capture(table()) as capture:
        ending = _LAUNCHERS[chosen](request, capture)
        duration_s = time.monotonic() - (ending.started_at or started)
        status = decode_status(capture.status())
        seal = decode_seal(capture.seal())
        zygote = current()
        leaks = leak_notes(capture.streams, ending.pid, (zygote.pid,) if zygote else ())
        return _outcome(request, chosen, ending, status, seal, capture, duration_s, leaks)


def _outcome(
    request: ChildRequest,
    style: str,
    ending: Ending,
    status: Status,
    seal: Seal,
    capture: Capture,
    duration_s: float,
    leaks: list[str] = (),  # type: ignore[assignment]
) -> Outcome:
    kind, error = _kind(request, ending, status, seal)
    return Outcome(
        kind=kind,
        exit_code=ending.exit_code,
        signal=_signal(ending.signal),
        stdout=capture.stdout.text(),
        stderr=capture.stderr.text(),
        returned=status.returned,
        raised=status.raised,
        duration_s=duration_s,
        style=style,
        pid=ending.pid,
        repro=repro_command(request),
        target=request.target.spec,
        config_id=request.config_id,
        env=dict(request.overrides),
        timeout_s=request.timeout_s,
        error=error,
        stderr_cut_bytes=capture.stderr.cut_bytes,
        stderr_cut_at=capture.stderr.cut_at,
        notes=(
            *status.notes,
            *capture.stdout.all_notes(),
            *capture.stderr.all_notes(),
            *leaks,
        ),
        host=_HOST,
    )


def _kind(
    request: ChildRequest, ending: Ending, status: Status, seal: Seal
) -> tuple[str, str | None]:
    """``(kind, error)`` of an outcome: a harness failure first, then a timeout, then what the
    wait status says."""
    if ending.error is not None:
        return "harness_error", ending.error
    if ending.timed_out:
        return "timed_out", None
    if not seal.delivered:
        return "harness_error", (
            f"the child could not deliver its status record ({seal.final}): {seal.error}; did "
            "the target close the harness's descriptors, or set RLIMIT_FSIZE?"
        )
    if status.harness_error is not None:
        return "harness_error", status.harness_error
    if seal.final is not None and status.final != seal.final:
        return "harness_error", (
            f"the child sent a {seal.final!r} status record that is not in its status file "
            "(did the target truncate or overwrite it?)"
        )
    if not status.started:
        how = describe_ending(
            "signaled" if ending.signal else "exited",
            ending.exit_code,
            ending.signal,
            request.timeout_s,
            None,
        )
        return "harness_error", (
            f"the child {how} while the harness was setting it up, before the target ran"
        )
    return ("signaled" if ending.signal is not None else "exited"), None


def _signal(signum: int | None) -> signal.Signals | None:
    if signum is None:
        return None
    try:
        return signal.Signals(signum)
    except ValueError:
        return signum  # type: ignore[return-value]  # a signal without a name


class _RunnerDefault:
    """The default of ``DeathRunner.run(timeout=...)``: the runner's own timeout."""

    def __repr__(self) -> str:
        return "<the runner's timeout>"


RUNNER_DEFAULT: Any = _RunnerDefault()


class DeathRunner:
    """:func:`run_child` with defaults bound: what the ``death`` pytest fixture gives a test.

    Args:
      style: the default style, one of ``auto``, ``fork``, ``forkserver``, ``exec``.
      timeout: the default timeout in seconds, or None for no deadline.

    Attributes:
      outcomes: every outcome of a child run through this runner, in order.

    Raises:
      HarnessError: ``style`` is unknown, or ``timeout`` is neither None nor a positive
        finite number of seconds.
    """

    def __init__(self, style: str = "auto", timeout: float | None = 60.0) -> None:
        __tracebackhide__ = True
        self.style = check_style(style, "DeathRunner(style=...)")
        self.timeout = check_timeout(timeout, "DeathRunner(timeout=...)")
        self.outcomes: list[Outcome] = []

    def run(
        self,
        target: Callable[..., Any] | str,
        *args: Any,
        env: Mapping[str, str | None] | None = None,
        config: Config | None = None,
        timeout: float | None = RUNNER_DEFAULT,
        style: str | None = None,
    ) -> Outcome:
        """:func:`harness.run_child` with this runner's style and timeout as the defaults.

        Args, returns and raises: as :func:`harness.run_child`; ``style=None`` and a timeout
        left out take the runner's (``timeout=None`` means no deadline).
        """
        __tracebackhide__ = True
        outcome = run_child(
            target,
            *args,
            env=env,
            config=config,
            style=self.style if style is None else style,
            timeout=self.timeout if timeout is RUNNER_DEFAULT else timeout,
        )
        self.outcomes.append(outcome)
        return outcome

    def __repr__(self) -> str:
        timeout = "None" if self.timeout is None else f"{self.timeout:g}"
        return f"DeathRunner(style={self.style!r}, timeout={timeout})"
