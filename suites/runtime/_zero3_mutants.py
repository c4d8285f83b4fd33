"""Mutants of ``runtime.zero3``: the seed's bugs, patched back in.

The pre-fix release path is the constructor's own ``legacy_release=True``; the ones here are the
fix without its ``record_stream`` (the storage is freed from the consumer's stream, but its
block goes back to the gather stream's free list at once, while the consumer's kernels may
still read it), and a ``wait`` that does not make the current stream wait for the gather
(DeepSpeed's ``wait_allgather`` skipped: the op reads the view while the all-gather may still
write it). ``apply(name)`` patches it in for the rest of the process: call it in a
death-test child. No pytest import.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime import zero3


def _release_without_record_stream():
    def free(self, base):
        base.storage.resize_(0, zero3.RELEASE_REASON)

    return zero3.Zero3, "_free", free


def _wait_does_not_wait():
    def wait(self, view, param_id):
        self._check_view(view, param_id, "wait")
        return view

    return zero3.Zero3, "wait", wait


def _wait_for_the_whole_gather_stream():
    # the wait before per-parameter events: correct, but every prefetched gather queued on the
    # gather stream delays the compute
    def wait(self, view, param_id):
        self._check_view(view, param_id, "wait")
        self.alloc.current_stream().wait_stream(self.gather_stream)
        return view

    return zero3.Zero3, "wait", wait


MUTANTS: dict[str, Callable[[], tuple[object, str, object]]] = {
    "release_without_record_stream": _release_without_record_stream,
    "wait_does_not_wait": _wait_does_not_wait,
    "wait_for_the_whole_gather_stream": _wait_for_the_whole_gather_stream,
}


def apply(name: str | None) -> None:
    """Patch mutant ``name`` in for good (``None``: nothing); call it in a child.

    Raises:
        KeyError: no mutant has that name.
    """
    if name is not None:
        owner, attribute, value = MUTANTS[name]()
        setattr(owner, attribute, value)
