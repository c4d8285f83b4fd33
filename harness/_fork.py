"""The fork style: ``os.fork()`` this process; the child runs the target and ``os._exit``s."""

from __future__ import annotations

import math
import os

from harness import _child
from harness._capture import Capture
from harness._coverage import fork_orders
from harness._forkserver import guard
from harness._reap import Deadline, Ending, abandon, first_wait, launch_poller, wait_direct
from harness._request import ChildRequest
from harness._styles import sigchld_problem


def launch_fork(request: ChildRequest, capture: Capture) -> Ending:
    """Fork a child for ``request``, wait for it until its deadline, reap it.

    The fastest style, and the only one that runs closures: the child is a copy of this
    process, target included. It is also the one that inherits everything, so it is refused
    after :func:`harness.mark_fork_unsafe` (checked by the caller). The child writes its pid
    into its page of the guard table, through the mapping it inherits, before anything else
    (see :func:`harness._forkserver.guard`).
    """
    reaper = sigchld_problem()
    if reaper is not None:
        return Ending(None, error=reaper)
    unguarded = guard()
    if unguarded is not None:
        return Ending(None, error=unguarded)
    _child.prepare()
    parent_pid = os.getpid()
    wire = request.wire(forked_from_parent=True)
    orders = fork_orders()  # None unless coverage is measured without its fork support
    if orders is not None:
        wire["coverage"] = orders
    seal = (capture.table.map, capture.seal_offset)
    info = os.fstat(capture.status_fd)
    identity = (info.st_dev, info.st_ino)
    poller = launch_poller(capture)  # made now: after the fork, every write is a page copy
    deadline = Deadline.start(request.timeout_s)
    until_ns = None if deadline.end is None else math.ceil(deadline.end * 1e9)
    try:
        pid = os.fork()
    except OSError as exc:
        return Ending(None, error=f"os.fork() failed: {exc}")
    if pid == 0:  # the child: never returns
        try:
            _child.run_child(
                wire,
                stdout_fd=capture.stdout.write_fd,
                stderr_fd=capture.stderr.write_fd,
                status_fd=capture.status_fd,
                parent_pid=parent_pid,
                target=request.target.function,
                seal=seal,
                status_identity=identity,
            )
        finally:
            os._exit(_child.EXIT_HARNESS_ERROR)
    try:
        os.setpgid(pid, pid)  # also done by the child; whichever runs first wins the race
    except OSError:
        pass
    try:
        pidfd = first_wait(pid, poller, until_ns)  # until it ends (or writes, or times out)
    except BaseException:  # KeyboardInterrupt
        abandon(pid, capture)
        raise
    return wait_direct(pid, capture, deadline, pidfd)
