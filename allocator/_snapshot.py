"""Snapshots in PyTorch's format, and the live blocks a leak report lists.

:func:`build` returns the structure of ``torch.cuda.memory._snapshot()``, so that PyTorch's own
readers take it as it is: ``python -m torch.cuda._memory_viz stats|trace|segments|memory|
trace_plot|segment_plot``, and the https://pytorch.org/memory_viz page::

    {"segments": [segment, ...],           # every device block the allocator holds
     "device_traces": [[event, ...]],      # one list per device; this allocator has one
     "devmem": {...}}                      # ours; PyTorch's readers never look at it

A segment is one device block (the reuse cache keeps exact sizes and never splits a block), so
each has exactly one block: ``active_allocated`` while a storage holds it,
``active_pending_free`` once freed while it still waits on other streams' events (what PyTorch's
caching allocator writes, and what the memory_viz page reads, for the state its docstring calls
``active_awaiting_free``), ``inactive`` while it waits in the reuse cache. An event has PyTorch's
keys ``action``, ``addr`` (``device_free`` instead for ``oom``), ``size``, ``stream``,
``time_us`` and ``frames``; a frame is ``{"filename", "line", "name"}``, innermost first.

``snapshot["devmem"]`` holds what is ours: the backend, the clock (``sim``'s logical clock or
the host's), the allocator's :class:`~allocator.AllocatorStats` at the snapshot, and the
annotations (``arena_exit``, ``release``, ``cap_evict``, ``device_synchronize``), each with
``trace_index``, the number of events of ``device_traces[0]`` before it. PyTorch's readers read
only ``segments`` and ``device_traces`` (torch 2.13's ``torch/cuda/_memory_viz.py`` and
``MemoryViz.js``), which is why the annotations live there and not among the events.

Live blocks are found by walking the collector's objects for this allocator's storages (the
allocator keeps no list of them, which is what keeps recording off free): blocks allocated
before recording started are there too, with no frames.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import pickle
from typing import TYPE_CHECKING

from . import _stacks
from ._buffer import Storage
from ._free_cause import FreeCause
from ._history import ACTIONS, Recorder, awaiting_free, block_stream

if TYPE_CHECKING:
    from ._arena import ArenaRegistry
    from ._cache import CachingLayer
    from ._stats import AllocatorStats
    from .device.base import Block

__all__ = [
    "BLOCK_STATES",
    "PICKLE_PROTOCOL",
    "SMALL_SEGMENT_MAX_BYTES",
    "LiveBlock",
    "StackFrame",
    "build",
    "dump",
    "live_blocks",
]

BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")
"""A block's states, as PyTorch's caching allocator writes them."""

SMALL_SEGMENT_MAX_BYTES = 1 << 20
"""PyTorch's small pool holds blocks of at most 1 MiB: ``segment_type`` ``small``, else
``large``."""

PICKLE_PROTOCOL = 4
"""The memory_viz page's own unpickler reads protocols 2 to 4 only."""


@dataclasses.dataclass(frozen=True, slots=True)
class StackFrame:
    """One frame of a Python stack.

    Attributes:
        filename: the source file.
        line: the line number.
        name: the function (``<module>`` for a module's top level).
    """

    filename: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.line} in {self.name}"


@dataclasses.dataclass(frozen=True, slots=True)
class LiveBlock:
    """A block a storage still holds (see :meth:`Allocator.live_blocks
    <allocator.Allocator.live_blocks>`).

    Attributes:
        address: its address on the device (the host address on ``cpu`` and ``sim``).
        size: its size in bytes.
        stream: its stream, in PyTorch's format (0: the default stream).
        frames: the Python stack it was allocated from, innermost first; empty if it was
            allocated while history was off or without stacks.
    """

    address: int
    size: int
    stream: int
    frames: tuple[StackFrame, ...]

    def format(self, indent: str = "", max_frames: int | None = None) -> str:
        """``0x7f..: 16384 bytes on stream 0, allocated at`` and one line per frame, innermost
        first (``allocated while history was off`` when it has none).

        Args:
            indent: put before every line.
            max_frames: show at most this many frames, then how many more there are.
        """
        head = f"{indent}{self.address:#x}: {self.size} bytes on stream {self.stream}"
        if not self.frames:
            return f"{head}, allocated while history was off (or without stacks)"
        shown = self.frames if max_frames is None else self.frames[:max_frames]
        lines = [f"{head}, allocated at", *(f"{indent}    {frame}" for frame in shown)]
        if len(shown) < len(self.frames):
            lines.append(f"{indent}    ... {len(self.frames) - len(shown)} more frames")
        return "\n".join(lines)


def _live(registry: ArenaRegistry) -> list[Block]:
    """The blocks this registry's storages hold now (a walk of the collector's objects)."""
    blocks = []
    for obj in gc.get_objects():
        if type(obj) is Storage and obj._home is registry:
            block = obj.block
            if block is not None:
                blocks.append(block)
    return blocks


