"""Entry point of the zygote: ``python _zygote.py --fd FD --root-pid PID --root-start TICKS
[--name NAME]``.

The zygote is a clean interpreter, exec'd by a test process, that imports only the standard
library, ``_child.py`` (by file path, not the ``harness`` package) and, at its first ``run``
request, the modules of that request's preload list; it never initializes CUDA. It has two
jobs, for every *client* (a test process connected to it):

- **forkserver**: it forks one death-test child per ``run`` request, reports the child's pid,
  and once the child has ended kills whatever is left in the child's process group, reaps the
  child and reports its wait status;
- **guard**: a client also registers here each child it starts itself (fork and exec styles:
  ``watch``, then ``unwatch`` once it has reaped it). When a client process ends, however it
  ends (SIGKILL included: its socket closes and its pidfd fires), the zygote kills the process
  group of each of that client's children still registered, and of each child it forked for
  that client. So nothing of a child's process group outlives the test process.

Its clients are the process that started it (descriptor ``FD``), and any process of the same
user that connects to the abstract unix socket ``NAME``: the processes forked from the same
*root* process (pytest-forked's test processes, say) share one zygote. It serves them all at
once (an event loop over sockets and pidfds; one child per ``run`` request, many at a time),
and exits once no client and no child is left and the root process ``PID`` (whose start time
in clock ticks is ``TICKS``) is gone or has said goodbye. It does not die with the thread or
the process that started it: a zygote started from a short-lived thread serves on.

Protocol: one JSON object per message on ``SOCK_SEQPACKET`` unix sockets.

Client to zygote:

- ``{"op": "hello"}``: first message; reply ``{"event": "ready", "pid": int}``.
- ``{"op": "run", "id": int}`` with four descriptors attached (request JSON, stdout, stderr,
  status): reply ``{"event": "forked", "id", "pid"}``, then, once the child has ended,
  ``{"event": "reaped", "id", "pid", "status"}`` (a raw wait status). A request it cannot
  serve gets ``{"event": "error", "id", "message"}`` instead. The request carries the child's
  request (see ``_child.run_child``) plus ``preload``, the modules to import before the first
  fork.
- ``{"op": "watch", "id": int}`` with the child's status file attached: guard that child (its
  pid is in the file's seal, written by the child before it does anything else). No reply.
- ``{"op": "unwatch", "id": int}``: stop guarding it (the client reaped it). No reply.
- ``{"op": "goodbye"}``: from the root, at its exit: leave once no client is left.
- end of file: the client is gone.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import select
import signal
import socket
import struct
import sys

_MAX_MESSAGE = 1 << 16
_CHILD_FDS = 4  # request, stdout, stderr, status


def _load_child():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_child.py")
    spec = importlib.util.spec_from_file_location("_devmem_death_child", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _kill_group(pgid: int) -> None:
    for kill in (os.killpg, os.kill):
        try:
            kill(pgid, signal.SIGKILL)
            return
        except ProcessLookupError:
            continue
        except OSError:
            return


def _op(message: bytes) -> tuple[object, object]:
    """``(op, id)`` of a client's message; ``(None, None)`` if it is not one."""
    try:
        request = json.loads(message)
        return request.get("op"), request.get("id")
    except (ValueError, AttributeError):
        return None, None


class _Client:
    def __init__(self, sock: socket.socket, pid: int | None) -> None:
        self.sock = sock
        self.pid = pid
        self.pidfd = _pidfd(pid) if pid else None
        self.children: dict[int, int] = {}  # pid -> request id, of the children we forked for it
        self.watched: dict[int, int] = {}  # request id -> status file descriptor

    def send(self, **message: object) -> None:
        try:
            self.sock.send(json.dumps(message).encode())
        except OSError:
            pass  # it is gone: its end of file comes next


