"""Environment overrides for a child: validate them, merge them, apply them to a base."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from harness._child import ENV_FLAG
from harness._errors import HarnessError

STARTUP_NAMES = frozenset(
    {
        "GLIBC_TUNABLES",
        "PYTHONCOERCECLOCALE",
        "PYTHONDEBUG",
        "PYTHONDEVMODE",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONFAULTHANDLER",
        "PYTHONHASHSEED",
        "PYTHONINTMAXSTRDIGITS",
        "PYTHONMALLOC",
        "PYTHONMALLOCSTATS",
        "PYTHONNODEBUGRANGES",
        "PYTHONNOUSERSITE",
        "PYTHONOPTIMIZE",
        "PYTHONPERFSUPPORT",
        "PYTHONPROFILEIMPORTTIME",
        "PYTHONPYCACHEPREFIX",
        "PYTHONSAFEPATH",
        "PYTHONTRACEMALLOC",
        "PYTHONUSERBASE",
        "PYTHONUTF8",
        "PYTHONVERBOSE",
        "PYTHONWARNDEFAULTENCODING",
        "PYTHONWARNINGS",
        "PYTHON_CPU_COUNT",
        "PYTHON_GIL",
    }
)
"""Variables that act only when an interpreter (or the C library) starts: CPython's start-up
variables, ``GLIBC_TUNABLES``, and every ``LD_*`` and ``MALLOC_*`` name (see
:func:`startup_variables`). A forked child, or a zygote's, started long before they were set."""

STARTUP_PREFIXES = ("LD_", "MALLOC_")
"""Name prefixes of variables read by the dynamic loader and glibc's malloc at start-up."""


def check_env(env: object, what: str) -> dict[str, str | None]:
    """Return ``env`` as a new dict after checking it maps names to str or None.

    Args:
      env: the mapping to check (None is an empty one).
      what: how to name it in an error, e.g. ``"run_child(env=...)"``.

    Raises:
      HarnessError: ``env`` is not a mapping, a name is not a non-empty str without ``=`` or
        NUL, or a value is neither a str (without NUL) nor None.
    """
    __tracebackhide__ = True
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise HarnessError(
            f"{what} must be a mapping of names to str or None, not {type(env).__name__}"
        )
    checked: dict[str, str | None] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise HarnessError(
                f"{what}: bad variable name {name!r}; names are non-empty str without '=' or NUL"
            )
        if value is not None and (not isinstance(value, str) or "\0" in value):
            raise HarnessError(
                f"{what}: the value of {name} must be a str (without NUL) or None (unset it), "
                f"not {value!r}"
            )
        checked[name] = value
    return checked


def child_environ(base: Mapping[str, str], overrides: Mapping[str, str | None]) -> dict[str, str]:
    """The child's whole environment: ``base`` with ``overrides`` applied and the child flag set.

    A None value in ``overrides`` removes the name.
    """
    environ = dict(base)
    for name, value in overrides.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    environ[ENV_FLAG] = "1"
    return environ


def describe_env(overrides: Mapping[str, str | None]) -> str:
    """One line for people: ``A=1, B unset``, or ``(no overrides)``."""
    if not overrides:
        return "(no overrides)"
    return ", ".join(
        f"{name} unset" if value is None else f"{name}={value}" for name, value in overrides.items()
    )


def startup_variables(names: Iterable[str]) -> list[str]:
    """The names among ``names`` that act only at interpreter or C-library start-up.

    Setting (or unsetting) one of them for a child only works in the ``exec`` style: a fork,
    or a fork of the zygote, runs in an interpreter that started before they were set.
    """
    return [name for name in names if name in STARTUP_NAMES or name.startswith(STARTUP_PREFIXES)]


PATH_NAMES = ("PYTHONPATH", "PYTHONHOME")
"""Variables from which an interpreter computes ``sys.path`` when it starts."""


def path_variables(
    overrides: Mapping[str, str | None], base: Mapping[str, str] | None = None
) -> list[str]:
    """The names of :data:`PATH_NAMES` that ``overrides`` changes (sets to another value, or
    unsets) relative to ``base`` (default: this process's environment).

    Only an exec child computes its ``sys.path`` from them; a forked one has its parent's.
    """
    base = os.environ if base is None else base
    return [name for name in PATH_NAMES if name in overrides and overrides[name] != base.get(name)]


def parent_path_entries(base: Mapping[str, str] | None = None) -> set[str]:
    """The absolute directories that ``PYTHONPATH`` in ``base`` (default: this process's
    environment) put on this process's ``sys.path``."""
    base = os.environ if base is None else base
    value = base.get("PYTHONPATH") or ""
    return {os.path.abspath(entry) for entry in value.split(os.pathsep) if entry}
