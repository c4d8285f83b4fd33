"""The forkserver zygote under mutmut (``ci/mutation.py``): ``harness/_zygote.py`` run as
the module ``harness._zygote``, its trampoline hits reported to the test that caused them.

``python _mutmut_zygote.py <the zygote's arguments>``; ``suites/_mutmut.py`` points
``harness._forkserver.ZYGOTE_PATH`` here in every pytest process mutmut runs.

A zygote is a fresh interpreter that runs ``_zygote.py`` as a script, so its functions
belong to ``__main__``: mutmut's trampolines would record their hits under that name and
never switch to a mutant of ``harness._zygote``. Run here, the module has its real name, and
so does each of its mutants. In mutmut's first, unmutated run (``MUTANT_UNDER_TEST=stats``)
each function the zygote or a child it forks reaches is appended to a file named for the pid
under ``$DEVMEM_MUTMUT_HITS`` (set by the pytest process), which the test's teardown adds to
the test's hits.

This module imports only the standard library (and mutmut, in a stats run): it runs in the
zygote and in every child forked from it. Nothing here is used outside mutation runs.
"""

from __future__ import annotations

import importlib.util
import os
import sys

HITS_VARIABLE = "DEVMEM_MUTMUT_HITS"
"""The directory a stats run's processes write their hits to, one file per pid."""


class SpillingHits(set):
    """A process's trampoline hits; each new function name is also appended to ``path``.

    Once the test process has read and removed the file (at a test's teardown), the names
    are forgotten, so the next test that reaches them is told too (a zygote outlives tests).
    """

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def add(self, name: str) -> None:
        if self and not os.path.exists(self.path):
            self.clear()  # the test process took what was written: start over for the next test
        if name not in self:
            super().add(name)
            try:
                with open(self.path, "a", encoding="utf-8") as spill:
                    spill.write(name + "\n")
            except OSError:  # the target limited file sizes (RLIMIT_FSIZE) or descriptors
                pass  # this hit is lost to the map; the target's own behaviour is untouched


def spill_hits_to(directory: str) -> None:
    """Send this process's trampoline hits, and those of every process it forks, to files
    ``<directory>/<pid>`` (a stats run only)."""
    from mutmut.mutation import trampoline

    def renew() -> None:
        hits = SpillingHits(os.path.join(directory, str(os.getpid())))
        trampoline.record_trampoline_hit = lambda name, caller=None: hits.add(name)

    renew()
    os.register_at_fork(after_in_child=renew)


def main() -> None:
    """Run ``harness/_zygote.py`` (beside this file's folder) as ``harness._zygote``."""
    harness_dir = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "harness"
    )
    sys.path[0] = harness_dir  # as when the zygote runs as a script
    directory = os.environ.get(HITS_VARIABLE)
    if os.environ.get("MUTANT_UNDER_TEST") == "stats" and directory:
        spill_hits_to(directory)
    spec = importlib.util.spec_from_file_location(
        "harness._zygote", os.path.join(harness_dir, "_zygote.py")
    )
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["harness._zygote"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    module.main(sys.argv[1:])


if __name__ == "__main__":
    main()
