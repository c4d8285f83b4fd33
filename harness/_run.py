"""``run_child``: check the request, pick the style, launch, turn the ending into an Outcome."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

from harness._capture import Capture
from harness._config import Config
from harness._exec import launch_exec
from harness._fork import launch_fork
from harness._forkserver import launch_forkserver
from harness._outcome import Outcome
from harness._protocol import Status, decode_status
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
    timeout: float = 60.0,
) -> Outcome:
    """Run ``target(*args)`` in a child process and report how the child ended.

    The child gets its own process group, no core dumps, stdin from ``/dev/null``, stdout and
    stderr captured at the descriptor level, ``faulthandler`` on its stderr, the environment
    ``DEVMEM_DEATH_CHILD=1``, and leaves through ``os._exit`` (no atexit handlers, no flushing
    of the parent's buffers). A target that raises makes the child exit with status 1 (the
    traceback goes to its stderr and into ``Outcome.raised``); ``sys.exit(n)`` exits with n.

    Args:
      target: a module-level function, importable as ``module:qualname`` (or such a str,
        imported only in the child). Closures, lambdas and bound methods only with
        ``style="fork"``.
      *args: its positional arguments: JSON plain data (None, bool, int, float, str, and lists
        and str-keyed dicts of those).
      env: variables for the child, applied after ``config.env``; a None value unsets the
        name. Applied before the target's module is imported, so module-level reads see it;
        in fork style the module was imported by the parent already, so only code that reads
        the environment at call time (or resets at fork) sees it.
      config: a :class:`~harness.Config`; its env is applied first and its id recorded.
      style: ``"fork"`` (fastest; the child is a copy of this process), ``"forkserver"`` (a
        fork of a clean zygote process), ``"exec"`` (a fresh interpreter) or ``"auto"`` (fork
        when safe, else forkserver; see :func:`harness.mark_fork_unsafe`).
      timeout: seconds the child may run. Shortly before, its Python stacks are dumped into
        its stderr; at the deadline its process group gets SIGTERM, then SIGKILL 0.5 s later.

    Returns:
      The :class:`~harness.Outcome`. A harness failure after the child started is an outcome
      of kind ``"harness_error"`` (never reported as a crash): the target's module failing to
      import in the child, a returned value that is not plain data, a dead zygote.

    Raises:
      HarnessError: before any child starts, for a bad argument (each message names it), or
        ``style="fork"`` after :func:`~harness.mark_fork_unsafe`.
    """
    request = make_request(target, args, env=env, config=config, timeout=timeout)
    chosen = choose_style(style, importable=request.target.importable)
    started = time.monotonic()
    with Capture() as capture:
        ending = _LAUNCHERS[chosen](request, capture)
        duration_s = time.monotonic() - (ending.started_at or started)
        status = decode_status(capture.status())
        stdout, stderr = capture.stdout(), capture.stderr()
    outcome = _outcome(request, chosen, ending, status, stdout, stderr, duration_s)
    for observer in list(_observers):
        observer(outcome)
    return outcome


def _outcome(
    request: ChildRequest,
    style: str,
    ending: Ending,
    status: Status,
    stdout: str,
    stderr: str,
    duration_s: float,
) -> Outcome:
    error = None
    if ending.error is not None:
        kind, error = "harness_error", ending.error
    elif ending.timed_out:
        kind = "timed_out"
    elif status.harness_error is not None:
        kind, error = "harness_error", status.harness_error
    elif not status.started:
        kind = "harness_error"
        how = describe_ending(
            "signaled" if ending.signal else "exited",
            ending.exit_code,
            ending.signal,
            request.timeout_s,
            None,
        )
        error = f"the child {how} while the harness was setting it up, before the target ran"
    else:
        kind = "signaled" if ending.signal is not None else "exited"
    return Outcome(
        kind=kind,
        exit_code=ending.exit_code,
        signal=_signal(ending.signal),
        stdout=stdout,
        stderr=stderr,
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
    )


def _signal(signum: int | None) -> signal.Signals | None:
    if signum is None:
        return None
    try:
        return signal.Signals(signum)
    except ValueError:
        return signum  # type: ignore[return-value]  # a signal without a name


class DeathRunner:
    """:func:`run_child` with defaults bound: what the ``death`` pytest fixture gives a test.

    Args:
      style: the default style (``--death-style``), one of ``auto``, ``fork``, ``forkserver``,
        ``exec``.
      timeout: the default timeout in seconds (``--death-timeout``).

    Attributes:
      outcomes: every outcome of a child run through this runner, in order.

    Raises:
      HarnessError: ``style`` is unknown or ``timeout`` is not a positive number of seconds.
    """

    def __init__(self, style: str = "auto", timeout: float = 60.0) -> None:
        self.style = check_style(style, "DeathRunner(style=...)")
        self.timeout = check_timeout(timeout, "DeathRunner(timeout=...)")
        self.outcomes: list[Outcome] = []

    def run(
        self,
        target: Callable[..., Any] | str,
        *args: Any,
        env: Mapping[str, str | None] | None = None,
        config: Config | None = None,
        timeout: float | None = None,
        style: str | None = None,
    ) -> Outcome:
        """:func:`harness.run_child` with this runner's style and timeout as the defaults.

        Args, returns and raises: as :func:`harness.run_child`; ``timeout=None`` and
        ``style=None`` take the runner's.
        """
        outcome = run_child(
            target,
            *args,
            env=env,
            config=config,
            style=self.style if style is None else style,
            timeout=self.timeout if timeout is None else timeout,
        )
        self.outcomes.append(outcome)
        return outcome

    def __repr__(self) -> str:
        return f"DeathRunner(style={self.style!r}, timeout={self.timeout:g})"
