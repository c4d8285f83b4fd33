"""The test process's connection to a forkserver zygote (``harness._forkserver.Connection``):
what a failure quotes of the zygote's stderr, closing, and the root's goodbye at exit.

These reach the connection alone, over a socket pair and a stand-in for the zygote's process,
so that each promise is checked where a whole run could not see it (the mutation run of
``harness._forkserver`` found them unchecked).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

import harness
from harness import _forkserver
from harness._errors import HarnessError
from harness._reap import GRACE_S
from suites.harness import _procs, _targets


class _Process:
    """Stands in for the zygote's ``subprocess.Popen``: records the waits asked of it."""

    def __init__(self, exits: bool = True) -> None:
        self.exits = exits
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> int:
        self.waits.append(timeout)
        if not self.exits:
            raise subprocess.TimeoutExpired("zygote", timeout)
        return 0


@pytest.fixture
def pair():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    yield ours, theirs
    ours.close()
    theirs.close()


def _kept(data: bytes) -> int:
    fd = os.memfd_create("zygote-stderr")
    os.write(fd, data)
    return fd


def test_a_refused_preload_list_points_at_the_caller_not_the_harness():
    with pytest.raises(HarnessError, match="takes a list of str") as excinfo:
        harness.set_forkserver_preload("numpy")

    shown = [entry.frame.code.name for entry in excinfo.traceback.filter(excinfo)]
    assert not any("set_forkserver_preload" in name for name in shown), shown


def test_a_connected_zygote_has_no_stderr_to_quote(pair):
    connection = _forkserver.Connection((), pair[0], 1, None, None)

    assert connection._stderr_tail() == ""


def test_an_empty_stderr_adds_nothing_to_a_failure(pair):
    connection = _forkserver.Connection((), pair[0], 1, None, _kept(b"  \n"))

    assert connection._stderr_tail() == ""
    connection.close()


def test_a_long_stderr_is_quoted_by_its_last_2000_bytes_and_says_what_was_cut(pair):
    connection = _forkserver.Connection((), pair[0], 1, None, _kept(b"a" * 2500 + b"b" * 2500))

    tail = connection._stderr_tail()
    connection.close()

    assert tail.startswith("; its stderr: [... devmem-harness cut 3000 bytes")
    assert "of zygote stderr here" in tail
    assert "kept the first 0 and the last 2000 ...]" in tail
    assert tail.endswith("\n" + "b" * 2000)
    assert "a" not in tail.split("...]")[1]


def test_close_closes_the_socket_and_the_kept_stderr_once(pair):
    fd = _kept(b"x")
    connection = _forkserver.Connection((), pair[0], 1, None, fd)

    connection.close()

    assert connection.closed is True
    assert connection.alive() is False
    assert connection.stderr_fd is None
    assert pair[0].fileno() == -1
    with pytest.raises(OSError):
        os.fstat(fd)
    connection.close()  # again: nothing left to close


def test_close_without_a_kept_stderr(pair):
    connection = _forkserver.Connection((), pair[0], 1, None, None)
    assert connection.closed is False and connection.alive() is True

    connection.close()

    assert connection.closed is True
    assert pair[0].fileno() == -1


def test_a_forked_process_leaves_the_zygote_to_the_root(pair, monkeypatch):
    abandoned: list[object] = []
    monkeypatch.setattr(_forkserver, "_abandoned", abandoned)
    monkeypatch.setattr(_forkserver, "ROOT", (os.getpid() + 1, "0"))  # we are not the root
    process = _Process()
    connection = _forkserver.Connection((), pair[0], 1, process, None)

    connection.shut_down(wait_s=0.5)

    assert pair[1].recv(100) == b""  # the end, no goodbye: the zygote serves the root on
    assert process.waits == []  # not this process's child to wait for
    assert abandoned == [process]
    assert connection.popen is None
    assert connection.closed is True


def test_the_root_says_goodbye_and_waits_for_its_zygote(pair, monkeypatch):
    abandoned: list[object] = []
    monkeypatch.setattr(_forkserver, "_abandoned", abandoned)
    monkeypatch.setattr(_forkserver, "ROOT", (os.getpid(), "0"))
    process = _Process()
    connection = _forkserver.Connection((), pair[0], 1, process, None)

    connection.shut_down(wait_s=0.5)

    assert pair[1].recv(100) == b'{"op": "goodbye"}'
    assert process.waits == [0.5]
    assert abandoned == []
    assert connection.popen is None


def test_a_zygote_that_does_not_leave_in_time_is_abandoned_not_waited_for(pair, monkeypatch):
    abandoned: list[object] = []
    monkeypatch.setattr(_forkserver, "_abandoned", abandoned)
    monkeypatch.setattr(_forkserver, "ROOT", (os.getpid(), "0"))
    process = _Process(exits=False)
    connection = _forkserver.Connection((), pair[0], 1, process, None)

    connection.shut_down(wait_s=0.25)

    assert process.waits == [0.25]
    assert abandoned == [process]
    assert connection.popen is None


def test_a_closed_connection_says_no_goodbye(pair, monkeypatch):
    monkeypatch.setattr(_forkserver, "ROOT", (os.getpid(), "0"))
    connection = _forkserver.Connection((), pair[0], 1, None, None)
    connection.close()

    connection.shut_down(wait_s=0.0)

    assert pair[1].recv(100) == b""  # the end, no goodbye


# -- greeting a zygote: what each broken greeting says -----------------------------------------


def _greeted(pair, reply: bytes | None, within_s: float = 5.0) -> int:
    """Greet the far end of ``pair`` (standing in for a zygote that answers ``reply``, or closes
    its end after reading the hello, for None) and return what ``_hello`` returns."""
    ours, theirs = pair
    if reply is None:
        theirs.shutdown(socket.SHUT_WR)  # the hello is sent, the reply is the end of file
    else:
        theirs.send(reply)
    return _forkserver._hello(ours, time.monotonic() + within_s)


def test_a_zygote_s_ready_message_gives_its_pid(pair):
    assert _greeted(pair, b'{"event": "ready", "pid": 4242}') == 4242
    message, fds, _, _ = socket.recv_fds(pair[1], 100, 1)
    assert message == b'{"op": "hello"}'
    assert len(fds) == 1  # the guard table, handed over with the hello
    os.close(fds[0])


def test_a_zygote_that_closes_before_it_is_ready_says_so(pair):
    with pytest.raises(_forkserver.ZygoteFailure) as excinfo:
        _greeted(pair, None)

    assert str(excinfo.value) == "it exited before it was ready"


def test_a_zygote_that_answers_something_else_is_quoted(pair):
    with pytest.raises(_forkserver.ZygoteFailure) as excinfo:
        _greeted(pair, b'{"event": "busy"}')

    assert str(excinfo.value) == "expected a 'ready' message, got {'event': 'busy'}"


def test_a_silent_zygote_is_given_up_on_at_the_deadline(pair):
    started = time.monotonic()
    with pytest.raises(_forkserver.ZygoteFailure) as excinfo:
        _forkserver._hello(pair[0], time.monotonic() + 0.2)

    assert str(excinfo.value) == f"it was not ready within {_forkserver.STARTUP_S:g} s"
    assert time.monotonic() - started < _forkserver.REPLY_S


def test_a_zygote_s_name_says_whose_it_is(monkeypatch):
    monkeypatch.setattr(_forkserver, "ROOT", (12345, "678"))

    name = _forkserver.zygote_name(("numpy",))

    assert name.startswith(f"devmem-harness-{os.getuid()}-12345-678-")
    assert name != _forkserver.zygote_name(())  # another preload list, another zygote


def test_a_root_in_another_pid_namespace_has_another_zygote_name():
    # the same pid and start time in another PID namespace (a pod's other container, which
    # shares the network namespace and so the abstract names): another root, another zygote
    unshare = shutil.which("unshare")
    ours = [sys.executable, "-c", _NAME_OF_ROOT_12345]
    theirs = [unshare, "--pid", "--fork", *ours] if unshare else None
    if theirs is None or subprocess.run([*theirs[:3], "true"], capture_output=True).returncode:
        pytest.skip("no PID namespace can be made here (unshare needs root)")
    names = [
        subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout
        for command in (ours, ours, theirs)
    ]

    assert names[0] == names[1]  # the same root's, in the same namespace
    assert names[2] != names[0]


def test_the_pid_namespace_is_read_from_proc_or_is_0(monkeypatch):
    assert _forkserver._pid_namespace() == os.stat("/proc/self/ns/pid").st_ino != 0

    def stat(path, *args, **kwargs):
        raise FileNotFoundError(path)  # no /proc (or no namespaces): every root alike

    monkeypatch.setattr(_forkserver.os, "stat", stat)
    assert _forkserver._pid_namespace() == 0


_NAME_OF_ROOT_12345 = (
    "from harness import _forkserver\n"
    "_forkserver.ROOT = (12345, '678')\n"
    "print(_forkserver.zygote_name(('numpy',)))\n"
)


def test_connecting_to_a_root_s_zygote_takes_its_pid_and_gives_up_on_a_silent_one(monkeypatch):
    monkeypatch.setattr(_forkserver, "REPLY_S", 0.2)
    name = f"devmem-test-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setattr(_forkserver, "zygote_name", lambda key: name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind("\0" + name)
    listener.listen(2)
    try:
        assert _forkserver._connect(()) is None  # it listens but never says it is ready

        def answer() -> None:
            peer, _ = listener.accept()
            with peer:
                _, fds, _, _ = socket.recv_fds(peer, 100, 1)
                for fd in fds:
                    os.close(fd)
                peer.send(b'{"event": "ready", "pid": 777}')
                peer.recv(100)  # until the connection is dropped

        listener.accept()[0].close()  # the first, silent connection's
        helper = threading.Thread(target=answer, daemon=True)  # a failed assert leaves it waiting
        helper.start()
        made = _forkserver._connect(())
        assert made is not None and made.pid == 777 and made.popen is None
        made.close()
        helper.join(5)
    finally:
        listener.close()