def live_blocks(registry: ArenaRegistry, recorder: Recorder) -> list[LiveBlock]:
    """Every block a storage of ``registry`` holds, by address, with its allocation frames."""
    with recorder._lock:
        frames_of = dict(recorder.alloc_frames)
    out, cache = [], _stacks.FrameCache()
    for block in _live(registry):
        stack = _stacks.frames_of(frames_of.get(block, ()), cache)
        frames = tuple(StackFrame(*frame) for frame in stack)
        out.append(LiveBlock(block.address, block.nbytes, block_stream(block), frames))
    return sorted(out, key=lambda block: block.address)


def _event(entry: tuple, frames_cache: _stacks.FrameCache) -> dict:
    action, address, size, stream, time_us, frames, extra = entry
    event = {"action": action}
    if action == "oom":
        event["device_free"] = extra["device_free"]
    else:
        event["addr"] = address
    event.update(
        size=size, stream=stream, time_us=time_us, frames=_stacks.frame_dicts(frames, frames_cache)
    )
    return event


def _annotation(entry: tuple, trace_index: int, frames_cache: _stacks.FrameCache) -> dict:
    action, address, size, stream, time_us, frames, extra = entry
    note = {"action": action, "trace_index": trace_index, "time_us": time_us}
    if address is not None:
        note.update(addr=address, size=size, stream=stream)
    if isinstance(extra, FreeCause):
        note["reason"] = extra.reason
    else:
        note.update(extra or {})
    note["frames"] = _stacks.frame_dicts(frames, frames_cache)
    return note


def _prune(recorder: Recorder, held: dict) -> None:
    """Drop the frames of blocks freed while recording was off (the maps are exact while on)."""
    with recorder._lock:
        for frames_of in (recorder.alloc_frames, recorder.segment_frames, recorder.addresses):
            for block in [block for block in frames_of if block not in held]:
                del frames_of[block]


def build(
    registry: ArenaRegistry,
    cache: CachingLayer | None,
    recorder: Recorder,
    stats: AllocatorStats,
) -> dict:
    """The snapshot of an allocator's layers, in ``torch.cuda.memory._snapshot()``'s format
    plus our ``devmem`` key (the module docstring gives every field).

    Args:
        registry: the allocator's arena registry (its storages are the live blocks).
        cache: its reuse cache (``None`` on ``cpu``): cached and awaiting blocks.
        recorder: its memory history (events, annotations, frames), recording or not.
        stats: its statistics at the snapshot, written to ``devmem["stats"]``.

    Returns:
        A new dict; sizes in bytes, ``time_us`` in microseconds of the recorder's clock.
    """
    entries = recorder.entries()
    device = recorder.device
    frames_cache = _stacks.FrameCache()
    trace, annotations = [], []
    for entry in entries:
        if entry[0] in ACTIONS:
            trace.append(_event(entry, frames_cache))
        else:
            annotations.append(_annotation(entry, len(trace), frames_cache))
    with recorder._lock:
        alloc_frames = dict(recorder.alloc_frames)
        segment_frames = dict(recorder.segment_frames)
        pending = dict(recorder.pending)
    held: dict[Block, str] = dict.fromkeys(_live(registry), "active_allocated")
    for block in [] if cache is None else cache.blocks():
        if block not in held:
            pending_free = awaiting_free(device, block)
            held[block] = "active_pending_free" if pending_free else "inactive"
    if not recorder.recording:
        _prune(recorder, held)
    segments = []
    for block, state in held.items():
        address, size = block.address, block.nbytes
        allocated = size if state == "active_allocated" else 0
        if state == "active_allocated":
            frames = alloc_frames.get(block, ())
        elif state == "active_pending_free" and block in pending:
            frames = pending[block][4]
        else:
            frames = ()
        segments.append(
            {
                "device": 0,
                "address": address,
                "total_size": size,
                "allocated_size": allocated,
                "active_size": 0 if state == "inactive" else size,
                "requested_size": allocated,
                "stream": block_stream(block),
                "segment_type": "small" if size <= SMALL_SEGMENT_MAX_BYTES else "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": _stacks.frame_dicts(segment_frames.get(block, ()), frames_cache),
                "blocks": [
                    {
                        "address": address,
                        "size": size,
                        "requested_size": size,
                        "state": state,
                        "frames": _stacks.frame_dicts(frames, frames_cache),
                    }
                ],
            }
        )
    segments.sort(key=lambda segment: segment["address"])
    return {
        "segments": segments,
        "device_traces": [trace],
        "devmem": {
            "format": 1,
            "backend": stats.backend,
            "clock": "sim" if stats.backend == "sim" else "host",
            "recording": recorder.recording,
            "stacks": recorder.stacks,
            "max_entries": recorder.ring.maxlen,
            "stats": dataclasses.asdict(stats),
            "annotations": annotations,
        },
    }


def dump(snapshot: dict, path: str | os.PathLike) -> None:
    """Pickle ``snapshot`` to ``path`` with :data:`PICKLE_PROTOCOL` (its one caller,
    ``Allocator.dump_snapshot``, has checked ``path`` before building the snapshot).

    Raises:
        OSError: the file cannot be written.
    """
    with open(path, "wb") as f:
        pickle.dump(snapshot, f, protocol=PICKLE_PROTOCOL)
