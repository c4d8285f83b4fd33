"""Entry point of the forkserver zygote: ``python _zygote.py --fd FD --parent-pid PID``.

The zygote is a clean interpreter, exec'd by the parent, that imports only the standard
library, ``_child.py`` (by file path, not the ``harness`` package) and the modules of its
preload list; it never initializes CUDA. It forks one death-test child per request, reports the
child's pid, reaps it (after killing whatever is left in the child's process group) and reports
its wait status. It dies with its parent (Linux) and exits when the parent closes the socket.

Protocol: one JSON object per message on a ``SOCK_SEQPACKET`` unix socket (descriptor ``FD``).

Parent to zygote:

- ``{"op": "init", "sys_path": [...], "preload": [...]}``: first message; the zygote replies
  ``{"event": "ready", "pid": int, "errors": {module: "Type: message"}}``.
- ``{"op": "run"}`` with four descriptors attached (request JSON, stdout, stderr, status):
  the zygote replies ``{"event": "forked", "pid": int}``, then, once the child has ended,
  ``{"event": "reaped", "pid": int, "status": int}`` (a raw wait status). A request it cannot
  serve gets ``{"event": "error", "message": str}`` instead.
- end of file: the zygote exits.

Requests are served one at a time; the parent serializes them.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import socket
import sys

_MAX_MESSAGE = 1 << 16


def _load_child():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_child.py")
    spec = importlib.util.spec_from_file_location("_devmem_death_child", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _send(sock: socket.socket, **message: object) -> None:
    sock.send(json.dumps(message).encode())


def _preload(modules: list[str]) -> dict[str, str]:
    errors = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    return errors


def _serve(sock: socket.socket, child, fds: list[int]) -> None:
    """Fork a child for one request, report its pid, reap it, report its wait status."""
    if len(fds) != 4:
        for fd in fds:
            os.close(fd)
        _send(sock, event="error", message=f"expected 4 descriptors, got {len(fds)}")
        return
    request_fd, stdout_fd, stderr_fd, status_fd = fds
    try:
        request = json.loads(child.read_all(request_fd))
    except (OSError, ValueError) as exc:
        for fd in fds:
            os.close(fd)
        _send(sock, event="error", message=f"bad request: {type(exc).__name__}: {exc}")
        return
    os.close(request_fd)
    zygote_pid = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in (stdout_fd, stderr_fd, status_fd):
            os.close(fd)
        _send(sock, event="error", message=f"os.fork() failed in the zygote: {exc}")
        return
    if pid == 0:
        try:
            sock.close()
            child.run_child(
                request,
                stdout_fd=stdout_fd,
                stderr_fd=stderr_fd,
                status_fd=status_fd,
                parent_pid=zygote_pid,
            )
        finally:
            os._exit(child.EXIT_HARNESS_ERROR)
    for fd in (stdout_fd, stderr_fd, status_fd):
        os.close(fd)
    try:
        os.setpgid(pid, pid)  # also done by the child; whichever runs first wins the race
    except OSError:
        pass
    _send(sock, event="forked", pid=pid)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped: pid still ours
    try:
        os.killpg(pid, signal.SIGKILL)  # whatever the child left behind in its group
    except OSError:
        pass
    _, wait_status = os.waitpid(pid, 0)
    _send(sock, event="reaped", pid=pid, status=wait_status)


def main(argv: list[str]) -> None:
    """Serve fork requests on the socket named by ``--fd`` until the parent goes away."""
    options = dict(zip(argv[::2], argv[1::2], strict=True))
    fd, parent_pid = int(options["--fd"]), int(options["--parent-pid"])
    child = _load_child()
    child.die_with_parent(parent_pid)
    sock = socket.socket(fileno=fd)
    init = json.loads(sock.recv(_MAX_MESSAGE))
    sys.path[:] = init["sys_path"]
    errors = _preload(init["preload"])
    _send(sock, event="ready", pid=os.getpid(), errors=errors)
    while True:
        message, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MESSAGE, 8)
        if not message:
            return
        try:
            op = json.loads(message).get("op")
        except ValueError:
            op = None
        if op == "run":
            _serve(sock, child, fds)
        else:
            for received in fds:
                os.close(received)
            _send(sock, event="error", message=f"unknown message {message[:200]!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
