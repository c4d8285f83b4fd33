"""The test process's own state that a child must share: what a fork would have inherited.

A fork-style child is a copy of the test process, so it has the test process's umask,
resource limits, nice value, warning filters and interpreter flags. A forkserver child is a
fork of the zygote, which started long before (with the root process's state of that time),
and an exec child is a fresh interpreter. So that a verdict does not depend on the style:

- the interpreter flags (``-O``, ``-X dev``, ``-W``, ``-B``, ...) cannot change in a running
  interpreter: the zygote and every exec child are *started* with the test process's
  (:func:`interpreter_flags`), and a zygote serves one set of flags;
- the rest is read at each request (:func:`process_state`) and applied by the child before
  anything of the request runs (``harness._child.apply_state``); what it cannot apply (a hard
  limit above its own, a nice value below its own, a warning category it cannot import
  without importing its module) is a note of the outcome.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

try:
    import resource
except ImportError:  # not on every platform
    resource = None  # type: ignore[assignment]

from harness._child import STATE_RLIMITS, type_name
from harness._env import startup_variables


def interpreter_flags() -> list[str]:
    """The command-line options that give a new interpreter this one's flags.

    ``-O``, ``-OO``, ``-B``, ``-E``, ``-s``, ``-S``, ``-I``, ``-b``, ``-v``, ``-q``, each
    ``-W`` of :data:`sys.warnoptions` and each ``-X`` of :data:`sys._xoptions` (``-X dev``,
    ``-X utf8``, ...), as :mod:`multiprocessing` starts its processes
    (``subprocess._args_from_interpreter_flags``), and the ``-X`` options that function
    leaves out (``-X warn_default_encoding``, ``-X int_max_str_digits=N``,
    ``-X pycache_prefix=DIR``, ...).
    """
    args = list(subprocess._args_from_interpreter_flags())  # type: ignore[attr-defined]
    given = {args[at + 1].partition("=")[0] for at, arg in enumerate(args[:-1]) if arg == "-X"}
    for name, value in getattr(sys, "_xoptions", {}).items():
        if name not in given:
            args += ["-X", name if value is True else f"{name}={value}"]
    return args


def startup_environ(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with the variables that act only at interpreter start-up
    (:func:`harness._env.startup_variables`: ``PYTHONOPTIMIZE``, ``PYTHONHASHSEED``, ``LD_*``,
    ...) as this process had them when it started (``/proc/self/environ``, which no change to
    :data:`os.environ` touches): what a zygote starts with, so that it is the interpreter the
    test process is, not one a test that set such a variable for a while happened to start
    (every later forkserver child would have run with it). ``environ`` itself where the start
    cannot be read (not Linux)."""
    try:
        with open("/proc/self/environ", "rb") as file:
            data = file.read()
    except OSError:
        return environ
    initial = {}
    for item in data.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name:
            initial[os.fsdecode(name)] = os.fsdecode(value)
    made = {name: value for name, value in environ.items() if not startup_variables([name])}
    made.update((name, value) for name, value in initial.items() if startup_variables([name]))
    return made


def umask() -> int:
    """This process's umask, read without changing it (``Umask:`` in ``/proc/self/status``,
    Linux 4.7 and later; elsewhere set and put back at once, which another thread creating a
    file at that instant would see)."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def process_state() -> dict:
    """What a child is set up with, read now: plain data for the child's request.

    Returns:
      ``{"umask": int, "rlimits": {name: [soft, hard]}, "nice": int, "warnings": [[action,
      message or None, category's qualified name, module or None, lineno]], "dont_write_bytecode":
      bool, "int_max_str_digits": int or None}``; ``rlimits`` has every limit of
      :data:`harness._child.STATE_RLIMITS` this platform has (``RLIM_INFINITY`` is -1),
      ``RLIMIT_CORE`` left out: every child has core files off.
    """
    limits = {}
    if resource is not None:
        for name in STATE_RLIMITS:
            number = getattr(resource, name, None)
            if number is not None:
                try:
                    limits[name] = list(resource.getrlimit(number))
                except (OSError, ValueError):
                    pass
    try:
        nice = os.getpriority(os.PRIO_PROCESS, 0)
    except (AttributeError, OSError):
        nice = None
    filters = []
    for action, message, category, module, lineno in list(warnings.filters):
        filters.append(
            [
                action,
                getattr(message, "pattern", message) or None,
                type_name(category),
                getattr(module, "pattern", module) or None,
                lineno,
            ]
        )
    get_digits = getattr(sys, "get_int_max_str_digits", None)
    return {
        "umask": umask(),
        "rlimits": limits,
        "nice": nice,
        "warnings": filters,
        "dont_write_bytecode": sys.dont_write_bytecode,
        "int_max_str_digits": get_digits() if get_digits is not None else None,
    }
