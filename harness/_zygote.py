"""Entry point of the zygote: ``python _zygote.py --fd FD --root-pid PID --root-start TICKS
[--name NAME]``.

The zygote is a clean interpreter, exec'd by a test process with that process's interpreter
flags (``-O``, ``-X dev``, ``-W``...: see ``harness._state``), that imports only the standard
library (and coverage.py, to measure its children, when the test process measures coverage:
see ``harness._coverage``), ``_child.py`` (by file path, not the ``harness`` package) and,
at its first ``run`` request, the modules of that request's preload list; it never
initializes CUDA. It has two jobs, for every *client* (a test process connected to it):

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
- ``{"op": "run", "id": int, "seal_offset": int}`` with four descriptors attached (request
  file, stdout, stderr, status): reply ``{"event": "forked", "id", "pid"}``, then, once the
  child has ended, ``{"event": "reaped", "id", "pid", "status"}`` (a raw wait status). A
  request it cannot serve gets ``{"event": "error", "id", "message"}`` instead.
  ``seal_offset`` is the child's page in the client's table. The request file holds two lines
  of JSON: the child's request (see ``_child.run_child``) less its setting, plus
  ``preload``, the modules to import before the first fork, and ``state``, the client's
  umask, resource limits, nice value and warning filters at the request, which the child
  (forked or a spare) takes before anything of the request runs (``_child.apply_state``:
  what it cannot take is a ``note`` record); then the setting
  (``_child.SETTING_KEYS``: environment, ``sys.path``, working directory), which the zygote
  applies before it forks and compares with its spare's. The zygote keeps its copies of the
  child's stdout and stderr until it has sent ``reaped``, so that the client wakes once per
  child.
- ``{"op": "goodbye"}``: from the root, at its exit: leave once no client is left.
- end of file: the client is gone.

The spare: while no child runs, the zygote forks one child ahead of the next request, which
rehearses its path and waits on a socket pair; a request whose setting it fits (the same, or
other environment variables only) is handed to it, with ``{"client", "serial",
"seal_offset", "environ"}`` (the changed variables) and the request's four descriptors, and
the client is told the child forked once the spare answers ``taken``; any other request gets
a child forked for it, and the spare is sent away (end of file). See ``Zygote._fork_spare``.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import itertools
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
_SPARE_MESSAGE = 1 << 15  # bytes of a message to a spare at most (else it is not used)
_MAX_DETAIL = 4000  # characters of the preload errors an "error" message quotes at most: at
# 12 bytes a character as JSON escapes them, its message still fits the client's 64 KiB read


def _load_child():
    """``_child.py`` beside this file, loaded by path (not entered in ``sys.modules``) under
    the name it has in a fork-style child, ``harness._child``: one name in every style (its
    functions' ``__module__``, which mutmut's trampolines also go by)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_child.py")
    spec = importlib.util.spec_from_file_location("harness._child", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _kill_group(pgid: int) -> None:
    """SIGKILL process group ``pgid`` (the process alone if it has no group); never one below
    2: a pid read from a scribbled guard-table page must not reach init's group (1), the
    zygote's own (0) or every process (-1)."""
    if pgid < 2:
        return
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


_serials = itertools.count(1)


class _Client:
    def __init__(self, sock: socket.socket, pid: int | None) -> None:
        self.serial = next(_serials)  # names it for good (its socket's number may be reused)
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


class _Handing:
    """A request handed to the spare, until the spare says it took it: the spare, the client
    (None once it is gone), the request's id, its four descriptors, its page's offset and its
    request file's bytes (to fork a child for it, should the spare have died before)."""

    def __init__(
        self,
        spare: _Spare,
        client: _Client,
        ident: object,
        fds: list[int],
        offset: int,
        data: bytes,
    ) -> None:
        self.spare = spare
        self.client: _Client | None = client
        self.ident = ident
        self.fds = fds
        self.offset = offset
        self.data = data


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

    def __init__(
        self,
        pid: int,
        pidfd: int,
        sock: socket.socket,
        setting: bytes,
        decoded: dict,
        known: frozenset[int],
    ) -> None:
        self.known = known  # the serials of the clients whose guard tables it has mapped
        self.pid = pid
        self.pidfd = pidfd
        self.sock = sock
        self.setting = setting
        self.suffix = b"\n" + setting  # how a request file that fits it exactly ends
        self.decoded = decoded  # the setting, decoded


def _environ_change(spare: _Spare, data: bytes) -> tuple[dict, dict, bytes] | None:
    """How the setting of a request file's bytes ``data`` differs from ``spare``'s:
    ``(variables, setting, setting's bytes)``, where ``variables`` maps each changed
    environment variable to its new value, or None where it is unset; None if anything else
    differs (or the setting cannot be read)."""
    setting = data.partition(b"\n")[2]
    try:
        decoded = json.loads(setting)
    except ValueError:
        return None
    if not isinstance(decoded, dict):
        return None
    before, after = spare.decoded.get("environ"), decoded.get("environ")
    if not isinstance(before, dict) or not isinstance(after, dict):
        return None
    for key in spare.decoded.keys() | decoded.keys():
        if key != "environ" and spare.decoded.get(key) != decoded.get(key):
            return None
    variables = {name: value for name, value in after.items() if before.get(name) != value}
    variables.update((name, None) for name in before if name not in after)
    return variables, decoded, setting


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
        self.handing: dict[int, _Handing] = {}  # the spare's socket -> the request handed to it
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
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII"))
        pid, uid, _gid = struct.unpack("iII", creds)  # struct ucred: pid_t, uid_t, gid_t
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
        while self.clients or self.children or self.handing or not (self.root_gone or self.goodbye):
            if self.listener is None and not (self.clients or self.children or self.handing):
                break  # private: nobody can reach us any more
            self._step()
        # no spare is left: the step that found no client retired it, and it was reaped as a
        # child of nobody's before the loop could end
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
        ready, taken = set(), []
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
            elif fd in self.handing:
                taken.append(fd)
            else:
                ready.add(fd)
        for fd in taken:  # first: a spare that took its request may have ended already
            self._taken(self.handing[fd])
        for pid, child in list(self.children.items()):
            if child.pidfd in ready or (child.pidfd < 0 and self._ended(pid)):
                self._reap(pid)
        if self.spare is not None and (self.spare.pidfd in ready or not self.clients):
            self._retire_spare()  # it died (someone killed it), or nobody is left to use it
        if (
            self.spare is None
            and self.clients
            and not self.children
            and not self.handing
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
        for handing in self.handing.values():
            if handing.client is client:
                handing.client = None

    # -- forkserver ----------------------------------------------------------------------------

    def _run(self, client: _Client, ident: object, fds: list[int], offset: object) -> None:
        if len(fds) != _CHILD_FDS:
            for fd in fds:
                os.close(fd)
            client.send(event="error", id=ident, message=f"expected 4 descriptors, got {len(fds)}")
            return
        try:
            data, failure = self.child.read_all(fds[0]), None
        except OSError as exc:
            data, failure = b"", exc
        fits = self._page_fits(client, offset)
        if failure is None and fits and self._hand_to_spare(client, ident, fds, offset, data):
            return
        self._fork_for(client, ident, fds, offset, data, failure)

    def _page_fits(self, client: _Client, offset: object) -> bool:
        """Whether ``offset`` is a page of ``client``'s guard table, as mapped here."""
        size = len(client.table_map) if client.table_map is not None else 0
        return isinstance(offset, int) and 0 <= offset <= size - self.child.SEAL_BYTES

    def _fork_for(
        self,
        client: _Client,
        ident: object,
        fds: list[int],
        offset: object,
        data: bytes,
        failure: OSError | None = None,
    ) -> None:
        """Fork a child for request ``ident`` of ``client`` (its descriptors ``fds``, its
        request file's bytes ``data``, or the ``failure`` to read them)."""
        request_fd, stdout_fd, stderr_fd, status_fd = fds
        table_map = client.table_map
        fits = self._page_fits(client, offset)
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
            if len(detail) > _MAX_DETAIL:
                detail = f"{detail[:_MAX_DETAIL]}... ({len(detail) - _MAX_DETAIL} more characters)"
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
        page = offset if seal is not None else None  # none to wipe at its reaping
        self._forked(client, ident, pid, -1 if pidfd is None else pidfd, page, fds)

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
        """Fork a child ahead of the next request, once no child runs (a spare forked while
        one runs would take the CPU it runs on, and its page copies that child's time): the
        *spare*. It closes the zygote's descriptors, takes its own process group, has itself
        killed when the zygote dies, rehearses its path (:meth:`_rehearse`) and waits on a
        socket for a request (:meth:`_serve_as_spare`). The next request whose setting
        (environment, ``sys.path``, working directory: what the zygote had applied when it
        forked the spare) matches, or differs in environment variables only, is then run
        without a fork, and without most of the page copies a fork costs the child (Python's
        after-fork hooks, the first run of the child's path), on its path. A spare that does
        not fit a request is sent away."""
        try:
            decoded = json.loads(self.applied)  # type: ignore[arg-type]
        except ValueError:
            self.applied = None
            return
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
        known = frozenset(c.serial for c in self.clients.values() if c.table_map is not None)
        self.spare = _Spare(pid, pidfd, ours, self.applied, decoded, known)  # type: ignore[arg-type]
        if not self.poller.poll(0):  # nothing waits (a rehearsal would only delay it)
            try:
                self._rehearse_forward()
            except Exception:  # a rehearsal that fails costs the next request its copies
                pass

    def _hand_to_spare(
        self, client: _Client, ident: object, fds: list[int], offset: int, data: bytes
    ) -> bool:
        """Hand request ``ident`` (its descriptors ``fds``, its request file's bytes ``data``)
        to the spare, if there is one and the request's setting is the one it was forked
        with, or differs from it only in environment variables (pytest's
        ``PYTEST_CURRENT_TEST`` differs from test to test), which the spare then sets itself
        before anything of the request runs. False (the caller forks) if not; a spare that
        does not fit is sent away.

        After a hand-over with variables changed, the zygote sets them too (while the child
        runs): the next spare is forked with them, for the next child of the same test.
        """
        spare = self.spare
        if spare is None or client.table_map is None:
            return False
        if client.serial not in spare.known:  # a client that came after it: the next will do
            self._retire_spare()
            return False
        message = {"client": client.sock.fileno(), "serial": client.serial, "seal_offset": offset}
        # The file's one newline ends its first line (JSON as json.dumps writes it has none):
        # no slice of it is made, since every page this process writes now is copied
        exact = data.endswith(spare.suffix)
        changed = None if exact else _environ_change(spare, data)
        if changed is not None:
            message["environ"] = changed[0]
        encoded = json.dumps(message).encode()
        if not (exact or changed is not None) or len(encoded) > _SPARE_MESSAGE:
            self._retire_spare()
            return False
        self.spare = None
        try:
            socket.send_fds(spare.sock, [encoded], fds)
        except OSError:  # it died: reap it, and fork
            self.spare = spare
            self._retire_spare()
            return False
        self.handing[spare.sock.fileno()] = _Handing(spare, client, ident, fds, offset, data)
        self._watch(spare.sock.fileno())
        client.children[spare.pid] = ident  # type: ignore[assignment]  # killed with the client's
        if changed is not None:  # the zygote follows, while the spare runs: for the next spare
            self._apply(changed[1], changed[2])
        return True

    def _taken(self, handing: _Handing) -> None:
        """The spare of ``handing`` said it took its request ("taken"), or died before it did
        (end of file): the client is told it forked, or the request gets a child forked for
        it (a spare runs nothing of a request it has not said it took)."""
        spare, client = handing.spare, handing.client
        try:
            said = spare.sock.recv(64, socket.MSG_DONTWAIT)
        except BlockingIOError:  # nothing yet after all: wait on
            return
        except OSError:
            said = b""
        del self.handing[spare.sock.fileno()]
        self._unwatch(spare.sock.fileno())
        spare.sock.close()
        request_fd, stdout_fd, stderr_fd, status_fd = handing.fds
        if said == b"taken":
            for fd in (request_fd, status_fd):  # the spare's now
                os.close(fd)
            if client is None:  # gone meanwhile, its children killed: reaped as nobody's
                self.children[spare.pid] = _Child(spare.pidfd, None, None, (stdout_fd, stderr_fd))
            else:
                self._forked(
                    client, handing.ident, spare.pid, spare.pidfd, handing.offset, handing.fds
                )
            return
        self.children[spare.pid] = _Child(spare.pidfd, None, None, ())  # reaped as nobody's
        if client is None:
            for fd in handing.fds:
                os.close(fd)
            return
        client.children.pop(spare.pid, None)
        self._fork_for(client, handing.ident, handing.fds, handing.offset, handing.data)

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
        the zygote writes while the spare shares it is copied; this rehearsal took about two
        thirds of those copies off that path, counted with ``getrusage`` when it was written)."""
        _op(_pass_descriptors({"op": "run", "id": 0, "seal_offset": 0}, _CHILD_FDS))
        fd = os.memfd_create("devmem-harness-rehearsal", os.MFD_CLOEXEC)
        try:
            self.child.read_all(fd).endswith(b"\n{}")
        finally:
            os.close(fd)
        if self.spare is not None:  # the setting compared with itself: no variable changed
            _environ_change(self.spare, self.spare.suffix)
        json.dumps({"client": 0, "serial": 0, "seal_offset": 0, "environ": {}}).encode()
        json.dumps({"event": "forked", "id": 0, "pid": 0}).encode()
        _Child(-1, None, 0, ())

    def _rehearse(self) -> None:
        """In the spare, before any request: run the steps of its path that leave nothing
        behind on made-up data and descriptors of its own (receiving descriptors, decoding a
        request, mapping a seal, the status records, resolving a standard-library target,
        checking a value, making the child's ``sys.std*`` objects), all closed after.

        Why: a forked process copies each page it writes, its interpreter's own included (the
        code objects its specializing interpreter updates, the allocator's free pools), and
        those copies were most of a forkserver child's time on the path of its request (this
        rehearsal, which makes them before the request comes, took about four fifths of them
        off that path, counted with ``getrusage`` when it was written). Nothing here may
        change what the request's run sees.
        """
        child = self.child
        json.loads(_pass_descriptors({"client": 0, "serial": 0, "seal_offset": 0}, _CHILD_FDS))
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
        child._apply_request({"env": {}})  # sets nothing: the child's flag is set already
        child.plain_problem(child._resolve("os:getpid", None, None)(), "a value")
        child._make_streams()

    def _serve_as_spare(self, sock_fd: int) -> None:
        """In the spare: wait for a request, then run it (:func:`_child.run_child`, set up by
        the zygote). Leaves at end of file. Never returns."""
        sock = socket.socket(fileno=sock_fd)
        try:
            sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)  # a request waits already:
        except BlockingIOError:  # none does: rehearse (a rehearsal then would only delay it)
            try:
                self._rehearse()
            except Exception:  # a rehearsal that fails costs the request its copies, no more
                pass
        except OSError:
            pass
        try:
            message, fds, _flags, _addr = socket.recv_fds(sock, _SPARE_MESSAGE, _CHILD_FDS)
        except OSError:
            message, fds = b"", []
        if not message or len(fds) != _CHILD_FDS:
            _leave_quietly(0)  # sent away
        try:
            sock.send(b"taken")  # the zygote tells the client it forked
        except OSError:  # unsaid, the zygote forks a child for the request: run none of it
            _leave_quietly(0)
        sock.close()
        request_fd, stdout_fd, stderr_fd, status_fd = fds
        try:  # the client's guard table, as the zygote had mapped it when it forked the spare
            orders = json.loads(message)
            client = self.clients[orders["client"]]
            if client.serial != orders["serial"] or client.table_map is None:
                raise KeyError(orders["serial"])
            seal = (client.table_map, orders["seal_offset"])
        except (ValueError, TypeError, KeyError, AttributeError):
            orders, seal = {}, None  # the client then finds no seal, and says so
        try:
            request = json.loads(self.child.read_all(request_fd).partition(b"\n")[0])
            if not isinstance(request, dict):
                raise ValueError("the request is not a JSON object")
            # the variables in which the request's environment differs from the zygote's
            self.child._apply_request({"env": orders.get("environ") or {}})
        except Exception as exc:
            status = self.child._Status(status_fd, seal, echo=False)
            status.harness_error(f"could not set up the child: {type(exc).__name__}: {exc}")
            _leave_quietly(self.child.EXIT_HARNESS_ERROR)
        os.close(request_fd)
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


def _start_coverage() -> None:
    """Measure coverage with the test process's configuration when it measures
    (``COVERAGE_PROCESS_CONFIG``, see ``harness._coverage``), so that each child, a fork of
    this process, measures into a data file of its own and saves it at its ``os._exit``
    (the configuration asks coverage.py for both); nothing where coverage.py's own start-up
    hook did it already."""
    if os.environ.get("COVERAGE_PROCESS_CONFIG"):
        try:
            import coverage

            coverage.process_startup()
        except Exception:  # no coverage.py here: the children run unmeasured
            pass


def main(argv: list[str]) -> None:
    """Serve the client on ``--fd`` (and those of ``--name``) until the root is gone."""
    options = dict(zip(argv[::2], argv[1::2], strict=True))
    # An ignored SIGCHLD survives exec: with it the kernel would reap our children itself
    # (a test process that ignores SIGCHLD starts us so), and their statuses would be lost.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _start_coverage()
    sock = socket.socket(fileno=int(options["--fd"]))
    zygote = Zygote(
        sock, int(options["--root-pid"]), options["--root-start"], options.get("--name")
    )
    zygote.serve()
    _leave_quietly(0)  # without the exit handlers


if __name__ == "__main__":
    main(sys.argv[1:])
