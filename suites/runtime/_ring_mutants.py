"""Mutants of the heap ring and the TensorMap: the seed's bugs, patched back in.

Each suite runs at least one (DESIGN 4) and asserts that its own check catches it.
``apply(name, monkeypatch)`` patches through pytest's ``monkeypatch`` (undone after the test);
without it (in a death-test child) the patch is permanent for that process. No pytest import.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime.ring import _program, _sim
from runtime.tensormap import TensorMap, _map

_real_by_producer = _map._by_producer
_real_newest_first = _map._newest_first
_real_candidates = _map._Bucket.candidates


def _truncated(keep: int):
    """Lookups and both gather paths (``gather_fanin``, ``gather_spans``) keep ``keep``."""
    return [
        (_map, "_by_producer", lambda found: _real_by_producer(found)[:keep]),
        (_map, "_newest_first", lambda tasks: _real_newest_first(tasks)[:keep]),
    ]


def _newest_only_lookup():
    """The seed's ``MapEntry::lookup``: only the newest overlapping producer (``return best``)."""
    return _truncated(1)


def _fanin_truncated_at_16():
    """The seed's fan-in array of 16: producers beyond it silently dropped."""
    return _truncated(16)


def _no_span_check():
    """Window mode as the seed shipped it: no "heap span exceeded" check at all (its comment
    promised one); the consumer reads whatever the ring holds by then."""
    return _program.Orchestrator, "_check_span", lambda self, task_id, owners: None


def _exact_reclaim_ignores_consumers():
    """An exact reclaim that frees a slice once its producer is done and its scope closed,
    forgetting the tasks still reading it."""

    def dead(self, p):
        return bool(self.done[p]) and self.max_pos >= self.close[p]

    return _sim._Engine, "_dead", dead


def _exact_reclaim_ignores_scope():
    """An exact reclaim that frees a slice once its task and readers are done, before its scope
    closes: the simulator knows every future reader from the plan, a real runtime does not (a
    reader submitted later in the scope would find the bytes gone)."""

    def dead(self, p):
        return bool(self.done[p]) and not self.users_left[p]

    return _sim._Engine, "_dead", dead


def _window_boundary_one_late():
    """Window reclaim's boundary one task too far: ``vend[F - H + 1]``."""

    def boundary(self):
        r = self.frontier - self.cfg.h + 1
        return self.vend[r] if r >= 0 else 0

    return _sim._Engine, "_boundary", boundary


def _fanin_truncated_at_100():
    """A fan-in array of 100: producers beyond it silently dropped."""
    return _truncated(100)


def _candidates_skip_one_byte_overlaps():
    """A candidate window that misses an entry ending one byte into the lookup."""

    def candidates(self, lo, hi):
        return [e for e in _real_candidates(self, lo, hi) if e.hi > lo + 1]

    return _map._Bucket, "candidates", candidates


def _no_readers_recorded():
    """The TensorMap before write-after-read was ordered: it records no readers (both the
    Region path and the span path)."""
    return [
        (TensorMap, "_record_read", lambda self, *args: None),
        (TensorMap, "_record_read_span", lambda self, *args: None),
    ]


def _fanin_without_writes():
    """Planning before write-after-write was ordered: the fan-in lookup without the task's
    ``writes=`` (both the Region path and the span path)."""
    patches = []
    for name in ("gather_fanin", "gather_spans"):
        real = getattr(_program, name)

        def without_writes(tmap, task, *, real=real, inputs=(), inouts=(), writes=(), **kw):
            return real(tmap, task, inputs=inputs, inouts=inouts, **kw)

        patches.append((_program, name, without_writes))
    return patches


def _lost_wake_up():
    """A simulator bug, not a seed's: a core idle until its task's producer ends is never
    woken (nor is a core blocked on back-pressure)."""
    return _sim._Engine, "_wake", lambda self, core: None


Patch = tuple[object, str, object]
MUTANTS: dict[str, Callable[[], Patch | list[Patch]]] = {
    "newest_only_lookup": _newest_only_lookup,
    "fanin_truncated_at_16": _fanin_truncated_at_16,
    "no_span_check": _no_span_check,
    "exact_reclaim_ignores_consumers": _exact_reclaim_ignores_consumers,
    "exact_reclaim_ignores_scope": _exact_reclaim_ignores_scope,
    "window_boundary_one_late": _window_boundary_one_late,
    "fanin_truncated_at_100": _fanin_truncated_at_100,
    "candidates_skip_one_byte_overlaps": _candidates_skip_one_byte_overlaps,
    "lost_wake_up": _lost_wake_up,
    "no_readers_recorded": _no_readers_recorded,
    "fanin_without_writes": _fanin_without_writes,
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
    patches = MUTANTS[name]()
    for owner, attribute, value in patches if isinstance(patches, list) else [patches]:
        if monkeypatch is not None:
            monkeypatch.setattr(owner, attribute, value)
        else:
            setattr(owner, attribute, value)
