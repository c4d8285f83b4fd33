"""The child's stdout, stderr and status channel: anonymous temp files, read back with limits.

Files, not pipes: a child that writes 20 MB never blocks on a parent that is not reading, and
what it wrote survives a SIGKILL. Reading keeps the first :data:`HEAD_BYTES` and the last
:data:`TAIL_BYTES` of a stream and says in between how much was cut.
"""

from __future__ import annotations

import os
import tempfile

HEAD_BYTES = 64 * 1024
"""Bytes kept from the start of a long stream."""

TAIL_BYTES = 1024 * 1024
"""Bytes kept from the end of a long stream (1 MiB)."""


def anonymous_fd() -> int:
    """A read-write descriptor of an unnamed temp file (not inherited across exec).

    ``O_TMPFILE`` where the temp directory supports it, else a file unlinked at once: either
    way nothing is left on disk, whatever happens to parent or child.
    """
    directory = tempfile.gettempdir()
    try:
        return os.open(directory, os.O_TMPFILE | os.O_RDWR, 0o600)
    except (AttributeError, OSError):
        fd, path = tempfile.mkstemp(prefix="devmem-death-")
        os.unlink(path)
        return fd


def read_kept(fd: int, name: str, head: int = HEAD_BYTES, tail: int = TAIL_BYTES) -> str:
    """Read a capture file: all of it, or its head and tail with a line saying what was cut.

    Args:
      fd: the file's descriptor (read with ``pread``; its offset is not used).
      name: the stream's name for the cut notice (``"stderr"``).
      head, tail: bytes to keep from each end when the file is longer than both together.

    Returns:
      The text, decoded as UTF-8 with undecodable bytes replaced.
    """
    size = os.fstat(fd).st_size
    if size <= head + tail:
        return _pread_all(fd, size, 0).decode("utf-8", "replace")
    cut = size - head - tail
    notice = (
        f"\n[... devmem-harness cut {cut} bytes ({cut / 2**20:.1f} MiB) of {name} here: "
        f"it wrote {size} bytes; kept the first {head} and the last {tail} ...]\n"
    )
    text = _pread_all(fd, head, 0) + notice.encode() + _pread_all(fd, tail, size - tail)
    return text.decode("utf-8", "replace")


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


class Capture:
    """The files of one child: stdout, stderr, status, and (optionally) the request.

    Use as a context manager; the descriptors are closed on exit. The files have no name, so
    nothing is left on disk whatever happens.
    """

    def __init__(self) -> None:
        self.fds: list[int] = []
        self.stdout_fd = self._new()
        self.stderr_fd = self._new()
        self.status_fd = self._new()
        self.request_fd: int | None = None

    def write_request(self, data: bytes) -> int:
        """Store ``data`` in a new request file; return its descriptor (also ``request_fd``)."""
        self.request_fd = self._new()
        view = memoryview(data)
        while view:
            view = view[os.pwrite(self.request_fd, view, len(data) - len(view)) :]
        return self.request_fd

    def _new(self) -> int:
        fd = anonymous_fd()
        self.fds.append(fd)
        return fd

    def stdout(self) -> str:
        """The child's stdout, head and tail kept (see :func:`read_kept`)."""
        return read_kept(self.stdout_fd, "stdout")

    def stderr(self) -> str:
        """The child's stderr, head and tail kept (see :func:`read_kept`)."""
        return read_kept(self.stderr_fd, "stderr")

    def status(self) -> bytes:
        """Everything the child wrote on its status channel."""
        return _pread_all(self.status_fd, os.fstat(self.status_fd).st_size, 0)

    def close(self) -> None:
        """Close every descriptor (idempotent)."""
        while self.fds:
            os.close(self.fds.pop())

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
