"""The channels of a child (``harness._capture``) on their own: bounded streams, the cut
notices, reading files back whole or by head and tail, and a capture's life cycle."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time

import pytest

from harness._capture import Capture, Stream, _pread_all, kept_text, read_kept
from harness._child import SEAL_BYTES, read_all
from harness._errors import HarnessError
from harness._guard import GuardTable

MIB = 2**20


def test_kept_text_joins_what_was_kept_and_says_what_was_cut():
    assert kept_text(b"ab", b"cd", 4, "stdout") == "abcd"  # nothing cut
    assert kept_text(b"ab", b"cd", 3, "stdout") == "abcd"  # (a total below what was kept)
    assert kept_text(b"\xff", b"", 1, "stdout") == "\ufffd"  # undecodable bytes replaced
    assert kept_text(b"HEAD", b"TAIL", 3 * MIB + 8, "stderr") == (
        "HEAD\n[... devmem-harness cut 3145728 bytes (3.0 MiB) of stderr here: it wrote "
        "3145736 bytes; kept the first 4 and the last 4 ...]\nTAIL"
    )


@contextlib.contextmanager
def _file(data: bytes):
    with tempfile.TemporaryFile() as file:
        file.write(data)
        file.flush()
        yield file


def test_read_kept_reads_a_file_whole_up_to_head_plus_tail_bytes():
    with _file(b"0123456789") as file:
        assert read_kept(file.fileno(), "x", head=4, tail=6) == "0123456789"
        assert read_kept(file.fileno(), "x", head=4, tail=5) == (
            "0123\n[... devmem-harness cut 1 bytes (0.0 MiB) of x here: it wrote 10 bytes; kept "
            "the first 4 and the last 5 ...]\n56789"
        )
        assert read_kept(file.fileno(), "x", head=0, tail=3) == (
            "\n[... devmem-harness cut 7 bytes (0.0 MiB) of x here: it wrote 10 bytes; kept the "
            "first 0 and the last 3 ...]\n789"
        )
        file.seek(3)
        assert read_kept(file.fileno(), "x") == "0123456789"  # from offset 0 whatever the offset
        assert file.tell() == 3
    with _file(b"") as empty:
        assert read_kept(empty.fileno(), "x") == ""


def test_a_stream_says_what_it_cut_in_mib():
    stream = Stream("stdout", head=2, tail=3)
    try:
        stream.feed(b"ab" + b"-" * (MIB + MIB // 2) + b"xyz")
        assert stream.text() == "abxyz"
        assert stream.all_notes() == [
            "devmem-harness cut 1572864 bytes (1.5 MiB) of stdout: it wrote 1572869 bytes; kept "
            "the first 2 and the last 3"
        ]
        stream.note("a note of the harness's")
        assert stream.all_notes()[1:] == ["a note of the harness's"]
        assert stream.notes == ["a note of the harness's"]
    finally:
        stream.close()


def test_a_stream_keeps_the_last_tail_bytes_across_many_small_writes():
    stream = Stream("stderr", head=3, tail=5)
    try:
        data = bytes(range(48, 48 + 40))  # "0123...W"
        for byte in data:
            stream.feed(bytes([byte]))
            assert len(stream.head) + len(stream.tail) <= 3 + 2 * 5 + 1
        assert stream.total == 40
        assert stream.cut_bytes == 40 - 3 - 5
        assert stream.text() == (data[:3] + data[-5:]).decode()
        assert stream.cut_at == 3
    finally:
        stream.close()


def test_a_stream_that_keeps_no_tail_keeps_its_head_only():
    stream = Stream("stderr", head=4, tail=0)
    try:
        stream.feed(b"0123456789")
        assert (stream.text(), stream.cut_bytes, stream.cut_at) == ("0123", 6, 4)
        assert stream.all_notes() == [
            "devmem-harness cut 6 bytes (0.0 MiB) of stderr: it wrote 10 bytes; kept the first 4 "
            "and the last 0"
        ]
    finally:
        stream.close()


def test_a_stream_not_cut_decodes_across_the_head_boundary_and_a_cut_one_each_part_alone():
    euro = "€".encode()  # 3 bytes, split by a head of 2
    whole = Stream("stdout", head=2, tail=10)
    cut = Stream("stdout", head=2, tail=3)
    try:
        whole.feed(b"a" + euro + b"b")
        assert (whole.text(), whole.cut_at) == ("a€b", None)
        cut.feed(b"a" + euro + b"-middle-" + euro)
        assert cut.text() == "a\ufffd" + "€"  # the head's half character is replaced
        assert cut.cut_at == len("a\ufffd")
    finally:
        whole.close()
        cut.close()


def test_a_stream_drains_at_most_its_reads_per_call_and_sees_end_of_file():
    stream = Stream("stdout")
    try:
        assert stream.last_data_at is None
        assert not os.get_blocking(stream.read_fd)
        assert not os.get_inheritable(stream.read_fd)
        stream.drain()  # nothing yet: returns at once
        assert (stream.total, stream.eof) == (0, False)
        os.write(stream.write_fd, b"x" * 1000)
        stream.drain()
        assert (stream.total, stream.eof) == (1000, False)
        assert stream.last_data_at is not None
        stream.close_write()
        assert stream.write_fd is None
        stream.close_write()  # again: nothing to do
        stream.drain()
        assert stream.eof
    finally:
        stream.close()
    assert stream.read_fd == -1
    stream.close()  # idempotent


def test_a_capture_stores_a_request_and_reads_back_its_status_and_seal():
    table = GuardTable()
    data = bytes(range(256)) * (3 * 4096 + 1)  # over 3 MiB
    with Capture(table) as capture:
        fd = capture.write_request(data)
        assert fd == capture.request_fd
        assert read_all(fd) == data
        assert capture.status() == b""
        os.pwrite(capture.status_fd, b'{"event": "started", "pid": 1}\n', 0)
        assert capture.status() == b'{"event": "started", "pid": 1}\n'
        offset = capture.seal_offset
        assert capture.seal() == bytes(SEAL_BYTES)
        table.map[offset : offset + 4] = b"42\n\0"
        assert capture.seal().startswith(b"42\n\0")
        capture.disown()
        assert capture.seal() == bytes(SEAL_BYTES)
        assert (capture.stdout.name, capture.stderr.name) == ("stdout", "stderr")
        assert capture.streams == (capture.stdout, capture.stderr)
        fds = list(capture.fds)
    assert capture.seal_offset is None
    assert capture.fds == []
    for closed in fds:
        with pytest.raises(OSError):
            os.fstat(closed)
    assert offset in table.free  # its page is free again
    capture.close()  # idempotent


def test_a_renewed_capture_has_fresh_channels():
    table = GuardTable()
    with Capture(table) as capture:
        assert not os.get_blocking(capture.stdout.read_fd)  # else the drain below never returns
        os.write(capture.stdout.write_fd, b"old")
        capture.stdout.drain()
        os.pwrite(capture.status_fd, b"old", 0)
        capture.write_request(b"old")
        capture.renew()
        assert capture.request_fd is None
        assert capture.status() == b""
        assert capture.stdout.total == 0
        assert capture.seal_offset is not None
        assert len(capture.fds) == 1  # the status file


def test_finish_reads_what_is_left_once_every_writer_is_gone():
    table = GuardTable()
    with Capture(table) as capture:
        out, err = os.dup(capture.stdout.write_fd), os.dup(capture.stderr.write_fd)
        capture.handed_over()  # the child has its own copies now
        assert capture.stdout.write_fd is None and capture.stderr.write_fd is None
        os.write(out, b"last words\n")
        os.write(err, b"e" * 60_000)
        os.close(out)
        os.close(err)
        capture.finish()
        assert capture.stdout.text() == "last words\n" and capture.stdout.eof
        assert (capture.stderr.total, capture.stderr.eof) == (60_000, True)


def test_finish_gives_up_on_a_pipe_still_held_open():
    table = GuardTable()
    with Capture(table) as capture:
        held = os.dup(capture.stdout.write_fd)
        late = os.dup(capture.stderr.write_fd)
        try:
            assert not os.get_blocking(capture.stdout.read_fd)  # else finish never returns
            os.write(held, b"partial")
            os.write(late, b"last")
            os.close(late)
            capture.finish(within_s=0.05)
            assert capture.stdout.text() == "partial"
            assert not capture.stdout.eof  # a grandchild still holds it: not waited for
            assert (capture.stderr.text(), capture.stderr.eof) == ("last", True)  # still read
        finally:
            os.close(held)


def test_undecodable_bytes_are_replaced_wherever_they_are_kept():
    assert kept_text(b"a\xff", b"\xfeb", 10, "x").startswith("a\ufffd\n[... devmem-harness cut 6")
    assert kept_text(b"a\xff", b"\xfeb", 10, "x").endswith("...]\n\ufffdb")
    with _file(b"\xffok\xfe") as file:
        assert read_kept(file.fileno(), "x") == "\ufffdok\ufffd"
    whole = Stream("stdout", head=2, tail=4)
    cut = Stream("stdout", head=2, tail=4)
    try:
        whole.feed(b"\xff1\xfe")
        assert whole.text() == "\ufffd1\ufffd"
        cut.feed(b"\xff1" + b"-" * 10 + b"2\xfe34")
        assert cut.text() == "\ufffd12\ufffd34"
    finally:
        whole.close()
        cut.close()


def test_a_one_byte_file_is_read_whole():
    with _file(b"x") as file:
        assert read_kept(file.fileno(), "x") == "x"
    table = GuardTable()
    with Capture(table) as capture:
        os.pwrite(capture.status_fd, b"\n", 0)
        assert capture.status() == b"\n"


def test_pread_all_stops_at_the_end_of_a_shorter_file():
    with _file(b"0123456789") as file:
        assert _pread_all(file.fileno(), 100, 0) == b"0123456789"
        assert _pread_all(file.fileno(), 100, 8) == b"89"
        assert _pread_all(file.fileno(), 0, 0) == b""


def test_a_stream_whose_pipe_got_descriptor_0_closes_it():
    saved = os.dup(0)
    try:
        os.close(0)  # a process started without stdin: the pipe takes descriptor 0
        stream = Stream("stdout")
        assert stream.read_fd == 0
        stream.close()
        with pytest.raises(OSError):
            os.fstat(0)
    finally:
        os.dup2(saved, 0)
        os.close(saved)


class _Endless(Stream):
    """A pipe that a writer keeps full: every drain finds more (for five seconds)."""

    __slots__ = ("until",)

    def drain(self) -> None:
        if time.monotonic() < self.until:
            self.feed(b"z" * 1024)
        else:
            self.eof = True


def _finish_with_an_endless_writer(**finish: float) -> tuple[float, _Endless]:
    """Seconds ``Capture.finish(**finish)`` takes when stderr is a writer that goes on for 5 s
    (a grandchild that escaped the group kill, writing on), and that writer."""
    with Capture(GuardTable()) as capture:
        endless = _Endless("stderr")
        endless.until = time.monotonic() + 5.0
        capture.stderr.close()
        capture.stderr = endless
        start = time.monotonic()
        capture.finish(**finish)
        took = time.monotonic() - start
        endless.close()
    return took, endless


def test_finish_does_not_wait_on_a_writer_that_never_stops():
    took, endless = _finish_with_an_endless_writer(within_s=0.2)
    assert 0.2 <= took < 3.0, f"finish took {took:.1f} s with a writer that never stops"
    assert endless.total > 0 and not endless.eof


def test_finish_gives_a_writer_that_never_stops_a_tenth_of_a_second_by_default():
    # what a death test costs when a grandchild that escaped the group kill writes on
    took, endless = _finish_with_an_endless_writer()
    assert 0.1 <= took < 0.6, f"finish took {took:.2f} s by default, not 0.1 s"
    assert endless.total > 0 and not endless.eof


def _open_fds() -> set[int]:
    """This process's open descriptors (not the one the listing itself used)."""
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            os.fstat(int(name))
            fds.add(int(name))
    return fds


