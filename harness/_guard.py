"""The guard table: one page per running child, shared by this process and its zygotes.

Each child gets a page (its *seal*, see ``harness._child``) before it starts, and writes its
pid there before it does anything else; its final status verdict goes there too. The table is
an unnamed file that this process maps into its memory and hands to each zygote it connects
to (once, at hello): when this process ends, however it ends, the zygote reads the table and
kills the process group of every child whose pid is still there. No message per child: the
zygote looks only when a client is gone.

Order of operations for a page: :meth:`GuardTable.allocate` (zeroed), the child writes its
pid and later its verdict, the parent reads the verdict (:meth:`GuardTable.seal`), and once
the child has ended, and *before* it is reaped (while its pid cannot be reused), the pid is
wiped (:meth:`GuardTable.disown`), then the page is zeroed and freed (:meth:`GuardTable.release`).
A forkserver child's pid is wiped by the zygote, which reaps it.

Imports run one way: :mod:`harness._capture` (a child's channels) takes each child's page from
this table and names its type; this module knows nothing of the capture. The unnamed file both
need comes from :mod:`harness._fd`, below both.
"""

from __future__ import annotations

import mmap
import os
import threading

from harness._child import SEAL_BYTES, SEAL_FINAL_AT
from harness._errors import HarnessError
from harness._fd import anonymous_fd

SLOTS = 1024
"""Pages in a guard table: the most children one process may run at the same time."""

_ZERO_PID = bytes(SEAL_FINAL_AT)
_ZERO_PAGE = bytes(SEAL_BYTES)


class GuardTable:
    """This process's guard table (see the module docstring).

    Attributes:
      fd: the table's file (inherited by children; handed to zygotes).
      map: the table mapped into this process's memory (``MAP_SHARED``; a fork-style child
        writes its page through the mapping it inherits).
    """

    def __init__(self) -> None:
        self.fd = anonymous_fd()
        os.ftruncate(self.fd, SLOTS * SEAL_BYTES)
        self.map = mmap.mmap(self.fd, SLOTS * SEAL_BYTES)
        self.owner = os.getpid()
        self.lock = threading.Lock()
        self.free = list(range((SLOTS - 1) * SEAL_BYTES, -1, -SEAL_BYTES))

    def allocate(self) -> int:
        """A free page's offset (the page is all zeros).

        Raises:
          HarnessError: :data:`SLOTS` children of this process are running already.
        """
        with self.lock:
            if not self.free:
                raise HarnessError(
                    f"this process runs {SLOTS} death-test children at once already; wait for "
                    "some to end"
                )
            return self.free.pop()

    def page(self, offset: int) -> memoryview:
        """The page at ``offset``, in this process's mapping (what a forked child writes)."""
        return memoryview(self.map)[offset : offset + SEAL_BYTES]

    def seal(self, offset: int) -> bytes:
        """The page at ``offset`` as the child left it."""
        return self.map[offset : offset + SEAL_BYTES]

    def disown(self, offset: int) -> None:
        """Wipe the pid of the page at ``offset``: the child has ended and is about to be
        reaped, so the zygote must not kill its group any more."""
        self.map[offset : offset + SEAL_FINAL_AT] = _ZERO_PID

    def release(self, offset: int) -> None:
        """Zero the page at ``offset`` and free it."""
        self.map[offset : offset + SEAL_BYTES] = _ZERO_PAGE
        with self.lock:
            self.free.append(offset)


_table: GuardTable | None = None
_table_lock = threading.Lock()
_abandoned: list[GuardTable] = []  # a forked process's inherited table: never touched again


def table() -> GuardTable:
    """This process's guard table (made on first use).

    A forked process makes its own: the table it inherits is its parent's (a fork-style child
    writes its page through the inherited mapping, so that table is kept alive, never closed,
    but never used for new children): the owner's pid says whose it is.
    """
    global _table, _table_lock
    found = _table
    if found is not None and found.owner == os.getpid():
        return found
    if found is not None:  # a forked process: the lock too may be the parent's, held
        _table_lock = threading.Lock()
    with _table_lock:
        if _table is not None and _table.owner != os.getpid():
            _abandoned.append(_table)
            _table = None
        if _table is None:
            _table = GuardTable()
        return _table
