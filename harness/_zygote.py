"""Entry point of the zygote: ``python _zygote.py --fd FD --root-pid PID --root-start TICKS
[--name NAME]``.

The zygote is a clean interpreter, exec'd by a test process, that imports only the standard
library, ``_child.py`` (by file path, not the ``harness`` package) and, at its first ``run``
request, the modules of that request's preload list; it never initializes CUDA. It has two
jobs, for every *client* (a test process connected to it):

- **forkserver**: it forks one death-test child per ``run`` request, reports the child's pid,
  and once the child has ended kills whatever is left in the child's process group, reaps the
  child and reports its wait status;
- **guard**: a client hands over its guard table (``harness._guard``) when it says hello; each
  of its children, whatever its style, writes its pid into its page of the table before
  anything else, and the client wipes it once the child has ended. When a client process
  ends, however it ends (SIGKILL included: its socket closes and its pidfd fires), the zygote
  kills the process group of every pid left in its table, and of each child it forked for
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

- ``{"op": "hello"}`` with the client's guard table attached: first message; reply
  ``{"event": "ready", "pid": int}``.
- ``{"op": "run", "id": int}`` with four descriptors attached (request JSON, stdout, stderr,
  status): reply ``{"event": "forked", "id", "pid"}``, then, once the child has ended,
  ``{"event": "reaped", "id", "pid", "status"}`` (a raw wait status). A request it cannot
  serve gets ``{"event": "error", "id", "message"}`` instead. The request carries the child's
  request (see ``_child.run_child``) plus ``preload``, the modules to import before the first
  fork, and ``seal_offset``, the child's page in the client's table. The zygote keeps its
  copies of the child's stdout and stderr until it has sent ``reaped``, so that the client
  wakes once per child.
- ``{"op": "goodbye"}``: from the root, at its exit: leave once no client is left.
- end of file: the client is gone.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import mmap
import os
import select
import signal
import socket
import struct
import sys

_MAX_MESSAGE = 1 << 16
_MAX_FD = os.sysconf("SC_OPEN_MAX")
_CHILD_FDS = 4  # request, stdout, stderr, status
_SPARE_FDS = 5  # request, stdout, stderr, status, the client's guard table


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


def _pids_in(table_fd: int, page: int) -> list[int]:
    """The pids written in the ``page``-byte pages of a client's guard table (see
    ``harness._guard``)."""
    try:
        size = os.fstat(table_fd).st_size
        view = mmap.mmap(table_fd, size, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return []
    pids = []
    with view:
        for offset in range(0, size - size % page, page):
            line = view[offset : offset + 32].split(b"\n", 1)[0]
            if line.isdigit():
                pids.append(int(line))
    return pids


def _leave_quietly(code: int) -> None:
    """``os._exit(code)`` as the C library has it, for a process that ran nothing of the
    user's (the zygote, a spare sent away): a coverage.py that measures the children (its
    "patch = subprocess, fork, _exit") also started in it, replaced ``os._exit`` with one that
    saves a data file, and that file would come after the test run combined them (left over,
    stray). posix's own ``_exit`` is not replaced."""
    posix = sys.modules.get("posix")
    (posix._exit if posix is not None else os._exit)(code)


def _pass_descriptors(message: dict, count: int) -> bytes:
    """Send ``message`` with ``count`` descriptors (of ``/dev/null``) through a socket pair of
    this process's, receive them, close everything; return the message received. For the
    rehearsals of the zygote and its spare (``Zygote._rehearse``)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        socket.send_fds(ours, [json.dumps(message).encode()], [null] * count)
        received, fds, _flags, _addr = socket.recv_fds(theirs, 1024, count)
        for fd in fds:
            os.close(fd)
    finally:
        os.close(null)
        ours.close()
        theirs.close()
    return received


def _op(message: bytes) -> tuple[object, object, object]:
    """``(op, id, seal_offset)`` of a client's message; Nones if it is not one."""
    try:
        request = json.loads(message)
        return request.get("op"), request.get("id"), request.get("seal_offset")
    except (ValueError, AttributeError):
        return None, None, None


class _Client:
    def __init__(self, sock: socket.socket, pid: int | None) -> None:
        self.sock = sock
        self.pid = pid
        self.pidfd = _pidfd(pid) if pid else None
        self.children: dict[int, int] = {}  # pid -> request id, of the children we forked for it
        self.table: int | None = None  # its guard table's descriptor
        self.table_map: mmap.mmap | None = None  # the table, mapped (a child writes its page)

    def send(self, **message: object) -> None:
        try:
            self.sock.send(json.dumps(message).encode())
        except OSError:
            pass  # it is gone: its end of file comes next


