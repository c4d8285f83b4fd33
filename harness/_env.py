"""Environment overrides for a child: validate them, merge them, apply them to a base."""

from __future__ import annotations

from collections.abc import Mapping

from harness._child import ENV_FLAG
from harness._errors import HarnessError


def check_env(env: object, what: str) -> dict[str, str | None]:
    """Return ``env`` as a new dict after checking it maps names to str or None.

    Args:
      env: the mapping to check (None is an empty one).
      what: how to name it in an error, e.g. ``"run_child(env=...)"``.

    Raises:
      HarnessError: ``env`` is not a mapping, a name is not a non-empty str without ``=`` or
        NUL, or a value is neither a str (without NUL) nor None.
    """
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