# -- a request the zygote does not answer, or that cannot be sent ------------------------------


def _request_and_capture(timeout: float = 30):
    from harness._capture import Capture
    from harness._guard import table
    from harness._request import make_request

    target = "suites.harness._targets:give_back"
    request = make_request(target, (), env=None, config=None, timeout=timeout)
    return request, Capture(table())


def test_a_zygote_that_does_not_say_it_forked_is_given_up_on_at_startup_s(pair, monkeypatch):
    monkeypatch.setattr(_forkserver, "STARTUP_S", 0.3)

    raised, message, handed = _answered(pair, SILENT)

    assert b'"op": "run"' in message and handed == 4  # the request was handed over
    assert type(raised) is _forkserver.NotForked
    assert str(raised) == "it did not fork a child within 0.3 s"


SILENT = b""
"""For :func:`_answered`: the zygote says nothing at all."""


def _answered(pair, reply: bytes | None) -> tuple[BaseException | None, bytes, int]:
    """Run a request over ``pair`` with the test as the zygote, which answers ``reply`` (None:
    it hangs up instead; :data:`SILENT`: nothing): what ``run`` raised, the request's message
    and how many descriptors came with it."""
    connection = _forkserver.Connection((), pair[0], 1, None, None)
    request, capture = _request_and_capture()
    raised: list[BaseException] = []

    def run() -> None:
        try:
            connection.run(request, capture)
        except BaseException as exc:  # handed to the test's thread
            raised.append(exc)

    with capture:
        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        message, fds, _flags, _address = socket.recv_fds(pair[1], 1 << 16, 8)
        for fd in fds:
            os.close(fd)
        if reply is None:
            pair[1].shutdown(socket.SHUT_RDWR)
        elif reply:
            pair[1].send(reply)
        runner.join(10)
        if runner.is_alive():  # it would wait for ever: hang up, so the thread ends
            pair[1].close()
            runner.join(10)
            pytest.fail("run() did not end on the zygote's answer (no deadline?)")
    assert connection.closed is (len(raised) == 1 and type(raised[0]) is _forkserver.NotForked)
    return (raised[0] if raised else None), message, len(fds)


@pytest.mark.parametrize(
    "reply, kind, said",
    [
        (None, _forkserver.NotForked, "it exited unexpectedly"),
        (b"not json", _forkserver.NotForked, "unreadable message b'not json'"),
        (b"{" + b"x" * 300, _forkserver.NotForked, f"unreadable message {b'{' + b'x' * 199!r}"),
        (
            b'{"event": "forked", "id": 7, "pid": PID}',
            _forkserver.NotForked,
            "expected a 'forked' message, got {'event': 'forked', 'id': 7, 'pid': PID}",
        ),
        (
            b'{"event": "reaped", "id": 1}',
            _forkserver.NotForked,
            "expected a 'forked' message, got {'event': 'reaped', 'id': 1}",
        ),
        (b'{"event": "error", "id": 1, "message": "no"}', _forkserver.Refused, "no"),
        (b'{"event": "error", "id": 1}', _forkserver.Refused, "None"),
    ],
    ids=["hung-up", "not-json", "long-garbage", "other-id", "other-event", "error", "bare-error"],
)
def test_each_wrong_answer_of_a_zygote_is_said_as_it_came(pair, reply, kind, said):
    # an error is the zygote's refusal, quoted (the connection stays); anything else it says
    # instead of "forked" breaks the protocol: not forked, with what came, the first 200 bytes.
    # A pid in an answer is a process of the test's own, in a session of its own: a harness
    # that took the answer would kill that process's group (a made-up pid, 1 say, would be
    # some other process's, init's)
    decoy = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        if reply is not None:
            reply = reply.replace(b"PID", str(decoy.pid).encode())
        raised = _answered(pair, reply)[0]
    finally:
        decoy.kill()
        decoy.wait()

    assert type(raised) is kind
    assert str(raised) == said.replace("PID", str(decoy.pid))


@pytest.mark.parametrize(
    "error, said",
    [(ConnectionResetError(), "ConnectionResetError"), (OSError("boom"), "boom")],
    ids=["no-message", "message"],
)
def test_a_request_that_cannot_be_sent_is_not_forked_and_says_why(pair, monkeypatch, error, said):
    def send_fds(*args, **kwargs):
        raise error

    monkeypatch.setattr(_forkserver.socket, "send_fds", send_fds)
    connection = _forkserver.Connection((), pair[0], 1, None, None)
    request, capture = _request_and_capture()

    with capture, pytest.raises(_forkserver.NotForked) as excinfo:
        connection.run(request, capture)

    assert str(excinfo.value) == said  # an error with no words is named by its type
    assert excinfo.value.__cause__ is error
    assert connection.closed is True


def test_a_zygote_that_does_not_reap_a_killed_child_is_given_up_on_after_reply_s(pair, monkeypatch):
    # the zygote says it forked a child (a real process, in a group of its own, that ignores
    # SIGTERM), then says nothing more: past the deadline the child is killed, and the zygote,
    # which reaps a killed child at once, is given up on REPLY_S after the SIGKILL
    monkeypatch.setattr(_forkserver, "REPLY_S", 0.3)
    hang = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", hang + "; time.sleep(60)"],
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    child.stdout.readline()  # SIGTERM is ignored from here on
    connection = _forkserver.Connection((), pair[0], 1, None, None)
    request, capture = _request_and_capture(timeout=0.2)
    before = time.monotonic()

    def zygote() -> None:
        message, fds, _flags, _address = socket.recv_fds(pair[1], 1 << 16, 8)
        for fd in fds:
            os.close(fd)
        forked = {"event": "forked", "id": json.loads(message)["id"], "pid": child.pid}
        pair[1].send(json.dumps(forked).encode())

    stand_in = threading.Thread(target=zygote, daemon=True)
    stand_in.start()
    hang_up = threading.Timer(15, pair[1].close)  # a run that would wait for ever ends here
    hang_up.start()
    try:
        with capture:
            ending = connection.run(request, capture)
        took = time.monotonic() - before
    finally:
        hang_up.cancel()
        child.kill()
        child.wait()
        child.stdout.close()

    assert child.returncode == -9  # SIGKILL, after SIGTERM was ignored for the grace period
    assert ending.error == (
        f"the forkserver zygote failed: it did not reap child {child.pid} within 0.3 s"
    )
    assert ending.pid == child.pid  # the outcome still names the child
    assert took >= 0.2 + GRACE_S + 0.3  # deadline, SIGTERM's grace, then REPLY_S from SIGKILL
    assert before <= ending.started_at <= before + 5  # its duration from the zygote's reply
    assert connection.closed is True


def test_a_zygote_serves_its_root_after_the_root_s_connection_closed():
    # a zygote leaves when its root is gone or said goodbye, not when its last client does:
    # the root (or a process forked from it) that connects again finds the same zygote. A
    # preload list of its own, so that this test starts that zygote (the mutation run maps a
    # zygote's start-up and loop to the test that started it)
    key = ("colorsys",)
    first = _forkserver.connection(key)
    assert first.popen is not None  # started here
    try:
        first.close()
        time.sleep(0.5)  # the zygote has seen its only client go
        second = _forkserver.connection(key)

        assert second.pid == first.pid
        assert second.popen is None  # connected to, by its name: not started again
    finally:
        _forkserver.connection(key).shut_down()
        if os.getpid() == _forkserver.ROOT[0]:  # the root's goodbye: it leaves
            assert first.popen.wait(timeout=10) == 0


def test_a_zygote_whose_name_is_taken_serves_privately_then_leaves_with_its_client():
    # another zygote won the race for the name: this one serves the client that started it,
    # and once that client is gone (nobody else can reach it) it leaves, its spare with it
    key = ("colorsys", "wave")
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    squatter.bind("\0" + _forkserver.zygote_name(key))
    squatter.listen(1)
    try:
        connection = _forkserver._start(key)
        for _ in range(2):  # the second runs in the spare forked ahead after the first
            request, capture = _request_and_capture()
            with capture:
                ending = connection.run(request, capture)
            assert (ending.exit_code, ending.error) == (0, None)
        time.sleep(0.2)  # the next spare is forked ahead
        spares = _procs.children_of(connection.pid)
        connection.close()

        assert connection.popen.wait(timeout=10) == 0
        assert spares and all(_procs.wait_until_dead(pid) for pid in spares)
    finally:
        squatter.close()


def test_a_child_without_a_pidfd_is_seen_to_end_and_left_for_the_zygote_to_reap():
    # where pidfd_open is missing the zygote polls its children with waitid: ended, not yet
    # reaped (it reaps it itself, then kills what is left in its group)
    from harness._zygote import Zygote

    def ended(pid: int) -> bool:
        return Zygote._ended(None, pid)  # type: ignore[arg-type]  # uses nothing of the zygote

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    assert ended(child.pid) is False
    child.stdin.close()
    deadline = time.monotonic() + 10
    while not ended(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)

    assert ended(child.pid) is True
    assert os.waitpid(child.pid, 0) == (child.pid, 0)  # its status is still there to reap
    child.returncode = 0  # reaped here, not by the Popen


# -- how a zygote is started -------------------------------------------------------------------


def test_a_zygote_starts_apart_from_the_test_process(monkeypatch):
    # its own session (a terminal's signals to the test process's group do not reach it),
    # /dev/null for stdin and stdout (a pipe that reads pytest's output to its end does not
    # wait for the zygote), the start-up variables the test process started with (not one a
    # test set for a while), and a socket that keeps each message one packet
    monkeypatch.setenv("PYTHONDEVMODE", "1")  # set after this process started
    key = ("colorsys", "sunau")
    connection = _forkserver._start(key)
    try:
        pid = connection.pid
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")

        assert os.getsid(pid) == pid
        assert [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (0, 1)] == ["/dev/null"] * 2
        assert b"PYTHONDEVMODE=1" not in environ
        assert connection.sock.type == socket.SOCK_SEQPACKET
    finally:
        connection.shut_down()
        if connection.popen is not None:  # not the root (pytest --forked): it leaves later
            connection.popen.kill()
            connection.popen.wait()


