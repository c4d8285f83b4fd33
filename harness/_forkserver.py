"""The forkserver style: one clean zygote per process forks the children.

The zygote (``_zygote.py``) is exec'd lazily on the first request, restarted if it died or if
the preload list changed, shut down at interpreter exit, and dies with this process (Linux).
It has imported only the standard library and its preload list, so its children start clean
(no pytest, no threads of ours, never CUDA) yet cost little more than a fork.

A process that forks (pytest-forked, a fork-style child) forgets its parent's zygote and
starts its own if it needs one. Requests are serialized by a lock.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from harness._capture import Capture, anonymous_fd, read_kept
from harness._errors import HarnessError
from harness._reap import (
    Deadline,
    Ending,
    dump_stacks,
    ending_from_wait_status,
    kill_group,
    wait_out,
)
from harness._request import ChildRequest

ZYGOTE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_zygote.py")
STARTUP_S = 60.0
"""Seconds the zygote may take to start and import its preload list."""
REPLY_S = 10.0
"""Seconds the zygote may take to answer a request it is not blocked on."""

_preload: tuple[str, ...] = ()


def set_forkserver_preload(modules: list[str]) -> None:
    """Name the modules the forkserver zygote imports before it forks any child.

    A module the children would import anyway (NumPy, say) then costs nothing per child. A
    zygote already running with a different list is replaced at its next request. Preload
    nothing that initializes CUDA or starts threads at import.

    Args:
      modules: importable module names; an empty list preloads nothing.

    Raises:
      HarnessError: ``modules`` is not a list (or tuple) of non-empty str.
    """
    global _preload
    if isinstance(modules, str) or not isinstance(modules, (list, tuple)):
        raise HarnessError(f"set_forkserver_preload(modules) takes a list of str, not {modules!r}")
    for name in modules:
        if not isinstance(name, str) or not name.strip():
            raise HarnessError(f"set_forkserver_preload: bad module name {name!r}")
    _preload = tuple(name.strip() for name in modules)


def forkserver_preload() -> tuple[str, ...]:
    """The current preload list (see :func:`set_forkserver_preload`)."""
    return _preload


class _ZygoteFailure(Exception):
    """The zygote died, hung, or broke the protocol."""


class ForkServer:
    """This process's connection to its zygote."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.lock = threading.Lock()
        self.popen: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.stderr_fd: int | None = None
        self.preload: tuple[str, ...] = ()

    @property
    def pid(self) -> int | None:
        """The zygote's pid, or None when none is running."""
        return self.popen.pid if self.popen is not None else None

    def run(self, request: ChildRequest, capture: Capture) -> Ending:
        """Have the zygote fork a child for ``request``; wait until its deadline; see it reaped."""
        with self.lock:
            try:
                self._ensure_started()
            except _ZygoteFailure as exc:
                return Ending(None, error=f"the forkserver zygote could not start: {exc}")
            capture.write_request(json.dumps(request.wire(forked_from_parent=False)).encode())
            deadline = Deadline.start(request.timeout_s)
            pid = None
            try:
                pid = self._fork(capture)
                return self._wait(pid, capture, deadline)
            except BaseException as exc:  # the zygote's protocol state is unknown now
                if pid is not None:
                    kill_group(pid, signal.SIGKILL)
                self.stop()
                if isinstance(exc, _ZygoteFailure):
                    return Ending(pid, error=f"the forkserver zygote failed: {exc}")
                raise

    def _fork(self, capture: Capture) -> int:
        fds = [capture.request_fd, capture.stdout_fd, capture.stderr_fd, capture.status_fd]
        try:
            socket.send_fds(self.sock, [b'{"op": "run"}'], fds)  # type: ignore[arg-type]
        except OSError as exc:  # died since the liveness check: one restart
            self.stop()
            self._ensure_started()
            try:
                socket.send_fds(self.sock, [b'{"op": "run"}'], fds)  # type: ignore[arg-type]
            except OSError:
                raise _ZygoteFailure(f"cannot send it a request: {exc}") from exc
        reply = self._receive(time.monotonic() + REPLY_S, "forked")
        if reply is None:
            raise _ZygoteFailure(f"it did not fork a child within {REPLY_S:g} s")
        return int(reply["pid"])

    def _wait(self, pid: int, capture: Capture, deadline: Deadline) -> Ending:
        replies: list[dict[str, Any]] = []

        def wait(until: float | None) -> bool:
            # until=None comes after SIGKILL: the zygote reaps at once unless it is broken
            reply = self._receive(time.monotonic() + REPLY_S if until is None else until, "reaped")
            if reply is None and until is None:
                raise _ZygoteFailure(f"it did not reap child {pid} within {REPLY_S:g} s")
            if reply is not None:
                replies.append(reply)
            return reply is not None

        ended = wait_out(
            wait,
            deadline,
            lambda: dump_stacks(pid, capture, deadline),
            lambda sig: kill_group(pid, sig),
        )
        return ending_from_wait_status(pid, int(replies[-1]["status"]), not ended, deadline)

    def _receive(self, deadline: float, expected: str) -> dict[str, Any] | None:
        """The zygote's next message, which must be ``expected``; None at the deadline."""
        assert self.sock is not None
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        while not poller.poll(max(deadline - time.monotonic(), 0.0) * 1000):
            if time.monotonic() >= deadline:
                return None
        data = self.sock.recv(1 << 16)
        if not data:
            raise _ZygoteFailure(f"it exited unexpectedly{self._stderr_tail()}")
        try:
            message = json.loads(data)
        except ValueError as exc:
            raise _ZygoteFailure(f"unreadable message {data[:200]!r}") from exc
        if message.get("event") == "error":
            raise _ZygoteFailure(str(message.get("message")))
        if message.get("event") != expected:
            raise _ZygoteFailure(f"expected a {expected!r} message, got {message!r}")
        return message

    def _ensure_started(self) -> None:
        if self.popen is not None:
            if self.popen.poll() is None and self.preload == _preload:
                return
            self.stop()
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.stderr_fd = anonymous_fd()
        try:
            self.popen = subprocess.Popen(
                [
                    sys.executable,
                    ZYGOTE_PATH,
                    "--fd",
                    str(child_sock.fileno()),
                    "--parent-pid",
                    str(os.getpid()),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self.stderr_fd,
                pass_fds=[child_sock.fileno()],
                start_new_session=True,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            parent_sock.close()
            self.stop()
            raise _ZygoteFailure(f"cannot start {sys.executable!r}: {exc}") from exc
        finally:
            child_sock.close()
        self.sock = parent_sock
        self.preload = _preload
        init = {"op": "init", "sys_path": list(sys.path), "preload": list(self.preload)}
        try:
            self.sock.send(json.dumps(init).encode())
            ready = self._receive(time.monotonic() + STARTUP_S, "ready")
        except (OSError, _ZygoteFailure) as exc:
            self.stop()
            raise _ZygoteFailure(str(exc)) from exc
        if ready is None:
            self.stop()
            raise _ZygoteFailure(f"it was not ready within {STARTUP_S:g} s")
        if ready.get("errors"):
            errors = "; ".join(f"{name}: {error}" for name, error in ready["errors"].items())
            self.stop()
            raise _ZygoteFailure(
                f"preloading failed ({errors}); see harness.set_forkserver_preload"
            )

    def _stderr_tail(self) -> str:
        if self.stderr_fd is None:
            return ""
        text = read_kept(self.stderr_fd, "zygote stderr", head=0, tail=2000).strip()
        return f"; its stderr: {text}" if text else ""

    def stop(self) -> None:
        """Shut the zygote down (it exits on end of file) and reap it."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.popen is not None:
            try:
                self.popen.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
            self.popen = None
        if self.stderr_fd is not None:
            os.close(self.stderr_fd)
            self.stderr_fd = None


_server: ForkServer | None = None
_server_lock = threading.Lock()
_abandoned: list[object] = []  # inherited zygote handles of a forked process: never touched


def server() -> ForkServer:
    """This process's :class:`ForkServer` (created on first use; its zygote starts lazily)."""
    global _server
    with _server_lock:
        if _server is None or _server.owner != os.getpid():
            _server = ForkServer()
        return _server


def launch_forkserver(request: ChildRequest, capture: Capture) -> Ending:
    """Run ``request`` in a child forked by this process's zygote."""
    return server().run(request, capture)


def _shutdown_at_exit() -> None:
    if _server is not None and _server.owner == os.getpid():
        _server.stop()


def _forget_in_child() -> None:
    """After a fork: the zygote is the parent's; drop our copy of the socket, touch nothing."""
    global _server, _server_lock
    if _server is not None:
        if _server.sock is not None:
            _server.sock.close()
        _abandoned.append(_server)
        _server = None
    _server_lock = threading.Lock()


atexit.register(_shutdown_at_exit)
os.register_at_fork(after_in_child=_forget_in_child)
