"""Coverage in children: each child measures with the configuration the test process uses.

Under ``pytest --cov`` the test process measures with the coverage.py configuration it found,
and pytest-cov combines every ``.coverage.*`` data file beside its own at the end. A child
counts only if it starts measuring too and saves a data file of its own there before it
leaves (through ``os._exit``). coverage.py's own process support (``[run] patch = subprocess,
fork, _exit``) does that, but only when the test process found a configuration that asks for
it: coverage.py looks for its configuration in the working directory, so pytest started from a
subdirectory of the project measures with none, and every child line was lost, silently.

So the harness hands the children the configuration the test process measures with, however
it found it (:func:`child_config`), with what children need added: a data file of their own
(``parallel``) beside the test process's (by absolute path, whatever the child's working
directory), saved at fork and at ``os._exit``. Exec children and the zygote get it in
``COVERAGE_PROCESS_CONFIG`` (coverage.py's ``.pth`` hook, or the runner itself, starts
measuring with it); fork-style children restart measuring with it (:func:`fork_orders`).
Nothing happens when the test process measures nothing.
"""

from __future__ import annotations

import os
import sys

ENV_NAME = "COVERAGE_PROCESS_CONFIG"
"""The variable coverage.py starts measuring from at interpreter start-up (``:data:``-less
serialized configuration)."""

CHILD_PATCHES = ("fork", "_exit")
"""coverage.py's process patches a child needs: a data file per fork, saved at ``os._exit``."""


def measuring() -> object | None:
    """The ``coverage.Coverage`` measuring this process now, or None (also when coverage.py
    is not imported: the harness never imports it)."""
    coverage = sys.modules.get("coverage")
    current = getattr(getattr(coverage, "Coverage", None), "current", None)
    if current is None:
        return None
    try:
        return current()
    except Exception:
        return None


def child_config() -> str | None:
    """The configuration a child measures with, serialized as coverage.py's
    ``COVERAGE_PROCESS_CONFIG`` takes it; None when this process measures nothing (or its
    coverage.py has no process support: before 7.10).

    It is the test process's own, with ``parallel`` on, the patches of :data:`CHILD_PATCHES`
    added, and the data file the test process writes, by absolute path.
    """
    cov = measuring()
    config = getattr(cov, "config", None)
    if config is None or not hasattr(config, "serialize") or not hasattr(config, "patch"):
        return None
    try:
        copy = type(config).deserialize(config.serialize())
        data = getattr(cov, "_data", None)
        base = data.base_filename() if data is not None else config.data_file
        copy.data_file = os.path.abspath(base)
        copy.parallel = True
        copy.patch = sorted({*config.patch, *CHILD_PATCHES})
        return copy.serialize()
    except Exception:  # an unexpected coverage.py: children run unmeasured, as before
        return None


def fork_orders() -> dict | None:
    """What a fork-style child must do to measure (``harness._child._restart_coverage``):
    None when this process measures nothing or its coverage.py patches fork and ``_exit``
    already (the child then measures and saves by itself); else ``{"config": ..., "restart":
    bool, "save": bool}``: restart measuring into a data file of its own, and save it at its
    ``os._exit``."""
    cov = measuring()
    patches = set(getattr(getattr(cov, "config", None), "patch", None) or ())
    if cov is None or patches >= set(CHILD_PATCHES):
        return None
    config = child_config()
    if config is None:
        return None
    return {"config": config, "restart": "fork" not in patches, "save": "_exit" not in patches}


def with_child_config(environ: dict[str, str], keep: bool = False) -> dict[str, str]:
    """``environ`` with :data:`ENV_NAME` set to :func:`child_config` when this process
    measures coverage (replacing the one coverage.py's ``patch = subprocess`` put there, which
    may lack the child patches); ``environ`` itself otherwise, or when ``keep`` (the request's
    env sets the variable: the caller's choice stands)."""
    config = None if keep else child_config()
    if config is None:
        return environ
    return {**environ, ENV_NAME: config}
