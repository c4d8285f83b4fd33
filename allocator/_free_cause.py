"""Why a block was freed: a kind and a reason, the one value every layer's free path carries.

A storage's block leaves its owner for one of three reasons (``release``, ``arena_exit``,
``finalize``); the reuse cache then hands blocks back to the device for reasons of its own
(``cap_evict``, ``empty_cache``, ``oom_flush``, ``teardown``). Each layer's ``deallocate`` takes
a :class:`FreeCause` and passes it down unchanged, or replaces it by its own when it frees a
block for a reason of its own (the cache's eviction), so a memory history can record why at
every step.
"""

from __future__ import annotations

import dataclasses

__all__ = [
    "CAP_EVICT",
    "EMPTY_CACHE",
    "FINALIZE",
    "FREE_KINDS",
    "OOM_FLUSH",
    "RELEASE",
    "STREAM_DROPPED",
    "TEARDOWN",
    "FreeCause",
    "arena_exit",
]

FREE_KINDS = (
    "release",
    "arena_exit",
    "finalize",
    "cap_evict",
    "empty_cache",
    "oom_flush",
    "teardown",
    "stream_dropped",
)
"""The kinds, storage-level first: ``release`` (``release()`` or ``resize_(0, reason)``),
``arena_exit``, ``finalize`` (the last reference died); then the cache's: ``cap_evict``,
``empty_cache``, ``oom_flush`` (the flush before the retry), ``teardown`` (the allocator was
dropped), ``stream_dropped`` (the blocks cached for a stream nobody holds any more)."""


@dataclasses.dataclass(frozen=True, slots=True)
class FreeCause:
    """Why a block was freed.

    Attributes:
        kind: one of :data:`FREE_KINDS`.
        reason: who asked, in words: ``"release()"``, the reason given to ``resize_``, or the
            kind itself for the others.
        depth: the depth of the arena epoch that reclaimed the block (kind ``arena_exit``),
            else ``None``.

    Raises:
        ValueError: ``kind`` is not one of :data:`FREE_KINDS`, ``reason`` is empty, or
            ``depth`` is given for another kind than ``arena_exit`` (or missing for it).
    """

    kind: str
    reason: str
    depth: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in FREE_KINDS:
            raise ValueError(f"kind={self.kind!r}: expected one of {', '.join(FREE_KINDS)}")
        if not self.reason:
            raise ValueError("reason must say who frees the block, got an empty string")
        if (self.depth is None) == (self.kind == "arena_exit"):
            raise ValueError(
                f"depth={self.depth!r}: an arena_exit cause needs the epoch's depth, and no"
                " other kind has one"
            )

    def describe(self) -> str:
        """The detector's words: ``reclaimed by arena_exit at depth 0`` for an arena exit,
        ``released by <reason>`` otherwise (``released by release()``)."""
        if self.kind == "arena_exit":
            return f"reclaimed by arena_exit at depth {self.depth}"
        return f"released by {self.reason}"


RELEASE = FreeCause("release", "release()")
FINALIZE = FreeCause("finalize", "finalize")
CAP_EVICT = FreeCause("cap_evict", "cap_evict")
EMPTY_CACHE = FreeCause("empty_cache", "empty_cache()")
OOM_FLUSH = FreeCause("oom_flush", "oom_flush")
TEARDOWN = FreeCause("teardown", "teardown")
STREAM_DROPPED = FreeCause("stream_dropped", "stream_dropped")


def arena_exit(depth: int) -> FreeCause:
    """The cause for blocks reclaimed by the exit of the epoch at ``depth``."""
    return FreeCause("arena_exit", "arena_exit", depth)
