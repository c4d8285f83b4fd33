"""What to run in the child: a function object or a ``"module:qualname"`` string, checked."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from harness._errors import HarnessError

_SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@dataclass(frozen=True)
class Target:
    """A checked target.

    Attributes:
      spec: ``"module:qualname"`` (for a target that is not importable, the best name we have).
      function: the callable object when one was given (fork style calls it directly).
      importable: whether a fresh interpreter can find it from ``spec``.
      main_path: the script to load as ``__main__`` in a fresh interpreter, for a target
        defined in the parent's ``__main__``; else None.
      module_path: the file of the target's module, for a function target (None for a str,
        or a module without a file): a child that cannot import the module by name, or finds
        that name in another file, loads this file instead (pytest's ``--import-mode=importlib``
        imports test modules under names that a fresh interpreter cannot find).
    """

    spec: str
    function: Callable[..., object] | None
    importable: bool
    main_path: str | None
    module_path: str | None = None


def resolve_target(target: object) -> Target:
    """Check a ``run_child`` target and describe it.

    Args:
      target: a module-level function (or other callable importable as module:qualname, such
        as a builtin), a ``"module:qualname"`` str (imported only in the child), or, for fork
        style only, any callable such as a closure.

    Returns:
      The :class:`Target`.

    Raises:
      HarnessError: ``target`` is neither callable nor a well-formed ``"module:qualname"`` str.
    """
    __tracebackhide__ = True
    if isinstance(target, str):
        if not _SPEC.match(target):
            raise HarnessError(
                f"run_child(target) as a str must look like 'package.module:function', "
                f"got {target!r}"
            )
        module = target.partition(":")[0]
        return Target(target, None, True, _main_path() if module == "__main__" else None)
    if not callable(target):
        raise HarnessError(
            "run_child(target) must be a module-level function or a 'module:qualname' str, "
            f"not {type(target).__name__} {target!r}"
        )
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return Target(repr(target), target, False, None)
    spec = f"{module}:{qualname}"
    importable = "<" not in qualname and _lookup(module, qualname) is target
    main_path = None
    if importable and module == "__main__":
        main_path = _main_path()
        importable = main_path is not None
    module_path = None
    if importable and module != "__main__":
        path = getattr(sys.modules.get(module), "__file__", None)
        module_path = os.path.abspath(path) if isinstance(path, str) else None
    return Target(spec, target, importable, main_path, module_path)


def _lookup(module: str, qualname: str) -> object:
    obj: object = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def _main_path() -> str | None:
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return os.path.abspath(path) if isinstance(path, str) else None


MAIN_ALIAS = "__mp_main__."
"""The prefix under which a forkserver or exec child names what the parent's script defines
(it loads the script again as ``__mp_main__``, as multiprocessing does)."""


def exception_name(name: str) -> str:
    """A qualified exception name as the status records give it: ``__mp_main__.MyError`` is
    ``__main__.MyError`` (the class of the parent's script, as the child names it too)."""
    return "__main__." + name[len(MAIN_ALIAS) :] if name.startswith(MAIN_ALIAS) else name


def raised_name(name: str, style: str | None) -> str:
    """``name`` of a raised type for a failure message, saying when the child knew that class
    under a second name: ``__main__.MyError (in the child also __mp_main__.MyError, the
    parent's script loaded again: one class, two names)``."""
    if style in ("forkserver", "exec") and name.startswith("__main__."):
        alias = MAIN_ALIAS + name[len("__main__.") :]
        return (
            f"{name} (in the child also {alias}, the parent's script loaded again: one class, "
            "two names)"
        )
    return name