def test_a_zygote_that_cannot_be_started_says_why_and_leaves_nothing_open(monkeypatch):
    def popen(*args, **kwargs):
        raise OSError("exec format error")

    monkeypatch.setattr(_forkserver.subprocess, "Popen", popen)
    before = sorted(os.listdir("/proc/self/fd"))

    with pytest.raises(_forkserver.ZygoteFailure) as excinfo:
        _forkserver._start(("colorsys",))

    assert str(excinfo.value) == f"cannot start {sys.executable!r}: exec format error"
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_a_zygote_that_never_says_hello_is_given_up_on_and_killed(tmp_path, monkeypatch):
    silent = tmp_path / "silent_zygote.py"
    silent.write_text(
        "import sys, time\nprint('about to sleep', file=sys.stderr)\ntime.sleep(60)\n"
    )
    monkeypatch.setattr(_forkserver, "ZYGOTE_PATH", str(silent))
    monkeypatch.setattr(_forkserver, "STARTUP_S", 1.0)
    started: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(_forkserver.subprocess, "Popen", popen)
    hang_up = threading.Timer(20, lambda: started and started[0].kill())
    hang_up.start()  # a start that would wait for ever for the hello ends here
    begun = time.monotonic()
    try:
        with pytest.raises(_forkserver.ZygoteFailure) as excinfo:
            _forkserver._start(("colorsys", "fractions"))
    finally:
        took = time.monotonic() - begun
        hang_up.cancel()

    assert "about to sleep" in str(excinfo.value)  # its stderr is quoted
    assert started[0].returncode == -9  # killed, and reaped
    assert took < 10  # given up on at STARTUP_S (1 s), not waited for until it was killed


def _stdin_of_a_zygote_started_with_a_pipe_for_stdin() -> str:
    """A death-test target: start a zygote while this process's stdin is a pipe."""
    read_end, _write_end = os.pipe()
    os.dup2(read_end, 0)
    connection = _forkserver._start(("colorsys", "aifc"))
    try:
        return os.readlink(f"/proc/{connection.pid}/fd/0")
    finally:
        connection.popen.kill()
        connection.popen.wait()
        connection.close()


def test_a_zygote_does_not_hold_the_test_process_s_stdin():
    # in a fork of this process, whose stdin may already be /dev/null (CI, xdist)
    outcome = harness.run_child(_stdin_of_a_zygote_started_with_a_pipe_for_stdin, style="fork")

    assert outcome.assert_clean().returned == "/dev/null"


class _FailingConnection:
    """Stands in for a connection whose run always fails with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.runs = 0

    def run(self, request, capture):
        self.runs += 1
        raise self.error


class _Capture:
    renewed = 0

    def renew(self) -> None:
        self.renewed += 1


@pytest.mark.parametrize(
    "error, runs, said",
    [
        (_forkserver.Refused("no such module"), 1, "could not run the child: no such module"),
        (_forkserver.NotForked("it exited"), 2, "failed: it exited (after one restart)"),
        (
            _forkserver.ZygoteFailure("no python"),
            2,
            "could not start: no python (after one restart)",
        ),
    ],
    ids=["refused", "not-forked", "not-started"],
)
def test_a_failing_zygote_is_restarted_once_then_the_ending_says_why(
    monkeypatch, error, runs, said
):
    failing = _FailingConnection(error)
    monkeypatch.setattr(_forkserver, "connection", lambda: failing)
    capture = _Capture()

    ending = _forkserver.launch_forkserver(None, capture)  # type: ignore[arg-type]

    assert ending.pid is None and ending.error == "the forkserver zygote " + said
    assert (failing.runs, capture.renewed) == (runs, runs - 1)  # fresh channels for the retry


# -- when a zygote leaves: its root dead (not yet reaped), its clients gone ------------------

_ORPHANED_ZYGOTE = r"""
import ctypes, json, os, signal, sys, time

# this process stands in for init: the zygote, and whatever it leaves unreaped, come to it
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
info, private = sys.argv[1], sys.argv[2] == "private"
root = os.fork()
if root == 0:  # the root: a child that hangs in a zygote of its own, and its socket held
    import socket, subprocess, threading
    from harness import _forkserver
    from harness._capture import Capture
    from harness._guard import table
    from harness._request import make_request
    if "MUTANT_UNDER_TEST" in os.environ:  # the zygote as the mutation run starts it
        from suites._mutmut import _own_zygotes
        _own_zygotes()
    key = ("colorsys",)
    if private:  # another zygote has the name: this one serves its client privately
        squatter = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        squatter.bind("\0" + _forkserver.zygote_name(key))
        squatter.listen(1)
    connection = _forkserver._start(key)
    pid_file = info + ".child"
    request = make_request(
        "suites.harness._targets:spawn_sleepers_and_hang", (pid_file, 0),
        env=None, config=None, timeout=120,
    )
    capture = Capture(table())
    capture.__enter__()
    threading.Thread(target=connection.run, args=(request, capture), daemon=True).start()
    # a process that outlives the root holds the root's end of the socket
    holder = subprocess.Popen(["sleep", "120"], pass_fds=(connection.sock.fileno(),))
    while not os.path.exists(pid_file):
        time.sleep(0.01)
    with open(info + ".tmp", "w") as out:
        json.dump({"zygote": connection.pid, "holder": holder.pid}, out)
    os.rename(info + ".tmp", info)
    os._exit(0)  # no goodbye: the root is gone

signal.alarm(60)
while not os.path.exists(info):
    time.sleep(0.01)
with open(info) as f:
    pids = json.load(f)
deadline, left = time.monotonic() + 15, False
while not left and time.monotonic() < deadline:  # the root stays unreaped meanwhile
    try:
        left = os.waitpid(pids["zygote"], os.WNOHANG)[0] != 0
    except ChildProcessError:  # not ours yet: the root has not ended
        pass
    time.sleep(0.02)
os.kill(pids["holder"], signal.SIGKILL)
reaped = []
while True:
    try:
        reaped.append(os.waitpid(-1, 0)[0])
    except ChildProcessError:
        break
