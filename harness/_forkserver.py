"""This process's connection to its zygote: the forkserver style, and the guard of every child.

The zygote (``_zygote.py``) forks the forkserver style's children, and guards the children of
every style: this process hands it its guard table (``harness._guard``) when it connects, each
child writes its pid there before anything else, and if this process dies, however it dies,
the zygote kills the process group of every child still in the table. A fork or exec child is
started only once a zygote holds the table (:func:`guard`).

One zygote serves a whole *root* process and every process forked from it (pytest-forked's
test processes, a fork-style child that runs death tests of its own): it listens on an
abstract unix socket named after the root's pid and start time, the preload list and the
interpreter, and a forked process connects to it there instead of starting its own. It is
started lazily, by whichever process and thread needs it first, and lives until the root is
gone (or says goodbye at its exit) and no client is left; the thread that started it may end
at once. A zygote found dead is restarted once; any failure becomes an outcome of kind
``harness_error``, never a raw exception. A different preload list means a different zygote.

Runs on one connection are serialized by a lock (the replies are read by the running thread).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from typing import Any

from harness._capture import Capture, read_kept
from harness._child import SETTING_KEYS, start_ticks
from harness._coverage import ENV_NAME, with_child_config
from harness._errors import HarnessError
from harness._fd import anonymous_fd
from harness._guard import table
from harness._reap import (
    Deadline,
    Ending,
    dump_stacks,
    ending_from_wait_status,
    kill_group,
    pump,
    wait_out,
)
from harness._request import ChildRequest
from harness._state import interpreter_flags, process_state, startup_environ

ZYGOTE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_zygote.py")
STARTUP_S = 60.0
"""Seconds the zygote may take to start, and to import its preload list at its first child."""
REPLY_S = 10.0
"""Seconds the zygote may take to reap a child it was told is dead (SIGKILLed)."""

ROOT = (os.getpid(), start_ticks(os.getpid()) or "0")
"""``(pid, start ticks)`` of the root process: the one that first imported the harness in this
fork lineage (a forked process inherits the value, so it names its parent's root)."""

_preload: tuple[str, ...] = ()


def set_forkserver_preload(modules: list[str]) -> None:
    """Name the modules the forkserver zygote imports before it forks any child.

    A module the children would import anyway (NumPy, say) then costs nothing per child. A
    different list means a different zygote, started at the next child that needs one.
    Preload nothing that initializes CUDA or starts threads at import.

    Args:
      modules: importable module names; an empty list preloads nothing.

    Raises:
      HarnessError: ``modules`` is not a list (or tuple) of non-empty str.
    """
    global _preload
    __tracebackhide__ = True
    if isinstance(modules, str) or not isinstance(modules, (list, tuple)):
        raise HarnessError(f"set_forkserver_preload(modules) takes a list of str, not {modules!r}")
    for name in modules:
        if not isinstance(name, str) or not name.strip():
            raise HarnessError(f"set_forkserver_preload: bad module name {name!r}")
    _preload = tuple(name.strip() for name in modules)


def forkserver_preload() -> tuple[str, ...]:
    """The current preload list (see :func:`set_forkserver_preload`)."""
    return _preload


class ZygoteFailure(Exception):
    """The zygote died, hung, or broke the protocol."""


class NotForked(ZygoteFailure):
    """The zygote failed before it forked the child: trying again cannot run the target twice."""


class Refused(Exception):
    """The zygote is well but would not run the child (a preload failed, say)."""


class Connection:
    """This process's connection to one zygote.

    Attributes:
      key: the preload list it serves.
      pid: the zygote's pid.
      popen: the zygote's process, if this process started it (else None).
    """

    def __init__(
        self,
        key: tuple[str, ...],
        sock: socket.socket,
        pid: int,
        popen: subprocess.Popen[bytes] | None,
        stderr_fd: int | None,
    ) -> None:
        self.key = key
        self.sock = sock
        self.pid = pid
        self.popen = popen
        self.stderr_fd = stderr_fd
        self.lock = threading.Lock()
        self.ids = itertools.count(1)
        self.closed = False

    # -- forkserver ----------------------------------------------------------------------------

    def run(self, request: ChildRequest, capture: Capture) -> Ending:
        """Have the zygote fork a child for ``request``; wait until its deadline; see it reaped.

        Raises:
          NotForked: the zygote failed before forking (the connection is closed).
          Refused: the zygote would not run it.
        """
        with self.lock:
            wire = request.wire(forked_from_parent=False)
            # measuring coverage: the variable the zygote's coverage.py restarts from in each
            # child (before 7.17 it reads it at the fork, from the environment applied then)
            keep = ENV_NAME in request.overrides
            wire["environ"] = with_child_config(wire["environ"], keep=keep)
            target = {key: value for key, value in wire.items() if key not in SETTING_KEYS}
            setting = {key: wire[key] for key in SETTING_KEYS if key in wire}
            target["preload"] = list(self.key)
            target["state"] = process_state()  # the test process's, now (see harness._state)
            capture.write_request(
                json.dumps(target).encode() + b"\n" + json.dumps(setting).encode()
            )
            ident = next(self.ids)
            fds = [capture.request_fd, capture.stdout.write_fd, capture.stderr.write_fd]
            try:
                run = {"op": "run", "id": ident, "seal_offset": capture.seal_offset}
                message = json.dumps(run).encode()
                socket.send_fds(self.sock, [message], [*fds, capture.status_fd])  # type: ignore[list-item]
                capture.handed_over()
                reply = self._receive(capture, time.monotonic() + STARTUP_S, "forked", ident)
                if reply is None:
                    raise ZygoteFailure(f"it did not fork a child within {STARTUP_S:g} s")
                # a child's pid, above init's: the child's group is killed by it, and 0 (or a
                # negative pid) would be this process's group, 1 the whole machine's init's
                if type(reply.get("pid")) is not int or reply["pid"] <= 1:
                    raise ZygoteFailure(f"a 'forked' message without a child's pid: {reply!r}")
            except (OSError, ZygoteFailure) as exc:
                self.close()
                raise NotForked(str(exc) or type(exc).__name__) from exc
            # The deadline starts when the zygote says it forked: its preloading, at its first
            # child, is not the child's time (nor part of its duration).
            deadline = Deadline.start(request.timeout_s)
            pid = reply["pid"]
            try:
                return self._wait(pid, ident, capture, deadline)
            except (OSError, ZygoteFailure) as exc:
                kill_group(pid, signal.SIGKILL)
                self.close()
                return Ending(
                    pid,
                    error=f"the forkserver zygote failed: {exc}",
                    started_at=deadline.started_at,
                )
            except BaseException:  # KeyboardInterrupt: the protocol's state is unknown now
                kill_group(pid, signal.SIGKILL)
                self.close()
                raise

    def _wait(self, pid: int, ident: int, capture: Capture, deadline: Deadline) -> Ending:
        replies: list[dict[str, Any]] = []
        killed_at: list[float] = []

        def wait(until: float | None) -> bool:
            if until is None and killed_at:  # after SIGKILL the zygote reaps at once, or is broken
                until = killed_at[0] + REPLY_S
                reply = self._receive(capture, until, "reaped", ident)
                if reply is None:
                    raise ZygoteFailure(f"it did not reap child {pid} within {REPLY_S:g} s")
            else:
                reply = self._receive(capture, until, "reaped", ident)
            if reply is not None:
                replies.append(reply)
            return reply is not None

        def stop(sig: int) -> None:
            if sig == signal.SIGKILL:
                killed_at.append(time.monotonic())
            kill_group(pid, sig)

        ended = wait_out(
            wait, deadline, lambda: dump_stacks(pid, capture, deadline), stop, capture.stderr
        )
        capture.finish()
        return ending_from_wait_status(pid, int(replies[-1]["status"]), not ended, deadline)

    def _receive(
        self, capture: Capture, until: float | None, expected: str, ident: int
    ) -> dict[str, Any] | None:
        """The zygote's next message, which must be ``expected``; None once ``until`` passes.
        The child's streams are drained meanwhile."""
        if not pump(capture.streams, until, ready_fd=self.sock.fileno()):
            return None
        data = self.sock.recv(1 << 16)
        if not data:
            raise ZygoteFailure(f"it exited unexpectedly{self._stderr_tail()}")
        try:
            message = json.loads(data)
        except ValueError as exc:
            raise ZygoteFailure(f"unreadable message {data[:200]!r}") from exc
        if message.get("event") == "error":
            raise Refused(str(message.get("message")))
        if message.get("event") != expected or message.get("id") != ident:
            raise ZygoteFailure(f"expected a {expected!r} message, got {message!r}")
        return message

    def _stderr_tail(self) -> str:
        if self.stderr_fd is None:
            return ""
        text = read_kept(self.stderr_fd, "zygote stderr", head=0, tail=2000).strip()
        return f"; its stderr: {text}" if text else ""

    def alive(self) -> bool:
        """Whether the zygote may still be there (its end of the socket is not closed)."""
        if self.closed:
            return False
        return not socket_closed(self.sock)

    def close(self) -> None:
        """Drop the connection (the zygote stays for its other clients)."""
        if not self.closed:
            self.closed = True
            for fd in (self.sock.fileno(), self.stderr_fd):
                if fd in _child_closes:  # its number may be reused: a child must not close it
                    _child_closes.remove(fd)
            self.sock.close()
            if self.stderr_fd is not None:
                os.close(self.stderr_fd)
                self.stderr_fd = None

    def shut_down(self, wait_s: float = 2.0) -> None:
        """At the root's exit: say goodbye, close, and reap the zygote if this process started
        it and it leaves within ``wait_s``. Elsewhere: close (the zygote serves the root on)."""
        root = os.getpid() == ROOT[0]
        if not self.closed and root:
            with contextlib.suppress(OSError):
                self.sock.send(b'{"op": "goodbye"}')
        self.close()
        if self.popen is not None and not root:
            _abandoned.append(self.popen)
            self.popen = None
        if self.popen is not None:
            try:
                self.popen.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                _abandoned.append(self.popen)
            self.popen = None


def socket_closed(sock: socket.socket) -> bool:
    """Whether the peer of ``sock`` has closed its end (the zygote is gone): a peek that
    neither waits nor takes anything (a reply waiting for another thread stays there)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


_connections: dict[tuple[str, ...], Connection] = {}
_lock = threading.Lock()
_abandoned: list[object] = []  # inherited zygote handles of a forked process: never touched


def _pid_namespace() -> int:
    """The inode of this process's PID namespace (0 where ``/proc`` does not say)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def zygote_name(key: tuple[str, ...]) -> str:
    """The abstract socket name of the zygote of this root for preload list ``key``.

    Abstract names are per network namespace, which the containers of one pod share while
    each has pids of its own: the root's PID namespace is in the name too, so two roots with
    the same pid and start time there (mutation runs in namespaces of their own, started in the
    same clock tick) never share a zygote.
    """
    digest = zlib.crc32(
        json.dumps(
            [key, sys.executable, ZYGOTE_PATH, interpreter_flags(), _pid_namespace()]
        ).encode()
    )
    return f"devmem-harness-{os.getuid()}-{ROOT[0]}-{ROOT[1]}-{digest:08x}"


def connection(key: tuple[str, ...] | None = None) -> Connection:
    """This process's connection to the zygote for preload list ``key`` (default: the
    current list), connecting to the root's or starting one if need be.

    Raises:
      ZygoteFailure: no zygote could be reached or started.
    """
    key = _preload if key is None else key
    _adopt_after_fork()
    with _lock:
        found = _connections.get(key)
        if found is not None and found.alive():
            return found
        if found is not None:
            found.close()
        made = _connect(key) or _start(key)
        _connections[key] = made
        _child_closes.extend(fd for fd in (made.sock.fileno(), made.stderr_fd) if fd is not None)
        return made


def current() -> Connection | None:
    """The connection for the current preload list, if one is open (no zygote is started)."""
    _adopt_after_fork()
    found = _connections.get(_preload)
    return found if found is not None and not found.closed else None


def _hello(sock: socket.socket, until: float) -> int:
    """Greet a zygote, handing it this process's guard table; return the zygote's pid."""
    try:
        socket.send_fds(sock, [b'{"op": "hello"}'], [table().fd])
        if not pump((), until, ready_fd=sock.fileno()):
            raise ZygoteFailure(f"it was not ready within {STARTUP_S:g} s")
        data = sock.recv(1 << 16)
    except OSError as exc:
        raise ZygoteFailure(f"it exited before it was ready ({exc.strerror})") from exc
    if not data:
        raise ZygoteFailure("it exited before it was ready")
    reply = json.loads(data)
    if reply.get("event") != "ready":
        raise ZygoteFailure(f"expected a 'ready' message, got {reply!r}")
    return int(reply["pid"])


def _connect(key: tuple[str, ...]) -> Connection | None:
    """Connect to the root's zygote for ``key``, if one is listening."""
    if not sys.platform.startswith("linux"):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect("\0" + zygote_name(key))
        pid = _hello(sock, time.monotonic() + REPLY_S)
    except (OSError, ValueError, ZygoteFailure):
        sock.close()
        return None
    return Connection(key, sock, pid, None, None)


def _start(key: tuple[str, ...]) -> Connection:
    """Start a zygote for ``key`` (named for the root, so forked processes find it)."""
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stderr_fd = anonymous_fd()
    # started with this interpreter's flags (-O, -X dev, -W...), which no running interpreter
    # can change, and measuring coverage with this process's configuration, if it measures
    argv = [sys.executable, *interpreter_flags(), ZYGOTE_PATH, "--fd", str(child_sock.fileno())]
    argv += ["--root-pid", str(ROOT[0]), "--root-start", ROOT[1], "--name", zygote_name(key)]
    try:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr_fd,
            pass_fds=[child_sock.fileno()],
            start_new_session=True,
            # the start-up variables this process started with: the zygote is its interpreter
            env=with_child_config(startup_environ(dict(os.environ))),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        parent_sock.close()
        os.close(stderr_fd)
        raise ZygoteFailure(f"cannot start {sys.executable!r}: {exc}") from exc
    finally:
        child_sock.close()
    made = Connection(key, parent_sock, popen.pid, popen, stderr_fd)
    try:
        _hello(parent_sock, time.monotonic() + STARTUP_S)
    except (OSError, ValueError, ZygoteFailure) as exc:
        tail = made._stderr_tail()
        made.shut_down(wait_s=0.0)
        popen.kill()
        popen.wait()
        raise ZygoteFailure(f"{exc}{tail}") from exc
    return made


def launch_forkserver(request: ChildRequest, capture: Capture) -> Ending:
    """Run ``request`` in a child forked by this process's zygote.

    A zygote found dead (before it forked the child) is restarted once, with fresh capture
    channels; any other failure is an :class:`Ending` with an ``error``.
    """
    failure = None
    for attempt in range(2):
        if attempt:
            capture.renew()
        try:
            return connection().run(request, capture)
        except Refused as exc:
            return Ending(None, error=f"the forkserver zygote could not run the child: {exc}")
        except NotForked as exc:
            failure = f"the forkserver zygote failed: {exc}"
        except ZygoteFailure as exc:
            failure = f"the forkserver zygote could not start: {exc}"
    return Ending(None, error=f"{failure} (after one restart)")


GUARD_CHECK_S = 0.25
"""How long :func:`guard` trusts the zygote it last found alive, before it looks again."""

_guarded_until = 0.0


def guard() -> str | None:
    """Make sure a zygote holds this process's guard table, before a fork or exec child starts.

    The zygote found alive is trusted for :data:`GUARD_CHECK_S` (a check per child would cost
    the fork style much of its speed); one that died meanwhile (someone killed it) leaves the
    children started in that time guarded only by their own death with this process.

    Returns:
      None, or why no zygote could be reached or started (even after one restart), in which
      case the caller must not start the child: nothing would kill its process group if this
      process died.
    """
    global _guarded_until
    now = time.monotonic()
    if now < _guarded_until and _owner == os.getpid():
        return None
    failure = None
    for _ in range(2):
        try:
            connection()
        except ZygoteFailure as exc:
            failure = str(exc)
            continue
        _guarded_until = now + GUARD_CHECK_S
        return None
    return (
        "no zygote to guard the child (the process that kills the child's process group if "
        f"this one dies) could be reached or started: {failure}"
    )


def _shutdown_at_exit() -> None:
    """At this process's exit (atexit, or a death-test child's ``_leave``): shut down the
    connections it opened (the root says goodbye and reaps its zygotes)."""
    if _owner != os.getpid():
        return
    for found in list(_connections.values()):
        found.shut_down()
    _connections.clear()


_owner = os.getpid()  # whose connections (and descriptors in _child_closes) these are
_child_closes: list[int] = []  # descriptors a forked child closes at once (the hook's only job)


def _close_in_child() -> None:
    """After a fork: close our copies of the connections' descriptors, raw (their objects
    are the parent's; a fork-style child must touch as little of its memory as it can), and
    forget their numbers: this process may reuse them for its own files, which a child it
    forks in turn must keep (``pytest --forked``'s child forking a fork-style death test)."""
    for fd in _child_closes:
        try:
            os.close(fd)
        except OSError:
            pass
    _child_closes.clear()


def _adopt_after_fork() -> None:
    """In a forked process, on first use: the connections are the parent's; forget them."""
    global _connections, _lock, _owner, _guarded_until, _child_closes
    if _owner != os.getpid():
        _abandoned.append(_connections)
        _connections, _lock, _owner = {}, threading.Lock(), os.getpid()
        _guarded_until, _child_closes = 0.0, []


atexit.register(_shutdown_at_exit)
os.register_at_fork(after_in_child=_close_in_child)
