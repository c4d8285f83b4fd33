"""What a snapshot's trace says over time: live and cached bytes, allocation sites, markers.

Pure functions over a snapshot dict in PyTorch's format (ours, or one from
``torch.cuda.memory._snapshot()``); :mod:`allocator.memory` prints and draws them.

Definitions, per device trace, after each event:

- live bytes: allocated and not yet freed (``alloc`` adds, ``free_requested`` subtracts), the
  allocator's ``live_bytes``;
- reserved bytes: held from the device (``segment_alloc`` and an expandable segment's
  ``segment_map`` add, ``segment_free`` and ``segment_unmap`` subtract);
  cached bytes are reserved minus live (the reuse cache, blocks awaiting events included);
- an allocation site: the innermost frame of an ``alloc`` (for a comprehension or a lambda,
  with the function around it), where the allocator's own frames are already left out.

A trace may start after the allocator held memory (recording started late, or the ring dropped
its oldest events): the starting levels are worked back from the snapshot's ``segments`` (the
state at its end), and the bytes live from before the trace count as the site
:data:`BEFORE_TRACE`.
"""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict

__all__ = [
    "ACTIONS",
    "BEFORE_TRACE",
    "NO_STACK",
    "Marker",
    "Site",
    "Timeline",
    "check_snapshot",
    "device_of",
    "format_bytes",
    "site_of",
    "sites",
    "timeline",
]

ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
)
"""Every trace action PyTorch 2.13 writes (``TraceEntry::Action``, as
``torch/csrc/cuda/memory_snapshot.cpp`` names them). ``segment_map`` and ``segment_unmap`` map
and unmap part of an expandable segment (``is_expandable``); ``snapshot`` marks when a snapshot
was taken."""

_NO_ADDRESS = ("oom",)  # it has ``device_free`` instead; every other event has an int ``addr``

BEFORE_TRACE = "<live before the trace>"
NO_STACK = "<no stack recorded>"


def format_bytes(nbytes: float) -> str:
    """``1536 -> "1.50 KiB"``, ``0 -> "0 B"`` (binary units, two decimals)."""
    if abs(nbytes) < 1024:
        return f"{int(nbytes)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        nbytes /= 1024
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes:.2f} {unit}"
    raise AssertionError("unreachable")


_MISSING = object()


