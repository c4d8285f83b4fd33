"""Import every module of the named packages (``ci/check.sh --ci-all``).

Usage: ``python ci/import_all.py PACKAGE [PACKAGE ...]``. Exits 1 naming each module that
fails to import, so an optional backend that breaks on a machine without its hardware shows up
here rather than in a user's session. A package's ``__main__`` module is left out: importing it
runs the package's command line (``python -m runtime.ring`` is how it runs).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import traceback


def import_all(package_names: list[str]) -> list[str]:
    """Import every module under each package; return the names that failed."""
    failed = []
    for name in package_names:
        package = importlib.import_module(name)
        modules = [name]
        modules += [
            m.name
            for m in pkgutil.walk_packages(package.__path__, prefix=name + ".")
            if m.name.rpartition(".")[2] != "__main__"
        ]
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception:
                traceback.print_exc()
                failed.append(module)
            else:
                print(f"imported {module}")
    return failed


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python ci/import_all.py PACKAGE [PACKAGE ...]")
    bad = import_all(sys.argv[1:])
    if bad:
        sys.exit(f"import failed: {', '.join(bad)}")
