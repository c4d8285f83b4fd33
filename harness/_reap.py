"""Waiting for a child with a deadline, killing its process group, and always reaping it.

While it waits, the parent reads the child's stdout and stderr pipes (:func:`pump`), so the
child never blocks on them. Order at the deadline (none if the timeout is None; any finite
length otherwise): the child is *timed out* from that instant, whatever happens next. If it
handles :data:`~harness._child.DUMP_SIGNAL` (the kernel says so: ``SigCgt`` in
``/proc/<pid>/status``), it is sent that signal, on which its faulthandler writes every
thread's Python stack into its stderr (a harness note, kept apart from the stderr, says so),
and given up to :data:`DUMP_WAIT_S` to write it; a child that reset the signal is not sent it
(its default action would kill it), and the harness notes so instead. Then its whole process
group gets SIGTERM; after :data:`GRACE_S`, SIGKILL. Once the child has ended, and before it is
reaped (so its pid, which is also its group id, cannot be reused yet), whatever is left in its
group gets SIGKILL. Since the verdict is fixed at the deadline, no signal the child receives
afterwards, nor the way it reacts, can turn a hang into a death.
"""

from __future__ import annotations

import math
import os
import select
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from harness._capture import Capture, Stream
from harness._child import DUMP_SIGNAL

GRACE_S = 0.5
"""Seconds between SIGTERM and SIGKILL for a child past its deadline."""

DUMP_WAIT_S = 0.5
"""At most this long, after the deadline, for a child to write its Python stacks (seconds)."""

DUMP_QUIET_S = 0.02
"""The stacks are taken as written once the child's stderr has been quiet this long."""

MAX_POLL_S = 3600.0
"""``poll()`` takes an int of milliseconds: a long wait is made of waits of at most this."""


REAPED_ELSEWHERE = (
    "the child was reaped by someone else in this process (a SIGCHLD handler installed outside "
    "Python, or os.wait() in another thread), so how it ended is lost; use style='forkserver'"
)
"""The error of a fork or exec child whose exit status someone else took."""


