"""Death tests for pytest: run a function in a child process and assert how the child ended.

A death test checks that code dies the way it should (an abort with a message, a signal, an
exit status) without taking the test process with it. ::

    import harness

    def use_after_free():            # module level: a child imports it by name
        ...                          # aborts with "use-after-arena-free: ..."

    def test_detector(death):        # the `death` fixture of the devmem_death plugin
        death.run(use_after_free, env={"DEVMEM_ARENA_DEBUG": "1"}).assert_aborted("use-after")

Children run in one of three styles: ``fork`` (a copy of this process; fastest), ``forkserver``
(a fork of a clean zygote process) or ``exec`` (a fresh interpreter); ``auto`` forks when that
is safe. :class:`Config` and :func:`matrix` run a test once per configuration. The pytest glue
lives in :mod:`harness.plugin`; this package itself never imports pytest (nor ``allocator``).
"""

from harness._config import Config, matrix
from harness._errors import DeathTestFailure, HarnessError, HarnessWarning
from harness._forkserver import forkserver_preload, set_forkserver_preload
from harness._gpus import list_gpus
from harness._outcome import Outcome
from harness._protocol import Raised
from harness._run import DeathRunner, run_child
from harness._styles import (
    STYLES,
    add_fork_safety_check,
    fork_unsafe_reason,
    in_death_child,
    mark_fork_unsafe,
)

__all__ = [
    "STYLES",
    "Config",
    "DeathRunner",
    "DeathTestFailure",
    "HarnessError",
    "HarnessWarning",
    "Outcome",
    "Raised",
    "add_fork_safety_check",
    "fork_unsafe_reason",
    "forkserver_preload",
    "in_death_child",
    "list_gpus",
    "mark_fork_unsafe",
    "matrix",
    "run_child",
    "set_forkserver_preload",
]

for _name in __all__:  # show harness.Outcome, not harness._outcome.Outcome (as trio does)
    _value = globals()[_name]
    if isinstance(_value, type) or callable(_value):
        _value.__module__ = __name__
del _name, _value
