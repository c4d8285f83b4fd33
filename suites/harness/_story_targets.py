"""Targets whose child ends in a way that contradicts what the target did (issue 36, item 4):
run in death-test children, so no pytest import here."""

from __future__ import annotations

import os
import sys
import time


class _FlushThen:
    """A stdout that swallows writes and, when flushed (the harness flushes sys.stdout on the
    child's way out), aborts (``"abort"``) or sleeps for ever (``"hang"``)."""

    def __init__(self, then: str) -> None:
        self.then = then

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        if self.then == "abort":
            os.abort()
        while self.then == "hang":
            time.sleep(0.05)


def raise_then(then: str, message: str) -> None:
    """Raise ``ValueError(message)``; the child's way out then aborts or hangs."""
    sys.stdout = _FlushThen(then)
    raise ValueError(message)


def return_then(then: str, value: int) -> int:
    """Return ``value``; the child's way out then aborts or hangs."""
    sys.stdout = _FlushThen(then)
    return value