def _need(ok: bool, where: str, field: str, value: object, expected: str) -> None:
    if not ok:
        if value is _MISSING:
            found = "missing"
        elif value is None:
            found = "None"
        else:
            shown = repr(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            found = f"{type(value).__name__} {shown}"
        raise ValueError(f"{where}{field} is {found}, expected {expected}")


def _is_int(value: object) -> bool:
    return type(value) is int  # not bool


def _check_frames(frames: object, where: str) -> None:
    _need(isinstance(frames, list), where, ".frames", frames, "a list of frames")
    for i, frame in enumerate(frames):
        at = f"{where}.frames[{i}]"
        _need(isinstance(frame, dict), at, "", frame, "a dict {filename, line, name}")
        for field, kind in (("filename", str), ("name", str)):
            if field in frame:
                _need(isinstance(frame[field], kind), at, f".{field}", frame[field], "a str")
        if "line" in frame:
            _need(_is_int(frame["line"]), at, ".line", frame["line"], "an int")


def check_snapshot(snapshot: object) -> dict:
    """``snapshot`` if it has the structure the readers here rely on, else a ``ValueError``
    naming the first field that is wrong (``device_traces[0][3].size is str '12', expected an
    int``).

    Required: a dict with a ``segments`` list; each segment a dict with an int ``total_size``
    (bytes) and a ``blocks`` list of dicts with an int ``size`` and a str ``state``;
    ``device_traces``, if present, a list (one per device) of lists of event dicts, each with an
    ``action`` of :data:`ACTIONS`, an int ``size`` and an int ``addr`` (but ``oom``), as PyTorch
    writes every event. Optional, but typed when present: ``device``
    and ``stream`` ints (a stream may be a handle, any int), ``time_us`` a number, ``frames`` a
    list of frame dicts (``filename`` and ``name`` str, ``line`` int), ``compile_context`` and
    ``user_metadata`` str, ``devmem`` a dict whose ``annotations`` is a list of dicts.

    Raises:
        ValueError: the first field that breaks the structure, by its path.
    """
    _need(isinstance(snapshot, dict), "", "the snapshot", snapshot, "a dict")
    segments = snapshot.get("segments", _MISSING)
    _need(isinstance(segments, list), "", "segments", segments, "a list of segments")
    for i, segment in enumerate(segments):
        where = f"segments[{i}]"
        _need(isinstance(segment, dict), where, "", segment, "a dict")
        for field in ("device", "address", "total_size", "stream"):
            if field in segment or field == "total_size":
                value = segment.get(field, _MISSING)
                _need(_is_int(value), where, f".{field}", value, "an int")
        blocks = segment.get("blocks", _MISSING)
        _need(isinstance(blocks, list), where, ".blocks", blocks, "a list of blocks")
        for j, block in enumerate(blocks):
            at = f"{where}.blocks[{j}]"
            _need(isinstance(block, dict), at, "", block, "a dict")
            size, state = block.get("size", _MISSING), block.get("state", _MISSING)
            _need(_is_int(size), at, ".size", size, "an int")
            _need(isinstance(state, str), at, ".state", state, "a str")
            if "frames" in block:
                _check_frames(block["frames"], at)
        if "frames" in segment:
            _check_frames(segment["frames"], where)
    traces = snapshot.get("device_traces", [])
    _need(isinstance(traces, list), "", "device_traces", traces, "a list of lists of events")
    for device, trace in enumerate(traces):
        where = f"device_traces[{device}]"
        _need(isinstance(trace, list), where, "", trace, "a list of events")
        for i, event in enumerate(trace):
            _check_event(event, f"{where}[{i}]")
    devmem = snapshot.get("devmem", {})
    _need(isinstance(devmem, dict), "", "devmem", devmem, "a dict")
    notes = devmem.get("annotations", [])
    _need(isinstance(notes, list), "devmem", ".annotations", notes, "a list")
    for i, note in enumerate(notes):
        _need(isinstance(note, dict), f"devmem.annotations[{i}]", "", note, "a dict")
    return snapshot


def _check_event(event: object, where: str) -> None:
    _need(isinstance(event, dict), where, "", event, "a dict")
    action = event.get("action", _MISSING)
    _need(action in ACTIONS, where, ".action", action, f"one of {', '.join(ACTIONS)}")
    size = event.get("size", _MISSING)
    _need(_is_int(size), where, ".size", size, "an int")
    if action not in _NO_ADDRESS:
        address = event.get("addr", _MISSING)
        _need(_is_int(address), where, ".addr", address, "an int")
    for field in ("stream", "device_free"):
        if field in event:
            _need(_is_int(event[field]), where, f".{field}", event[field], "an int")
    if "time_us" in event:
        value = event["time_us"]
        _need(_is_int(value) or type(value) is float, where, ".time_us", value, "a number")
    if "frames" in event:
        _check_frames(event["frames"], where)
    for field in ("compile_context", "user_metadata"):
        if field in event:
            _need(isinstance(event[field], str), where, f".{field}", event[field], "a str")


def _frame_text(frame: dict, short: bool) -> str:
    filename = frame.get("filename", "?")
    if short:
        filename = os.path.basename(filename)
    else:
        try:
            relative = os.path.relpath(filename)
        except ValueError:  # another drive
            relative = filename
        if not relative.startswith(".."):
            filename = relative
    return f"{filename}:{frame.get('line', '?')} in {frame.get('name', '?')}"


def site_of(frames: list[dict], short: bool = False) -> str:
    """The allocation site of ``frames`` (innermost first): the first Python frame, with its
    caller when it is a comprehension or a lambda (``<listcomp>``). :data:`NO_STACK` if none.

    Args:
        frames: PyTorch frame dicts.
        short: file names without their directories (for a picture's legend).
    """
    python = [frame for frame in frames if str(frame.get("filename", "")).endswith(".py")]
    chosen = python or list(frames)
    if not chosen:
        return NO_STACK
    text = _frame_text(chosen[0], short)
    if str(chosen[0].get("name", "")).startswith("<") and len(chosen) > 1:
        text += f" < {chosen[1].get('name', '?')}"
    return text


def device_of(snapshot: dict, device: int | None = None) -> int:
    """The device to read: ``device`` if given, else the first with trace events (else 0).

    Raises:
        ValueError: ``device`` has no trace in this snapshot.
    """
    traces = snapshot.get("device_traces") or []
    if device is not None:
        if not 0 <= device < max(len(traces), 1):
            raise ValueError(
                f"device={device}: the snapshot has traces for devices 0 to {len(traces) - 1}"
            )
        return device
    return next((i for i, trace in enumerate(traces) if trace), 0)


@dataclasses.dataclass(frozen=True)
class Marker:
    """Something worth a mark on the timeline.

    Attributes:
        index: the number of trace events before it.
        kind: ``arena_exit``, ``release``, ``cap_evict``, ``oom`` or ``snapshot`` (PyTorch's
            mark of a snapshot taken while recording).
        label: a few words (``exit d0: 64 buffers``, ``release_param``, ``OOM 2.00 MiB``).
    """

    index: int
    kind: str
    label: str


@dataclasses.dataclass(frozen=True)
class Site:
    """One allocation site over the trace.

    Attributes:
        name: the site (see :func:`site_of`).
        peak_bytes: the most bytes allocated there and live at once.
        allocs: allocations made there during the trace.
        largest_bytes: its largest single allocation.
        live_end_bytes: its bytes still live at the end of the trace.
    """

    name: str
    peak_bytes: int
    allocs: int
    largest_bytes: int
    live_end_bytes: int


@dataclasses.dataclass(frozen=True)
class Timeline:
    """Levels after each event of one device's trace (index 0: before the first event).

    Attributes:
        time_us: the time of each point (the first event's time for point 0).
        live: live bytes.
        reserved: bytes held from the device.
        by_site: live bytes of each of the chosen sites, in the order given.
        markers: arena exits, releases, cap evictions and OOMs.
        backend: the backend the snapshot came from (``"torch"`` for PyTorch's own).
    """

    time_us: list[int]
    live: list[int]
    reserved: list[int]
    by_site: dict[str, list[int]]
    markers: list[Marker]
    backend: str

    @property
    def events(self) -> int:
        """The number of trace events."""
        return len(self.live) - 1

    @property
    def cached(self) -> list[int]:
        """Reserved minus live bytes at each point."""
        return [r - live for r, live in zip(self.reserved, self.live, strict=True)]

    @property
    def peak(self) -> tuple[int, int]:
        """``(bytes, index)`` of the highest live level (the first point that reaches it)."""
        peak = max(self.live)
        return peak, self.live.index(peak)


def _trace(snapshot: dict, device: int) -> list[dict]:
    traces = snapshot.get("device_traces") or []
    return traces[device] if device < len(traces) else []


def _end_levels(snapshot: dict, device: int) -> tuple[int, int]:
    """``(live, reserved)`` bytes at the end, from the snapshot's segments."""
    live = reserved = 0
    for segment in snapshot.get("segments", []):
        if segment.get("device", 0) != device:
            continue
        reserved += segment.get("total_size", 0)
        live += sum(
            block.get("size", 0)
            for block in segment.get("blocks", [])
            if block.get("state") == "active_allocated"
        )
    return live, reserved


_RESERVES = ("segment_alloc", "segment_map")  # an expandable segment maps more of itself
_RELEASES = ("segment_free", "segment_unmap")


def _walk(trace: list[dict], short: bool):
    """Yield ``(event, site, delta_live, delta_reserved)``; the site of a free is the site of
    the allocation it frees (``None`` when that was before the trace)."""
    site_at: dict[int, str] = {}
    for event in trace:
        action, size = event.get("action"), event.get("size", 0)
        if action == "alloc":
            site = site_of(event.get("frames", []), short)
            site_at[event.get("addr")] = site
            yield event, site, size, 0
        elif action == "free_requested":
            yield event, site_at.pop(event.get("addr"), None), -size, 0
        elif action in _RESERVES:
            yield event, None, 0, size
        elif action in _RELEASES:
            yield event, None, 0, -size
        else:
            yield event, None, 0, 0


def sites(snapshot: dict, device: int | None = None, short: bool = False) -> list[Site]:
    """Every allocation site of a device's trace, by peak live bytes (largest first), and the
    bytes live from before the trace as :data:`BEFORE_TRACE` (if any).

    Args:
        snapshot: a snapshot dict (``torch.cuda.memory._snapshot()``'s format, ours or
            PyTorch's).
        device: the device to read (default: the first with events).
        short: site names without directories.

    Returns:
        One :class:`Site` per allocating frame chain; its byte counts are bytes.

    Raises:
        ValueError: ``device`` has no trace.
    """
    device = device_of(snapshot, device)
    trace = _trace(snapshot, device)
    end_live, _ = _end_levels(snapshot, device)
    delta = sum(d for _, _, d, _ in _walk(trace, short))
    live: dict[str, int] = defaultdict(int)
    before = end_live - delta
    live[BEFORE_TRACE] = before
    peak, allocs, largest = dict(live), defaultdict(int), defaultdict(int)
    for event, site, d_live, _ in _walk(trace, short):
        if not d_live:
            continue
        site = BEFORE_TRACE if site is None else site
        live[site] += d_live
        if d_live > 0:
            allocs[site] += 1
            largest[site] = max(largest[site], event.get("size", 0))
            peak[site] = max(peak.get(site, 0), live[site])
    out = [
        Site(name, peak.get(name, 0), allocs[name], largest[name], live[name])
        for name in live
        if name != BEFORE_TRACE or before > 0
    ]
    return sorted(out, key=lambda site: (-site.peak_bytes, site.name))


def _markers(snapshot: dict, trace: list[dict], device: int) -> list[Marker]:
    """The OOMs of ``trace`` and, on device 0 (whose trace their ``trace_index`` counts), our
    annotations."""
    markers = []
    for i, event in enumerate(trace):
        action = event.get("action")
        if action == "oom":
            markers.append(Marker(i, "oom", f"OOM {format_bytes(event.get('size', 0))}"))
        elif action == "snapshot":
            markers.append(Marker(i, "snapshot", "snapshot"))
    notes = (snapshot.get("devmem") or {}).get("annotations", []) if device == 0 else []
    for note in notes:
        kind, index = note.get("action"), note.get("trace_index", 0)
        if kind == "arena_exit":
            label = f"exit d{note.get('depth')}: {note.get('reclaimed')} buffers"
        elif kind == "release":
            label = str(note.get("reason", "release"))
        elif kind == "cap_evict":
            label = f"cap evict {format_bytes(note.get('size', 0))}"
        else:
            continue
        markers.append(Marker(index, kind, label))
    return sorted(markers, key=lambda marker: marker.index)


def timeline(
    snapshot: dict, device: int | None = None, top: int = 6, short: bool = True
) -> Timeline:
    """The levels of one device's trace, with the live bytes of its ``top`` sites by peak.

    Args:
        snapshot: a snapshot dict.
        device: the device to read (default: the first with events).
        top: how many sites get their own series (>= 0).
        short: site names without directories.

    Raises:
        ValueError: ``top`` < 0, or ``device`` has no trace.
    """
    if top < 0:
        raise ValueError(f"top must be >= 0, got {top}")
    device = device_of(snapshot, device)
    trace = _trace(snapshot, device)
    chosen = [site.name for site in sites(snapshot, device, short)[:top]] if top else []
    end_live, end_reserved = _end_levels(snapshot, device)
    d_live = d_reserved = 0
    for _, _, a, b in _walk(trace, short):
        d_live, d_reserved = d_live + a, d_reserved + b
    live, reserved = [end_live - d_live], [end_reserved - d_reserved]
    first_time = trace[0].get("time_us", 0) if trace else 0
    time_us = [first_time]
    levels = dict.fromkeys(chosen, 0)
    if BEFORE_TRACE in levels:
        levels[BEFORE_TRACE] = live[0]
    by_site = {name: [level] for name, level in levels.items()}
    for event, site, a, b in _walk(trace, short):
        live.append(live[-1] + a)
        reserved.append(reserved[-1] + b)
        time_us.append(event.get("time_us", time_us[-1]))
        site = BEFORE_TRACE if site is None and a else site
        if a and site in levels:
            levels[site] += a
        for name, series in by_site.items():
            series.append(levels[name])
    backend = (snapshot.get("devmem") or {}).get("backend", "torch")
    markers = _markers(snapshot, trace, device)
    return Timeline(time_us, live, reserved, by_site, markers, backend)
