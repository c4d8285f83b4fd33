"""Waiting for a child with a deadline, killing its process group, and always reaping it.

Order: shortly before the deadline (:attr:`Deadline.dump_at`) a child that is still running,
and has finished its setup, is sent :data:`~harness._child.DUMP_SIGNAL`, on which its
faulthandler writes every thread's Python stack into its stderr (after one harness line saying
so). At the deadline its whole process group gets SIGTERM; after :data:`GRACE_S`, SIGKILL.
Once the child has ended, and before it is reaped (so its pid, which is also its group id,
cannot be reused yet), whatever is left in its group gets SIGKILL.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from harness._capture import Capture
from harness._child import DUMP_SIGNAL

GRACE_S = 0.5
"""Seconds between SIGTERM and SIGKILL for a child past its deadline."""

DUMP_MARGIN_MAX_S = 0.5
"""The child's stacks are dumped at most this long before its deadline (seconds)."""


@dataclass(frozen=True)
class Ending:
    """How a child process ended, as its parent saw it.

    Attributes:
      pid: the child's pid, or None if it never started.
      exit_code: its exit status if it exited, else None.
      signal: the number of the signal that killed it, else None.
      timed_out: the parent killed it at the deadline.
      error: a harness failure that prevented knowing how it ended (None if all went well).
      started_at: ``time.monotonic()`` just before it was launched (None if it was not).
    """

    pid: int | None
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    error: str | None = None
    started_at: float | None = None


@dataclass(frozen=True)
class Deadline:
    """When a child must be done, and when to dump its stacks (``time.monotonic()`` seconds)."""

    timeout_s: float
    started_at: float
    end: float
    dump_at: float

    @classmethod
    def start(cls, timeout_s: float) -> Deadline:
        """A deadline ``timeout_s`` seconds from now (call it just before the launch)."""
        now = time.monotonic()
        end = now + timeout_s
        return cls(timeout_s, now, end, end - min(DUMP_MARGIN_MAX_S, timeout_s / 4))


def ending_from_wait_status(pid: int, status: int, timed_out: bool, deadline: Deadline) -> Ending:
    """Decode the raw ``waitpid`` status of child ``pid`` into an :class:`Ending`.

    ``timed_out`` says whether the parent stopped it at the deadline; ``started_at`` is taken
    from ``deadline`` (the launch time the duration is measured from).
    """
    if os.WIFSIGNALED(status):
        return Ending(
            pid, signal=os.WTERMSIG(status), timed_out=timed_out, started_at=deadline.started_at
        )
    return Ending(
        pid,
        exit_code=os.waitstatus_to_exitcode(status),
        timed_out=timed_out,
        started_at=deadline.started_at,
    )


def kill_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group ``pid`` (to the process alone if it has no group).

    Never raises: a group or process that is already gone, or not ours, is left alone.
    """
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    except OSError:
        pass


def dump_stacks(pid: int, capture: Capture, deadline: Deadline) -> None:
    """Have a running child dump its Python stacks into its stderr, if it got that far.

    A child that has not yet written its ``started`` record has no handler for the signal
    (its default action would kill it), so it is left alone.
    """
    if os.fstat(capture.status_fd).st_size == 0:
        return
    note = (
        f"devmem-harness: the child's {deadline.timeout_s:g} s timeout is near; "
        "its Python stacks follow\n"
    )
    os.write(capture.stderr_fd, note.encode())  # shares the child's file offset: appends
    try:
        os.kill(pid, DUMP_SIGNAL)
    except OSError:
        pass


def wait_out(
    wait: Callable[[float | None], bool],
    deadline: Deadline,
    dump: Callable[[], None],
    stop: Callable[[int], None],
) -> bool:
    """Wait for a child to end; past the deadline, stop it. The order of the module docstring.

    Args:
      wait: ``wait(until)`` waits until the child ends (True) or the monotonic time ``until``
        passes (False); ``until=None`` waits for as long as it takes.
      deadline: the child's deadline.
      dump: makes the child dump its stacks (:func:`dump_stacks`).
      stop: ``stop(sig)`` signals the child's process group.

    Returns:
      True if the child ended by itself, False if it was stopped at the deadline.
    """
    if wait(deadline.dump_at):
        return True
    dump()
    if wait(deadline.end):
        return True
    stop(signal.SIGTERM)
    if not wait(time.monotonic() + GRACE_S):
        stop(signal.SIGKILL)
        wait(None)
    return False


class _ExitWatch:
    """Waits for a child to end without reaping it: a pidfd, or polling ``waitid(WNOWAIT)``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.pidfd: int | None = None
        try:
            self.pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.pidfd = None

    def wait(self, until: float | None) -> bool:
        """Wait until the child ends or ``until`` (monotonic) passes; True if it ended."""
        if self.pidfd is not None:
            poller = select.poll()
            poller.register(self.pidfd, select.POLLIN)
            while True:
                left = None if until is None else max(until - time.monotonic(), 0.0)
                if poller.poll(None if left is None else left * 1000):
                    return True
                if left is not None and left <= 0:
                    return False
        delay = 0.0001
        while True:
            if os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
            if until is not None and time.monotonic() >= until:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def wait_direct(pid: int, capture: Capture, deadline: Deadline) -> Ending:
    """Wait for our own child ``pid`` until ``deadline``, stopping it if need be; reap it.

    Returns:
      Its :class:`Ending`; ``timed_out`` if it was still running at the deadline.

    The child is always reaped, also when the wait is interrupted (KeyboardInterrupt): then
    its group is killed first and the exception propagates.
    """
    watch = _ExitWatch(pid)
    reaped = False
    try:
        ended = wait_out(
            watch.wait,
            deadline,
            lambda: dump_stacks(pid, capture, deadline),
            lambda sig: kill_group(pid, sig),
        )
        kill_group(pid, signal.SIGKILL)  # leftovers in its group; pid not reusable until reaped
        _, status = os.waitpid(pid, 0)
        reaped = True
        return ending_from_wait_status(pid, status, not ended, deadline)
    finally:
        watch.close()
        if not reaped:
            kill_group(pid, signal.SIGKILL)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
