"""Mutants of ``runtime.zero3``: the seed's bugs, patched back in.

The pre-fix release path is the constructor's own ``legacy_release=True``; the one here is the
fix without its ``record_stream``: the storage is freed from the consumer's stream, but its
block goes back to the gather stream's free list at once, while the consumer's kernels may
still read it. ``apply(name, monkeypatch)`` patches through pytest's ``monkeypatch`` (undone
after the test); without it (in a death-test child) the patch is permanent for that process.
No pytest import.
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


def apply(name: str | None, monkeypatch=None) -> None:
    """Patch mutant ``name`` in (``None``: nothing).

    Raises:
        ValueError: an unknown name.
    """
    if name is None:
        return
    if name not in MUTANTS:
        raise ValueError(f"unknown mutant {name!r}; expected one of {', '.join(MUTANTS)}")
    owner, attribute, value = MUTANTS[name]()
    if monkeypatch is not None:
        monkeypatch.setattr(owner, attribute, value)
    else:
        setattr(owner, attribute, value)
