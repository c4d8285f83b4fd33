"""A value built at its first use in each process: dropped in a forked child, which builds its
own. The default configuration and the default allocator are two of them."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

__all__ = ["PerProcess"]


class PerProcess(Generic[T]):
    """Holds ``factory()``, built once per process under a lock, at the first :meth:`get`.

    After ``os.fork()`` the child drops the value (``os.register_at_fork``), so its first
    :meth:`get` builds a new one, from the child's own environment.

    Args:
        factory: builds the value; its exceptions propagate from :meth:`get`, and the next
            call tries again.
    """

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self.value: T | None = None
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._drop)

    def get(self) -> T:
        """The value, built by ``factory()`` at this process's first call."""
        value = self.value
        if value is None:
            with self._lock:
                if self.value is None:
                    self.value = self._factory()
                value = self.value
        return value

    def _drop(self) -> None:
        self.value = None
        self._lock = threading.Lock()
