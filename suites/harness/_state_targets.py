"""Targets for the issue-36 self-tests (process state, threads, leaks): no pytest here."""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
import warnings

LIMITS = ("RLIMIT_NOFILE", "RLIMIT_STACK", "RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_FSIZE")


def umask() -> int:
    """This process's umask, from ``/proc/self/status`` (without changing it)."""
    with open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))


def state() -> dict:
    """The process state a child must share with the test process (issue 36, item 1)."""
    return {
        "umask": umask(),
        "rlimits": {name: list(resource.getrlimit(getattr(resource, name))) for name in LIMITS},
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "flags": {name: getattr(sys.flags, name) for name in dir(sys.flags) if _flag(name)},
        "optimize": sys.flags.optimize,
        "dev_mode": sys.flags.dev_mode,
        "debug": __debug__,
        "dont_write_bytecode": sys.dont_write_bytecode,
        "int_max_str_digits": getattr(sys, "get_int_max_str_digits", lambda: None)(),
        "warnoptions": list(sys.warnoptions),
        "filters": [
            [action, category.__name__, getattr(module, "pattern", module)]
            for action, _message, category, module, _lineno in warnings.filters
        ],
        "user_warning_raises": _warns_raise(),
    }


def _flag(name: str) -> bool:
    return not name.startswith("_") and name not in (
        "count",
        "index",
        "n_fields",
        "n_sequence_fields",
        "n_unnamed_fields",
    )


def _warns_raise() -> bool:
    try:
        warnings.warn("probe", UserWarning, stacklevel=1)
    except UserWarning:
        return True
    return False


def join_parent_group() -> list:
    """Move into the parent's process group (``setpgid``); return ``[ok, error]``."""
    try:
        os.setpgid(0, os.getpgid(os.getppid()))
    except OSError as exc:
        return [False, exc.strerror]
    return [True, None]


def session_leader() -> bool:
    """Whether this child leads a session of its own."""
    return os.getsid(0) == os.getpid()


LATE_S = 1.5
"""Seconds :func:`late_thread`'s thread waits before it writes."""


def late_thread(path: str) -> None:
    """Start a non-daemon thread that writes ``path`` after :data:`LATE_S`, and return at once."""

    def late() -> None:
        time.sleep(LATE_S)
        with open(path, "w") as file:
            file.write("the thread ran on")

    threading.Thread(target=late, daemon=False).start()


def escape_with_stderr(seconds: float) -> int:
    """Fork a grandchild that leaves the group (``setsid``) holding stderr, sleeping
    ``seconds``; return its pid."""
    ready, done = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.write(done, b"x")  # out of the group before the child ends (and the group kill)
            time.sleep(seconds)
        finally:
            os._exit(0)
    os.close(done)
    os.read(ready, 1)
    os.close(ready)
    return pid


def no_thread_fork_warning() -> list:
    """Run a fork-style child from this single-threaded interpreter; return the warnings."""
    import harness

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        harness.run_child("os:getpid", style="fork").assert_clean()
    return [f"{w.category.__name__}: {w.message}" for w in caught]


class Outer:
    """A class whose nested class is a warning category (issue 36, item 1)."""

    class NestedWarning(UserWarning):
        """A warning category named ``suites.harness._state_targets.Outer.NestedWarning``."""


def warn_nested() -> str:
    """Warn with :class:`Outer.NestedWarning`; return if the warning did not raise."""
    warnings.warn("nested", Outer.NestedWarning, stacklevel=1)
    return "not raised"


def optimize_and_env() -> list:
    """``[sys.flags.optimize, os.environ.get("PYTHONOPTIMIZE")]``: the interpreter's own
    optimization level, and the variable the child sees."""
    return [sys.flags.optimize, os.environ.get("PYTHONOPTIMIZE")]


def restart_coverage(data_file: str, restart: bool, save: bool) -> dict:
    """In a fork-style child: start a coverage.py measurement that saves itself (as a test
    process's would be, inherited), then follow the orders ``harness._child`` takes from the
    harness (measure into ``data_file``, a file per process); report what measures now."""
    import coverage

    from harness import _child

    before = coverage.Coverage(data_file=data_file + "-before", config_file=False, auto_data=True)
    before.start()
    config = coverage.Coverage(data_file=data_file, config_file=False).config.serialize()
    _child._restart_coverage({"config": config, "restart": restart, "save": save})
    current = coverage.Coverage.current()
    kept = _child._coverage
    return {
        "measures": "before" if current is before else current.config.data_file,
        "before_saves_itself": before._auto_save,
        "saved_at_exit": kept is not None and kept[0] == os.getpid() and kept[1] is current,
    }


def take_state(
    taken: dict, filters: bool, lower_nofile: bool = False, refuse_first: bool = False
) -> dict:
    """In a fork-style child: ``harness._child.apply_state(taken, filters=filters)`` (with
    ``DEVMEM_TAKE_UNSET`` set first, for ``taken`` to unset); what it returned and
    :func:`state` after it, with the two variables and ``RLIMIT_NOFILE`` before it.

    ``lower_nofile`` halves the soft ``RLIMIT_NOFILE`` first; ``refuse_first`` makes the first
    ``resource.setrlimit`` call fail as an unprivileged process's raise of a hard limit does.
    """
    from harness import _child

    os.environ["DEVMEM_TAKE_UNSET"] = "set before"
    if lower_nofile:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft // 2, hard))
    before = list(resource.getrlimit(resource.RLIMIT_NOFILE))
    real, calls = resource.setrlimit, []

    def refusing(number: int, limits: tuple) -> None:
        calls.append(number)
        if len(calls) == 1:
            raise ValueError("not allowed to raise maximum limit")
        real(number, limits)

    if refuse_first:
        resource.setrlimit = refusing
    try:
        notes = _child.apply_state(taken, filters=filters)
    finally:
        resource.setrlimit = real
    return {
        "notes": notes,
        "state": state(),
        "env": [os.environ.get("DEVMEM_TAKE_SET"), os.environ.get("DEVMEM_TAKE_UNSET")],
        "nofile_before": before,
    }


def restart_coverage_with(config: str) -> object:
    """In a fork-style child: ``harness._child``'s coverage restart with ``config`` (coverage.py's
    serialized configuration), saved at exit; what the child measures with, by its data file
    (None if it measures nothing)."""
    import coverage

    from harness import _child

    _child._restart_coverage({"config": config, "restart": True, "save": True})
    current = coverage.Coverage.current()
    return None if _child._coverage is None else current.config.data_file


ORDERS_TAKEN: list = []
"""What :func:`take_orders` records, in this process: the coverage orders handed to it."""


def take_orders(orders: dict) -> None:
    """A stand-in for ``harness._child._restart_coverage``: records ``orders``."""
    ORDERS_TAKEN.append(orders)


def orders_taken() -> list:
    """In a fork-style child: the coverage orders :func:`take_orders` recorded here."""
    return ORDERS_TAKEN