class _Child:
    """A child this zygote forked: its pidfd (or -1), client, page offset, kept pipe ends."""

    def __init__(self, pidfd: int, client: _Client | None, offset: object, pipes: tuple) -> None:
        self.pidfd = pidfd
        self.client = client
        self.offset = offset if isinstance(offset, int) else None
        self.pipes = pipes


class _Spare:
    """A child forked ahead of any request (see ``Zygote._fork_spare``): its pid, its pidfd,
    the zygote's end of the socket it waits on, and the setting (a request file's second line)
    the zygote had applied when it forked it, which a request must match to be handed to it."""

    def __init__(self, pid: int, pidfd: int, sock: socket.socket, setting: bytes) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.sock = sock
        self.setting = setting
        self.suffix = b"\n" + setting  # how a request file that fits it ends


class Zygote:
    """The event loop (module docstring)."""

    def __init__(self, sock: socket.socket, root_pid: int, root_start: str, name: str | None):
        self.child = _load_child()
        self.child.prepare()  # libc's prctl, loaded once: every child inherits it
        self.clients: dict[int, _Client] = {}  # socket fd -> client
        self.by_pidfd: dict[int, _Client] = {}
        self.children: dict[int, _Child] = {}
        self.root_pid = root_pid
        self.root_fd = _pidfd(root_pid)
        self.root_gone = self.child.start_ticks(root_pid) != root_start
        self.goodbye = False
        self.preloaded: dict[str, str] | None = None  # module -> error, once preloaded
        self.set_up = False  # whether the children's set-up is done here (see _preload)
        self.applied: bytes | None = None  # the setting applied here (see _apply), if one is
        self.spare: _Spare | None = None  # a child forked ahead (see _fork_spare)
        self.poller = select.poll()
        self.listener: socket.socket | None = None
        if name:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                listener.bind("\0" + name)
                listener.listen(16)
                self.listener = listener
                self._watch(listener.fileno())
            except OSError:  # another zygote won the race for this name: serve privately
                listener.close()
        if not self.root_gone:
            self._watch(self.root_fd)
        self._add_client(sock)

    def _add_client(self, sock: socket.socket) -> None:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid():
            sock.close()
            return
        client = _Client(sock, pid)
        self.clients[sock.fileno()] = client
        self._watch(sock.fileno())
        if client.pidfd is not None:
            self.by_pidfd[client.pidfd] = client
            self._watch(client.pidfd)

    # -- the loop ----------------------------------------------------------------------------

    def serve(self) -> None:
        """Serve until no client and no child is left and the root is gone or said goodbye."""
        while self.clients or self.children or not (self.root_gone or self.goodbye):
            if self.listener is None and not self.clients and not self.children:
                break  # private: nobody can reach us any more
            self._step()
        if self.spare is not None:  # never handed a request: it ran nothing of anyone's
            _kill_group(self.spare.pid)
            os.waitpid(self.spare.pid, 0)
        if self.listener is not None:
            self.listener.close()

    def _watch(self, fd: int | None) -> None:
        if fd is not None and fd >= 0:
            self.poller.register(fd, select.POLLIN)

    def _unwatch(self, fd: int | None) -> None:
        if fd is not None and fd >= 0:
            try:
                self.poller.unregister(fd)
            except KeyError:
                pass

    def _step(self) -> None:
        fallback = self.root_fd is None or any(c.pidfd < 0 for c in self.children.values())
        events = self.poller.poll(50 if fallback else None)
        ready = set()
        for fd, _ in events:
            if self.listener is not None and fd == self.listener.fileno():
                self._accept()
            elif fd in self.clients:
                self._read(self.clients[fd])
            elif fd in self.by_pidfd:
                self._gone(self.by_pidfd[fd])
            elif fd == self.root_fd:
                self.root_gone = True
                self._unwatch(fd)
            else:
                ready.add(fd)
        for pid, child in list(self.children.items()):
            if child.pidfd in ready or (child.pidfd < 0 and self._ended(pid)):
                self._reap(pid)
        if self.spare is not None and (self.spare.pidfd in ready or not self.clients):
            self._retire_spare()  # it died (someone killed it), or nobody is left to use it
        if (
            self.spare is None
            and self.clients
            and not self.children
            and self.applied is not None
            and self.set_up
        ):
            self._fork_spare()
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
        op, ident, offset = _op(message)
        if op == "hello":
            if len(fds) == 1 and client.table is None:
                client.table = fds.pop()
                try:
                    client.table_map = mmap.mmap(client.table, os.fstat(client.table).st_size)
                except (OSError, ValueError):
                    client.table_map = None
            client.send(event="ready", pid=os.getpid())
        elif op == "run":
            self._run(client, ident, fds, offset)
            return
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
        if client.table is not None:
            for pid in _pids_in(client.table, self.child.SEAL_BYTES):
                _kill_group(pid)
            os.close(client.table)
            client.table = None
        if client.table_map is not None:
            client.table_map.close()
            client.table_map = None
        self.clients.pop(client.sock.fileno(), None)
        self._unwatch(client.sock.fileno())
        if client.pidfd is not None:
            self.by_pidfd.pop(client.pidfd, None)
            self._unwatch(client.pidfd)
            os.close(client.pidfd)
        client.sock.close()
        for child in self.children.values():
            if child.client is client:
                child.client = None

    # -- forkserver ----------------------------------------------------------------------------

    def _run(self, client: _Client, ident: object, fds: list[int], offset: object) -> None:
        if len(fds) != _CHILD_FDS:
            for fd in fds:
                os.close(fd)
            client.send(event="error", id=ident, message=f"expected 4 descriptors, got {len(fds)}")
            return
        request_fd, stdout_fd, stderr_fd, status_fd = fds
        try:
            data, failure = self.child.read_all(request_fd), None
        except OSError as exc:
            data, failure = b"", exc
        table_map = client.table_map
        fits = (
            isinstance(offset, int) and 0 <= offset <= len(table_map or ()) - self.child.SEAL_BYTES
        )
        if failure is None and fits and self._hand_to_spare(client, ident, fds, offset, data):
            return
        try:
            if failure is not None:
                raise failure
            target, _, setting = data.partition(b"\n")
            request = json.loads(target)
            request.update(json.loads(setting))
        except (OSError, ValueError, TypeError, AttributeError) as exc:
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
        request, applied = self._apply(request, setting)
        zygote_pid = os.getpid()
        seal = (table_map, offset) if table_map is not None and fits else None
        try:
            info = os.fstat(status_fd)
            identity: tuple[int, int] | None = (info.st_dev, info.st_ino)
        except OSError:
            identity = None
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
                    seal=seal,
                    status_identity=identity,
                    set_up_by_parent=applied and self.set_up,
                )
            finally:
                os._exit(self.child.EXIT_HARNESS_ERROR)
        try:
            os.setpgid(pid, pid)  # also done by the child; whichever runs first wins the race
        except OSError:
            pass
        os.close(status_fd)
        pidfd = _pidfd(pid)  # a child that has ended already makes it readable at once
        self._watch(pidfd)
        self._forked(client, ident, pid, -1 if pidfd is None else pidfd, offset, fds)

    def _forked(
        self, client: _Client, ident: object, pid: int, pidfd: int, offset: object, fds: list[int]
    ) -> None:
        """Child ``pid`` (watched on ``pidfd``, or -1) runs request ``ident`` of ``client``,
        whose descriptors were ``fds``: tell the client, and keep the child's pipes."""
        client.send(event="forked", id=ident, pid=pid)
        pipes = (fds[1], fds[2])  # kept until "reaped" is sent: one wake-up for the client
        self.children[pid] = _Child(pidfd, client, offset, pipes)
        client.children[pid] = ident  # type: ignore[assignment]

    # -- the spare: a child forked ahead ------------------------------------------------------

    def _fork_spare(self) -> None:
        """Fork a child ahead of any request, while no child runs (so that the fork delays no
        child's reaping): the *spare*. It closes the zygote's descriptors, takes its own
        process group, has itself killed when the zygote dies, and waits on a socket for a
        request (:meth:`_serve_as_spare`). So the next request whose setting (environment,
        ``sys.path``, working directory: what the zygote had applied when it forked the spare)
        matches is run without a fork, or the page copies a fork's own steps cost the child
        (Python's after-fork hooks), on its path: a forkserver child then costs less than a
        raw fork of the test process. A spare that does not fit a request is sent away."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        zygote_pid = os.getpid()
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            self.applied = None  # no spare until the next request is applied here
            return
        if pid == 0:
            try:
                self._close_all_but((theirs.fileno(),))
                self.child._isolate(zygote_pid, True)
                self._serve_as_spare(theirs.fileno())
            finally:
                _leave_quietly(self.child.EXIT_HARNESS_ERROR)
        theirs.close()
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass
        pidfd = _pidfd(pid)
        if pidfd is None:  # nothing would tell us it died: no spares here
            ours.close()
            _kill_group(pid)
            os.waitpid(pid, 0)
            self.applied = None
            return
        self._watch(pidfd)
        self.spare = _Spare(pid, pidfd, ours, self.applied)  # type: ignore[arg-type]
        try:
            self._rehearse_forward()
        except Exception:  # a rehearsal that fails costs the next request its copies, no more
            pass

    def _hand_to_spare(
        self, client: _Client, ident: object, fds: list[int], offset: int, data: bytes
    ) -> bool:
        """Hand request ``ident`` (its descriptors ``fds``, its request file's bytes ``data``)
        to the spare, if there is one and the request's setting is the one it was forked
        with. False (the caller forks) if not; a spare that does not fit is sent away."""
        spare = self.spare
        if spare is None or client.table is None:
            return False
        # The file's one newline ends its first line (JSON as json.dumps writes it has none):
        # no slice of it is made, since every page this process writes now is copied
        if not data.endswith(spare.suffix):
            self._retire_spare()
            return False
        self.spare = None
        request_fd, stdout_fd, stderr_fd, status_fd = fds
        message = json.dumps({"seal_offset": offset}).encode()
        try:
            socket.send_fds(
                spare.sock, [message], [request_fd, stdout_fd, stderr_fd, status_fd, client.table]
            )
        except OSError:  # it died: reap it, and fork
            self.spare = spare
            self._retire_spare()
            return False
        spare.sock.close()
        for fd in (request_fd, status_fd):  # the spare has its own
            os.close(fd)
        self._forked(client, ident, spare.pid, spare.pidfd, offset, fds)
        return True

    def _retire_spare(self) -> None:
        """Send the spare away (it reads end of file and leaves); it is reaped as a child of
        nobody's."""
        spare, self.spare = self.spare, None
        if spare is not None:
            spare.sock.close()
            self.children[spare.pid] = _Child(spare.pidfd, None, None, ())

    def _rehearse_forward(self) -> None:
        """In the zygote, once it has forked a spare: run the steps of handing a request to a
        spare that leave nothing behind, on made-up data (see :meth:`_rehearse`: every page
        the zygote writes while the spare shares it is copied; 120 copies on that path,
        measured with ``getrusage``, before this rehearsal)."""
        _op(_pass_descriptors({"op": "run", "id": 0, "seal_offset": 0}, _CHILD_FDS))
        fd = os.memfd_create("devmem-harness-rehearsal", os.MFD_CLOEXEC)
        try:
            self.child.read_all(fd).endswith(b"\n{}")
        finally:
            os.close(fd)
        json.dumps({"seal_offset": 0}).encode()
        json.dumps({"event": "forked", "id": 0, "pid": 0}).encode()
        _Child(-1, None, 0, ())

    def _rehearse(self) -> None:
        """In the spare, before any request: run the steps of its path that leave nothing
        behind on made-up data and descriptors of its own (receiving descriptors, decoding a
        request, mapping a seal, the status records, resolving a standard-library target,
        checking a value, making the child's ``sys.std*`` objects), all closed after.

        Why: a forked process copies each page it writes, its interpreter's own included (the
        code objects its specializing interpreter updates, the allocator's free pools), and
        those copies were most of a forkserver child's time on the path of its request (167
        faults there, measured with ``getrusage``; 32 after this rehearsal, which makes them
        before the request comes). Nothing here may change what the request's run sees.
        """
        child = self.child
        json.loads(_pass_descriptors({"seal_offset": 0}, _SPARE_FDS))
        json.loads(
            b'{"target": "os:getpid", "args": [], "main_path": null}\n{}'.partition(b"\n")[0]
        )
        fd = os.memfd_create("devmem-harness-rehearsal", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, child.SEAL_BYTES)
            page = child._map_page(fd, 0)
            try:
                child.read_all(fd)
                status = child._Status(fd, (page, 0), echo=False)
                status.started()
                status.emit("returned", value=0)
            finally:
                page.close()
        finally:
            os.close(fd)
        child.plain_problem(child._resolve("os:getpid", None, None)(), "a value")
        child._make_streams()

    def _serve_as_spare(self, sock_fd: int) -> None:
        """In the spare: wait for a request, then run it (:func:`_child.run_child`, set up by
        the zygote). Leaves at end of file. Never returns."""
        sock = socket.socket(fileno=sock_fd)
        try:
            self._rehearse()
        except Exception:  # a rehearsal that fails costs the request its page copies, no more
            pass
        try:
            message, fds, _flags, _addr = socket.recv_fds(sock, 1024, _SPARE_FDS)
        except OSError:
            message, fds = b"", []
        if not message or len(fds) != _SPARE_FDS:
            _leave_quietly(0)  # sent away
        sock.close()
        request_fd, stdout_fd, stderr_fd, status_fd, table_fd = fds
        try:
            seal = (self.child._map_page(table_fd, json.loads(message)["seal_offset"]), 0)
        except (OSError, ValueError, TypeError, KeyError):
            seal = None  # the client then finds no seal, and says so
        os.close(table_fd)
        try:
            request = json.loads(self.child.read_all(request_fd).partition(b"\n")[0])
        except (OSError, ValueError) as exc:
            request = exc
        os.close(request_fd)
        if not isinstance(request, dict):
            status = self.child._Status(status_fd, seal, echo=False)
            status.harness_error(f"could not read the request in the child: {request}")
            _leave_quietly(self.child.EXIT_HARNESS_ERROR)
        self.child.run_child(
            request,
            stdout_fd=stdout_fd,
            stderr_fd=stderr_fd,
            status_fd=status_fd,
            parent_pid=None,  # done when it was forked: its group, its death with the zygote
            new_group=False,
            seal=seal,
            set_up_by_parent=True,
        )

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
            # What the zygote holds now stays: out of the collector's sight, so that a child's
            # collections never touch (and copy) it. CPython's advice for a fork server.
            gc.collect()
            gc.freeze()
            # The children's signals, core limit and faulthandler, set here once they are
            # inherited (after the preload, whose imports could have changed them)
            self.set_up = self.child.set_up_ahead()
        return self.preloaded

    def _apply(self, request: dict, setting: bytes) -> tuple[dict, bool]:
        """Set up here, before the fork, the environment, ``sys.path``, working directory and
        import caches that the child would set up itself (after the preload, which sees the
        zygote's own): the child inherits them, without the page copies that the work would
        cost it. Each request sets them all again, so none leaks into the next.

        Returns:
          The request for the child, and whether it was applied here: without those parts,
          or as it was if setting them up failed here (the child then sets itself up, fails
          at it, and reports it as it would have).
        """
        if self.spare is not None and self.spare.setting != setting:
            self._retire_spare()
        try:
            self.child._apply_request(request)
        except Exception:
            self.applied = None
            return request, False
        self.applied = setting
        keys = self.child.SETTING_KEYS
        return {key: value for key, value in request.items() if key not in keys}, True

    @staticmethod
    def _close_all_but(keep: tuple[int, ...]) -> None:
        """In a forked child: close every descriptor above 2 but ``keep`` (the zygote's sockets,
        pidfds and tables among them), a range at a time: no zygote object is touched (each
        would cost the child a copy-on-write fault), and none is finalized (the child leaves
        by os._exit)."""
        low = 3
        for fd in sorted(keep):
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, _MAX_FD)

    def _ended(self, pid: int) -> bool:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

    def _reap(self, pid: int) -> None:
        """A child of ours ended (not yet reaped: its pid is still ours): kill what is left in
        its group, reap it, report its wait status."""
        child = self.children.pop(pid)
        _kill_group(pid)
        client = child.client
        if client is not None and client.table_map is not None and child.offset is not None:
            end = child.offset + self.child.SEAL_FINAL_AT  # wipe its pid: reusable once reaped
            client.table_map[child.offset : end] = bytes(self.child.SEAL_FINAL_AT)
        _, wait_status = os.waitpid(pid, 0)
        if client is not None:
            ident = client.children.pop(pid, None)
            client.send(event="reaped", id=ident, pid=pid, status=wait_status)
        if child.pidfd >= 0:
            self._unwatch(child.pidfd)
            os.close(child.pidfd)
        for fd in child.pipes:
            os.close(fd)


def main(argv: list[str]) -> None:
    """Serve the client on ``--fd`` (and those of ``--name``) until the root is gone."""
    options = dict(zip(argv[::2], argv[1::2], strict=True))
    # An ignored SIGCHLD survives exec: with it the kernel would reap our children itself
    # (a test process that ignores SIGCHLD starts us so), and their statuses would be lost.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sock = socket.socket(fileno=int(options["--fd"]))
    zygote = Zygote(
        sock, int(options["--root-pid"]), options["--root-start"], options.get("--name")
    )
    zygote.serve()
    _leave_quietly(0)  # without the exit handlers


if __name__ == "__main__":
    main(sys.argv[1:])
