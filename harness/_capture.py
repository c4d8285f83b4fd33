"""The child's stdout, stderr and status channel, and reading them back with bounds.

stdout and stderr are pipes that the parent reads *while it waits* for the child (see
:func:`harness._reap.pump`), keeping the first :data:`HEAD_BYTES` and the last
:data:`TAIL_BYTES` of each in memory: a child that writes gigabytes never blocks on a parent
that is not reading, puts nothing on disk, and costs the parent at most a few MiB, however
much it writes (what it wrote before a SIGKILL is still in the pipe). The status channel is an
unnamed temp file; the child's seal (see ``harness._child``) is a page of this process's guard
table (``harness._guard``).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from harness._errors import HarnessError
from harness._fd import anonymous_fd

if TYPE_CHECKING:
    from harness._guard import GuardTable

HEAD_BYTES = 64 * 1024
"""Bytes kept from the start of a long stream."""

TAIL_BYTES = 1024 * 1024
"""Bytes kept from the end of a long stream (1 MiB)."""

READ_BYTES = 64 * 1024
"""Bytes read from a pipe per call (below malloc's mmap threshold); :meth:`Stream.drain` reads
at most :data:`DRAIN_READS` times per call, so a child that writes without pause cannot keep
the parent from checking its deadline."""

DRAIN_READS = 64
"""Reads per :meth:`Stream.drain` call at most (4 MiB)."""


def kept_text(head: bytes, tail: bytes, total: int, name: str) -> str:
    """A stream's text from its kept head and tail, with a line saying what was cut.

    Args:
      head: the first bytes kept.
      tail: the last bytes kept (``head + tail`` is the whole stream when nothing was cut).
      total: bytes the stream had in all.
      name: the stream's name for the notice (``"stderr"``).

    Returns:
      The text, decoded as UTF-8 with undecodable bytes replaced.
    """
    cut = total - len(head) - len(tail)
    if cut <= 0:
        return (head + tail).decode("utf-8", "replace")
    notice = (
        f"\n[... devmem-harness cut {cut} bytes ({cut / 2**20:.1f} MiB) of {name} here: "
        f"it wrote {total} bytes; kept the first {len(head)} and the last {len(tail)} ...]\n"
    )
    return (head + notice.encode() + tail).decode("utf-8", "replace")


def cut_notice(name: str, cut: int, total: int, head: int, tail: int) -> str:
    """The harness's line saying what it cut from the middle of a stream (never part of the
    stream's text itself: see :attr:`harness.Outcome.notes`)."""
    return (
        f"devmem-harness cut {cut} bytes ({cut / 2**20:.1f} MiB) of {name}: it wrote {total} "
        f"bytes; kept the first {head} and the last {tail}"
    )


def read_kept(fd: int, name: str, head: int = HEAD_BYTES, tail: int = TAIL_BYTES) -> str:
    """Read a file: all of it, or its head and tail with a line saying what was cut.

    Args:
      fd: the file's descriptor (read with ``pread``; its offset is not used).
      name: the stream's name for the cut notice.
      head, tail: bytes to keep from each end when the file is longer than both together.
    """
    size = os.fstat(fd).st_size
    if size <= head + tail:
        return _pread_all(fd, size, 0).decode("utf-8", "replace")
    return kept_text(_pread_all(fd, head, 0), _pread_all(fd, tail, size - tail), size, name)


def _pread_all(fd: int, size: int, offset: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


class Stream:
    """One output stream of a child: a pipe it writes, which the parent drains into memory.

    Keeps the first ``head`` bytes and the last ``tail`` bytes; never holds more than
    ``head + 2 * tail + READ_BYTES`` bytes however much goes through.

    Attributes:
      name: ``"stdout"`` or ``"stderr"``.
      read_fd: the parent's end (non-blocking; not inherited across exec).
      write_fd: the child's end, or None once the parent has closed its copy.
      total: bytes seen so far.
      eof: every writer has closed its end.
      last_data_at: ``time.monotonic()`` of the last read that got bytes, or None.
    """

    __slots__ = (
        "eof",
        "head",
        "head_limit",
        "last_data_at",
        "name",
        "notes",
        "read_fd",
        "tail",
        "tail_limit",
        "total",
        "write_fd",
    )

    def __init__(self, name: str, head: int = HEAD_BYTES, tail: int = TAIL_BYTES) -> None:
        self.name = name
        self.head_limit = head
        self.tail_limit = tail
        self.read_fd, write_fd = os.pipe()
        self.write_fd: int | None = write_fd
        os.set_blocking(self.read_fd, False)
        self.head = b""  # bytearrays once data comes
        self.tail = b""
        self.total = 0
        self.eof = False
        self.last_data_at: float | None = None
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        """Record a line of the harness's own about this stream (kept apart from its text, so
        that a ``match`` never finds it)."""
        self.notes.append(text)

    def feed(self, data: bytes) -> None:
        """Append ``data`` to what was kept."""
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            if not self.head:
                self.head = bytearray()
            self.head += data[:room]
            data = data[room:]
        if data:
            if not self.tail:
                self.tail = bytearray()
            self.tail += data
            if len(self.tail) > 2 * self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    def drain(self) -> None:
        """Read what the pipe holds now (:data:`DRAIN_READS` reads at most); set :attr:`eof`
        at end of file."""
        for _ in range(DRAIN_READS):
            try:
                data = os.read(self.read_fd, READ_BYTES)
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            if not data:
                self.eof = True
                return
            self.last_data_at = time.monotonic()
            self.feed(data)

    def close_write(self) -> None:
        """Close the parent's copy of the child's end (once the child has its own)."""
        if self.write_fd is not None:
            os.close(self.write_fd)
            self.write_fd = None

    @property
    def cut_bytes(self) -> int:
        """Bytes dropped from the middle of the stream (0 when it was kept whole)."""
        return max(self.total - len(self.head) - min(len(self.tail), self.tail_limit), 0)

    def _kept_tail(self) -> bytes:
        return bytes(self.tail[-self.tail_limit :]) if self.tail_limit else b""

    def text(self) -> str:
        """The kept text, only what the child wrote: the head and the tail, decoded each on
        its own (UTF-8, undecodable bytes replaced) and joined; where bytes were cut, see
        :attr:`cut_at` and :meth:`all_notes`."""
        head = bytes(self.head).decode("utf-8", "replace")
        if not self.cut_bytes:
            return (bytes(self.head) + self._kept_tail()).decode("utf-8", "replace")
        return head + self._kept_tail().decode("utf-8", "replace")

    @property
    def cut_at(self) -> int | None:
        """Where in :meth:`text` (a str index) bytes were cut, or None if none were."""
        if not self.cut_bytes:
            return None
        return len(bytes(self.head).decode("utf-8", "replace"))

    def all_notes(self) -> list[str]:
        """The harness's notes about this stream: the cut notice first, then :attr:`notes`."""
        notes = []
        if self.cut_bytes:
            tail = len(self._kept_tail())
            notes.append(cut_notice(self.name, self.cut_bytes, self.total, len(self.head), tail))
        return notes + self.notes

    def close(self) -> None:
        """Close both ends (idempotent)."""
        self.close_write()
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1


def _channel_failure(exc: OSError) -> HarnessError:
    """The error for a child's channel (a pipe, the status or request file) that cannot be
    opened in this process."""
    return HarnessError(
        "cannot open a child's channels (its stdout and stderr pipes, status and request "
        f"files): {exc.strerror or exc} (this process's RLIMIT_NOFILE, or the system's file "
        "table, may be exhausted)"
    )


class Capture:
    """The channels of one child: stdout and stderr pipes, the status file, its page of the
    guard table (its seal), and (optionally) the request file.

    Use as a context manager; every descriptor is closed and the page freed on exit.

    Args:
      table: this process's guard table, from which the child's page is taken.

    Raises:
      HarnessError: the guard table has no free page, or a descriptor cannot be opened (none
        is left open then).
    """

    def __init__(self, table: GuardTable) -> None:
        self.table = table
        self._open()

    def _open(self) -> None:
        self.fds: list[int] = []
        self.seal_offset: int | None = None
        self.stdout = self.stderr = None  # type: ignore[assignment]
        self.request_fd: int | None = None
        try:
            self.seal_offset = self.table.allocate()
            self.stdout = Stream("stdout")
            self.stderr = Stream("stderr")
            self.status_fd = self._new()
        except OSError as exc:  # out of descriptors, say: close what was opened, then say so
            self.close()
            raise _channel_failure(exc) from exc
        except HarnessError:
            self.close()
            raise

    @property
    def streams(self) -> tuple[Stream, Stream]:
        """``(stdout, stderr)``."""
        return self.stdout, self.stderr

    def write_request(self, data: bytes) -> int:
        """Store ``data`` in a new request file; return its descriptor (also ``request_fd``).

        Raises:
          HarnessError: no descriptor can be opened for it.
        """
        self.request_fd = self._new()
        view = memoryview(data)
        while view:
            view = view[os.pwrite(self.request_fd, view, len(data) - len(view)) :]
        return self.request_fd

    def _new(self) -> int:
        try:
            fd = anonymous_fd()
        except OSError as exc:
            raise _channel_failure(exc) from exc
        self.fds.append(fd)
        return fd

    def handed_over(self) -> None:
        """The child (or the zygote) has its own copies of the pipes' ends: close ours."""
        for stream in self.streams:
            stream.close_write()

    def finish(self, within_s: float = 0.1) -> None:
        """Read what is left in the pipes once the child is gone (at most ``within_s``).

        A grandchild that escaped the group kill and still holds a pipe cannot stall this.
        """
        self.handed_over()
        until = time.monotonic() + within_s
        for stream in self.streams:
            while not stream.eof and time.monotonic() < until:
                before = stream.total
                stream.drain()
                if stream.total == before:
                    break

    def status(self) -> bytes:
        """Everything the child wrote on its status channel."""
        return _pread_all(self.status_fd, os.fstat(self.status_fd).st_size, 0)

    def seal(self) -> bytes:
        """The child's seal, as it left it (see ``harness._child``)."""
        return self.table.seal(self.seal_offset)  # type: ignore[arg-type]

    def disown(self) -> None:
        """Wipe the child's pid from its page: it has ended and is about to be reaped."""
        self.table.disown(self.seal_offset)  # type: ignore[arg-type]

    def renew(self) -> None:
        """Close every channel and open fresh ones (to try a launch again from scratch)."""
        self.close()
        self._open()

    def close(self) -> None:
        """Close every descriptor and free the page (idempotent)."""
        for stream in self.streams:
            if stream is not None:  # None: its opening failed
                stream.close()
        while self.fds:
            os.close(self.fds.pop())
        if self.seal_offset is not None:
            self.table.release(self.seal_offset)
            self.seal_offset = None

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
