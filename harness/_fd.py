"""Unnamed files: the descriptors behind a child's status file, request file and the guard table.

A module of its own below both users, so that imports run one way: :mod:`harness._capture`
(a child's channels) and :mod:`harness._guard` (the guard table, whose type the capture names)
both import it, and it imports neither.
"""

from __future__ import annotations

import errno
import os
import tempfile

__all__ = ["anonymous_fd"]


def anonymous_fd() -> int:
    """A read-write descriptor of an unnamed file (not inherited across exec).

    A memory file (Linux ``memfd_create``: no disk, no journal, cheap to map) where there is
    one; else ``O_TMPFILE`` in the temp directory, else a file unlinked at once: either way
    nothing is left behind, whatever happens to parent or child.

    Raises:
      OSError: no descriptor is left (``EMFILE``, ``ENFILE``), or no file can be made.
    """
    try:
        return os.memfd_create("devmem-death", os.MFD_CLOEXEC)
    except AttributeError:
        pass
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            raise  # out of descriptors: a file in the temp directory cannot be opened either
    directory = tempfile.gettempdir()
    try:
        return os.open(directory, os.O_TMPFILE | os.O_RDWR, 0o600)
    except (AttributeError, OSError):
        fd, path = tempfile.mkstemp(prefix="devmem-death-")
        os.unlink(path)
        return fd