print(json.dumps({"left": left, "reaped": reaped, "root": root, **pids}))
"""


@pytest.mark.parametrize("private", [False, True], ids=["named", "private"])
def test_a_zygote_leaves_once_its_root_ended_and_reaps_what_it_killed(tmp_path, private):
    # the root ends (unreaped: a zombie still has its /proc entry) while a child of it runs and
    # another process holds its socket: the zygote sees both ends by pidfd (no end of file
    # comes), kills the child, reaps it itself, and leaves. What it left unreaped would come
    # to the nearest subreaper, the script here
    info = tmp_path / "pids.json"
    run = subprocess.run(
        [sys.executable, "-c", _ORPHANED_ZYGOTE, str(info), "private" if private else "named"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    child = json.loads((tmp_path / "pids.json.child").read_text())["child"]

    assert seen["left"] is True, "the zygote stayed while its root was a zombie"
    # reaped after the zygote: the root and the socket's holder, and nothing the zygote left
    assert sorted(seen["reaped"]) == sorted([seen["root"], seen["holder"]])
    assert child not in seen["reaped"]  # it reaped its child before it left


def test_a_zygote_whose_root_s_pid_was_reused_leaves_with_its_last_client(monkeypatch):
    # the root's pid names another process by the time the zygote starts (its start ticks
    # differ): the root is gone, so the zygote leaves once its last client is; it does not
    # wait for the process that now has the pid (here, the test process itself)
    monkeypatch.setattr(_forkserver, "ROOT", (os.getpid(), "1"))
    connection = _forkserver._start(("colorsys", "fractions"))
    try:
        request, capture = _request_and_capture()
        with capture:
            ending = connection.run(request, capture)
        assert (ending.exit_code, ending.error) == (0, None)
        connection.close()

        assert connection.popen.wait(timeout=10) == 0
    finally:
        if connection.popen.poll() is None:
            connection.popen.kill()
            connection.popen.wait()


@pytest.mark.parametrize("measuring", [True, False], ids=["measuring", "not-measuring"])
def test_a_zygote_starts_coverage_from_the_variable_the_test_process_set(monkeypatch, measuring):
    # coverage.py's .pth hook starts measuring too; this is for an interpreter that skipped it
    # (python -S): the zygote asks coverage.py to start from COVERAGE_PROCESS_CONFIG itself
    coverage = pytest.importorskip("coverage")
    from harness._coverage import ENV_NAME
    from harness._zygote import _start_coverage

    calls = []
    monkeypatch.setattr(coverage, "process_startup", lambda: calls.append(os.environ[ENV_NAME]))
    monkeypatch.delenv(ENV_NAME, raising=False)
    if measuring:
        monkeypatch.setenv(ENV_NAME, "the test process's configuration")

    _start_coverage()

    assert calls == (["the test process's configuration"] if measuring else [])


def test_a_zygote_without_coverage_py_runs_its_children_unmeasured(monkeypatch):
    from harness._coverage import ENV_NAME
    from harness._zygote import _start_coverage

    monkeypatch.setenv(ENV_NAME, "the test process's configuration")
    monkeypatch.setitem(sys.modules, "coverage", None)  # import coverage raises ImportError

    _start_coverage()  # raises nothing


def test_a_long_preload_error_is_cut_so_its_message_still_reaches_the_client(tmp_path, monkeypatch):
    # a preload error of 100,000 characters made a message longer than the client reads (64
    # KiB): "unreadable message" and a needless restart, where the error belongs to the caller
    (tmp_path / "devmem_long_preload_error.py").write_text('raise ImportError("x" * 100_000)\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    harness.set_forkserver_preload(["devmem_long_preload_error"])
    try:
        outcome = harness.run_child(_targets.give_back, style="forkserver", timeout=30)
    finally:
        harness.set_forkserver_preload([])

    cut = "devmem_long_preload_error: ImportError: " + "x" * (4000 - 40)
    assert outcome.kind == "harness_error"
    assert outcome.error == (
        f"the forkserver zygote could not run the child: preloading failed ({cut}..."
        f" ({100_040 - 4000} more characters)); see harness.set_forkserver_preload"
    )


def test_a_connection_that_leaves_without_a_hello_does_not_end_the_zygote():
    # any process of ours may connect by the name; one that goes before it handed over a guard
    # table (a hello) leaves nothing to unmap, and the zygote serves on
    key = ("colorsys", "quopri")
    connection = _forkserver._start(key)
    try:
        stray = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        stray.connect("\0" + _forkserver.zygote_name(key))
        stray.close()
        time.sleep(0.3)  # the zygote has seen it go
        request, capture = _request_and_capture()
        with capture:
            ending = connection.run(request, capture)

        assert (ending.exit_code, ending.error) == (0, None)
        assert connection.popen.poll() is None
    finally:
        popen = connection.popen
        connection.close()
        popen.kill()  # not the root's goodbye: a --forked test's root is pytest's
        popen.wait()


# -- guard(): a zygote holds this process's guard table before a fork or exec child starts ----


def test_guard_tries_twice_then_says_why_no_zygote_guards_the_child(monkeypatch):
    tries: list[int] = []

    def connection() -> None:
        tries.append(1)
        if len(tries) <= 2:
            raise _forkserver.ZygoteFailure(f"failure {len(tries)}")

    monkeypatch.setattr(_forkserver, "connection", connection)
    monkeypatch.setattr(_forkserver, "_guarded_until", 0.0)

    said = _forkserver.guard()

    assert len(tries) == 2  # once, and once more: never a third time
    assert said == (
        "no zygote to guard the child (the process that kills the child's process group if "
        "this one dies) could be reached or started: failure 2"
    )


def test_a_forked_process_does_not_trust_its_parent_s_guard(monkeypatch):
    # the parent's zygote holds the parent's table: a process forked from it, even right after
    # the parent's check, has a zygote take its own table before its first child
    monkeypatch.setattr(_forkserver, "GUARD_CHECK_S", 600.0)  # the parent's check still holds
    assert _forkserver.guard() is None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the forked process reports through the pipe)
        try:
            found = _forkserver.guard(), _forkserver.current() is not None
            os.write(write, json.dumps(found).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read()
    assert os.waitpid(pid, 0)[1] == 0

    assert json.loads(said) == [None, True]  # guarded, by a connection of its own


def test_a_zygote_found_alive_is_trusted_for_guard_check_s(monkeypatch):
    # a check per child would cost the fork style much of its speed: one guard() holds for
    # GUARD_CHECK_S, in the process that made it
    calls: list[int] = []
    monkeypatch.setattr(_forkserver, "connection", lambda: calls.append(1))
    monkeypatch.setattr(_forkserver, "_guarded_until", 0.0)
    monkeypatch.setattr(_forkserver, "GUARD_CHECK_S", 600.0)
    monkeypatch.setattr(_forkserver, "_owner", os.getpid())  # adopted (pytest --forked)

    assert [_forkserver.guard() for _ in range(3)] == [None] * 3
    assert len(calls) == 1
    monkeypatch.setattr(_forkserver, "_guarded_until", time.monotonic() - 0.001)  # it ran out
    assert _forkserver.guard() is None
    assert len(calls) == 2


def test_a_gone_client_s_unread_messages_are_read_and_its_runs_dropped():
    # a client can go with messages the zygote has not read yet: its hello's guard table is
    # still taken (and each child in it killed), a run is never forked for it (its descriptors
    # are closed), and nothing else is answered. A zygote in this process, over a socket pair
    from harness._child import SEAL_BYTES, start_ticks
    from harness._zygote import Zygote

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    zygote = Zygote(theirs, os.getpid(), start_ticks(os.getpid()), None)
    client = next(iter(zygote.clients.values()))
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a child in its table
    table = os.memfd_create("guard-table")
    os.ftruncate(table, 2 * SEAL_BYTES)
    os.pwrite(table, f"{sleeper.pid}\n".encode(), SEAL_BYTES)
    pipes = [os.pipe() for _ in range(4)]
    try:
        run = json.dumps({"op": "run", "id": 1, "seal_offset": SEAL_BYTES}).encode()
        socket.send_fds(ours, [run], [w for _, w in pipes])  # dropped, and the next one read
        for _, w in pipes:
            os.close(w)
        socket.send_fds(ours, [b'{"op": "hello"}'], [table])

        zygote._gone(client)

        assert sleeper.wait(timeout=10) == -9  # killed: its pid was in the table
        for r, _ in pipes:  # the zygote closed the run's descriptors: every write end is shut
            os.set_blocking(r, False)
            assert os.read(r, 1) == b""
        replies = []
        while data := ours.recv(1 << 16, socket.MSG_DONTWAIT):  # b"": the zygote hung up
            replies.append(json.loads(data))
        assert replies == [{"event": "ready", "pid": os.getpid()}]
        assert zygote.clients == {}
    finally:
        sleeper.kill()
        sleeper.wait()
        for r, _ in pipes:
            os.close(r)
        os.close(table)
        ours.close()
        if zygote.root_fd is not None:
            os.close(zygote.root_fd)


@pytest.mark.parametrize(
    "pid",
    ["0", "1", "-1", '"0"', "false", None],
    ids=["zero", "init", "minus-one", "str", "bool", "missing"],
)
def test_a_forked_message_without_a_child_s_pid_is_not_taken(pair, monkeypatch, pid):
    # the child's group is killed by its pid: 0 is this process's own group, 1 init's, -1
    # every process. kill_group refuses those too, and here it is watched
    signalled: list[int] = []
    monkeypatch.setattr(_forkserver, "kill_group", lambda pid, sig: signalled.append(pid))
    field = "" if pid is None else f', "pid": {pid}'
    reply = f'{{"event": "forked", "id": 1{field}}}'

    raised = _answered(pair, reply.encode())[0]

    assert type(raised) is _forkserver.NotForked
    assert str(raised) == f"a 'forked' message without a child's pid: {json.loads(reply)!r}"
    assert signalled == []


@pytest.mark.parametrize("pid", [0, 1, -1, -4242])
def test_kill_group_never_signals_a_pid_below_2(monkeypatch, pid):
    from harness import _reap

    sent: list[tuple] = []
    monkeypatch.setattr(_reap.os, "killpg", lambda *args: sent.append(("killpg", *args)))
    monkeypatch.setattr(_reap.os, "kill", lambda *args: sent.append(("kill", *args)))

    _reap.kill_group(pid, signal.SIGKILL)
    _reap.kill_group(2, signal.SIGKILL)  # the smallest pid it signals

    assert sent == [("killpg", 2, signal.SIGKILL)]


@pytest.mark.parametrize("pid", [0, 1, -1])
def test_the_zygote_never_kills_a_group_below_2(monkeypatch, pid):
    # its pids come from guard-table pages too, which a target's stray write could scribble on
    from harness import _zygote

    sent: list[tuple] = []
    monkeypatch.setattr(_zygote.os, "killpg", lambda *args: sent.append(("killpg", *args)))
    monkeypatch.setattr(_zygote.os, "kill", lambda *args: sent.append(("kill", *args)))

    _zygote._kill_group(pid)
    _zygote._kill_group(2)

    assert sent == [("killpg", 2, signal.SIGKILL)]


# -- the zygote's own fork (not the spare's), in this process over a socket pair ------------------


@pytest.fixture
def zygote_here(monkeypatch):
    """A zygote in this process whose root and only client is this process, with a guard table
    of two pages: ``(our end of its socket, the zygote, its client, the table's descriptor)``.
    It is never served: a test calls what it checks. Its preload counts as done (nothing is
    imported or frozen here) and the environment its requests set is restored afterwards."""
    from harness import _zygote
    from harness._child import ENV_FLAG, SEAL_BYTES, start_ticks
    from harness._zygote import Zygote

    monkeypatch.setenv(ENV_FLAG, "")  # a request sets it: restored (or unset) at teardown
    monkeypatch.delenv(ENV_FLAG)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    zygote = Zygote(theirs, os.getpid(), start_ticks(os.getpid()), None)
    zygote.preloaded = {}
    client = next(iter(zygote.clients.values()))
    table = os.memfd_create("guard-table")
    os.ftruncate(table, 2 * SEAL_BYTES)
    zygote._handle(client, b'{"op": "hello"}', [table])
    assert json.loads(ours.recv(1 << 16)) == {"event": "ready", "pid": os.getpid()}
    try:
        yield ours, zygote, client, table
    finally:
        pids = [*zygote.children, *([zygote.spare.pid] if zygote.spare is not None else [])]
        pids += [h.spare.pid for h in zygote.handing.values() if h.spare is not None]
        for pid in pids:  # a test that failed half-way: none is left running
            _zygote._kill_group(pid)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        for child in zygote.children.values():
            for fd in child.pipes:
                os.close(fd)
            if child.pidfd >= 0:
                os.close(child.pidfd)
        if client.sock.fileno() >= 0:  # not gone yet
            zygote._gone(client)  # closes the table, its mapping and the zygote's end
        ours.close()
        if zygote.root_fd is not None:
            os.close(zygote.root_fd)


def _four_pipes(request: int | None = None) -> tuple[list[int], list[int]]:
    """A request's four descriptors as the zygote gets them (write ends), and the read ends,
    which see end of file once the zygote has closed each of them. ``request``: the request
    file's descriptor to give instead of the first pipe's (whose write end is closed then)."""
    pipes = [os.pipe() for _ in range(4)]
    fds = [w for _, w in pipes]
    if request is not None:
        os.close(fds[0])
        fds[0] = request
    return fds, [r for r, _ in pipes]


def _request_file(data: bytes = b"") -> int:
    """A request file holding ``data``: a memfd, read from its start."""
    fd = os.memfd_create("request")
    os.write(fd, data)
    return fd


def _closed(read_ends: list[int]) -> list[bool]:
    """For each pipe, whether every write end is closed (what was written is read past);
    closes the read ends."""
    shut = []
    for r in read_ends:
        os.set_blocking(r, False)
        try:
            while os.read(r, 1 << 16):
                pass
            shut.append(True)
        except BlockingIOError:
            shut.append(False)
        os.close(r)
    return shut


def _replies(ours: socket.socket) -> list[dict]:
    """The zygote's messages waiting on ``ours``, up to its hang-up if it hung up."""
    replies = []
    while True:
        try:
            data = ours.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return replies
        if not data:
            return replies
        replies.append(json.loads(data))


_REQUEST = b'{"target": "suites.harness._targets:hygiene", "args": []}\n{}'


@pytest.mark.parametrize(
    "data, failure, said",
    [
        (b"no json", None, "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"),
        (
            b'{"target": "m:f"}\n["a list"]',
            None,
            "ValueError: dictionary update sequence element #0 has length 6; 2 is required",
        ),
        (_REQUEST, OSError(5, "Input/output error"), "OSError: [Errno 5] Input/output error"),
    ],
    ids=["not-json", "setting-not-a-dict", "unreadable"],
)
def test_a_request_the_zygote_cannot_read_is_refused_with_its_descriptors_closed(
    zygote_here, data, failure, said
):
    from harness._child import SEAL_BYTES

    ours, zygote, client, _ = zygote_here
    fds, read_ends = _four_pipes()

    zygote._fork_for(client, 7, fds, SEAL_BYTES, data, failure)

    assert _replies(ours) == [{"event": "error", "id": 7, "message": f"bad request: {said}"}]
    assert _closed(read_ends) == [True] * 4
    assert zygote.children == {} and client.children == {}


@pytest.mark.parametrize("length", [3999, 4000], ids=["under", "at-the-cut"])
def test_preload_errors_are_each_named_and_cut_only_past_4000_characters(zygote_here, length):
    from harness._child import SEAL_BYTES

    ours, zygote, client, _ = zygote_here
    zygote.preloaded = {"a": "ImportError: x", "b": "E" * (length - len("a: ImportError: x; b: "))}
    fds, read_ends = _four_pipes()

    zygote._fork_for(client, 7, fds, SEAL_BYTES, _REQUEST)

    detail = f"a: ImportError: x; b: {zygote.preloaded['b']}"
    assert len(detail) == length  # not cut: "... (N more characters)" only past 4000
    assert _replies(ours) == [
        {
            "event": "error",
            "id": 7,
            "message": f"preloading failed ({detail}); see harness.set_forkserver_preload",
        }
    ]
    assert _closed(read_ends) == [True] * 4


def test_a_fork_that_fails_in_the_zygote_is_refused_with_its_descriptors_closed(
    zygote_here, monkeypatch
):
    from harness import _zygote
    from harness._child import SEAL_BYTES

    ours, zygote, client, _ = zygote_here
    fds, read_ends = _four_pipes()

    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(_zygote.os, "fork", no_fork)
    zygote._fork_for(client, 7, fds, SEAL_BYTES, _REQUEST)

    message = "os.fork() failed in the zygote: [Errno 11] Resource temporarily unavailable"
    assert _replies(ours) == [{"event": "error", "id": 7, "message": message}]
    assert _closed(read_ends) == [True] * 4
    assert zygote.children == {}


@pytest.mark.parametrize("page", [1, 2], ids=["in-the-table", "past-its-end"])
def test_the_zygote_s_child_seals_its_page_dies_with_the_zygote_and_reports(zygote_here, page):
    # the zygote's own fork (no spare): the child writes its pid into its page of the client's
    # guard table (an offset past the table's end gets no seal: the child runs all the same),
    # takes the zygote as the parent it dies with, and its status channel (whose identity the
    # zygote took before the fork) carries its final record; reaped, its page is wiped (its
    # pid may be reused) and the client told
    from harness._child import SEAL_BYTES, SEAL_FINAL_AT

    offset = page * SEAL_BYTES

    ours, zygote, client, table = zygote_here
    status = os.memfd_create("status")
    outputs = [os.memfd_create("stdout"), os.memfd_create("stderr")]
    request_r, request_w = os.pipe()
    os.close(request_w)
    fds = [request_r, *(os.dup(fd) for fd in outputs), os.dup(status)]
    try:
        zygote._fork_for(client, 7, fds, offset, _REQUEST)

        (pid,) = zygote.children
        assert zygote.children[pid].pidfd >= 0  # watched by its pidfd
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # ended, still ours to reap
        sealed = os.pread(table, 32, SEAL_BYTES)
        assert sealed.startswith(f"{pid}\n".encode()) if page == 1 else sealed == bytes(32)
        assert os.pread(table, 32, 0) == bytes(32)  # the other page is untouched
        assert os.fstat(table).st_size == 2 * SEAL_BYTES
        records = [json.loads(line) for line in os.pread(status, 1 << 16, 0).splitlines()]
        assert [record["event"] for record in records] == ["started", "returned"], os.pread(
            outputs[1], 4096, 0
        )
        seen = records[-1]["value"]
        assert seen["pid"] == pid and seen["deathsig"] == signal.SIGKILL
        assert client.children == {pid: 7}

        zygote._reap(pid)

        assert os.pread(table, SEAL_FINAL_AT, SEAL_BYTES) == bytes(SEAL_FINAL_AT)
        assert _replies(ours) == [
            {"event": "forked", "id": 7, "pid": pid},
            {"event": "reaped", "id": 7, "pid": pid, "status": 0},
        ]
        assert zygote.children == {} and client.children == {}
    finally:
        os.close(status)
        for fd in outputs:
            os.close(fd)


def test_a_gone_client_leaves_no_trace_in_the_zygote(zygote_here):
    # its pidfd no longer names it (the number is reused for the next descriptor), its child
    # and its request being handed to the spare are no longer its (nothing is sent to it),
    # and the child, reaped later, is reaped without it
    from harness._child import SEAL_BYTES
    from harness._zygote import _Handing

    ours, zygote, client, _ = zygote_here
    status = os.memfd_create("status")
    request_r, request_w = os.pipe()
    os.close(request_w)
    fds = [request_r, os.dup(status), os.dup(status), os.dup(status)]
    zygote._fork_for(client, 7, fds, SEAL_BYTES, _REQUEST)
    (pid,) = zygote.children
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    zygote.handing[-1] = handing = _Handing(None, client, 8, [], SEAL_BYTES, b"")
    assert client.pidfd is not None and zygote.by_pidfd == {client.pidfd: client}

    zygote._gone(client)

    assert zygote.by_pidfd == {} and zygote.clients == {}
    assert zygote.children[pid].client is None and handing.client is None
    zygote._reap(pid)
    assert zygote.children == {}
    assert _replies(ours) == [{"event": "forked", "id": 7, "pid": pid}]  # no "reaped"
    os.close(status)


def test_a_zygote_leaves_by_posix_s_own_exit_not_a_replaced_os_exit(monkeypatch):
    # coverage.py measuring the children replaces os._exit with one that saves a data file:
    # a zygote or a spare leaving by it would leave a stray file after the run combined them
    import posix

    from harness import _zygote

    class Left(Exception):
        pass

    calls = []

    def exit_by(name):
        def leave(code):
            calls.append((name, code))
            raise Left

        return leave

    monkeypatch.setattr(os, "_exit", exit_by("os"))
    monkeypatch.setattr(posix, "_exit", exit_by("posix"))
    with pytest.raises(Left):
        _zygote._leave_quietly(3)
    assert calls == [("posix", 3)]


def test_a_child_without_a_pidfd_is_kept_as_such_and_reaped(zygote_here, monkeypatch):
    # a kernel without pidfd_open (before 5.3): the zygote polls the child's end instead
    from harness import _zygote
    from harness._child import SEAL_BYTES

    ours, zygote, client, _ = zygote_here
    monkeypatch.setattr(_zygote, "_pidfd", lambda pid: None)
    fds, read_ends = _four_pipes(os.open(os.devnull, os.O_RDONLY))

    zygote._fork_for(client, 7, fds, SEAL_BYTES, _REQUEST)

    (pid,) = zygote.children
    assert zygote.children[pid].pidfd == -1
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    zygote._step()  # no pidfd: the poll times out at 50 ms, and waitid sees the end

    assert zygote.children == {}
    replies = _replies(ours)
    assert [reply["event"] for reply in replies] == ["forked", "reaped"]
    assert _closed(read_ends[1:3]) == [True, True]  # the zygote's copies of its pipes, closed
    for fd in (read_ends[0], read_ends[3]):
        os.close(fd)


def test_a_zygote_s_child_whose_set_up_raised_leaves_with_the_harness_error_status(
    zygote_here, monkeypatch
):
    # run_child never returns; were it to raise, the child (a copy of the zygote) must not go
    # on with the zygote's loop: it leaves with EXIT_HARNESS_ERROR
    from harness._child import EXIT_HARNESS_ERROR, SEAL_BYTES

    ours, zygote, client, _ = zygote_here
    here = os.getpid()

    def raising(*args, **kwargs):
        raise RuntimeError("run_child raised")

    monkeypatch.setattr(zygote.child, "run_child", raising)
    fds, read_ends = _four_pipes(os.open(os.devnull, os.O_RDONLY))
    try:
        zygote._fork_for(client, 7, fds, SEAL_BYTES, _REQUEST)
    except BaseException:
        if os.getpid() != here:  # this test's copy in the child: never run pytest on there
            os._exit(99)
        raise

    (pid,) = zygote.children
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    zygote._reap(pid)
    reaped = _replies(ours)[-1]
    assert reaped["event"] == "reaped"
    assert os.waitstatus_to_exitcode(reaped["status"]) == EXIT_HARNESS_ERROR
    for fd in read_ends:
        os.close(fd)


@pytest.mark.parametrize("gone", [False, True], ids=["its-client-waits", "its-client-went"])
def test_a_request_handed_to_the_spare(zygote_here, gone):
    # the zygote forks a spare ahead of the request, hands the request to it, and, once the
    # spare said "taken", tells the client it forked (the spare's pid); the child seals its
    # page, and reaped, its page is wiped. A client gone after the spare said "taken": the
    # child is killed with the client's, and reaped as nobody's, its pipes kept until then
    from harness._child import SEAL_BYTES, SEAL_FINAL_AT

    ours, zygote, client, table = zygote_here
    zygote.applied = b"{}"  # the setting the spare is forked with: the request's
    zygote._fork_spare()
    spare = zygote.spare
    assert spare is not None
    status = os.memfd_create("status")
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()

    zygote._run(client, 7, [_request_file(_REQUEST), out_w, err_w, os.dup(status)], SEAL_BYTES)

    assert zygote.spare is None
    ((_fd, handing),) = zygote.handing.items()
    assert handing.spare is spare and client.children == {spare.pid: 7}
    assert select.select([spare.sock], [], [], 30)[0], "the spare never said it took it"
    if gone:
        zygote._gone(client)
        assert handing.client is None
    zygote._taken(handing)

    assert zygote.handing == {}
    # the spare's socket, closed, is out of the poll set (else poll would return at once, for
    # good: POLLNVAL, a busy loop)
    assert [fd for fd, event in zygote.poller.poll(0) if event & select.POLLNVAL] == []
    os.waitid(os.P_PID, spare.pid, os.WEXITED | os.WNOWAIT)
    if gone:
        child = zygote.children[spare.pid]
        assert (child.client, child.offset, child.pipes) == (None, None, (out_w, err_w))
        assert child.pidfd == spare.pidfd
        zygote._reap(spare.pid)
        assert _replies(ours) == []  # nothing to a gone client
    else:
        records = [json.loads(line) for line in os.pread(status, 1 << 16, 0).splitlines()]
        assert [record["event"] for record in records] == ["started", "returned"]
        assert records[-1]["value"]["pid"] == spare.pid
        assert os.pread(table, 32, SEAL_BYTES).startswith(f"{spare.pid}\n".encode())
        zygote._reap(spare.pid)
        assert os.pread(table, SEAL_FINAL_AT, SEAL_BYTES) == bytes(SEAL_FINAL_AT)  # wiped
        assert _replies(ours) == [
            {"event": "forked", "id": 7, "pid": spare.pid},
            {"event": "reaped", "id": 7, "pid": spare.pid, "status": 0},
        ]
    assert zygote.children == {}
    assert [fd for fd, event in zygote.poller.poll(0) if event & select.POLLNVAL] == []
    assert _closed([out_r, err_r]) == [True, True]  # the zygote's copies closed at the reaping
    os.close(status)


@pytest.mark.parametrize("why", ["died", "unknown-client", "another-setting"])
def test_a_spare_that_cannot_take_the_request_is_sent_away_and_a_child_forked(zygote_here, why):
    # a spare that died, that was forked before this client came (it has not mapped its guard
    # table), or whose setting is another (not only in its variables): the zygote forks a
    # child for the request, and the spare is reaped as nobody's (sent away, it leaves by 0)
    from harness import _zygote
    from harness._child import SEAL_BYTES

    ours, zygote, client, _ = zygote_here
    zygote.applied = b"{}"
    zygote._fork_spare()
    spare = zygote.spare
    data = _REQUEST
    if why == "died":
        _zygote._kill_group(spare.pid)
        os.waitid(os.P_PID, spare.pid, os.WEXITED | os.WNOWAIT)
    elif why == "unknown-client":
        spare.known = frozenset()
    else:
        data = _REQUEST.replace(b"\n{}", b'\n{"invalidate_caches": true}')
    fds, read_ends = _four_pipes(_request_file(data))

    zygote._run(client, 7, fds, SEAL_BYTES)

    assert zygote.spare is None and zygote.handing == {}
    sent_away = zygote.children[spare.pid]
    assert (sent_away.client, sent_away.pipes) == (None, ())
    (pid,) = set(zygote.children) - {spare.pid}
    assert zygote.children[pid].client is client
    left = os.waitid(os.P_PID, spare.pid, os.WEXITED | os.WNOWAIT)
    if why == "died":
        assert (left.si_code, left.si_status) == (os.CLD_KILLED, signal.SIGKILL)
    else:  # it read end of file, ran nothing
        assert (left.si_code, left.si_status) == (os.CLD_EXITED, 0)
    for ended in (spare.pid, pid):
        os.waitid(os.P_PID, ended, os.WEXITED | os.WNOWAIT)
        zygote._reap(ended)
    replies = _replies(ours)
    assert replies == [
        {"event": "forked", "id": 7, "pid": pid},
        {"event": "reaped", "id": 7, "pid": pid, "status": 0},
    ]
    assert zygote.children == {} and client.children == {}
    for fd in read_ends:
        os.close(fd)


@pytest.mark.parametrize("gone", [False, True], ids=["its-client-waits", "its-client-went"])
def test_a_spare_that_died_before_it_took_the_request(zygote_here, gone):
    # the spare got the request and died before it said "taken" (it ran none of it): the
    # zygote forks a child for the request, unless the client is gone (its descriptors are
    # closed then); the spare is reaped as nobody's
    from harness import _zygote
    from harness._child import SEAL_BYTES

    ours, zygote, client, table = zygote_here
    zygote.applied = b"{}"
    zygote._fork_spare()
    spare = zygote.spare
    os.kill(spare.pid, signal.SIGSTOP)  # it cannot take the request
    os.waitid(os.P_PID, spare.pid, os.WSTOPPED | os.WNOWAIT)
    fds, read_ends = _four_pipes(_request_file(_REQUEST))

    zygote._run(client, 7, fds, SEAL_BYTES)

    ((_fd, handing),) = zygote.handing.items()
    _zygote._kill_group(spare.pid)
    os.waitid(os.P_PID, spare.pid, os.WEXITED | os.WNOWAIT)
    if gone:
        zygote._gone(client)
    assert select.select([spare.sock], [], [], 30)[0]
    zygote._taken(handing)

    assert zygote.handing == {}
    assert (zygote.children[spare.pid].client, zygote.children[spare.pid].pipes) == (None, ())
    forked = set(zygote.children) - {spare.pid}
    zygote._reap(spare.pid)
    if gone:
        assert forked == set()
        assert _closed(read_ends) == [True] * 4
        assert _replies(ours) == []
        return
    (pid,) = forked
    assert client.children == {pid: 7}
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    assert os.pread(table, 32, SEAL_BYTES).startswith(f"{pid}\n".encode())  # its page
    zygote._reap(pid)
    assert _replies(ours) == [
        {"event": "forked", "id": 7, "pid": pid},
        {"event": "reaped", "id": 7, "pid": pid, "status": 0},
    ]
    assert client.children == {} and zygote.children == {}
    assert _closed(read_ends) == [True] * 4


def test_a_spare_whose_serving_raised_leaves_with_the_harness_error_status(
    zygote_here, monkeypatch
):
    # _serve_as_spare never returns; were it to raise, the spare (a copy of the zygote) must
    # not go on with the zygote's loop: it leaves with EXIT_HARNESS_ERROR
    from harness._child import EXIT_HARNESS_ERROR

    _ours, zygote, _client, _ = zygote_here
    here = os.getpid()

    def raising(sock_fd: int) -> None:
        raise RuntimeError("serving raised")

    monkeypatch.setattr(zygote, "_serve_as_spare", raising)
    zygote.applied = b"{}"
    try:
        zygote._fork_spare()
    except BaseException:
        if os.getpid() != here:  # this test's copy in the spare: never run pytest on there
            os._exit(99)
        raise

    spare = zygote.spare
    left = os.waitid(os.P_PID, spare.pid, os.WEXITED | os.WNOWAIT)
    assert (left.si_code, left.si_status) == (os.CLD_EXITED, EXIT_HARNESS_ERROR)
    zygote._retire_spare()
    zygote._reap(spare.pid)
    assert zygote.children == {}


def test_without_a_pidfd_a_spare_is_killed_and_reaped_at_once(zygote_here, monkeypatch):
    # nothing would tell the zygote that a spare died (kernels before 5.3): it keeps none
    from harness import _zygote

    _ours, zygote, _client, _ = zygote_here
    asked: list[int] = []

    def no_pidfd(pid: int) -> None:
        asked.append(pid)

    monkeypatch.setattr(_zygote, "_pidfd", no_pidfd)
    zygote.applied = b"{}"

    zygote._fork_spare()

    assert zygote.spare is None and zygote.children == {}
    (pid,) = asked
    with pytest.raises(ChildProcessError):  # reaped already: no zombie is left
        os.waitpid(pid, os.WNOHANG)


@pytest.mark.parametrize("setting", [b"{}", b'{"invalidate_caches": true}'], ids=["its", "another"])
def test_a_request_forked_for_beside_a_spare_keeps_it_only_if_it_has_the_spare_s_setting(
    zygote_here, setting
):
    # a request without a page in the guard table is never handed to the spare; the zygote
    # forks for it, and sends the spare away only if it applied another setting for it
    from harness._child import SEAL_BYTES

    _ours, zygote, client, _ = zygote_here
    zygote.applied = b"{}"
    zygote._fork_spare()
    spare = zygote.spare
    fds, read_ends = _four_pipes(_request_file(_REQUEST.replace(b"\n{}", b"\n" + setting)))

    zygote._run(client, 7, fds, 2 * SEAL_BYTES)  # past the table's end

    (pid,) = set(zygote.children) - {spare.pid}
    if setting == b"{}":
        assert zygote.spare is spare and spare.pid not in zygote.children
        zygote._retire_spare()
    else:
        assert zygote.spare is None and zygote.children[spare.pid].client is None
    for ended in (pid, spare.pid):
        os.waitid(os.P_PID, ended, os.WEXITED | os.WNOWAIT)
        zygote._reap(ended)
    for fd in read_ends:
        os.close(fd)


def test_the_zygote_kills_a_process_without_a_group_of_its_own_by_its_pid():
    # a child killed before it took its own group (setpgid) leads none: killpg finds no group
    from harness import _zygote

    sleeper = subprocess.Popen(["sleep", "60"])  # in this process's group, not a leader
    try:
        _zygote._kill_group(sleeper.pid)
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("given", [3, 5])
def test_a_run_without_its_four_descriptors_is_refused_with_them_closed(zygote_here, given):
    from harness._child import SEAL_BYTES

    ours, zygote, client, _ = zygote_here
    pipes = [os.pipe() for _ in range(given)]

    zygote._run(client, 7, [w for _, w in pipes], SEAL_BYTES)

    assert _replies(ours) == [
        {"event": "error", "id": 7, "message": f"expected 4 descriptors, got {given}"}
    ]
    assert _closed([r for r, _ in pipes]) == [True] * given
    assert zygote.children == {}


def test_a_request_file_the_zygote_cannot_read_is_a_bad_request(zygote_here, tmp_path):
    from harness._child import SEAL_BYTES

    ours, zygote, client, _ = zygote_here
    unreadable = os.open(tmp_path / "request", os.O_WRONLY | os.O_CREAT)
    fds, read_ends = _four_pipes(unreadable)

    zygote._run(client, 7, fds, SEAL_BYTES)

    message = "bad request: OSError: [Errno 9] Bad file descriptor"
    assert _replies(ours) == [{"event": "error", "id": 7, "message": message}]
    assert _closed(read_ends[1:]) == [True] * 3
    os.close(read_ends[0])


def test_a_client_without_a_guard_table_gets_its_child_unsealed(zygote_here):
    # its hello came without a table (or the table could not be mapped): no page fits
    from harness._child import SEAL_BYTES

    ours, zygote, client, _ = zygote_here
    client.table_map.close()
    client.table_map = None
    fds, read_ends = _four_pipes(_request_file(_REQUEST))

    zygote._run(client, 7, fds, SEAL_BYTES)

    (pid,) = zygote.children
    assert zygote.children[pid].offset is None  # nothing to wipe at its reaping
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    zygote._reap(pid)
    assert [reply["event"] for reply in _replies(ours)] == ["forked", "reaped"]
    for fd in read_ends:
        os.close(fd)


def test_a_request_the_zygote_forks_for_itself_is_sealed_in_its_page(zygote_here):
    # no spare: the zygote's own fork, through _run, seals the child in the page it was given
    from harness._child import SEAL_BYTES

    ours, zygote, client, table = zygote_here
    fds, read_ends = _four_pipes(_request_file(_REQUEST))

    zygote._run(client, 7, fds, SEAL_BYTES)

    (pid,) = zygote.children
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    assert os.pread(table, 32, SEAL_BYTES).startswith(f"{pid}\n".encode())
    zygote._reap(pid)
    assert [reply["event"] for reply in _replies(ours)] == ["forked", "reaped"]
    for fd in read_ends:
        os.close(fd)


@pytest.mark.parametrize("table", ["none", "empty"])
def test_a_hello_without_a_table_it_can_map_leaves_the_client_without_one(zygote_here, table):
    # a hello with no descriptor, or with a table of 0 bytes (nothing to map): the client is
    # ready all the same, and leaves without a trace
    _ours, zygote, _client, _ = zygote_here
    theirs, ours = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    zygote._add_client(theirs)
    client = zygote.clients[theirs.fileno()]
    fds = [] if table == "none" else [os.memfd_create("empty-table")]

    zygote._handle(client, b'{"op": "hello"}', fds)

    assert json.loads(ours.recv(1 << 16)) == {"event": "ready", "pid": os.getpid()}
    assert client.table_map is None
    assert (client.table is None) is (table == "none")
    zygote._gone(client)
    assert client.table is None and theirs.fileno() == -1
    ours.close()


@pytest.mark.parametrize(
    "message",
    [
        b'{"op": "frobnicate", "id": 7}',
        b"not json at all",
        b'{"op": "x", "pad": "' + b"y" * 300 + b'"}',
    ],
    ids=["unknown-op", "not-json", "long"],
)
def test_a_message_the_zygote_does_not_know_is_an_error_naming_it_and_its_fds_are_closed(
    zygote_here, message
):
    # a client of another version, or a bug: the reply names the message (its first 200
    # bytes) and the request's id; descriptors sent with it are not kept
    ours, zygote, client, _table = zygote_here
    fds, read_ends = _four_pipes()

    zygote._handle(client, message, fds)

    ident = 7 if b"frobnicate" in message else None
    said = f"unknown message {message[:200]!r}"
    assert _replies(ours) == [{"event": "error", "id": ident, "message": said}]
    assert _closed(read_ends) == [True] * 4
    assert zygote.clients and not zygote.children  # nothing forked, the client kept


def test_a_client_whose_socket_cannot_be_read_is_gone(zygote_here, monkeypatch):
    # an error reading its socket (ECONNRESET, say) ends the client as its end of file does:
    # no reply, its socket closed, the client forgotten
    ours, zygote, client, _table = zygote_here

    def reset(*args):
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(socket, "recv_fds", reset)
    zygote._read(client)

    assert not zygote.clients
    assert client.sock.fileno() == -1
    assert ours.recv(1 << 16) == b""  # the zygote's end is closed: nothing was sent


# -- the rehearsals: a zygote's and a spare's steps run ahead on made-up data -------------------


def _in_a_fork(call) -> dict:
    """``call()`` in a fork of this process: ``{"returned": <its JSON value>}``, or
    ``{"raised": "<type>: <message>"}``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            result = {"returned": call()}
        except BaseException as exc:
            result = {"raised": f"{type(exc).__name__}: {exc}"}
        try:
            os.write(write_end, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 1 << 16):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks))


def test_passing_descriptors_to_itself_returns_the_message_and_leaves_nothing_open():
    from harness import _zygote

    before = _procs.open_fds()
    received = _zygote._pass_descriptors({"op": "run", "id": 3, "seal_offset": 64}, 4)
    assert json.loads(received) == {"op": "run", "id": 3, "seal_offset": 64}
    assert _procs.open_fds() == before


@pytest.mark.parametrize("spare", [False, True], ids=["no-spare", "spare"])
def test_the_zygote_s_rehearsal_of_a_hand_over_completes_and_leaves_nothing_behind(spare):
    # a rehearsal that fails is swallowed where it runs (it costs the next request its page
    # copies, no more), so here it is called alone: it must run to its end and leave no
    # descriptor open and no variable changed
    from harness import _child, _zygote

    setting = b'{"environ": {"DEVMEM_REHEARSED": "1"}}'
    made_up = _zygote._Spare(-1, -1, None, setting, json.loads(setting), frozenset())
    zygote = types.SimpleNamespace(spare=made_up if spare else None, child=_child)
    before, environ = _procs.open_fds(), dict(os.environ)

    assert _zygote.Zygote._rehearse_forward(zygote) is None

    assert (_procs.open_fds(), dict(os.environ)) == (before, environ)


def test_the_spare_s_rehearsal_completes_and_leaves_nothing_behind():
    # in a fork, as in the spare (whose environment has the child's flag set already): what a
    # request's run sees (descriptors, environment, working directory, sys.path) is unchanged
    from harness import _child, _zygote

    def rehearse() -> dict:
        os.environ[_child.ENV_FLAG] = "1"
        seen = lambda: [_procs.open_fds(), dict(os.environ), os.getcwd(), list(sys.path)]  # noqa: E731
        before = seen()
        returned = _zygote.Zygote._rehearse(types.SimpleNamespace(child=_child))
        return {"returned": returned, "unchanged": seen() == before}

    assert _in_a_fork(rehearse) == {"returned": {"returned": None, "unchanged": True}}


# -- a spare, served a request directly -----------------------------------------------------


def _spare_served(zygote, message: bytes | None, request: bytes | None, fail_recv=False) -> dict:
    """Fork a spare of ``zygote`` (``Zygote._serve_as_spare``) and send it ``message`` with a
    request's four descriptors: a request file holding ``request``, then stdout, stderr and
    status files (``request`` None: ``message`` alone, no descriptors; ``message`` None:
    nothing, then end of file); ``fail_recv``: its receive raises. Returns what the zygote's
    end got (``said``: b"" once the spare closed its end, None if it did not), the spare's
    exit status, its status records and what it wrote on its own stderr (``echoed``)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    files = [os.memfd_create(name) for name in ("stdout", "stderr", "status")]
    own_stderr = os.memfd_create("spare-stderr")  # the zygote's, in a real spare
    pid = os.fork()
    if pid == 0:
        ours.close()
        os.dup2(own_stderr, 2)
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 (not pytest's capture)
        if fail_recv:

            def fail(*args):
                raise ConnectionResetError(104, "Connection reset by peer")

            socket.recv_fds = fail
        try:
            zygote._serve_as_spare(theirs.detach())
        finally:
            os._exit(99)  # it returned, or raised: it must leave by itself
    theirs.close()
    if message is None:
        ours.shutdown(socket.SHUT_WR)  # its end of file
    else:
        fds = [] if request is None else [_request_file(request), *files]
        socket.send_fds(ours, [message], fds)
        if request is not None:
            os.close(fds[0])
    _, status = os.waitpid(pid, 0)
    try:
        said = ours.recv(64, socket.MSG_DONTWAIT)
    except BlockingIOError:
        said = None
    except ConnectionResetError:  # it closed its end with our message unread
        said = b""
    ours.close()
    records = [json.loads(line) for line in os.pread(files[2], 1 << 16, 0).splitlines()]
    echoed = os.pread(own_stderr, 1 << 16, 0)
    for fd in (*files, own_stderr):
        os.close(fd)
    exit_code = os.waitstatus_to_exitcode(status)
    return {"said": said, "exit": exit_code, "records": records, "echoed": echoed}


def _orders(client, serial=None, seal_offset=None) -> bytes:
    from harness._child import SEAL_BYTES

    return json.dumps(
        {
            "client": client.sock.fileno(),
            "serial": client.serial if serial is None else serial,
            "seal_offset": SEAL_BYTES if seal_offset is None else seal_offset,
            "environ": {},
        }
    ).encode()


@pytest.mark.parametrize("how", ["no-fds", "recv-fails", "end-of-file"])
def test_a_spare_sent_away_runs_nothing_and_leaves_quietly(zygote_here, how):
    # the zygote sends a spare away with a message and no descriptors, or by closing its end;
    # a receive that fails is the same: nothing is taken, nothing run, exit status 0
    _ours, zygote, _client, _table = zygote_here
    message = None if how == "end-of-file" else b"away"

    served = _spare_served(zygote, message, None, fail_recv=how == "recv-fails")

    assert served == {"said": b"", "exit": 0, "records": [], "echoed": b""}  # unsaid


@pytest.mark.parametrize("whose", ["its-client", "a-serial-gone", "unknown", "not-json"])
def test_a_spare_seals_the_page_only_of_the_client_it_mapped(zygote_here, whose):
    # the orders name the client by its socket's number and serial: a number reused by a
    # later client (another serial), one unknown or orders unreadable give the child no seal
    from harness._child import SEAL_BYTES

    _ours, zygote, client, table = zygote_here
    message = {
        "its-client": _orders(client),
        "a-serial-gone": _orders(client, serial=client.serial + 1),
        "unknown": _orders(client).replace(b'"client": ', b'"client": 1000'),
        "not-json": b"orders?",
    }[whose]

    served = _spare_served(zygote, message, b'{"target": "os:getpid", "args": []}\n{}')

    assert served["said"] == b"taken"
    assert served["exit"] == 0
    pid = served["records"][0]["pid"]
    assert [r["event"] for r in served["records"]] == ["started", "returned"]
    assert served["records"][1]["value"] == pid
    sealed = os.pread(table, 32, SEAL_BYTES)
    assert sealed.startswith(f"{pid}\n".encode()) if whose == "its-client" else sealed == bytes(32)


@pytest.mark.parametrize(
    "request_bytes, said",
    [
        (b"[1]\n{}", "ValueError: the request is not a JSON object"),
        (b"not json\n{}", "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"),
    ],
    ids=["a-list", "not-json"],
)
def test_a_request_a_spare_cannot_read_is_a_harness_error_on_its_channel(
    zygote_here, request_bytes, said
):
    from harness._child import EXIT_HARNESS_ERROR

    _ours, zygote, client, _table = zygote_here

    served = _spare_served(zygote, _orders(client), request_bytes)

    assert (served["said"], served["exit"]) == (b"taken", EXIT_HARNESS_ERROR)
    assert served["records"] == [
        {
            "event": "harness_error",
            "message": f"could not set up the child: {said}",
            "traceback": "",
        }
    ]
    assert served["echoed"] == b""  # the channel's alone: the spare's stderr is the zygote's


def test_a_spare_runs_its_child_in_the_group_it_was_given(zygote_here):
    # the zygote forks a spare into a group of its own, which its child keeps (its death with
    # the zygote goes by it): the run makes no new group. This spare, forked here, is in ours.
    _ours, zygote, client, _table = zygote_here

    served = _spare_served(zygote, _orders(client), b'{"target": "os:getpgid", "args": [0]}\n{}')

    assert served["records"][-1] == {"event": "returned", "value": os.getpgrp()}


def test_a_request_a_spare_cannot_read_is_its_seal_s_verdict_too(zygote_here):
    from harness._child import SEAL_BYTES, SEAL_FINAL_AT

    _ours, zygote, client, table = zygote_here

    served = _spare_served(zygote, _orders(client), b"[1]\n{}")

    assert served["records"][0]["event"] == "harness_error"
    verdict = os.pread(table, 128, SEAL_BYTES + SEAL_FINAL_AT).rstrip(b"\0")
    assert json.loads(verdict) == {"event": "harness_error", "delivered": True, "error": None}


def _a_child_that_ended() -> int:
    """The pid of a child of this process that has exited, not reaped yet (still ours)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    return pid


def test_without_a_pidfd_for_its_root_the_zygote_wakes_to_look_for_it(zygote_here):
    # a kernel without pidfd_open: no descriptor says the root ended, so the loop wakes every
    # 50 ms to look (the root's start time) instead of waiting for events that never come
    _ours, zygote, _client, _table = zygote_here
    pid = _a_child_that_ended()
    os.waitpid(pid, 0)  # a root that ended: reaped, its pid names no process

    def step() -> list:
        signal.alarm(10)  # a loop that waits for an event that never comes: killed by it
        zygote.root_fd = None
        started = time.monotonic()
        zygote._step()
        seen = [time.monotonic() - started < 5, zygote.root_gone]  # the root lives: this process
        zygote.root_pid = pid
        zygote._step()
        return [*seen, zygote.root_gone]

    assert _in_a_fork(step) == {"returned": [True, False, True]}


def test_the_root_s_end_is_seen_once_and_for_good(zygote_here):
    # the root's pidfd, readable for good once the root ended, leaves the poll set once seen
    # (else every poll would return at once: a busy loop); and a root seen gone stays gone,
    # though its pid names a live process again (this process, here) where no pidfd tells
    _ours, zygote, _client, _table = zygote_here
    pid = _a_child_that_ended()
    root_fd = os.pidfd_open(pid)  # readable: its process ended
    zygote._unwatch(zygote.root_fd)
    if zygote.root_fd is not None:
        os.close(zygote.root_fd)
    zygote.root_fd = root_fd  # the fixture closes it
    zygote._watch(root_fd)

    def steps() -> list:
        signal.alarm(10)  # a loop that waits for an event that never comes: killed by it
        zygote._step()
        seen = [zygote.root_gone, [fd for fd, _ in zygote.poller.poll(0) if fd == root_fd]]
        zygote.root_fd = None  # no pidfd: the loop looks for the root's pid every 50 ms
        zygote._step()
        return [*seen, zygote.root_gone]

    assert _in_a_fork(steps) == {"returned": [True, [], True]}
    os.waitpid(pid, 0)


def _step_once_woken(zygote) -> None:
    """One pass of the zygote's loop, once something is there to wake it (else it would wait
    for good: its root, this process, does not end)."""
    assert zygote.poller.poll(30_000), "nothing wakes the zygote"
    zygote._step()


def test_a_spare_is_kept_while_it_lives_and_has_clients_and_replaced_once_it_died(zygote_here):
    # a wake that is not the spare's leaves it be; a spare that died (someone killed it) is
    # sent away and reaped, and another forked once no child runs; once the last client left,
    # the spare is sent away (it reads the end of its socket and leaves) and reaped
    ours, zygote, _client, _ = zygote_here
    zygote.applied, zygote.set_up = b"{}", True  # a setting applied, the set-up done ahead
    zygote._fork_spare()
    spare = zygote.spare
    assert spare is not None

    ours.send(b'{"op": "hello"}')
    _step_once_woken(zygote)
    assert zygote.spare is spare and spare.pid not in zygote.children
    assert json.loads(ours.recv(1 << 16))["event"] == "ready"

    os.kill(spare.pid, signal.SIGKILL)
    os.waitid(os.P_PID, spare.pid, os.WEXITED | os.WNOWAIT)
    _step_once_woken(zygote)
    assert zygote.spare is None and zygote.children[spare.pid].client is None
    _step_once_woken(zygote)
    assert spare.pid not in zygote.children  # reaped: no zombie is left
    with pytest.raises(ChildProcessError):
        os.waitpid(spare.pid, os.WNOHANG)
    another = zygote.spare
    assert another is not None and another.pid != spare.pid

    ours.close()  # the last client leaves
    _step_once_woken(zygote)
    assert zygote.clients == {} and zygote.spare is None
    assert zygote.children[another.pid].client is None
    _step_once_woken(zygote)
    assert zygote.children == {}


def test_a_zygote_s_child_closes_every_descriptor_above_2_but_those_kept():
    from harness._zygote import Zygote

    pid = os.fork()
    if pid == 0:  # the verdict by exit status: every descriptor that could carry it is closed
        try:

            def is_open(fd: int) -> bool:
                try:
                    os.fstat(fd)
                    return True
                except OSError:
                    return False

            # the lowest free descriptors: the one after `kept` is open, this one or another
            kept, _next_one, also_kept = (os.open(os.devnull, os.O_RDONLY) for _ in range(3))
            far = max(kept, also_kept) + 100  # far above: a range between
            os.dup2(kept, far)
            standard = [is_open(fd) for fd in (0, 1, 2)]
            Zygote._close_all_but((also_kept, far, kept))  # in any order

            seen = [fd for fd in range(3, far + 100) if is_open(fd)]
            same = [is_open(fd) for fd in (0, 1, 2)] == standard  # never closed
            os._exit(0 if same and seen == sorted((kept, also_kept, far)) else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