@dataclass(frozen=True)
class Ending:
    """How a child process ended, as its parent saw it.

    Attributes:
      pid: the child's pid, or None if it never started.
      exit_code: its exit status if it exited, else None.
      signal: the number of the signal that killed it, else None.
      timed_out: it was still running at its deadline (the parent then stopped it).
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
    """When a child must be done (``time.monotonic()`` seconds; None: no deadline)."""

    timeout_s: float | None
    started_at: float
    end: float | None

    @classmethod
    def start(cls, timeout_s: float | None) -> Deadline:
        """A deadline ``timeout_s`` seconds from now, or none (call it just before the launch)."""
        now = time.monotonic()
        return cls(timeout_s, now, None if timeout_s is None else now + timeout_s)


def ending_from_wait_status(pid: int, status: int, timed_out: bool, deadline: Deadline) -> Ending:
    """Decode the raw ``waitpid`` status of child ``pid`` into an :class:`Ending`.

    ``timed_out`` says whether it was still running at its deadline; ``started_at`` is taken
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

    Never raises: a group or process that is already gone, or not ours, is left alone. A pid
    below 2 is never signalled: 0 is the caller's own group, 1 init's, a negative one every
    process (a broken zygote, or a mutant in a mutation run, could hand one over).
    """
    if pid < 2:
        return
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    except OSError:
        pass


def poll_ms(until: float | None, cap_s: float = MAX_POLL_S) -> int:
    """Milliseconds for ``poll()`` until the monotonic time ``until`` (None: ``cap_s``), at most
    ``cap_s``, rounded up so that a wait never returns just before ``until``."""
    left = cap_s if until is None else min(max(until - time.monotonic(), 0.0), cap_s)
    return math.ceil(left * 1000)


def pump(
    streams: Iterable[Stream],
    until: float | None,
    ready_fd: int | None = None,
    ended: Callable[[], bool] | None = None,
    step_s: float = MAX_POLL_S,
) -> bool:
    """Read ``streams`` until ``ready_fd`` is readable or ``ended()`` is true (True), or until
    the monotonic time ``until`` passes (False; None waits for as long as it takes).

    Args:
      streams: the child's output streams; each is drained when it has data, and left alone
        once at its end of file.
      until: when to give up.
      ready_fd: a descriptor that becomes readable when the wait is over (a pidfd, or the
        zygote's socket), or None.
      ended: checked before each wait, for when there is no such descriptor.
      step_s: the longest single wait (what makes ``ended`` be checked again).
    """
    poller = select.poll()
    by_fd = {}
    for stream in streams:
        if not stream.eof:
            by_fd[stream.read_fd] = stream
            poller.register(stream.read_fd, select.POLLIN)
    if ready_fd is not None:
        poller.register(ready_fd, select.POLLIN)
    while True:
        if ended is not None and ended():
            return True
        ready = False
        for fd, _events in poller.poll(poll_ms(until, step_s)):
            if fd == ready_fd:
                ready = True
                continue
            stream = by_fd[fd]
            stream.drain()
            if stream.eof:
                poller.unregister(fd)
        if ready:
            return True
        if until is not None and time.monotonic() >= until:
            return False


def handles_signal(pid: int, signum: int) -> bool | None:
    """Whether process ``pid`` has a handler for ``signum`` (``SigCgt`` in its
    ``/proc/<pid>/status``); None when that cannot be read (no /proc, or it is gone)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def dump_stacks(pid: int, capture: Capture, deadline: Deadline) -> bool:
    """Past the deadline: have the child dump its Python stacks into its stderr, if it can.

    A child with no handler for :data:`~harness._child.DUMP_SIGNAL` (it reset the signal, or
    has not finished its set-up) is not sent it, since the default action would kill it; a
    line in its stderr says so. Where the kernel cannot be asked, a child that wrote its
    ``started`` record is taken to have the handler.

    Returns:
      Whether the signal was sent.
    """
    name = signal.Signals(DUMP_SIGNAL).name
    handled = handles_signal(pid, DUMP_SIGNAL)
    if handled is None:
        handled = len(capture.status()) > 0
    capture.stderr.drain()
    if not handled:
        capture.stderr.note(
            f"devmem-harness: the child's {deadline.timeout_s:g} s timeout has passed; it does "
            f"not handle {name} (did the target reset it?), so its Python stacks cannot be "
            "shown"
        )
        return False
    capture.stderr.note(
        f"devmem-harness: the child's {deadline.timeout_s:g} s timeout has passed; its Python "
        f"stacks follow in its stderr (after byte {capture.stderr.total})"
    )
    try:
        os.kill(pid, DUMP_SIGNAL)
    except OSError:
        return False
    return True


def wait_for_dump(wait: Callable[[float | None], bool], stderr: Stream) -> bool:
    """Give a child that was sent the dump signal up to :data:`DUMP_WAIT_S` to write its
    stacks: until its stderr grew and then stayed quiet :data:`DUMP_QUIET_S`, or it ended.

    Returns:
      Whether it ended meanwhile (its end was then consumed: do not wait for it again).
    """
    before = stderr.total
    end = time.monotonic() + DUMP_WAIT_S
    while True:
        now = time.monotonic()
        if now >= end:
            return False
        if wait(min(end, now + DUMP_QUIET_S)):
            return True
        quiet_since = stderr.last_data_at
        grew = stderr.total > before and quiet_since is not None
        if grew and time.monotonic() - quiet_since >= DUMP_QUIET_S:  # type: ignore[operator]
            return False


def wait_out(
    wait: Callable[[float | None], bool],
    deadline: Deadline,
    dump: Callable[[], bool],
    stop: Callable[[int], None],
    stderr: Stream,
) -> bool:
    """Wait for a child to end; past the deadline, stop it. The order of the module docstring.

    Args:
      wait: ``wait(until)`` waits (reading the child's streams) until the child ends (True) or
        the monotonic time ``until`` passes (False); ``until=None`` waits as long as it takes.
      deadline: the child's deadline.
      dump: asks the child for its stacks (:func:`dump_stacks`); True if the signal was sent.
      stop: ``stop(sig)`` signals the child's process group.
      stderr: the child's stderr stream (to see its stacks arrive).

    Returns:
      True if the child ended by itself before its deadline, False if it was timed out.
      Either way it has ended: ``wait`` returned True once, and is not called again.
    """
    if wait(deadline.end):
        return True
    if dump() and wait_for_dump(wait, stderr):
        return False  # it ended of the dump signal, or by itself: timed out all the same
    stop(signal.SIGTERM)
    if not wait(time.monotonic() + GRACE_S):
        stop(signal.SIGKILL)
        wait(None)
    return False


def _ours(pid: int) -> bool:
    """Whether ``pid`` is still our child (running, or ended and not reaped): only then may
    it, or its group, be signalled (a pid reaped by someone else may be reused)."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _stop_if_ours(pid: int, sig: int) -> None:
    if _ours(pid):
        kill_group(pid, sig)


class _ExitWatch:
    """Waits for a child to end without reaping it: a pidfd, or polling ``waitid(WNOWAIT)``."""

    def __init__(self, pid: int, pidfd: int | None = None) -> None:
        self.pid = pid
        self.pidfd = pidfd if pidfd is not None else open_pidfd(pid)

    def ended(self) -> bool:
        """Whether the child has ended (it is not reaped; or someone else reaped it)."""
        try:
            found = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return found is not None

    def wait(self, until: float | None, streams: Iterable[Stream]) -> bool:
        """Wait until the child ends or ``until`` (monotonic) passes; True if it ended."""
        if self.pidfd is not None:
            return pump(streams, until, ready_fd=self.pidfd)
        return pump(streams, until, ended=self.ended, step_s=0.01)

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def open_pidfd(pid: int) -> int | None:
    """A pidfd of process ``pid`` (Linux 5.3 and later), or None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def launch_poller(capture: Capture) -> select.poll:
    """A ``poll`` object with the child's output pipes registered, made *before* the fork, for
    :func:`first_wait`."""
    poller = select.poll()
    for stream in capture.streams:
        poller.register(stream.read_fd, select.POLLIN)
    return poller


def first_wait(pid: int, poller: select.poll, until_ns: int | None) -> int | None:
    """Right after the fork: wait, doing as little as can be, until the child ``pid`` ends,
    writes to a pipe of ``poller`` (from :func:`launch_poller`) or reaches the monotonic time
    ``until_ns`` (``time.monotonic_ns()``, computed before the fork; None: no deadline). The
    rest of the wait (:func:`wait_direct`) comes after.

    Why: every page this process writes while a forked child lives is a copy-on-write fault
    (a copy of the page: tens of microseconds each on a virtual machine), which the child's
    exit makes cheap again. So the objects and the work of the general wait (closures, the
    stream loop, closing the pipes' write ends) come once the child is gone, and this wait
    allocates next to nothing: a trivial child then costs about what a raw ``os.fork()`` +
    ``waitpid`` does.

    Returns:
      A pidfd of the child, or None (no pidfd here: no first wait).

    Raises what interrupts it (KeyboardInterrupt), the child left as it is: the caller kills
    and reaps it (:func:`abandon`).
    """
    if _pidfd_open is None:
        return None
    try:
        pidfd = _pidfd_open(pid)
    except OSError:
        return None
    try:
        if until_ns is None:
            poller.register(pidfd, _POLLIN)
            poller.poll()
            return pidfd
        # whole milliseconds rounded up (never before until_ns), in [0, MAX_POLL_S]
        wait_ms = (until_ns - _monotonic_ns()) // 1_000_000 + 1
        if wait_ms < 0:
            wait_ms = 0
        elif wait_ms > _MAX_POLL_MS:
            wait_ms = _MAX_POLL_MS
        poller.register(pidfd, _POLLIN)
        poller.poll(wait_ms)
        return pidfd
    except BaseException:
        os.close(pidfd)
        raise


def abandon(pid: int, capture: Capture) -> None:
    """Kill the group of our child ``pid`` (if it is still ours), wipe its pid from its seal,
    reap it. For a wait that was interrupted; never raises."""
    _stop_if_ours(pid, signal.SIGKILL)
    capture.disown()
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


_pidfd_open = getattr(os, "pidfd_open", None)
_monotonic_ns = time.monotonic_ns
_POLLIN = select.POLLIN
_MAX_POLL_MS = int(MAX_POLL_S * 1000)


def wait_direct(pid: int, capture: Capture, deadline: Deadline, pidfd: int | None = None) -> Ending:
    """Wait for our own child ``pid`` until ``deadline``, stopping it if need be; reap it.

    Args:
      pid: the child, just forked (or spawned).
      capture: its channels; the parent's copies of the pipes' write ends are closed here.
      deadline: when it must be done.
      pidfd: a pidfd of the child (from :func:`first_wait`; closed here), or None.

    Returns:
      Its :class:`Ending`; ``timed_out`` if it was still running at the deadline.

    The child is always reaped, also when the wait is interrupted (KeyboardInterrupt): then
    its group is killed first and the exception propagates.
    """
    reaped = False
    watch = None
    try:
        watch = _ExitWatch(pid, pidfd)
        capture.handed_over()
        ended = wait_out(
            lambda until: watch.wait(until, capture.streams),
            deadline,
            lambda: _ours(pid) and dump_stacks(pid, capture, deadline),
            lambda sig: _stop_if_ours(pid, sig),
            capture.stderr,
        )
        _stop_if_ours(pid, signal.SIGKILL)  # leftovers in its group; pid not reusable until reaped
        capture.disown()
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # reaped by someone else: how it ended is lost
            reaped = True
            capture.finish()
            return Ending(pid, error=REAPED_ELSEWHERE, started_at=deadline.started_at)
        reaped = True
        capture.finish()
        return ending_from_wait_status(pid, status, not ended, deadline)
    finally:
        if watch is not None:
            watch.close()
        if not reaped:
            abandon(pid, capture)
