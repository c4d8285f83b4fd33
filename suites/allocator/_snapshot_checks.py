"""Checks of a snapshot against what its readers rely on; each raises ``AssertionError`` saying
what broke. No pytest import: death-test children run them too.

- :func:`check_accounts`: the trace adds up to the allocator's own counters, the way PyTorch's
  ``_memory_viz trace`` sums it (``alloc`` minus ``free_completed``: its ``TOTAL MEM``).
- :func:`check_segments`: the segments add up to the statistics, and each one to its blocks
  (``_memory_viz stats`` raises "Segment size mismatch" otherwise).
- :func:`check_consistent`: the trace replayed backwards from the segments (as the memory_viz
  page's Allocator State History view does) finds every block in the state its event needs,
  and the levels it gives never go negative (DESIGN 2.10: every snapshot is self-consistent).
- :func:`check_page_readable`: the pickle and the fields that the https://pytorch.org/memory_viz
  page's own JavaScript reads (``torch/utils/viz/MemoryViz.js``: ``unpickle``,
  ``annotate_snapshot``, ``process_alloc_data``, ``MemoryView``).
"""

from __future__ import annotations

import pickle
import pickletools

__all__ = [
    "PAGE_OPCODES",
    "check_accounts",
    "check_consistent",
    "check_page_readable",
    "check_segments",
    "totals",
]

PAGE_OPCODES = frozenset(
    {
        "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET",
        "LONG_BINGET", "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST",
        "APPEND", "APPENDS", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE",
        "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT",
        "SHORT_BINUNICODE", "BINUNICODE",
    }
)  # fmt: skip
"""The pickle opcodes MemoryViz.js's ``unpickle`` implements (it throws on any other), for
protocols 2 to 4."""

_STATES = ("active_allocated", "active_pending_free", "inactive")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)


def totals(snapshot: dict) -> dict[str, int]:
    """Sums over device 0's trace and the segments (bytes)."""
    sums = dict.fromkeys(
        ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free"), 0
    )
    for event in snapshot["device_traces"][0]:
        if event["action"] in sums:
            sums[event["action"]] += event["size"]
    blocks = [block for segment in snapshot["segments"] for block in segment["blocks"]]
    for state in _STATES:
        sums[state] = sum(block["size"] for block in blocks if block["state"] == state)
    sums["reserved"] = sum(segment["total_size"] for segment in snapshot["segments"])
    return sums


def check_accounts(snapshot: dict) -> None:
    """The trace of a history started on an empty allocator adds up to its statistics.

    ``alloc - free_requested`` is ``live_bytes``; ``alloc - free_completed`` (PyTorch's
    ``TOTAL MEM``) is ``live_bytes`` plus the bytes still awaiting their event; device mallocs
    minus frees is what the segments reserve.
    """
    stats = snapshot["devmem"]["stats"]
    sums = totals(snapshot)
    live = stats["live_bytes"]
    _check(
        sums["alloc"] - sums["free_requested"] == live,
        f"alloc - free_requested = {sums['alloc'] - sums['free_requested']} bytes, but"
        f" live_bytes = {live}",
    )
    _check(
        sums["alloc"] - sums["free_completed"] == live + sums["active_pending_free"],
        f"alloc - free_completed (trace's TOTAL MEM) = {sums['alloc'] - sums['free_completed']}"
        f" bytes, but live_bytes + awaiting free = {live} + {sums['active_pending_free']}",
    )
    _check(
        sums["segment_alloc"] - sums["segment_free"] == sums["reserved"],
        f"segment_alloc - segment_free = {sums['segment_alloc'] - sums['segment_free']} bytes,"
        f" but the segments hold {sums['reserved']}",
    )


def check_segments(snapshot: dict) -> None:
    """The segments add up: active blocks are ``live_bytes``, all of them ``live_bytes +
    cache_bytes``, and each segment's blocks tile it (the condition of ``_memory_viz stats``'s
    "Segment size mismatch")."""
    stats = snapshot["devmem"]["stats"]
    sums = totals(snapshot)
    _check(
        sums["active_allocated"] == stats["live_bytes"],
        f"active_allocated blocks hold {sums['active_allocated']} bytes, but live_bytes ="
        f" {stats['live_bytes']}",
    )
    _check(
        sums["reserved"] == stats["live_bytes"] + stats["cache_bytes"],
        f"the segments hold {sums['reserved']} bytes, but live + cache ="
        f" {stats['live_bytes']} + {stats['cache_bytes']}",
    )
    for segment in snapshot["segments"]:
        address = segment["address"]
        for block in segment["blocks"]:
            _check(block["state"] in _STATES, f"block state {block['state']!r} at {address:#x}")
            _check(block["address"] == address, f"the blocks of {segment['address']:#x} have gaps")
            address += block["size"]
        _check(
            address - segment["address"] == segment["total_size"],
            f"Segment size mismatch at {segment['address']:#x}: blocks"
            f" {address - segment['address']} != total_size {segment['total_size']}",
        )
        active = sum(b["size"] for b in segment["blocks"] if b["state"] == "active_allocated")
        _check(
            segment["allocated_size"] == active,
            f"allocated_size {segment['allocated_size']} != active blocks {active}",
        )


