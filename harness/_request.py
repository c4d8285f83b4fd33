"""One child's request: everything the child needs, checked, in the parent's terms."""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Any

from harness._child import plain_problem
from harness._config import Config
from harness._env import check_env, child_environ, parent_path_entries, path_variables
from harness._errors import HarnessError
from harness._target import Target, resolve_target


@dataclass(frozen=True)
class ChildRequest:
    """A checked request for one child.

    Attributes:
      target: the checked target.
      args: positional arguments (JSON plain data).
      overrides: env overrides, config's first, then the call's (None = unset).
      config_id: the config's id, or None.
      sys_path: the parent's ``sys.path`` when the request was made.
      cwd: the parent's working directory when the request was made.
      timeout_s: the deadline, in seconds from the start of the child; None for none.
    """

    target: Target
    args: list[Any]
    overrides: dict[str, str | None]
    config_id: str | None
    sys_path: list[str]
    cwd: str
    timeout_s: float | None

    def portable(self) -> dict[str, Any]:
        """The request as the exec runner takes it: no environment, no deadline.

        When the overrides change ``PYTHONPATH`` or ``PYTHONHOME``, ``sys_path`` is None and
        ``sys_path_after`` lists this process's entries (less those its own ``PYTHONPATH``
        put there): the child keeps the ``sys.path`` its interpreter computed from them and
        appends these, so the target stays importable.
        """
        if path_variables(self.overrides):
            own = parent_path_entries()
            after = [entry for entry in self.sys_path if os.path.abspath(entry) not in own]
            sys_path, sys_path_after = None, after
        else:
            sys_path, sys_path_after = self.sys_path, None
        return {
            "target": self.target.spec,
            "args": self.args,
            "sys_path": sys_path,
            "sys_path_after": sys_path_after,
            "cwd": self.cwd,
            "main_path": self.target.main_path,
            "module_path": self.target.module_path,
        }

    def portable_json(self) -> str:
        """:meth:`portable` as compact JSON (what the exec runner's ``--request`` takes)."""
        return json.dumps(self.portable(), separators=(",", ":"))

    def wire(self, *, forked_from_parent: bool) -> dict[str, Any]:
        """The request as a forked child takes it: with its environment.

        Args:
          forked_from_parent: the child is a fork of this process (fork style), so it has
            this environment already and needs only the overrides; a zygote's child gets the
            whole environment and refreshes its import caches.
        """
        if forked_from_parent:
            return {**self.portable(), "env": self.overrides}
        return {**self.portable(), "environ": self.environ(), "invalidate_caches": True}

    def environ(self) -> dict[str, str]:
        """The child's whole environment: this process's now, with the overrides and the flag
        (a fork-style child needs only the overrides, so it is built only when asked)."""
        return child_environ(os.environ, self.overrides)


def make_request(
    target: object,
    args: tuple[Any, ...],
    *,
    env: object,
    config: object,
    timeout: object,
) -> ChildRequest:
    """Check the arguments of ``run_child`` and build the request.

    Raises:
      HarnessError: naming the bad argument (see :func:`harness.run_child`).
    """
    __tracebackhide__ = True
    checked_target = resolve_target(target)
    problem = plain_problem(list(args), "the arguments")
    if problem:
        raise HarnessError(f"run_child({checked_target.spec}, ...): {problem}")
    if config is not None and not isinstance(config, Config):
        raise HarnessError(f"run_child(config=...) must be a harness.Config, not {config!r}")
    overrides = dict(config.env) if config is not None else {}
    overrides.update(check_env(env, "run_child(env=...)"))
    timeout_s = check_timeout(timeout)
    return ChildRequest(
        target=checked_target,
        args=list(args),
        overrides=overrides,
        config_id=config.id if config is not None else None,
        sys_path=[where_imports_look(entry) for entry in sys.path],
        cwd=os.getcwd(),
        timeout_s=timeout_s,
    )


def where_imports_look(entry: str) -> str:
    """The directory a relative ``sys.path`` entry stands for in this process, for a child.

    An import caches a finder per entry, holding the entry's absolute directory as it was
    when first used: after an ``os.chdir`` a relative entry still means that directory here,
    and so it must in a forkserver or exec child (a fork child has the cache itself). An entry
    no import has used yet means the current directory's, as it would here; ``""`` (the
    current directory, whatever it is at each import) stays as it is.
    """
    if not entry or os.path.isabs(entry):
        return entry
    found = getattr(sys.path_importer_cache.get(entry), "path", None)
    if isinstance(found, str) and os.path.isabs(found):
        return found
    return os.path.abspath(entry)


def check_timeout(timeout: object, what: str = "run_child(timeout=...)") -> float | None:
    """Return ``timeout`` as float seconds, or None (no deadline).

    Raises:
      HarnessError: ``timeout`` is neither None nor a positive finite number of seconds.
    """
    __tracebackhide__ = True
    if timeout is None:
        return None
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise HarnessError(
            f"{what} must be a positive finite number of seconds, or None for no deadline, "
            f"not {timeout!r}"
        )
    return float(timeout)
