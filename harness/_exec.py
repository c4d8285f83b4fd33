"""The exec style: a fresh ``sys.executable`` running the tiny runner script, never pytest."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from harness._capture import Capture
from harness._coverage import ENV_NAME, with_child_config
from harness._env import startup_variables
from harness._forkserver import guard
from harness._reap import Deadline, Ending, wait_direct
from harness._repro import RUNNER_PATH
from harness._request import ChildRequest
from harness._state import interpreter_flags, process_state, startup_environ
from harness._styles import sigchld_problem

MAX_ARGUMENT_BYTES = 100_000
"""A longer request goes through a descriptor instead of argv (Linux caps one at 128 KiB)."""


_OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
"""How the child gets a process group of its own: as a fork or forkserver child has one, in
this process's session (it may then ``setpgid`` into another group of that session, as they
may); Python 3.10's ``Popen`` has no ``process_group``, so there it leads a session of its own
(and such a ``setpgid`` fails with EPERM)."""


def launch_exec(request: ChildRequest, capture: Capture) -> Ending:
    """Start the exec runner for ``request``, wait for it until its deadline, reap it.

    The slowest style (a whole interpreter starts, then imports the target's module) and the
    most faithful: nothing of this process is inherited but the environment and ``sys.path``.
    The argv is the repro command's, plus the options that tie the child to this parent; a
    request longer than :data:`MAX_ARGUMENT_BYTES` goes through a descriptor instead. The
    child writes its pid into its page of the guard table before it runs anything of ours
    (see :func:`harness._forkserver.guard`).
    """
    reaper = sigchld_problem()
    if reaper is not None:
        return Ending(None, error=reaper)
    unguarded = guard()
    if unguarded is not None:
        return Ending(None, error=unguarded)
    text = request.portable_json()
    data = text.encode()
    argv = [
        sys.executable,
        *interpreter_flags(),  # -O, -X dev, -W...: this interpreter's flags
        RUNNER_PATH,
        "--status-fd",
        str(capture.status_fd),
        "--parent-pid",
        str(os.getpid()),
        "--seal",
        f"{capture.table.fd}:{capture.seal_offset}",
    ]
    # the start-up variables this process started with, as a fork or forkserver child's
    # interpreter did; a change since (a test's os.environ) is the child's os.environ only
    environ = with_child_config(request.environ(), keep=ENV_NAME in request.overrides)
    started = startup_environ(environ)
    for name in startup_variables(request.overrides):  # the request's own: exec acts on it
        if name in environ:
            started[name] = environ[name]
        else:
            started.pop(name, None)
    state = process_state()
    names = [name for name in {*environ, *started} if startup_variables([name])]
    changed = {name: environ.get(name) for name in names if environ.get(name) != started.get(name)}
    if changed:
        state["environ"] = changed
    argv += ["--state", json.dumps(state, separators=(",", ":"))]
    pass_fds = [capture.status_fd, capture.table.fd]
    if len(data) <= MAX_ARGUMENT_BYTES:
        argv += ["--request", text]
    else:
        request_fd = capture.write_request(data)
        argv += ["--request-fd", str(request_fd)]
        pass_fds.append(request_fd)
    deadline = Deadline.start(request.timeout_s)
    try:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=capture.stdout.write_fd,
            stderr=capture.stderr.write_fd,
            pass_fds=pass_fds,
            **_OWN_GROUP,
            env=started,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return Ending(None, error=f"could not start {sys.executable!r}: {exc}")
    capture.handed_over()
    try:
        ending = wait_direct(popen.pid, capture, deadline)
    finally:
        popen.returncode = -1  # reaped by wait_direct: keep Popen from waiting or warning
    return ending
