"""Death-test targets for the memory history: workloads that record, and report what the
snapshot checks say. No pytest import: children start fast.

Each target patches its ``mutant`` in first (see :mod:`suites.allocator._mutants`), so a suite
can show that its own checks catch a history that forgets an event or a snapshot that
miscounts.
"""

from __future__ import annotations

import pickle

import allocator as dm
from allocator import Allocator, AllocatorConfig

from . import _mutants, _snapshot_checks, _stress


def verdicts(snapshot: dict) -> dict:
    """What each check says of ``snapshot``: ``None`` if it holds, else its message."""
    verdicts = {}
    for name, check, argument in (
        ("accounts", _snapshot_checks.check_accounts, snapshot),
        ("segments", _snapshot_checks.check_segments, snapshot),
        ("page", _snapshot_checks.check_page_readable, pickle.dumps(snapshot, protocol=4)),
    ):
        try:
            check(argument)
            verdicts[name] = None
        except AssertionError as exc:
            verdicts[name] = str(exc)
    return verdicts


def workloads(backend: str, mutant: str | None = None) -> dict:
    """The arena stress (small), then a cache-cap round (32 blocks, 24 released, a 256 KiB
    cap), on a fresh recording allocator; the checks' verdicts and the statistics."""
    _mutants.apply(mutant)
    alloc = Allocator(AllocatorConfig(backend=backend, cache_cap_bytes=4 * 65536))
    with alloc.history():
        _stress.arena_stress(alloc, n=256, k=8, arenas=2)
        held = [alloc.full(65536, 1.0) for _ in range(32)]
        for buf in held[8:]:
            alloc.release(buf)
        snapshot = alloc.snapshot()
    stats = snapshot["devmem"]["stats"]
    return {"verdicts": verdicts(snapshot), "live": stats["live_bytes"], "held": len(held)}


def default_allocator(api: str) -> dict:
    """The default allocator's history: ``knob`` (``DEVMEM_HISTORY`` set by the parent) or
    ``functions`` (the module-level forms). Reports the actions, whether the first ``alloc``
    has frames, the live blocks' frames and a dumped snapshot's round trip."""
    if api == "functions":
        dm.record_history(True, max_entries=1000, stacks=True)
        keep = dm.full(16, 1.0)
        with dm.history(stacks=False):
            dm.release(dm.full(16, 2.0))
        dm.record_history(False)
    elif api == "knob":
        keep = dm.full(16, 1.0)
        dm.release(dm.full(16, 2.0))
    else:
        raise ValueError(f"api={api!r}: expected knob or functions")
    snapshot = dm.snapshot()
    trace = snapshot["device_traces"][0]
    live = dm.live_blocks()
    return {
        "recording": snapshot["devmem"]["recording"],
        "actions": [event["action"] for event in trace],
        "frames": [len(event["frames"]) > 0 for event in trace],
        "live": [[block.size, [frame.name for frame in block.frames]] for block in live],
        "kept": keep.size,
    }
