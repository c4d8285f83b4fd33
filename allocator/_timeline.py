"""What a snapshot's trace says over time: live and cached bytes, allocation sites, markers.

Pure functions over a snapshot dict in PyTorch's format (ours, or one from
``torch.cuda.memory._snapshot()``); :mod:`allocator.memory` prints and draws them.

Definitions, per device trace, after each event:

- live bytes: allocated and not yet freed (``alloc`` adds, ``free_requested`` subtracts, each
  by the bytes its event carries: what was requested), the allocator's ``live_bytes``;
  memory_viz lets a free subtract at its ``free_completed`` instead, which differs only for a
  block that awaited another stream's work (:attr:`Overview.viz_peak`);
- reserved bytes: held from the device (``segment_alloc`` and an expandable segment's
  ``segment_map`` add, ``segment_free`` and ``segment_unmap`` subtract);
  cached bytes are reserved minus live (the reuse cache, blocks awaiting events included, and
  what PyTorch's allocator rounded each block up by);
- an allocation site: see :func:`site_of` (as memory_viz shows a stack, less the allocator's
  own frames; our recorder leaves ours out already).

A trace may start after the allocator held memory (recording started late, or the ring dropped
its oldest events): the starting levels are worked back from the snapshot's ``segments`` (the
state at its end: the requested bytes of its live blocks, as memory_viz counts them), and the
bytes live from before the trace count as the site :data:`BEFORE_TRACE`.

The checks (:func:`check_snapshot`, :func:`check_one`) treat a file as hostile: a value in an
error message is shown bounded (:func:`shown_value`), every int fits in 64 bits, and a segment,
block list or trace that the file shares is refused (read in full it would be many times the
file); a frame list that it shares is checked and named once.
"""

from __future__ import annotations

import dataclasses
import os
import re
import reprlib
from collections import defaultdict
from sys import getrefcount

