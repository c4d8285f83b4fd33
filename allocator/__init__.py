"""A compact device allocator: streams, reuse cache with a byte cap, arenas, a use-after-free
detector.

Backends: ``cpu`` (a NumPy stub with no cache), ``sim`` (a simulated device with a capacity,
a reuse cache and streams with completion events on logical clocks) and ``cuda`` (CuPy). The
module-level functions act on a process-wide default allocator configured from ``DEVMEM_*``
environment variables, read once per process (a forked child re-reads its own);
``Allocator(config=...)`` builds another one explicitly. See ``../shared/DESIGN.md`` section 2
for the contract.

A memory history (``record_history``, ``history()``) records every allocation and free with its
Python stack; ``snapshot()`` and ``dump_snapshot(path)`` write it in the format of
``torch.cuda.memory._snapshot()``, which PyTorch's memory_viz tools read, and
``python -m allocator.memory plot|summary`` draws or summarizes it (:mod:`allocator.memory`).

Example::

    import allocator as dm

    with dm.arena() as scope:
        a, b = dm.full(16, 3.0), dm.full(16, 5.0)
        c = dm.add(a, b)
        scope.keep(c)
    assert dm.sum(c) == 128.0 and a.size == 0
"""

from ._allocator import Allocator
from ._buffer import Buffer, Storage
from ._config import (
    ARENA_DEBUG_MODES,
    BACKENDS,
    HISTORY_MODES,
    STREAM_CHECK_MODES,
    AllocatorConfig,
    default_config,
    parse_cache_cap,
)
from ._default import (
    add,
    arena,
    arena_enter,
    arena_exit,
    copy,
    current_stream,
    default_stream,
    dump_snapshot,
    empty,
    empty_cache,
    fma,
    from_numpy,
    full,
    get_allocator,
    history,
    live_blocks,
    mul,
    new_event,
    new_stream,
    record_history,
    release,
    run_in_arena,
    snapshot,
    stats,
    sum,
    to_numpy,
    use_stream,
    zeros,
)
from ._errors import (
    AllocatorError,
    ArenaError,
    BackendUnavailable,
    ConfigError,
    DeviceOutOfMemory,
    SizeMismatchError,
    UseAfterFreeError,
)
from ._free_cause import FREE_KINDS, FreeCause
from ._scope import ArenaScope
from ._snapshot import LiveBlock, StackFrame
from ._stats import AllocatorStats, EpochStats
from .device import fork_unsafe_reason
from .device._happens_before import StreamRaceError
from .device.stream import Event, Stream

__all__ = [
    "ARENA_DEBUG_MODES",
    "BACKENDS",
    "FREE_KINDS",
    "HISTORY_MODES",
    "STREAM_CHECK_MODES",
    "Allocator",
    "AllocatorConfig",
    "AllocatorError",
    "AllocatorStats",
    "ArenaError",
    "ArenaScope",
    "BackendUnavailable",
    "Buffer",
    "ConfigError",
    "DeviceOutOfMemory",
    "EpochStats",
    "Event",
    "FreeCause",
    "LiveBlock",
    "SizeMismatchError",
    "StackFrame",
    "Storage",
    "Stream",
    "StreamRaceError",
    "UseAfterFreeError",
    "add",
    "arena",
    "arena_enter",
    "arena_exit",
    "copy",
    "current_stream",
    "default_config",
    "default_stream",
    "dump_snapshot",
    "empty",
    "empty_cache",
    "fma",
    "fork_unsafe_reason",
    "from_numpy",
    "full",
    "get_allocator",
    "history",
    "live_blocks",
    "mul",
    "new_event",
    "new_stream",
    "parse_cache_cap",
    "record_history",
    "release",
    "run_in_arena",
    "snapshot",
    "stats",
    "sum",
    "to_numpy",
    "use_stream",
    "zeros",
]

# Public classes report the package as their home (``allocator.UseAfterFreeError``), in
# messages, reprs and pickles, rather than the private module that defines them.
for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type):
        _value.__module__ = __name__
del _name, _value
