"""The test process's connection to a forkserver zygote (``harness._forkserver.Connection``):
what a failure quotes of the zygote's stderr, closing, and the root's goodbye at exit.

These reach the connection alone, over a socket pair and a stand-in for the zygote's process,
so that each promise is checked where a whole run could not see it (the mutation run of
``harness._forkserver`` found them unchecked).
"""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

import harness
from harness import _forkserver
from harness._errors import HarnessError


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