__all__ = [
    "ACTIONS",
    "BEFORE_TRACE",
    "NO_STACK",
    "Marker",
    "Overview",
    "Site",
    "Timeline",
    "TraceScan",
    "check_devmem",
    "check_one",
    "check_snapshot",
    "device_of",
    "format_bytes",
    "memory_viz_shows",
    "overview",
    "overview_of",
    "scan_device",
    "shown_value",
    "site_of",
    "sites",
    "timeline",
    "timeline_of",
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
            shown = shown_value(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            found = f"{type(value).__name__} {shown}"
        raise ValueError(f"{where}{field} is {found}, expected {expected}")


class _BoundedRepr(reprlib.Repr):
    """:mod:`reprlib` with every count small, and ints of more than 64 bits by their size (the
    digits of a huge int cost time, and more than 4,300 of them are a ``ValueError``)."""

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 64:
            return f"<an int of {x.bit_length()} bits>"
        return repr(x)

    def repr_instance(self, x: object, level: int) -> str:
        if isinstance(x, (bytes, bytearray)):
            return repr(x[: self.maxstring]) + ("..." if len(x) > self.maxstring else "")
        if x is None or isinstance(x, (bool, float)):
            return repr(x)
        return f"<{type(x).__name__}>"


_REPR = _BoundedRepr()
_REPR.maxlevel = 3
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = 4


def shown_value(value: object) -> str:
    """``repr(value)`` bounded, as an error message shows a value from a file: at most 3 levels
    deep and 4 items a level (:mod:`reprlib`), so a structure nested 1,000 deep or one that
    shares itself a billion times over ("billion laughs") costs microseconds, not a
    ``RecursionError`` or minutes. About 60 characters a string; never raises."""
    try:
        return _REPR.repr(value)
    except Exception:  # a value no repr of ours expects: say what it is
        return f"<{type(value).__name__}>"


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
            _need(-_LIMIT < frame["line"] < _LIMIT, at, ".line", frame["line"], _BOUNDED)


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
    owners: dict[int, str] = {}  # id of a segment, a block list, a trace -> where it was
    seen: dict[tuple | int, object] = {}  # frame lists checked already (see check_one)
    for i, segment in enumerate(segments):
        where = f"segments[{i}]"
        _need(isinstance(segment, dict), where, "", segment, "a dict")
        _own(segment, where, owners)
        for field in ("device", "address", "total_size", "stream"):
            if field in segment or field == "total_size":
                value = segment.get(field, _MISSING)
                _need(_is_int(value), where, f".{field}", value, "an int")
                _need(-_LIMIT < value < _LIMIT, where, f".{field}", value, _BOUNDED)
        blocks = segment.get("blocks", _MISSING)
        _need(isinstance(blocks, list), where, ".blocks", blocks, "a list of blocks")
        _own(blocks, f"{where}.blocks", owners)
        for j, block in enumerate(blocks):
            at = f"{where}.blocks[{j}]"
            _need(isinstance(block, dict), at, "", block, "a dict")
            size, state = block.get("size", _MISSING), block.get("state", _MISSING)
            _need(_is_int(size), at, ".size", size, "an int")
            _need(-_LIMIT < size < _LIMIT, at, ".size", size, _BOUNDED)
            _need(isinstance(state, str), at, ".state", state, "a str")
            requested = block.get("requested_size", 0)
            _need(_is_size(requested), at, ".requested_size", requested, "an int >= 0")
            if "frames" in block:
                _frames_once(block["frames"], at, seen)
        if "frames" in segment:
            _frames_once(segment["frames"], where, seen)
    traces = snapshot.get("device_traces", [])
    _need(isinstance(traces, list), "", "device_traces", traces, "a list of lists of events")
    for device, trace in enumerate(traces):
        where = f"device_traces[{device}]"
        _need(isinstance(trace, list), where, "", trace, "a list of events")
        _own(trace, where, owners)
        for i, event in enumerate(trace):
            check_one(event, i, where, seen)
    check_devmem(snapshot.get("devmem", {}))
    return snapshot


def _own(value: object, where: str, owners: dict[int, str]) -> None:
    """Refuse a segment, a block list or a trace that the file shares (a pickle may write one
    object once and refer to it again, a few bytes each time): read as written, a file of KiBs
    would be GiBs of segments or events. A snapshot never shares them."""
    first = owners.setdefault(id(value), where)
    if first != where:
        raise ValueError(
            f"{where} is {first} again; a snapshot shares no segment, block list or trace"
            " (read in full, a file that does is many times larger than it is)"
        )


def _frames_once(frames: object, where: str, seen: dict[tuple | int, object]) -> None:
    """:func:`_check_frames`, but once per list object (``seen`` holds it: its id stays its own)."""
    if seen.get(id(frames)) is not frames:
        _check_frames(frames, where)
        seen[id(frames)] = frames


# devmem's fields that the readers show or count, by the type each must have when present
_DEVMEM_FIELDS = (("backend", str), ("clock", str), ("max_entries", int), ("reconciled", int))
_NOTE_FIELDS = (("action", str), ("trace_index", int), ("reason", str))
_NOTE_INTS = ("depth", "reclaimed", "size")


def check_devmem(devmem: object) -> None:
    """Check ``snapshot["devmem"]`` (ours; PyTorch's snapshots have none): a dict whose
    ``backend`` and ``clock`` are str, ``max_entries`` (or None) and ``reconciled`` ints, and
    ``annotations`` a list of dicts whose ``action`` and ``reason`` are str and ``trace_index``,
    ``depth``, ``reclaimed`` and ``size`` ints >= 0, where present: the fields
    :func:`~allocator.memory.summary` and :func:`~allocator.memory.plot` print, count or place.

    Raises:
        ValueError: the first field that is wrong, by its path (``devmem.annotations[3].depth``).
    """
    _need(isinstance(devmem, dict), "", "devmem", devmem, "a dict")
    for field, kind in _DEVMEM_FIELDS:
        value = devmem.get(field)
        if value is not None:
            _need(
                _is_size(value) if kind is int else type(value) is kind,
                "devmem",
                f".{field}",
                value,
                "an int >= 0" if kind is int else "a str",
            )
    notes = devmem.get("annotations", [])
    _need(isinstance(notes, list), "devmem", ".annotations", notes, "a list")
    for i, note in enumerate(notes):
        where = f"devmem.annotations[{i}]"
        _need(type(note) is dict, where, "", note, "a dict")
        for field, kind in _NOTE_FIELDS:
            if field in note:
                value = note[field]
                good = _is_size(value) if kind is int else type(value) is kind
                _need(good, where, f".{field}", value, "an int >= 0" if kind is int else "a str")
        for field in _NOTE_INTS:
            if field in note:
                _need(_is_size(note[field]), where, f".{field}", note[field], "an int >= 0")


_BOUNDED = "an int of at most 64 bits"
_LIMIT = 1 << 64
"""Every int a snapshot holds (an address, a size, a time, a stream's handle) fits in 64 bits:
a larger one is refused (its digits alone could take seconds to print)."""


def _is_size(value: object) -> bool:
    return type(value) is int and 0 <= value < _LIMIT


_ACTION_SET = frozenset(ACTIONS)
_NONE: tuple = ()


_OWN_REFS = 3
"""``sys.getrefcount`` of a frame list that only its event holds, seen from a reader's function
(the event, the function's name for it, the call's argument). One with more references is
shared (a pickle wrote it once and referred to it again, a few bytes per event): the readers
then key it by its own id as well, so a list of 20,000 frames shared by 20,000 events costs one
pass over its frames, not one per event. A list that only its event holds is never held by its
id (holding it would keep every event's frames alive); an interpreter that counts fewer
references only loses the shortcut."""

_CACHE_LIMIT = 1 << 16
"""Entries kept in a cache of frame lists by their frames' ids (each entry holds its frames, so
their ids stay theirs); when a reader that drops events as it goes meets more distinct frame
lists than this, the cache is emptied and starts again."""


def check_one(event: object, index: int, where: str, seen: dict[tuple | int, object]) -> None:
    """Check one trace event, ``where[index]`` in the message, fast: the fields are read once
    and a frame list whose frames were all checked before (the same dicts: a pickle shares
    equal ones) is not checked again (``seen``: a cache, keyed by the frames' ids); any doubt
    goes to the slow check, which names the field.

    Raises:
        ValueError: the first field that is wrong, by its path.
    """
    if type(event) is not dict:
        _check_event(event, f"{where}[{index}]")
    get = event.get
    action = get("action")
    size, address, time_us = get("size"), get("addr"), get("time_us", 0)
    if (
        type(action) is not str
        or action not in _ACTION_SET
        or type(size) is not int
        or not -_LIMIT < size < _LIMIT
        or (action != "oom" and (type(address) is not int or not -_LIMIT < address < _LIMIT))
        or type(get("stream", 0)) is not int
        or type(get("device_free", 0)) is not int
        or type(time_us) not in (int, float)
        or not -_LIMIT < time_us < _LIMIT  # a float's inf and nan too
        or type(get("compile_context", "")) is not str
        or type(get("user_metadata", "")) is not str
    ):
        _check_event(event, f"{where}[{index}]")
    frames = get("frames", _NONE)
    if frames is not _NONE:
        if type(frames) is not list:
            _check_event(event, f"{where}[{index}]")
        if seen.get(id(frames)) is not frames:  # not this very list again (a pickle shares it)
            key = tuple(map(id, frames))
            if key not in seen:
                _check_frames(frames, f"{where}[{index}]")
                if len(seen) >= _CACHE_LIMIT:
                    seen.clear()
                seen[key] = frames  # held: no id in the key can be reused while cached
            if getrefcount(frames) > _OWN_REFS:  # shared: alive anyway, held by its own id too
                seen[id(frames)] = frames


def _check_event(event: object, where: str) -> None:
    _need(isinstance(event, dict), where, "", event, "a dict")
    action = event.get("action", _MISSING)
    _need(action in ACTIONS, where, ".action", action, f"one of {', '.join(ACTIONS)}")
    size = event.get("size", _MISSING)
    _need(_is_int(size), where, ".size", size, "an int")
    _need(-_LIMIT < size < _LIMIT, where, ".size", size, _BOUNDED)
    if action not in _NO_ADDRESS:
        address = event.get("addr", _MISSING)
        _need(_is_int(address), where, ".addr", address, "an int")
        _need(-_LIMIT < address < _LIMIT, where, ".addr", address, _BOUNDED)
    for field in ("stream", "device_free"):
        if field in event:
            _need(_is_int(event[field]), where, f".{field}", event[field], "an int")
    if "time_us" in event:
        value = event["time_us"]
        _need(_is_int(value) or type(value) is float, where, ".time_us", value, "a number")
        _need(-_LIMIT < value < _LIMIT, where, ".time_us", value, "a finite number of 64 bits")
    if "frames" in event:
        _check_frames(event["frames"], where)
    for field in ("compile_context", "user_metadata"):
        if field in event:
            _need(isinstance(event[field], str), where, f".{field}", event[field], "a str")


def _frame_text(frame: dict, short: bool, files: dict | None = None) -> str:
    filename = frame.get("filename", "?")
    shown = None if files is None else files.get(filename)
    if shown is None:
        if short:
            shown = os.path.basename(filename)
        else:
            try:
                relative = os.path.relpath(filename)
            except ValueError:  # another drive
                relative = filename
            shown = filename if relative.startswith("..") else relative
        if files is not None:
            files[filename] = shown
    return f"{shown}:{frame.get('line', '?')} in {frame.get('name', '?')}"


MEMORY_VIZ_OMIT_FUNCTIONS = (
    "unwind::unwind",
    "CapturedTraceback::gather",
    "gather_with_cpp",
    "_start",
    "__libc_start_main",
    "PyEval_",
    "PyObject_",
    "PyFunction_",
)
"""A frame whose function name contains one of these is hidden by memory_viz
(``frameFilter`` in PyTorch's ``torch/utils/viz/MemoryViz.js``, ``_frame_filter`` in
``torch/cuda/_memory_viz.py``: the same lists in both, as of PyTorch 2.13)."""

MEMORY_VIZ_OMIT_FILENAMES = (
    "core/boxing",
    "/Register",
    "/Redispatch",
    "pythonrun.c",
    "Modules/main.c",
    "Objects/call.c",
    "Objects/methodobject.c",
    "pycore_ceval.h",
    "ceval.c",
    "cpython/abstract.h",
)
"""A frame whose file name contains one of these is hidden by memory_viz (as above)."""

ALLOCATOR_FUNCTIONS = (
    "CachingAllocator",
    "at::detail::empty",
    "at::native::empty",
    "at::empty",
    "at::_ops::empty",
    "at::_ops::new_empty",
    "wrap_kernel_functor_unboxed",
    "create_out",
    "set_output_raw_strided",
)
"""Frames memory_viz shows but that name no allocation site: the caching allocator, the empty
tensor factories every op allocates through, and the dispatcher's wrappers around them."""

ALLOCATOR_FILENAMES = ("torch/cuda/memory.py",)
"""Python files of the allocator's own API (``torch.cuda.caching_allocator_alloc``): their frame
is the allocator's, the one below it the site."""

_NODE = re.compile(r"torch::autograd::(?:generated::)?(\w+)::apply\(")
_OP = re.compile(r"at::_ops::(\w+)::(?:call|redispatch)\b")


def memory_viz_shows(frame: dict) -> bool:
    """Whether memory_viz shows ``frame`` (its ``frameFilter``, ported): not when its ``name``
    contains one of :data:`MEMORY_VIZ_OMIT_FUNCTIONS` or its ``filename`` one of
    :data:`MEMORY_VIZ_OMIT_FILENAMES` (a missing field is an empty string)."""
    name, filename = frame.get("name", ""), frame.get("filename", "")
    return not any(part in name for part in MEMORY_VIZ_OMIT_FUNCTIONS) and not any(
        part in filename for part in MEMORY_VIZ_OMIT_FILENAMES
    )


def _allocators(frame: dict) -> bool:
    name, filename = frame.get("name", ""), frame.get("filename", "")
    return any(part in name for part in ALLOCATOR_FUNCTIONS) or any(
        filename.endswith(part) for part in ALLOCATOR_FILENAMES
    )


def site_of(frames: list[dict], short: bool = False, files: dict | None = None) -> str:
    """The allocation site of ``frames`` (innermost first), among the frames memory_viz shows
    (:func:`memory_viz_shows`) that are not the allocator's own (:data:`ALLOCATOR_FUNCTIONS`,
    :data:`ALLOCATOR_FILENAMES`):

    - the first Python frame, with its caller's name when it is a comprehension or a lambda
      (``model.py:7 in <listcomp> < build``);
    - with no Python frame (a C++ stack: PyTorch's ``stacks="all"`` on its autograd thread), the
      operator and the autograd node that allocated (``at::_ops::mm < MmBackward0``: the
      first ``at::_ops::<op>::call`` or ``redispatch`` frame that is not an empty-tensor
      factory, and the first ``torch::autograd::...::<Node>::apply`` frame), either alone when
      the other is missing;
    - else the first such frame, its name without its argument list;
    - :data:`NO_STACK` when there is no frame, and the first frame when every one is hidden.

    Args:
        frames: PyTorch frame dicts.
        short: file names without their directories (for a picture's legend).
        files: a cache of each file name as shown (relative paths cost a ``getcwd``).
    """
    if not frames:
        return NO_STACK
    chosen = []  # the first two Python frames (the caller names a comprehension's site)
    native = None  # the first C++ frame shown
    op = node = None
    for frame in frames:
        if not memory_viz_shows(frame) or _allocators(frame):
            continue
        if str(frame.get("filename", "")).endswith(".py"):
            chosen.append(frame)
            if len(chosen) == 2:
                break
        elif not chosen:
            native = native or frame
            name = str(frame.get("name", ""))
            if op is None and "at::_ops::" in name:
                found = _OP.search(name)
                op = found and found.group(1)
            if node is None and "::apply(" in name:
                found = _NODE.search(name)
                node = found and found.group(1)
    if not chosen:
        if op or node:
            return " < ".join(part for part in (op and f"at::_ops::{op}", node) if part)
        frame = native or frames[0]
        name = str(frame.get("name", "?"))
        return _frame_text({**frame, "name": name.split("(", 1)[0] or name}, short, files)
    text = _frame_text(chosen[0], short, files)
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
    """``(live, reserved)`` bytes at the end, from the snapshot's segments: the requested bytes
    of the ``active_allocated`` blocks (``requested_size``, else ``size``), as memory_viz counts
    them and as the trace's events carry them (PyTorch rounds a block's ``size`` up to 512
    bytes, its events say what was asked), and the segments' ``total_size``."""
    live = reserved = 0
    for segment in snapshot.get("segments", []):
        if segment.get("device", 0) != device:
            continue
        reserved += segment.get("total_size", 0)
        for block in segment.get("blocks", []):
            if block.get("state") == "active_allocated":
                live += block.get("requested_size", block.get("size", 0))
    return live, reserved


_RESERVES = ("segment_alloc", "segment_map")  # an expandable segment maps more of itself
_RELEASES = ("segment_free", "segment_unmap")


class TraceScan:
    """One pass over a trace, an event at a time (:meth:`add`): the level changes, and per
    allocation site (each distinct frame list named once) its bytes live, their highest level,
    its allocations and the largest; and the trace's own markers (OOMs, snapshots taken).

    Levels are relative to the trace's start (the bytes live before it are worked out from the
    segments afterwards). With ``series``, the relative levels after every event, each event's
    time, and each event's site of a live-bytes change (``None`` for the bytes live before the
    trace)."""

    def __init__(self, short: bool, series: bool) -> None:
        self.short, self.series = short, series
        # frames' ids (or a frame list's own id) -> (site, the frames or that list)
        self.names: dict[tuple | int, tuple[str, object]] = {}
        self.files: dict[str, str] = {}
        self.site_at: dict[int, str] = {}  # address -> the site of the block live there
        self.live: dict[str | None, int] = defaultdict(int)  # None: live before the trace
        self.peak: dict[str | None, int] = defaultdict(int)
        self.allocs: dict[str, int] = defaultdict(int)
        self.largest: dict[str, int] = defaultdict(int)
        self.markers: list[Marker] = []
        self.events = 0
        self.delta_live = self.delta_reserved = 0  # the levels, relative to the start
        self.top = self.top_at = 0  # the highest relative level, first reached after event top_at
        # memory_viz's level: a block is live until its free_completed (not free_requested)
        self.viz_live = self.viz_top = self.viz_top_at = 0
        self.levels, self.reserves, self.times, self.owners = [0], [0], [], []
        self.time_us: int | float = 0  # the last time seen (series): an event without one has it

    def add(self, event: dict) -> None:
        """Count one more event (a checked event dict, see :func:`check_one`)."""
        self.events = i = self.events + 1
        action = event.get("action")
        size = event.get("size", 0)
        site = None
        if action == "alloc":
            frames = event.get("frames", ())
            named = self.names.get(id(frames))  # this very list again: a pickle shares it
            if named is None or named[1] is not frames:
                key = tuple(map(id, frames))
                named = self.names.get(key)
                if named is None:
                    if len(self.names) >= _CACHE_LIMIT:
                        self.names.clear()
                    named = (site_of(frames, self.short, self.files), frames)
                    self.names[key] = named  # held: the ids cannot be reused while cached
                if getrefcount(frames) > _OWN_REFS:  # shared (see check_one)
                    self.names[id(frames)] = (named[0], frames)
            site = named[0]
            self.site_at[event.get("addr")] = site
            self.allocs[site] += 1
            if size > self.largest[site]:
                self.largest[site] = size
            now = self.live[site] = self.live[site] + size
            if now > self.peak[site]:
                self.peak[site] = now
            self.delta_live = level = self.delta_live + size
            if level > self.top:
                self.top, self.top_at = level, i
            self.viz_live = level = self.viz_live + size
            if level > self.viz_top:
                self.viz_top, self.viz_top_at = level, i
        elif action == "free_completed":
            self.viz_live -= size
        elif action == "free_requested":
            site = self.site_at.pop(event.get("addr"), None)
            self.live[site] -= size
            self.delta_live -= size
        elif action in _RESERVES:
            self.delta_reserved += size
        elif action in _RELEASES:
            self.delta_reserved -= size
        elif action == "oom":
            self.markers.append(Marker(i - 1, "oom", f"OOM {format_bytes(size)}"))
        elif action == "snapshot":
            self.markers.append(Marker(i - 1, "snapshot", "snapshot"))
        if self.series:
            self.levels.append(self.delta_live)
            self.reserves.append(self.delta_reserved)
            self.time_us = event.get("time_us", self.time_us)
            self.times.append(self.time_us)
            self.owners.append(site)

    def sites(self, before: int) -> list[Site]:
        """The sites, given the bytes live before the trace."""
        out = [
            Site(name, self.peak[name], self.allocs[name], self.largest[name], self.live[name])
            for name in self.live
            if name is not None
        ]
        if before > 0:
            # the bytes live before the trace: their own level starts at ``before``
            out.append(Site(BEFORE_TRACE, before + self.peak[None], 0, 0, before + self.live[None]))
        return sorted(out, key=lambda site: (-site.peak_bytes, site.name))


def scan_device(snapshot: dict, device: int, *, short: bool, series: bool) -> TraceScan:
    """One :class:`TraceScan` over ``device``'s trace in ``snapshot`` (none: an empty scan);
    ``device`` is the caller's to check (:func:`device_of`)."""
    scan = TraceScan(short, series)
    for event in _trace(snapshot, device):
        scan.add(event)
    return scan


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
    scan = scan_device(snapshot, device, short=short, series=False)
    end_live, _ = _end_levels(snapshot, device)
    return scan.sites(end_live - scan.delta_live)


@dataclasses.dataclass(frozen=True)
class Overview:
    """What ``summary`` prints, from one pass over a device's trace.

    Attributes:
        events: trace events.
        peak: ``(bytes, index)`` of the highest live level and the first point reaching it.
        live, cached, reserved: the levels at the end (bytes).
        markers: as :attr:`Timeline.markers`.
        backend: as :attr:`Timeline.backend`.
        sites: as :func:`sites` (``short=False``).
        viz_peak: ``(bytes, index)`` of the highest level as memory_viz counts it, a freed block
            live until its ``free_completed`` (not its ``free_requested``): higher than
            ``peak`` when a block freed while another stream used it (``record_stream``)
            awaited that stream while others were allocated.
    """

    events: int
    peak: tuple[int, int]
    live: int
    cached: int
    reserved: int
    markers: list[Marker]
    backend: str
    sites: list[Site]
    viz_peak: tuple[int, int] = (0, 0)


def overview(snapshot: dict, device: int | None = None) -> Overview:
    """The levels, markers and sites of one device's trace in one pass (what :func:`timeline`
    and :func:`sites` give, without the series).

    Raises:
        ValueError: ``device`` has no trace.
    """
    device = device_of(snapshot, device)
    return overview_of(snapshot, device, scan_device(snapshot, device, short=False, series=False))


def overview_of(snapshot: dict, device: int, scan: TraceScan) -> Overview:
    """:func:`overview` of ``device``, from its trace's events already counted into ``scan``
    (``TraceScan(short=False, series=False)``; ``snapshot``'s own trace is not read: a streaming
    reader drops the events). Byte counts are bytes; nothing is raised: ``device`` is the
    caller's to check (:func:`device_of`)."""
    end_live, end_reserved = _end_levels(snapshot, device)
    before = end_live - scan.delta_live
    peak = (before + scan.top, scan.top_at) if scan.top > 0 else (before, 0)
    viz = (before + scan.viz_top, scan.viz_top_at) if scan.viz_top > 0 else (before, 0)
    backend = (snapshot.get("devmem") or {}).get("backend", "torch")
    return Overview(
        scan.events,
        peak,
        end_live,
        end_reserved - end_live,
        end_reserved,
        _markers(snapshot, scan, device),
        backend,
        scan.sites(before),
        viz,
    )


def _markers(snapshot: dict, scan: TraceScan, device: int) -> list[Marker]:
    """The OOMs and snapshots of the scanned trace and, on device 0 (whose trace their
    ``trace_index`` counts), our annotations."""
    markers = list(scan.markers)
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
        # an index past the trace (a file's, or a ring's that dropped events) marks its end
        markers.append(Marker(min(index, scan.events), kind, label))
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
    return timeline_of(
        snapshot, device, scan_device(snapshot, device, short=short, series=True), top
    )


def timeline_of(snapshot: dict, device: int, scan: TraceScan, top: int = 6) -> Timeline:
    """:func:`timeline` from a scan (``series`` on) of ``device``'s trace, read already: the
    trace itself is not needed (it may have been streamed and dropped, see
    :func:`allocator.memory.plot`); the segments and annotations are read from ``snapshot``.
    ``top`` >= 0 (checked by :func:`timeline`)."""
    end_live, end_reserved = _end_levels(snapshot, device)
    before = end_live - scan.delta_live
    chosen = [site.name for site in scan.sites(before)[:top]] if top else []
    levels = scan.levels
    live = [before + level for level in levels]
    start_reserved = end_reserved - scan.delta_reserved
    reserved = [start_reserved + level for level in scan.reserves]
    # point 0 takes the first event's time (its time, or 0 without one: what times[0] holds)
    time_us = [scan.times[0] if scan.times else 0, *scan.times]
    by_site = {}
    for name in chosen:
        owner = None if name == BEFORE_TRACE else name
        level = before if owner is None else 0
        series = [level]
        # an event changes the live level only by its own site's bytes (an allocation, or a
        # free's request of a block allocated at that site): its site owns the change
        for i, site in enumerate(scan.owners):
            if site == owner:
                level += levels[i + 1] - levels[i]
            series.append(level)
        by_site[name] = series
    backend = (snapshot.get("devmem") or {}).get("backend", "torch")
    markers = _markers(snapshot, scan, device)
    return Timeline(time_us, live, reserved, by_site, markers, backend)