class Zygote:
    """The event loop (module docstring)."""

    def __init__(self, sock: socket.socket, root_pid: int, root_start: str, name: str | None):
        self.child = _load_child()
        self.clients: dict[int, _Client] = {}  # socket fd -> client
        self.by_pidfd: dict[int, _Client] = {}
        self.children: dict[int, tuple[int, int | None]] = {}  # pid -> (pidfd or -1, client fd)
        self.root_pid = root_pid
        self.root_fd = _pidfd(root_pid)
        self.root_gone = self.child.start_ticks(root_pid) != root_start
        self.goodbye = False
        self.preloaded: dict[str, str] | None = None  # module -> error, once preloaded
        self.listener: socket.socket | None = None
        if name:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                listener.bind("\0" + name)
                listener.listen(16)
                self.listener = listener
            except OSError:  # another zygote won the race for this name: serve privately
                listener.close()
        self._add_client(sock)

    def _add_client(self, sock: socket.socket) -> None:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid():
            sock.close()
            return
        client = _Client(sock, pid)
        self.clients[sock.fileno()] = client
        if client.pidfd is not None:
            self.by_pidfd[client.pidfd] = client

    # -- the loop ----------------------------------------------------------------------------

    def serve(self) -> None:
        """Serve until no client and no child is left and the root is gone or said goodbye."""
        while self.clients or self.children or not (self.root_gone or self.goodbye):
            if self.listener is None and not self.clients and not self.children:
                return  # private: nobody can reach us any more
            self._step()
        if self.listener is not None:
            self.listener.close()

    def _step(self) -> None:
        poller = select.poll()
        watched_fds = []
        if self.listener is not None:
            watched_fds.append(self.listener.fileno())
        watched_fds += list(self.clients)
        watched_fds += list(self.by_pidfd)
        watched_fds += [fd for fd, _ in self.children.values() if fd >= 0]
        if self.root_fd is not None and not self.root_gone:
            watched_fds.append(self.root_fd)
        for fd in watched_fds:
            poller.register(fd, select.POLLIN)
        fallback = self.root_fd is None or any(fd < 0 for fd, _ in self.children.values())
        events = poller.poll(50 if fallback else None)
        for fd, _ in events:
            if self.listener is not None and fd == self.listener.fileno():
                self._accept()
            elif fd in self.clients:
                self._read(self.clients[fd])
            elif fd in self.by_pidfd:
                self._gone(self.by_pidfd[fd])
            elif fd == self.root_fd:
                self.root_gone = True
        ready = {fd for fd, _ in events}
        for pid, (fd, _) in list(self.children.items()):
            if fd in ready or (fd < 0 and self._ended(pid)):
                self._reap(pid)
        if fallback and not self.root_gone and self.root_fd is None:
            self.root_gone = self.child.start_ticks(self.root_pid) is None

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()  # type: ignore[union-attr]
        except OSError:
            return
        self._add_client(sock)

    def _read(self, client: _Client) -> None:
        try:
            message, fds, _flags, _addr = socket.recv_fds(client.sock, _MAX_MESSAGE, 8)
        except OSError:
            message, fds = b"", []
        if not message:
            self._gone(client)
            return
        self._handle(client, message, fds)

    def _handle(self, client: _Client, message: bytes, fds: list[int]) -> None:
        op, ident = _op(message)
        if op == "hello":
            client.send(event="ready", pid=os.getpid())
        elif op == "run":
            self._run(client, ident, fds)
            return
        elif op == "watch" and len(fds) == 1 and isinstance(ident, int):
            old = client.watched.pop(ident, None)
            if old is not None:
                os.close(old)
            client.watched[ident] = fds.pop()
        elif op == "unwatch" and isinstance(ident, int):
            fd = client.watched.pop(ident, None)
            if fd is not None:
                os.close(fd)
        elif op == "goodbye":
            self.goodbye = self.goodbye or client.pid == self.root_pid
        else:
            client.send(event="error", id=ident, message=f"unknown message {message[:200]!r}")
        for fd in fds:
            os.close(fd)

    def _gone(self, client: _Client) -> None:
        """The client process ended: drain what it sent, then kill its children's groups."""
        client.sock.setblocking(False)
        while True:
            try:
                message, fds, _flags, _addr = socket.recv_fds(client.sock, _MAX_MESSAGE, 8)
            except OSError:
                break
            if not message:
                break
            if _op(message)[0] == "run":  # never fork for a dead client
                for fd in fds:
                    os.close(fd)
                continue
            self._handle(client, message, fds)
        for pid in client.children:
            _kill_group(pid)
        for fd in client.watched.values():
            pid = self._sealed_pid(fd)
            if pid is not None:
                _kill_group(pid)
            os.close(fd)
        client.watched.clear()
        self.clients.pop(client.sock.fileno(), None)
        if client.pidfd is not None:
            self.by_pidfd.pop(client.pidfd, None)
            os.close(client.pidfd)
        client.sock.close()
        for pid, (fd, owner) in self.children.items():
            if owner is client:
                self.children[pid] = (fd, None)

    def _sealed_pid(self, fd: int) -> int | None:
        try:
            line = os.pread(fd, 32, 0).split(b"\n", 1)[0]
        except OSError:
            return None
        return int(line) if line.isdigit() else None

    # -- forkserver ----------------------------------------------------------------------------

    def _run(self, client: _Client, ident: object, fds: list[int]) -> None:
        if len(fds) != _CHILD_FDS:
            for fd in fds:
                os.close(fd)
            client.send(event="error", id=ident, message=f"expected 4 descriptors, got {len(fds)}")
            return
        request_fd, stdout_fd, stderr_fd, status_fd = fds
        try:
            request = json.loads(self.child.read_all(request_fd))
        except (OSError, ValueError) as exc:
            for fd in fds:
                os.close(fd)
            client.send(
                event="error", id=ident, message=f"bad request: {type(exc).__name__}: {exc}"
            )
            return
        os.close(request_fd)
        errors = self._preload(request)
        if errors:
            for fd in (stdout_fd, stderr_fd, status_fd):
                os.close(fd)
            detail = "; ".join(f"{name}: {error}" for name, error in errors.items())
            client.send(
                event="error",
                id=ident,
                message=f"preloading failed ({detail}); see harness.set_forkserver_preload",
            )
            return
        zygote_pid = os.getpid()
        try:
            pid = os.fork()
        except OSError as exc:
            for fd in (stdout_fd, stderr_fd, status_fd):
                os.close(fd)
            client.send(event="error", id=ident, message=f"os.fork() failed in the zygote: {exc}")
            return
        if pid == 0:
            try:
                self._close_all_but((stdout_fd, stderr_fd, status_fd))
                self.child.run_child(
                    request,
                    stdout_fd=stdout_fd,
                    stderr_fd=stderr_fd,
                    status_fd=status_fd,
                    parent_pid=zygote_pid,
                )
            finally:
                os._exit(self.child.EXIT_HARNESS_ERROR)
        for fd in (stdout_fd, stderr_fd, status_fd):
            os.close(fd)
        try:
            os.setpgid(pid, pid)  # also done by the child; whichever runs first wins the race
        except OSError:
            pass
        pidfd = _pidfd(pid)
        self.children[pid] = (pidfd if pidfd is not None else -1, client)
        client.children[pid] = ident  # type: ignore[assignment]
        client.send(event="forked", id=ident, pid=pid)

    def _preload(self, request: dict) -> dict[str, str]:
        if self.preloaded is None:
            if request.get("sys_path") is not None:
                sys.path[:] = request["sys_path"]
            self.preloaded = {}
            for name in request.get("preload") or ():
                try:
                    importlib.import_module(name)
                except BaseException as exc:
                    self.preloaded[name] = f"{type(exc).__name__}: {exc}"
        return self.preloaded

    def _close_all_but(self, keep: tuple[int, ...]) -> None:
        """In a forked child: close the zygote's sockets, pidfds and watched files."""
        fds = set(self.by_pidfd)
        fds |= {fd for fd, _ in self.children.values() if fd >= 0}
        for client in self.clients.values():
            fds |= set(client.watched.values())
            fds.add(client.sock.detach())
        if self.listener is not None:
            fds.add(self.listener.detach())
        if self.root_fd is not None:
            fds.add(self.root_fd)
        for fd in fds - set(keep):
            try:
                os.close(fd)
            except OSError:
                pass

    def _ended(self, pid: int) -> bool:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

    def _reap(self, pid: int) -> None:
        """A child of ours ended (not yet reaped: its pid is still ours): kill what is left in
        its group, reap it, report its wait status."""
        fd, client = self.children.pop(pid)
        _kill_group(pid)
        _, wait_status = os.waitpid(pid, 0)
        if fd >= 0:
            os.close(fd)
        if client is not None:
            ident = client.children.pop(pid, None)
            client.send(event="reaped", id=ident, pid=pid, status=wait_status)


def main(argv: list[str]) -> None:
    """Serve the client on ``--fd`` (and those of ``--name``) until the root is gone."""
    options = dict(zip(argv[::2], argv[1::2], strict=True))
    sock = socket.socket(fileno=int(options["--fd"]))
    zygote = Zygote(
        sock, int(options["--root-pid"]), options["--root-start"], options.get("--name")
    )
    zygote.serve()


if __name__ == "__main__":
    main(sys.argv[1:])
