"""The exceptions and the warning of the harness: whose fault it is decides which you get."""

from __future__ import annotations


class HarnessError(Exception):
    """The harness was misused, or failed itself; never a verdict on the code under test.

    Raised before any child starts for bad arguments (a target that cannot be imported in a
    child, arguments that are not JSON plain data, an unknown style, a bad timeout or env), and
    for fork when :func:`harness.mark_fork_unsafe` was called. A harness failure *after* the
    child started is not raised: it comes back as an :class:`~harness.Outcome` whose ``kind``
    is ``"harness_error"``, and is never reported as a crash.
    """


class DeathTestFailure(AssertionError):
    """A death-test assertion failed: the child did not end the way the test expected.

    Raised by the ``assert_*`` methods of :class:`~harness.Outcome`. The message names the
    target, the config id and env, the expected and the actual ending, the child's stderr
    (its first 20 and last 50 lines when longer, each prefixed ``[  DEATH   ] ``) and a shell
    command that reruns the child.
    """


class HarnessWarning(UserWarning):
    """Something will not work as the call reads, though the child can run.

    Warned by :func:`harness.run_child` when ``env`` sets a variable that acts only at
    interpreter start-up (``PYTHONWARNINGS``, ``PYTHONDEVMODE``, ``PYTHONMALLOC``,
    ``LD_PRELOAD``, ``MALLOC_*``, ...) and the style asked for forks a running interpreter
    (``fork``, ``forkserver``): the child would not see its effect. ``style="auto"`` picks
    ``exec`` for such an env instead. Make it an error with
    ``-W error::harness.HarnessWarning``.
    """
