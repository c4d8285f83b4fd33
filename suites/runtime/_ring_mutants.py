"""Mutants of the heap ring and the TensorMap: the seed's bugs, patched back in.

Each suite runs at least one (DESIGN 4) and asserts that its own check catches it.
``apply(name, monkeypatch)`` patches through pytest's ``monkeypatch`` (undone after the test);
without it (in a death-test child) the patch is permanent for that process. No pytest import.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime import _ring_program, _ring_sim, tensormap

_real_by_producer = tensormap._by_producer


def _newest_only_lookup():
    """The seed's ``MapEntry::lookup``: only the newest overlapping producer (``return best``)."""
    return tensormap, "_by_producer", lambda found: _real_by_producer(found)[:1]


def _fanin_truncated_at_16():
    """The seed's fan-in array of 16: producers beyond it silently dropped."""
    return tensormap, "_by_producer", lambda found: _real_by_producer(found)[:16]


def _no_span_check():
    """Window mode as the seed shipped it: no "heap span exceeded" check at all (its comment
    promised one); the consumer reads whatever the ring holds by then."""
    return _ring_program.Orchestrator, "_check_span", lambda self, task_id, owners: None


def _exact_reclaim_ignores_consumers():
    """An exact reclaim that frees a slice once its producer is done and its scope closed,
    forgetting the tasks still reading it."""

    def dead(self, p):
        return bool(self.done[p]) and self.max_pos >= self.close[p]

    return _ring_sim._Engine, "_dead", dead


MUTANTS: dict[str, Callable[[], tuple[object, str, object]]] = {
    "newest_only_lookup": _newest_only_lookup,
    "fanin_truncated_at_16": _fanin_truncated_at_16,
    "no_span_check": _no_span_check,
    "exact_reclaim_ignores_consumers": _exact_reclaim_ignores_consumers,
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
