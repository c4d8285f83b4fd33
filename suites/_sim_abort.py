"""The simulator's aborts inside an in-process test: a failure with the line, not a dead session.

The simulator aborts the process (``os.abort``) on a race or a free in flight: in a death
test's child that is the verdict, but in a test that runs in the pytest process it killed the
whole session with no reason (``-n 0``) or left only "worker crashed" (xdist). The suites'
conftests install :func:`raise_in_process` for every test: in the pytest process the
simulator's ``fatal`` raises :class:`SimulatorAbort` (a ``BaseException``, so no ``except
Exception`` of the code under test swallows it) carrying the line, which the report shows; in
any other process (a death test's forked child) it aborts as before, so death tests still see
their SIGABRT and their line. No pytest import.
"""

from __future__ import annotations

import os

from allocator.device import sim

__all__ = ["SimulatorAbort", "raise_in_process"]


class SimulatorAbort(BaseException):
    """The simulator's fatal line, raised in the pytest process instead of aborting it."""


def raise_in_process(monkeypatch) -> None:
    """Patch the simulator's ``fatal`` (for the current test, through ``monkeypatch``) to raise
    :class:`SimulatorAbort` in this process and abort in any other."""
    real, here = sim.fatal, os.getpid()

    def fatal(message: str) -> None:
        if os.getpid() != here:
            real(message)  # a forked child: the abort is its verdict
        raise SimulatorAbort(message)

    monkeypatch.setattr(sim, "fatal", fatal)
