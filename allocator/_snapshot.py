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

A snapshot taken after recording stopped is still self-consistent: the recorder keeps the
state the trace ends in, and the snapshot appends the events that bring it to the segments'
state now (:func:`reconcile`, each with the one frame :data:`OFF_FRAME`);
``devmem["reconciled"]`` counts them (DESIGN 2.10; ``docs/memory-history.md``).

Live blocks are found by walking the collector's objects for this allocator's storages (the
allocator keeps no list of them, which is what keeps recording off free): blocks allocated
before recording started are there too, with no frames.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from typing import TYPE_CHECKING

from . import _stacks
from ._free_cause import FreeCause
from ._history import ACTIONS, Recorder, block_stream, storages
from ._history import held as _held

if TYPE_CHECKING:
    from ._arena import ArenaRegistry
    from ._cache import CachingLayer
    from ._stats import AllocatorStats

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


def live_blocks(registry: ArenaRegistry, recorder: Recorder) -> list[LiveBlock]:
    """Every block a storage of ``registry`` holds, by address, with the frames of that
    storage's allocation (none if it was not recorded)."""
    out, cache = [], _stacks.FrameCache()
    held = [(st, st.block) for st in storages(registry)]
    with recorder._lock:
        recorded = [(block, recorder.storage_frames(block, st)) for st, block in held if block]
    for block, frames in recorded:
        stack = _stacks.frames_of(frames or (), cache)
        triples = tuple(StackFrame(*frame) for frame in stack)
        out.append(LiveBlock(block.address, block.nbytes, block_stream(block), triples))
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
        for frames_of in (
            recorder.alloc_frames,
            recorder.owners,
            recorder.segment_frames,
            recorder.addresses,
        ):
            for block in [block for block in frames_of if block not in held]:
                del frames_of[block]


OFF_FRAME = {
    "filename": "<devmem history off>",
    "line": 0,
    "name": "happened while history was off; found at the snapshot",
}
"""The one frame of the events a snapshot adds at the end of its trace for what changed while
recording was off (see :func:`reconcile`)."""


def reconcile(
    before: dict[int, tuple], now: dict[int, tuple], reallocated: set[int], time_us: int
) -> list[dict]:
    """The events that bring the state ``before`` (where the trace ends: when recording
    stopped) to the state ``now`` (what changed while recording was off: PyTorch clears its
    trace when recording stops, we keep ours and add these), each with the one frame
    :data:`OFF_FRAME`.

    Args:
        before: per address held when recording stopped, ``(size, state, stream, ...)``;
            ``state`` one of :data:`BLOCK_STATES`.
        now: per address held now, the same.
        reallocated: addresses live both then and now, by different storages (freed and
            allocated again while off).
        time_us: the time of the added events (the snapshot's).

    Returns:
        The events to append, frees first per address (so no level ever goes negative when
        the trace is replayed from the segments' state), in address order.
    """
    out = []

    def add(action: str, address: int, size: int, stream: int) -> None:
        out.append(
            {
                "action": action,
                "addr": address,
                "size": size,
                "stream": stream,
                "time_us": time_us,
                "frames": [OFF_FRAME],
            }
        )

    for address in sorted(before.keys() | now.keys()):
        seg, state, stream = before.get(address, (None, None, 0))[:3]
        size, target, target_stream = now.get(address, (None, None, stream))[:3]
        if size == seg and target == state and address not in reallocated:
            continue
        if size == seg and size is not None:
            # the same segment: free what the trace left live, then allocate what is live now
            if state == "active_allocated" and (
                target != "active_allocated" or address in reallocated
            ):
                add("free_requested", address, seg, stream)
                state = "active_pending_free"
            if state == "active_pending_free" and target != "active_pending_free":
                add("free_completed", address, seg, stream)
                state = "inactive"
            if state == "inactive" and target != "inactive":
                add("alloc", address, size, target_stream)
                if target == "active_pending_free":
                    add("free_requested", address, size, target_stream)
            continue
        if seg is not None:  # the trace's segment went back to the device
            if state == "active_allocated":
                add("free_requested", address, seg, stream)
            if state in ("active_allocated", "active_pending_free"):
                add("free_completed", address, seg, stream)
            add("segment_free", address, seg, stream)
        if size is not None:  # a segment the trace does not know of took its address
            add("segment_alloc", address, size, target_stream)
            if target != "inactive":
                add("alloc", address, size, target_stream)
            if target == "active_pending_free":
                add("free_requested", address, size, target_stream)
    return out


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
    live, held = _held(registry, cache, device)
    with recorder._lock:
        alloc_frames = {block: recorder.storage_frames(block, st) for st, block in live}
        segment_frames = dict(recorder.segment_frames)
        pending = dict(recorder.pending)
        recording = recorder.recording
        at_stop = None if recording else recorder.at_stop
    if not recording:
        _prune(recorder, held)
    storage_of = {block: st for st, block in live}
    segments, now, reallocated = [], {}, set()
    for block, state in held.items():
        address, size, stream = block.address, block.nbytes, block_stream(block)
        allocated = size if state == "active_allocated" else 0
        now[address] = (size, state, stream)
        if state == "active_allocated":
            frames = alloc_frames.get(block) or ()
            then = None if at_stop is None else at_stop.get(address)
            if then is not None and then[1] == state and then[3]() is not storage_of[block]:
                reallocated.add(address)
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
                "stream": stream,
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
    added = [] if at_stop is None else reconcile(at_stop, now, reallocated, device.clock_us())
    trace.extend(added)
    return {
        "segments": segments,
        "device_traces": [trace],
        "devmem": {
            "format": 1,
            "backend": stats.backend,
            "clock": "sim" if stats.backend == "sim" else "host",
            "recording": recording,
            "stacks": recorder.stacks,
            "max_entries": recorder.ring.maxlen,
            "reconciled": len(added),
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