@pytest.mark.parametrize("fails", ["stderr-pipe", "status-file", "request-file"])
def test_a_channel_that_cannot_be_opened_is_a_harness_error_and_leaves_nothing_open(
    monkeypatch, fails
):
    # out of descriptors (EMFILE) half-way: what was opened is closed, the page freed, and
    # the error says why, with the OSError as its cause
    import harness._capture as capture_module

    table = GuardTable()
    free = sorted(table.free)
    full = OSError(24, "Too many open files")
    real_pipe = os.pipe
    pipes = []

    def pipe() -> tuple[int, int]:
        if pipes:  # the second pipe: stderr's
            raise full
        pipes.append(real_pipe())
        return pipes[-1]

    def anonymous_fd() -> int:
        raise full

    before = _open_fds()
    if fails == "request-file":
        capture = Capture(table)
        monkeypatch.setattr(capture_module, "anonymous_fd", anonymous_fd)
        with pytest.raises(HarnessError) as raised:
            capture.write_request(b"{}")
        capture.close()
    else:
        if fails == "stderr-pipe":
            monkeypatch.setattr(capture_module.os, "pipe", pipe)
        else:
            monkeypatch.setattr(capture_module, "anonymous_fd", anonymous_fd)
        with pytest.raises(HarnessError) as raised:
            Capture(table)
    monkeypatch.undo()

    assert str(raised.value) == (
        "cannot open a child's channels (its stdout and stderr pipes, status and request "
        "files): Too many open files (this process's RLIMIT_NOFILE, or the system's file "
        "table, may be exhausted)"
    )
    assert raised.value.__cause__ is full
    assert _open_fds() - before == set()  # none left open
    assert sorted(table.free) == free


def test_a_capture_without_a_free_page_opens_nothing(monkeypatch):
    table = GuardTable()
    monkeypatch.setattr(table, "free", [])
    before = _open_fds()

    with pytest.raises(HarnessError, match="death-test children at once already"):
        Capture(table)

    assert _open_fds() - before == set()  # none left open