# what undoing an event needs the block at its address to be, and what it leaves there
_UNDO = {
    "free_completed": ("inactive", "active_pending_free"),
    "free_requested": ("active_pending_free", "active_allocated"),
    "alloc": ("active_allocated", "inactive"),
    "segment_alloc": ("inactive", None),
    "segment_free": (None, "inactive"),
}


def check_consistent(snapshot: dict) -> None:
    """Every device's trace, undone event by event from the newest, starting from the blocks
    the segments hold: each event finds its address in the state it left it in (a segment of
    one block, as ours are), and the live and reserved levels forward from the start that this
    gives are never negative and end at the segments' sums."""
    for device, trace in enumerate(snapshot["device_traces"]):
        state: dict[int, tuple[int, str]] = {}
        for segment in snapshot["segments"]:
            if segment.get("device", 0) == device:
                (block,) = segment["blocks"]
                state[segment["address"]] = (segment["total_size"], block["state"])
        live_end = sum(size for size, s in state.values() if s == "active_allocated")
        reserved_end = sum(size for size, _ in state.values())
        for i in range(len(trace) - 1, -1, -1):
            event = trace[i]
            action = event["action"]
            if action not in _UNDO:
                continue
            address, size = event["addr"], event["size"]
            needs, leaves = _UNDO[action]
            found = state.get(address)
            _check(
                (found is None and needs is None) or found == (size, needs),
                f"device_traces[{device}][{i}] {action} of {size} bytes at {address:#x}: the"
                f" block there is {found!r} after it, expected {needs!r}",
            )
            if leaves is None:
                del state[address]
            else:
                state[address] = (size, leaves)
        live = sum(size for size, s in state.values() if s == "active_allocated")
        reserved = sum(size for size, _ in state.values())
        for i, event in enumerate(trace):
            live += {"alloc": 1, "free_requested": -1}.get(event["action"], 0) * event["size"]
            reserved += {"segment_alloc": 1, "segment_free": -1}.get(event["action"], 0) * (
                event["size"]
            )
            _check(
                live >= 0 and reserved >= live,
                f"device_traces[{device}][{i}]: live {live} reserved {reserved} bytes",
            )
        _check(
            (live, reserved) == (live_end, reserved_end),
            f"device {device}: the trace ends at live {live} reserved {reserved}, the segments"
            f" hold {live_end} live of {reserved_end}",
        )


def _check_frames(frames: object, where: str) -> None:
    _check(isinstance(frames, list), f"{where}: frames is {type(frames).__name__}, not a list")
    for frame in frames:
        _check(
            isinstance(frame.get("filename"), str)
            and isinstance(frame.get("name"), str)
            and isinstance(frame.get("line"), int),
            f"{where}: frame {frame!r} is not {{filename: str, line: int, name: str}}",
        )


def check_page_readable(data: bytes) -> None:
    """The pickled snapshot ``data`` is one the memory_viz page can load and draw: only opcodes
    its unpickler knows, segments on a device that has a trace list, an integer ``addr`` on
    every event but ``oom`` (its event list formats it in hex), and frames it can filter."""
    for opcode, argument, _ in pickletools.genops(data):
        _check(opcode.name in PAGE_OPCODES, f"pickle opcode {opcode.name} is not in MemoryViz.js")
        if opcode.name == "PROTO":
            _check(2 <= argument <= 4, f"pickle protocol {argument}: the page reads 2 to 4")
    snapshot = pickle.loads(data)
    traces = snapshot["device_traces"]
    for device, trace in enumerate(traces):
        for i, event in enumerate(trace):
            where = f"device_traces[{device}][{i}] ({event.get('action')})"
            _check(isinstance(event.get("size"), int), f"{where}: size is not an int")
            _check(isinstance(event.get("stream"), int), f"{where}: stream is not an int")
            if event["action"] == "oom":
                _check(isinstance(event.get("device_free"), int), f"{where}: no device_free")
            else:
                _check(isinstance(event.get("addr"), int), f"{where}: addr is not an int")
            _check_frames(event.get("frames", []), where)
    for i, segment in enumerate(snapshot["segments"]):
        where = f"segments[{i}]"
        _check(
            isinstance(segment.get("device"), int) and 0 <= segment["device"] < len(traces),
            f"{where}: device {segment.get('device')!r} has no device_traces list",
        )
        _check(sum(b["size"] for b in segment["blocks"]) == segment["total_size"], where)
        for block in segment["blocks"]:
            _check(block.get("state") in _STATES, f"{where}: state {block.get('state')!r}")
            _check_frames(block.get("frames", []), where)
