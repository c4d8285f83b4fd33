"""Config matrices: named environments, and a decorator that makes one pytest item per config."""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from harness._env import check_env
from harness._errors import HarnessError

MATRIX_ATTR = "__devmem_death_matrix__"
"""Attribute that :func:`matrix` sets on a test function; the plugin parametrizes from it."""

_F = TypeVar("_F", bound=Callable[..., object])


@dataclass(frozen=True, repr=False)
class Config:
    """A named environment for death-test children: one configuration of the code under test.

    Pass it to :func:`harness.run_child` (or ``death.run``) as ``config=``: its ``env`` is
    applied first, then the call's own ``env``, and its ``id`` is recorded in the
    :class:`~harness.Outcome` and shown in failure messages.

    Attributes:
      id: short name, used as the pytest id by :func:`matrix` (``test_cap[capped]``).
      env: names to values in the child; a None value unsets the name. Stored read-only.

    Raises:
      HarnessError: ``id`` is not a non-empty str, or ``env`` is not a mapping of names to
        str or None.
    """

    id: str
    env: Mapping[str, str | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise HarnessError(f"Config(id=...) must be a non-empty str, not {self.id!r}")
        env = check_env(self.env, f"Config({self.id!r}).env")
        object.__setattr__(self, "env", types.MappingProxyType(env))

    def __repr__(self) -> str:
        return f"Config({self.id!r}, {dict(self.env)!r})"

    def __hash__(self) -> int:
        return hash((self.id, tuple(self.env.items())))

    def __reduce__(self):
        return (Config, (self.id, dict(self.env)))


def matrix(configs: Iterable[Config]) -> Callable[[_F], _F]:
    """Decorate a test to run once per config: one pytest item each, with the config's id.

    The test takes an argument named ``config`` and receives the :class:`Config`::

        CONFIGS = [Config("detector_on", {"DEVMEM_ARENA_DEBUG": "1"}),
                   Config("detector_off", {"DEVMEM_ARENA_DEBUG": None})]

        @harness.matrix(CONFIGS)
        def test_use_after_free(death, config):   # test_use_after_free[detector_on], ...
            death.run(use_freed_buffer, config=config).assert_aborted("use-after")

    Separate items let ``pytest -n`` spread the configs over workers. The decorator marks
    the test with ``pytest.mark.parametrize("config", ...)``, so this works with or without
    the ``devmem_death`` plugin (``-p no:devmem_death``: the ``death`` fixture is then gone,
    but ``config`` is still given).

    Args:
      configs: the configs, at least one, with distinct ids.

    Returns:
      The decorator; it returns the test function itself, marked.

    Raises:
      HarnessError: ``configs`` is empty, holds something other than a :class:`Config`, or
        repeats an id; or (when decorating) the function has no ``config`` parameter.
    """
    if isinstance(configs, (Config, str, bytes)) or not isinstance(configs, Iterable):
        raise HarnessError(f"matrix(configs) takes an iterable of Config, not {configs!r}")
    configs = list(configs)
    if not configs:
        raise HarnessError("matrix(configs) needs at least one Config")
    seen: set[str] = set()
    for config in configs:
        if not isinstance(config, Config):
            raise HarnessError(f"matrix(configs) takes Config values, got {config!r}")
        if config.id in seen:
            raise HarnessError(f"matrix(configs) has the id {config.id!r} twice; ids must differ")
        seen.add(config.id)

    def decorate(function: _F) -> _F:
        try:
            parameters = inspect.signature(function).parameters
        except (TypeError, ValueError) as exc:
            raise HarnessError(f"matrix(...) decorates test functions, not {function!r}") from exc
        if "config" not in parameters:
            name = getattr(function, "__qualname__", repr(function))
            raise HarnessError(
                f"matrix(...) was applied to {name}, which has no 'config' parameter to receive "
                "the Config"
            )
        setattr(function, MATRIX_ATTR, tuple(configs))
        try:  # imported here: the harness imports without pytest, a test module never does
            import pytest
        except ImportError:
            return function
        ids = [config.id for config in configs]
        return pytest.mark.parametrize("config", configs, ids=ids)(function)

    return decorate
