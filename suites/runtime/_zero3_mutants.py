"""Mutants of ``runtime.zero3``: the seed's bugs, patched back in.

The pre-fix release path is the constructor's own ``legacy_release=True``; the one here is the
fix without its ``record_stream``: the storage is freed from the consumer's stream, but its
block goes back to the gather stream's free list at once, while the consumer's kernels may
still read it. ``apply(name)`` patches it in for the rest of the process: call it in a
death-test child. No pytest import.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime import zero3


def _release_without_record_stream():
    def free(self, base):
        base.storage.resize_(0, zero3.RELEASE_REASON)

    return zero3.Zero3, "_free", free


MUTANTS: dict[str, Callable[[], tuple[object, str, object]]] = {
    "release_without_record_stream": _release_without_record_stream,
}


def apply(name: str | None) -> None:
    """Patch mutant ``name`` in for good (``None``: nothing); call it in a child.

    Raises:
        KeyError: no mutant has that name.
    """
    if name is not None:
        owner, attribute, value = MUTANTS[name]()
        setattr(owner, attribute, value)
