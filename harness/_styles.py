"""Which style runs a child: the fork-safety state of this process and the ``auto`` rule."""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings
from collections.abc import Sequence

from harness._child import ENV_FLAG
from harness._errors import HarnessError, HarnessWarning

STYLES = ("auto", "fork", "forkserver", "exec")
"""The values of ``style``; ``auto`` picks ``fork`` when it is safe, else ``forkserver``, and
``exec`` when the env sets a variable that acts only at interpreter start-up."""

_HARNESS_DIR = os.path.dirname(os.path.abspath(__file__))

_fork_unsafe_reasons: list[str] = []
_fork_safety_checks: list = []


def mark_fork_unsafe(reason: str) -> None:
    """Declare that forking this process is no longer safe (e.g. CUDA is initialized).

    Libraries call this when they do something a forked child cannot inherit. From then on
    ``style="fork"`` raises :class:`HarnessError` quoting ``reason``, and ``style="auto"``
    uses the forkserver. It cannot be undone, and forked children inherit it.

    Args:
      reason: why, for the error message (e.g. ``"CUDA was initialized by allocator.cuda"``).

    Raises:
      HarnessError: ``reason`` is not a non-empty str.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise HarnessError(f"mark_fork_unsafe(reason) needs a non-empty str, not {reason!r}")
    if reason not in _fork_unsafe_reasons:
        _fork_unsafe_reasons.append(reason)


def add_fork_safety_check(check) -> None:
    """Register a callable that says whether forking this process is unsafe right now.

    This is how a library that must not import the harness (the project's allocator, whose
    ``cuda`` backend initializes CUDA) still refuses fork: the project's ``conftest.py`` hands
    its check over, e.g. ``harness.add_fork_safety_check(allocator.fork_unsafe_reason)``.
    Each check is called on every :func:`fork_unsafe_reason` call, so it must be cheap and must
    not start a thread or initialize CUDA. Registering the same callable twice has no effect.

    Args:
      check: a callable taking no arguments and returning ``None`` (fork is safe as far as it
        knows) or a non-empty str saying why it is not.

    Raises:
      HarnessError: ``check`` is not callable.
    """
    if not callable(check):
        raise HarnessError(f"add_fork_safety_check(check) needs a callable, not {check!r}")
    if check not in _fork_safety_checks:
        _fork_safety_checks.append(check)


def fork_unsafe_reason() -> str | None:
    """Why fork is unsafe in this process, if it is.

    Returns:
      The reasons given to :func:`mark_fork_unsafe` and those returned by the checks of
      :func:`add_fork_safety_check`, joined by ``"; "``, or None if there are none (fork may
      still be avoided by ``auto`` when this process has threads).

    Raises:
      HarnessError: a registered check raised, or returned something other than None or a
        non-empty str (the message names the check).
    """
    reasons = list(_fork_unsafe_reasons)
    for check in _fork_safety_checks:
        name = getattr(check, "__qualname__", repr(check))
        try:
            reason = check()
        except Exception as exc:
            raise HarnessError(f"fork-safety check {name} raised {exc!r}") from exc
        if reason is None:
            continue
        if not isinstance(reason, str) or not reason.strip():
            raise HarnessError(
                f"fork-safety check {name} returned {reason!r}; expected None or a non-empty str"
            )
        if reason not in reasons:
            reasons.append(reason)
    return "; ".join(reasons) or None


def sigchld_problem() -> str | None:
    """Why this process cannot reap a child of its own, if it cannot: SIGCHLD is ignored (the
    kernel then reaps children itself) or has a Python handler (which may reap the child
    first). Either way the fork and exec styles cannot learn how a child ended; the
    forkserver's zygote, which resets SIGCHLD, can. None when SIGCHLD has its default action
    (or a handler installed outside Python, which cannot be seen: then a child reaped by
    someone else is still reported, as a harness error)."""
    handler = signal.getsignal(signal.SIGCHLD)
    if handler == signal.SIG_IGN:
        how = (
            "SIGCHLD is ignored in this process (signal.signal(SIGCHLD, SIG_IGN)), so the "
            "kernel will"
        )
    elif callable(handler):
        name = getattr(handler, "__qualname__", None) or repr(handler)
        how = f"SIGCHLD has a handler in this process ({name}), which may"
    else:
        return None
    return (
        f"{how} reap this process's children before the harness can, so how a fork or exec "
        "child ended would be lost; use style='forkserver' (its zygote reaps the children), or "
        "restore SIGCHLD's default action"
    )


def in_death_child() -> bool:
    """Whether this process is a death-test child.

    Returns:
      True when the environment has ``DEVMEM_DEATH_CHILD=1``, which the harness sets in every
      child (and its repro command sets too); code can use it to skip work a child must not do.
    """
    return os.environ.get(ENV_FLAG) == "1"


def thread_count() -> int:
    """Threads of this process as the kernel counts them (native ones included), at least 1.

    Reads ``/proc/self/stat`` on Linux, like GoogleTest and CPython's fork warning do; falls
    back to :func:`threading.active_count` elsewhere. Native pools count: NumPy's OpenBLAS
    starts one at import unless ``OPENBLAS_NUM_THREADS=1``.
    """
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return max(int(fields[17]), 1)
    except (OSError, IndexError, ValueError):
        return threading.active_count()


def check_style(style: object, what: str = "style") -> str:
    """Return ``style`` if it is one of :data:`STYLES`; else raise HarnessError naming ``what``."""
    __tracebackhide__ = True
    if style not in STYLES:
        raise HarnessError(f"{what} must be one of {', '.join(map(repr, STYLES))}, not {style!r}")
    return style  # type: ignore[return-value]


def choose_style(
    style: object,
    *,
    importable: bool,
    startup: Sequence[str] = (),
    path: Sequence[str] = (),
    warn_threads: bool = True,
) -> str:
    """Resolve ``style`` to the one that will run the child.

    Args:
      style: one of :data:`STYLES`.
      importable: whether the target can be imported in a fresh interpreter (a closure
        cannot, so it needs ``fork``).
      startup: the child's env overrides that act only at interpreter start-up (see
        :func:`harness._env.startup_variables`).
      path: the ``sys.path`` variables (``PYTHONPATH``, ``PYTHONHOME``) the env changes (see
        :func:`harness._env.path_variables`): only an exec child can honour them.
      warn_threads: warn when ``fork`` is asked for while this process has other threads.

    Returns:
      ``"fork"``, ``"forkserver"`` or ``"exec"``. ``auto`` gives exec when ``startup`` or
      ``path`` names a variable; else fork when fork is not marked unsafe, this process has
      no other thread (see :func:`thread_count`) and SIGCHLD has its default action (see
      :func:`sigchld_problem`); else forkserver.

    Raises:
      HarnessError: unknown style; fork asked for after :func:`mark_fork_unsafe`; a target
        that is not importable with a style other than fork; or ``path`` names a variable
        and the style asked for is fork or forkserver (whose children have this process's,
        or the zygote's, ``sys.path``: the variable cannot apply).

    Warns:
      HarnessWarning: ``startup`` names a variable and the style asked for is fork or
        forkserver: the child will not see it act; or ``fork`` is asked for while this
        process has other threads (see :func:`thread_count`): the child runs, but a lock
        one of them held at the fork stays held in it (fork is refused only once it is
        marked unsafe, see :func:`mark_fork_unsafe`).
    """
    __tracebackhide__ = True
    style = requested = check_style(style)
    unsafe = fork_unsafe_reason()
    if style == "fork" and unsafe:
        raise HarnessError(
            f"style='fork' is refused: fork is unsafe in this process ({unsafe}; declared "
            "with harness.mark_fork_unsafe or a harness.add_fork_safety_check check). Use"
            " style='forkserver' or style='exec'."
        )
    if not importable and style != "fork":
        raise HarnessError(
            f"style={style!r} cannot run this target: it is not importable as module:qualname "
            "(a closure, lambda or bound method), so only style='fork' can; move it to module "
            "level, or pass style='fork' explicitly"
        )
    if path and style in ("fork", "forkserver"):
        names = " and ".join(path)
        raise HarnessError(
            f"env changes {names}, from which an interpreter computes sys.path when it starts, "
            f"but style={style!r} forks one that has started already (its sys.path is fixed), "
            "so it cannot apply. Use style='exec' (or 'auto', which picks exec for such an env)."
        )
    if style == "auto":
        if startup or path:
            return "exec"
        own = unsafe is None and thread_count() == 1 and sigchld_problem() is None
        style = "fork" if own else "forkserver"
    if requested == "fork" and warn_threads:
        threads = thread_count()
        if threads > 1:
            warnings.warn(
                f"style='fork' with {threads} threads in this process: a thread that holds a "
                "lock (the allocator's, the C library's malloc, logging's) at the fork leaves "
                "it held for good in the child, which may then hang (CPython 3.12 and later "
                "warn of it too, with a DeprecationWarning). The child runs; use "
                "style='forkserver' (or 'auto', which picks it) for a child that cannot "
                "inherit a held lock.",
                HarnessWarning,
                stacklevel=_user_stacklevel(),
            )
    if startup and style != "exec":
        names = ", ".join(startup)
        warnings.warn(
            f"env sets {names}, which acts only when an interpreter starts, but style={style!r} "
            "forks one that has started already: the child will not see it act. Use "
            "style='exec' (or 'auto', which picks exec for such an env).",
            HarnessWarning,
            stacklevel=_user_stacklevel(),
        )
    return style


def _user_stacklevel() -> int:
    """The ``stacklevel`` of a warning that points at the first caller outside the harness."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and os.path.dirname(frame.f_code.co_filename) == _HARNESS_DIR:
        frame = frame.f_back
        level += 1
    return level
