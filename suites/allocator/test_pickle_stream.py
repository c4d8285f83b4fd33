"""The streaming snapshot reader (``allocator/_pickle_stream.py``) against ``pickle`` itself, and
``summary`` of a file (read streaming, the events dropped as counted) against ``summary`` of the
same snapshot read whole.

The oracle is the standard library: whatever ``pickle.loads`` builds, the streaming reader must
build too, less the trace events, which it must hand over in order with their device."""

from __future__ import annotations

import gc
import io
import pickle
import pickletools
import re
import struct
import sys
from unittest import mock

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from allocator import _pickle_stream, _timeline, memory

from .test_memory_cli import BY_HAND, describe, random_snapshots, well_formed

PROTOCOLS = (2, 3, 4, 5)

_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(2**80), 2**80)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.text(min_size=250, max_size=300)  # longer than SHORT_BINUNICODE's 255 bytes
    | st.binary(max_size=8)
)
values = st.recursive(
    _leaves,
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.tuples(kids)
        | st.tuples(kids, kids, kids)
        | st.lists(kids, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=4), kids, max_size=4)
        | st.frozensets(st.integers(), max_size=3)
        | st.sets(st.integers(), max_size=3)
    ),
    max_leaves=12,
)


_REFUSED = object()


def _stream(data: bytes, may_refuse_late: bool = False):
    """``(what stream built or _REFUSED, the (device, event) pairs handed over)``; a refusal
    after events were handed over only if ``may_refuse_late``."""
    events: list[tuple[int, object]] = []
    try:
        result = _pickle_stream.stream(io.BytesIO(data), lambda d, e: events.append((d, e)))
    except _pickle_stream.NotStreamable as exc:
        if exc.handed:
            assert may_refuse_late, exc
        else:
            assert not events
        return _REFUSED, events
    return result, events


def _uses_a_global(data: bytes) -> bool:
    return any(op.name in ("GLOBAL", "STACK_GLOBAL") for op, _, _ in pickletools.genops(data))


def _check_against_pickle(snapshot: dict, protocol: int, may_refuse_late: bool = False) -> None:
    """What :func:`_pickle_stream.stream` builds and hands over is what ``pickle`` builds;
    refused only for a global (and, if ``may_refuse_late``, after the fact)."""
    data = pickle.dumps(snapshot, protocol=protocol)
    result, events = _stream(data, may_refuse_late)
    if result is _REFUSED:  # protocol 2 and 3 write bytes and sets through a global
        assert may_refuse_late or (protocol < 4 and _uses_a_global(data))
        return
    expected = pickle.loads(data)
    traces = expected.get("device_traces", [])
    if all(type(trace) is list for trace in traces):  # else: read whole (nothing to stream)
        assert events == [(d, event) for d, trace in enumerate(traces) for event in trace]
        if "device_traces" in expected:
            expected["device_traces"] = [[] for _ in traces]
    assert result == expected


@st.composite
def snapshots_of_values(draw, events=values):
    """A dict shaped like a snapshot, of any builtin values: other keys before and after
    ``device_traces``, traces of any length (a batch of APPENDS is 1,000 items), ``events``
    shared by identity (memoized, fetched again) and values shared between events."""
    shared = draw(values)
    traces = []
    for _ in range(draw(st.integers(0, 3))):
        length = draw(st.sampled_from([0, 1, 2, 3, 999, 1000, 1001, 2001]))
        if length > 3:  # long: small events, some sharing a value
            trace = [
                {"action": "alloc", "i": i, "x": shared if i % 7 else i} for i in range(length)
            ]
        else:
            trace = draw(st.lists(events, min_size=length, max_size=length))
        if trace and draw(st.booleans()):
            trace.append(trace[0])  # the same object twice
        traces.append(trace)
    snapshot = {}
    for key in draw(st.lists(st.text(max_size=3), max_size=2)):
        snapshot[key] = draw(values)
    snapshot["device_traces"] = traces
    for key in draw(st.lists(st.text(min_size=4, max_size=5), max_size=2)):
        snapshot[key] = shared
    return snapshot


@settings(max_examples=120, deadline=None)
@given(snapshot=snapshots_of_values(), protocol=st.sampled_from(PROTOCOLS))
def test_the_stream_builds_what_pickle_builds_less_the_events_handed_over(snapshot, protocol):
    # events of any value: one built without a MARK of its own (a list, a dict of one key)
    # can look like another trace while it is built; the stream is then refused afterwards
    _check_against_pickle(snapshot, protocol, may_refuse_late=True)


_event_like = st.fixed_dictionaries(
    {"action": st.sampled_from(["alloc", "free_requested"]), "size": st.integers(0, 2**40)},
    optional={"addr": st.integers(0, 2**64), "frames": st.lists(values, max_size=3), "x": values},
)


@settings(max_examples=120, deadline=None)
@given(snapshot=snapshots_of_values(_event_like), protocol=st.sampled_from(PROTOCOLS))
def test_traces_of_event_dicts_are_always_streamed(snapshot, protocol):
    # what a snapshot holds (events are dicts of two keys or more) is never refused (but
    # through a global, in protocols 2 and 3)
    _check_against_pickle(snapshot, protocol)


@settings(max_examples=60, deadline=None)
@given(value=values, protocol=st.sampled_from(PROTOCOLS))
def test_a_pickle_without_traces_is_built_whole(value, protocol):
    data = pickle.dumps(value, protocol=protocol)
    result, events = _stream(data)
    assert events == []
    if result is _REFUSED:
        assert protocol < 4 and _uses_a_global(data)
    else:
        assert result == value


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_more_than_a_batch_of_devices_each_with_its_events(protocol):
    # 1,003 devices: the traces list itself needs two APPENDS batches and an APPEND; a device
    # with one event is written with APPEND, one with many with APPENDS
    traces = [[{"i": d, "j": j} for j in range(d % 3)] for d in range(1003)]
    _check_against_pickle({"device_traces": traces}, protocol)  # SETITEM: the only key
    _check_against_pickle({"a": 1, "device_traces": traces, "segments": []}, protocol)
    _check_against_pickle({"device_traces": [[{"i": 0}]]}, protocol)  # one device, one event


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_only_the_top_level_dicts_traces_are_streamed(protocol):
    # a nested dict's key looks like the top-level one's while it is read: its events are
    # handed over, and then the stream is refused (the caller reads the file whole)
    nested = {"inner": {"device_traces": [[{"i": 1}, {"i": 2}]]}, "device_traces": []}
    with pytest.raises(
        _pickle_stream.NotStreamable,
        match=r"^the streamed lists are not the top-level device_traces$",
    ) as refused:
        _pickle_stream.stream(io.BytesIO(pickle.dumps(nested, protocol=protocol)), print)
    assert refused.value.handed
    _check_against_pickle({"inner": {"device_traces": [[{"i": 1}, {"i": 2}]]}}, protocol)
    # a list of them inside a trace, fetched again: refused as well
    traces: list = [[]]
    traces[0].extend([traces, [{"i": 1}]])
    with pytest.raises(_pickle_stream.NotStreamable):
        _pickle_stream.stream(io.BytesIO(pickle.dumps({"device_traces": traces}, protocol)), print)
    result, events = _stream(pickle.dumps([{"device_traces": [[{"i": 1}]]}], protocol=protocol))
    assert result == [{"device_traces": [[{"i": 1}]]}] and events == []
    value = {"segments": [], "device_traces": "not a list"}
    assert _stream(pickle.dumps(value, protocol=protocol)) == (value, [])


class _Thing:  # a global: a pickle of it calls something to build it
    pass


_NOT_PROTOCOL_2 = "^not a pickle of protocol 2 or later$"
_TRUNCATED = "^pickle data was truncated$"


@pytest.mark.parametrize(
    "data, reason",
    [
        (pickle.dumps({"device_traces": [[{"i": 1}]]}, protocol=0), _NOT_PROTOCOL_2),
        (pickle.dumps({"device_traces": [[{"i": 1}]]}, protocol=1), _NOT_PROTOCOL_2),
        (b"\x80\x01}q\x00.", _NOT_PROTOCOL_2),  # protocol 1 saying so
        (pickle.dumps({"device_traces": [[_Thing()]]}, protocol=4), r"^opcode b'\\x93' at byte"),
        (pickle.dumps({"device_traces": [[{"i": 1}] * 2000]}, protocol=4)[:-20], _TRUNCATED),
        (b"", _NOT_PROTOCOL_2),
        (b"\x80", _NOT_PROTOCOL_2),
        (b"\x80\x04", _TRUNCATED),
        (b"\x80\x04N", _TRUNCATED),  # no STOP
        (b"not a pickle", _NOT_PROTOCOL_2),
        (b"\x80\x04}q\x00.", "^opcode b'q' at byte 3$"),  # protocol 4 numbering its memo by PUT
        (b"\x80\x02}\x94.", r"^opcode b'\\x94' at byte 3$"),  # protocol 2 with MEMOIZE
        (b"\x80\x04\x8d" + (1 << 62).to_bytes(8, "little") + b"abc.", _TRUNCATED),  # 4 EiB
    ],
    ids=[
        "protocol-0",
        "protocol-1",
        "protocol-1-header",
        "global",
        "truncated",
        "empty",
        "proto-only",
        "header-only",
        "no-stop",
        "text",
        "put-in-protocol-4",
        "memoize-in-protocol-2",
        "a-length-beyond-the-file",
    ],
)
def test_what_it_does_not_handle_is_refused_before_any_event_and_the_file_rewound(data, reason):
    f = io.BytesIO(b"head" + data)
    f.seek(4)
    events = []
    with pytest.raises(_pickle_stream.NotStreamable, match=reason) as refused:
        _pickle_stream.stream(f, lambda d, e: events.append(e))
    assert not refused.value.handed and events == [] and f.tell() == 4


def test_a_pickle_malformed_after_its_events_raises_not_streamable():
    data = pickle.dumps({"device_traces": [[{"i": 1}, {"i": 2}]]}, protocol=4)
    assert data.endswith(b".")
    broken = data[:-1] + b"00."  # POP the top-level dict and one more: STOP finds nothing
    events = []
    with pytest.raises(_pickle_stream.NotStreamable) as refused:
        _pickle_stream.stream(io.BytesIO(broken), lambda d, e: events.append(e))
    assert refused.value.handed and len(events) == 2  # handed over before the damage


def test_what_the_callback_raises_is_raised_as_it_is():
    data = pickle.dumps({"device_traces": [[{"i": 1}, {"i": 2}], [{"i": 3}]]}, protocol=4)

    def refuse(device, event):
        if event == {"i": 3}:
            raise ValueError("device 1 refused")

    with pytest.raises(ValueError, match="device 1 refused"):
        _pickle_stream.stream(io.BytesIO(data), refuse)


# --- summary of a file: streamed, the same text as of the snapshot read whole ---


def _on_the_last_device(snapshot: dict, devices: int, protocol: int, tmp_path_factory):
    """Pickle ``snapshot`` (one trace) to a new file with its events and segments on device
    ``devices - 1``, the other devices' traces empty (the default device is the first with
    events); returns the file's path."""
    trace = snapshot["device_traces"][0]
    snapshot["device_traces"] = [[] for _ in range(devices - 1)] + [trace]
    for segment in snapshot["segments"]:
        segment["device"] = devices - 1
    path = tmp_path_factory.mktemp("s") / "s.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=protocol))
    return path


@settings(max_examples=80, deadline=None)
@given(
    snapshot=random_snapshots(),
    protocol=st.sampled_from(PROTOCOLS),
    top=st.integers(1, 4),
    devices=st.integers(1, 3),
)
def test_summary_of_a_file_is_the_summary_of_its_snapshot(
    snapshot, protocol, top, devices, tmp_path_factory
):
    path = _on_the_last_device(snapshot, devices, protocol, tmp_path_factory)
    whole = memory.load(path)
    assert memory.summary(path, top=top) == memory.summary(whole, top=top)
    for device in range(devices):
        assert memory.summary(str(path), top=top, device=device) == memory.summary(
            whole, top=top, device=device
        )
    with pytest.raises(ValueError, match=f"device={devices}:"):
        memory.summary(path, device=devices)


@pytest.mark.parametrize(
    "damage, field",
    [
        (lambda s: s["device_traces"][0][5].update(size="12"), r"device_traces\[0\]\[5\]\.size"),
        (
            lambda s: s["device_traces"][0][7].update(frames=None),
            r"device_traces\[0\]\[7\]\.frames",
        ),
        (lambda s: s["device_traces"][0].__setitem__(3, "alloc"), r"device_traces\[0\]\[3\] is"),
        (lambda s: s["device_traces"][0][2].pop("size"), r"device_traces\[0\]\[2\]\.size is miss"),
        (lambda s: s["segments"][0].update(total_size="1"), r"segments\[0\]\.total_size"),
        (lambda s: s.update(device_traces="x"), "device_traces is str"),
    ],
)
def test_a_file_that_is_not_a_snapshot_is_named_as_load_names_it(damage, field, tmp_path):
    events = [
        {"action": "alloc", "addr": i * 64, "size": 64, "frames": [{"filename": "a.py", "line": i}]}
        for i in range(10)
    ]
    snapshot = {"segments": [{"total_size": 640, "blocks": []}], "device_traces": [events]}
    damage(snapshot)
    path = tmp_path / "bad.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    with pytest.raises(ValueError) as loaded:
        memory.load(path)
    with pytest.raises(ValueError) as streamed:
        memory.summary(path)
    assert str(streamed.value) == str(loaded.value)
    assert str(streamed.value).startswith(f"{path}: not a memory snapshot:")
    assert re.search(field, str(streamed.value))


def test_a_length_beyond_the_file_is_one_error_not_a_memory_error(tmp_path, capsys):
    # a BINUNICODE8 claiming 4 EiB: read as it claims, it would be a MemoryError (a traceback)
    path = tmp_path / "claims.pickle"
    path.write_bytes(b"\x80\x04\x8d" + (1 << 62).to_bytes(8, "little") + b"abc.")
    assert memory.main(["summary", str(path)]) == 1
    assert capsys.readouterr().err == (
        f"python -m allocator.memory summary: error: {path}: not a pickled memory snapshot"
        " (pickle data was truncated)\n"
    )


def test_summary_of_a_malformed_file_says_what_load_says(tmp_path):
    event = {"action": "alloc", "addr": 0, "size": 64}
    data = pickle.dumps({"segments": [], "device_traces": [[event, event]]}, protocol=4)
    path = tmp_path / "broken.pickle"
    path.write_bytes(data[:-1] + b"00.")
    with pytest.raises(ValueError, match="not a pickled memory snapshot") as streamed:
        memory.summary(path)
    with pytest.raises(ValueError) as loaded:
        memory.load(path)
    assert str(streamed.value) == str(loaded.value)


def _distinct_stacks(events: int) -> dict:
    """A trace whose every allocation has frames of its own (no dict shared between events):
    the streaming reader frees each event's frames once counted, so their ids are reused."""
    trace = []
    for i in range(events):
        frames = [{"filename": f"/src/site_{i % 50}.py", "line": i % 50, "name": f"f{i % 50}"}]
        trace.append(
            {"action": "alloc", "addr": i * 64, "size": 64 * (1 + i % 50), "frames": frames}
        )
        trace.append({"action": "free_requested", "addr": i * 64, "size": 64 * (1 + i % 50)})
    return {"segments": [], "device_traces": [trace]}


@pytest.mark.parametrize("limit", [7, _timeline._CACHE_LIMIT])
def test_frames_freed_as_read_never_name_a_later_allocation(limit, tmp_path, monkeypatch):
    # a cache of frame lists by their frames' ids must hold the frames it names: freed (a batch
    # of 1,000 events at a time), their ids are reused by later frames, and a stale entry would
    # name the wrong site; the cache is emptied when full (often, with a limit of 7)
    monkeypatch.setattr(_timeline, "_CACHE_LIMIT", limit)
    snapshot = _distinct_stacks(3000)
    path = tmp_path / "distinct.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    assert memory.summary(path, top=50) == memory.summary(snapshot, top=50)
    assert "/src/site_49.py:49 in f49" in memory.summary(path, top=1)


def _round_trips(path, events: int) -> int:
    """Write a snapshot of ``events`` allocations, each freed by the next; returns its bytes."""
    trace, frames = [], [[{"filename": f"/s/m{i}.py", "line": 1, "name": "f"}] for i in range(8)]
    for i in range(events):
        if i:
            trace.append({"action": "free_requested", "addr": i - 1, "size": 64, "time_us": i})
        alloc = {"action": "alloc", "addr": i, "size": 64, "stream": 0, "time_us": i}
        trace.append({**alloc, "frames": list(frames[i % 8])})
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4))
    return path.stat().st_size


def test_summary_of_a_file_holds_no_event(tmp_path, blocks_per_1000_events):
    # the events are counted and dropped: the memory blocks allocated stay flat while 60,000
    # events go by (each event kept would hold three blocks or more: its dict, its frames list,
    # its numbers), where reading the snapshot whole holds them all
    path = tmp_path / "trips.pickle"
    _round_trips(path, 30_000)
    blocks = blocks_per_1000_events
    memory.summary(path)
    streamed = blocks[5:]
    assert len(blocks) == 60
    assert max(streamed) - min(streamed) < 6_000, blocks  # a tenth of a block an event
    blocks.clear()
    memory.summary(memory.load(path))  # the same samples, the snapshot read whole
    assert min(blocks) - max(streamed) > 2 * 60_000  # what the streaming does not hold


# --- plot of a file: streamed, the levels kept and not the events, the same picture ---


def _timed(snapshot: dict, data) -> dict:
    """``snapshot`` with a ``time_us`` on some events (rising), none on the others."""
    clock = 0
    for event in snapshot["device_traces"][0]:
        clock += data.draw(st.integers(0, 3))
        if data.draw(st.booleans()):
            event["time_us"] = clock
    return snapshot


def _replayed_by_site(snapshot: dict, device: int, names: list[str]) -> dict[str, list[int]]:
    """Brute force: each named site's live bytes after every event of ``device``'s trace,
    replayed from the trace (an allocation is its site's; a free's request is the site of the
    block's allocation, or of the bytes live before the trace)."""
    trace = snapshot["device_traces"][device]
    sign = {"alloc": 1, "free_requested": -1}
    end_live, _ = _timeline._end_levels(snapshot, device)
    before = end_live - sum(sign.get(e["action"], 0) * e["size"] for e in trace)
    series = {name: [before if name == _timeline.BEFORE_TRACE else 0] for name in names}
    owner: dict[int, str] = {}
    for e in trace:
        name, change = None, sign.get(e["action"], 0) * e.get("size", 0)
        if e["action"] == "alloc":
            name = owner[e["addr"]] = _timeline.site_of(e["frames"], True)
        elif e["action"] == "free_requested":
            name = owner.pop(e["addr"], _timeline.BEFORE_TRACE)
        for site, levels in series.items():
            levels.append(levels[-1] + (change if site == name else 0))
    return series


def _streamed_timeline(path, device, top):
    snapshot, read, scan, _ = memory._read_streamed(path, device, series=True)
    return _timeline.timeline_of(snapshot, read, scan, top)


@settings(max_examples=80, deadline=None)
@given(
    snapshot=random_snapshots(),
    protocol=st.sampled_from(PROTOCOLS),
    top=st.integers(0, 4),
    devices=st.integers(1, 3),
    data=st.data(),
)
def test_the_timeline_of_a_file_is_the_timeline_of_its_snapshot(
    snapshot, protocol, top, devices, data, tmp_path_factory
):
    snapshot = _timed(snapshot, data)
    trace = snapshot["device_traces"][0]
    path = _on_the_last_device(snapshot, devices, protocol, tmp_path_factory)
    whole = memory.load(path)
    for device in (None, *range(devices)):
        line = _streamed_timeline(path, device, top)
        assert line == _timeline.timeline(whole, device, top=top)
        read = (devices - 1 if trace else 0) if device is None else device
        if read == devices - 1:
            assert len(line.by_site) == min(top, len(_timeline.sites(whole, devices - 1)))
            assert line.by_site == _replayed_by_site(whole, devices - 1, list(line.by_site))
            times = [e["time_us"] for e in trace if "time_us" in e]
            assert line.time_us[-1] == (times[-1] if times else 0)
            assert line.time_us[0] == (trace[0].get("time_us", 0) if trace else 0)
    with pytest.raises(ValueError, match=f"device={devices}:"):
        _streamed_timeline(path, devices, top)


@pytest.mark.parametrize("protocol", [0, 1, 2, 4, 5])
@pytest.mark.parametrize("options", [{}, {"device": 1, "use_time": True, "top": 1}])
def test_plot_of_a_file_draws_what_plot_of_its_snapshot_draws(
    protocol, options, drawn, tmp_path, monkeypatch
):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(well_formed(BY_HAND), protocol=protocol))
    memory.plot(memory.load(path), tmp_path / "whole.png", **options)
    if protocol >= 2:  # streamed: never read whole
        monkeypatch.setattr(memory, "load", lambda path: pytest.fail("read whole"))
    memory.plot(path, tmp_path / "streamed.png", **options)
    assert describe(drawn[1]) == describe(drawn[0])
    assert (tmp_path / "streamed.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_earlier_device_whose_events_come_late_is_read_whole(tmp_path, monkeypatch):
    # a reader that handed device 1's events before device 0's (device 0's trace built in one
    # step, say) must not draw device 1: the default device is the first with events
    path = tmp_path / "s.pickle"
    whole = well_formed(BY_HAND)
    path.write_bytes(pickle.dumps(whole, protocol=4))
    traces = whole["device_traces"]
    assert traces[0] and traces[1]

    def reordered(f, on_event):
        for event in traces[1]:
            on_event(1, event)
        for event in traces[0]:
            on_event(0, event)
        return {**whole, "device_traces": [[], []]}

    monkeypatch.setattr(_pickle_stream, "stream", reordered)
    snapshot, read, scan, device0 = memory._read_streamed(path, None, series=True)
    assert (read, scan.events, device0) == (0, len(traces[0]), len(traces[0]))
    assert snapshot["device_traces"] == traces  # read whole
    assert _timeline.timeline_of(snapshot, read, scan) == _timeline.timeline(whole)


def test_plot_of_a_file_checks_top_before_reading_it(tmp_path):
    with pytest.raises(ValueError, match="top must be >= 0, got -1"):
        memory.plot(tmp_path / "missing.pickle", tmp_path / "t.png", top=-1)
    with pytest.raises(FileNotFoundError):
        memory.plot(tmp_path / "missing.pickle", tmp_path / "t.png")
    assert not (tmp_path / "t.png").exists()


def test_the_timeline_of_a_file_holds_levels_not_events(tmp_path):
    # a picture needs the levels after every event (a few numbers an event), not the events:
    # what reading streaming keeps is a fraction of what the snapshot read whole holds
    path = tmp_path / "trips.pickle"
    _round_trips(path, 30_000)  # 59,999 events
    gc.collect()
    base = sys.getallocatedblocks()
    kept = memory._read_streamed(path, None, series=True)
    streamed = sys.getallocatedblocks() - base
    assert kept[2].events == 59_999
    del kept
    gc.collect()
    base = sys.getallocatedblocks()
    whole = memory.load(path)
    held = sys.getallocatedblocks() - base
    assert len(whole["device_traces"][0]) == 59_999
    assert streamed < 1.5 * 60_000  # about a block an event: its time
    assert held > 3 * 60_000  # an event's dict, its frames list, its numbers


# --- opcodes ``pickle.dumps`` seldom or never writes, assembled by hand ---


def _n(width: int, value: int) -> bytes:
    return value.to_bytes(width, "little")


def _unicode(text: str) -> bytes:  # SHORT_BINUNICODE
    data = text.encode()
    return b"\x8c" + _n(1, len(data)) + data


# one value each, pushed by opcodes that pickle.dumps of a snapshot does not write (MARK-based
# DICT, LIST, TUPLE, FROZENSET, DUP, POP, POP_MARK) or writes only for rare values (LONG4,
# BINSTRING, the 4- and 8-byte length forms, BYTEARRAY8)
_RARE = {
    "dict": b"(" + _unicode("a") + b"K\x01" + _unicode("b") + b"N" + b"d",
    "empty-dict-by-mark": b"(d",
    "list": b"(K\x01K\x02K\x03l",
    "tuple": b"(K\x01K\x02K\x03K\x04t",
    "frozenset": b"(K\x05K\x06\x91",
    "set-additems": b"\x8f(K\x07K\x08\x90",
    "dup": b"]2\x86",  # the same list twice, in a pair
    "pop": b"K\x01K\x02" + b"0",
    "pop-mark": b"K\x09(K\x01K\x021",
    "long4": b"\x8b" + _n(4, 9) + (-(2**70)).to_bytes(9, "little", signed=True),
    "long1-negative": b"\x8a\x02" + (-300).to_bytes(2, "little", signed=True),
    "binstring": b"T" + _n(4, 3) + b"abc",
    "short-binstring": b"U\x03xyz",
    "binunicode": b"X" + _n(4, 2) + "é".encode() + b"",
    "binunicode8": b"\x8d" + _n(8, 3) + b"uvw",
    # a lone surrogate, as pickle writes it (UTF-8 with surrogatepass), in each string opcode
    "short-binunicode-surrogate": b"\x8c\x04a" + "\ud800".encode("utf-8", "surrogatepass"),
    "binunicode-surrogate": b"X" + _n(4, 3) + "\udfff".encode("utf-8", "surrogatepass"),
    "binunicode8-surrogate": b"\x8d" + _n(8, 3) + "\udc80".encode("utf-8", "surrogatepass"),
    "binbytes": b"B" + _n(4, 2) + b"\x00\xff",
    "short-binbytes": b"C\x01\x01",
    "binbytes8": b"\x8e" + _n(8, 2) + b"\x02\x03",
    "bytearray8": b"\x96" + _n(8, 3) + b"\x04\x05\x06",
    "binfloat": b"G" + struct.pack(">d", -2.5),
    "bools-none": b"\x88\x89N\x87",
    "empty-tuple": b")",
    "tuple1": b"K\x01\x85",
    "binint": b"J" + (-5).to_bytes(4, "little", signed=True),
    "binint2": b"M" + _n(2, 65535),
}


@pytest.mark.parametrize("fragment", list(_RARE.values()), ids=list(_RARE))
def test_rare_opcodes_build_what_pickle_builds(fragment):
    data = b"\x80\x05\x95" + _n(8, len(fragment) + 1) + fragment + b"."
    built = _stream(data)
    assert built == (pickle.loads(data), [])
    assert repr(built[0]) == repr(pickle.loads(data))  # of the same types (bytearray is not bytes)
    # the same value as both events of a device's trace, handed over as pickle builds it
    key = _unicode("device_traces")
    snapshot = b"\x80\x05}(" + key + b"](](" + fragment + fragment + b"eeu."
    expected = pickle.loads(snapshot)
    events = [(0, event) for event in expected["device_traces"][0]]
    assert _stream(snapshot) == ({"device_traces": [[]]}, events)
    # a value kept by BINPUT and fetched by BINGET in protocol 2 (explicit memo indices)
    kept = b"\x80\x02(" + fragment + b"q\x07h\x07l."
    assert _stream(kept) == (pickle.loads(kept), [])


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"\x80\x04K\x01K\x02.", "^objects left on the stack at STOP$"),
        (b"\x80\x04h\x05.", r"malformed at byte 3 \(KeyError\)"),  # fetches what it never put
        (b"\x80\x04(K\x01" + b"\x94" + b"h\x00u.", r"malformed at byte \d+ \(IndexError\)"),
        (b"\x80\x04K\x010.", r"^malformed at byte \d+ \(IndexError\)$"),  # STOP finds nothing
        (b"\x80\x04K\x01(0.", "^POP of a MARK$"),  # pickle pops the MARK: refused here
        (b"\x80\x04}(K\x01K\x02K\x03u.", r"malformed at byte \d+ \(ValueError\)"),  # a key alone
        (b"\x80\x04(K\x01K\x02K\x03d.", r"malformed at byte \d+ \(ValueError\)"),  # the same
    ],
    ids=[
        "two-values-at-stop",
        "binget-unset",
        "setitems-without-dict",
        "stop-on-nothing",
        "pop-of-a-mark",
        "setitems-odd",
        "dict-odd",
    ],
)
def test_a_pickle_pass_one_cannot_judge_is_refused_by_pass_two(data, reason):
    with pytest.raises(_pickle_stream.NotStreamable, match=reason) as refused:
        _pickle_stream.stream(io.BytesIO(data), print)
    assert refused.value.handed


def test_the_byte_named_is_the_pickles_own_past_the_first_chunk():
    # a refusal names its byte in the pickle, not in the chunk being read (3 MB in, 3 chunks):
    # a string, popped, then 20 Nones pushed and popped, so that the byte is well inside its
    # chunk; bytes after STOP, never read as opcodes, so that it is not within _SLACK of the
    # end (there every opcode is read from a fresh buffer, at its position 0)
    long = b"\x8d" + _n(8, 3_000_000) + b"x" * 3_000_000 + b"0" + b"N0" * 20
    tail = b"\x00" * 40
    where = 2 + len(long)
    with pytest.raises(_pickle_stream.NotStreamable, match=f"opcode b'c' at byte {where}$"):
        _pickle_stream.stream(io.BytesIO(b"\x80\x04" + long + b"cos\nsystem\n." + tail), print)
    data = b"\x80\x04" + long + b"h\x05." + tail  # the argument of a BINGET that fetches nothing
    with pytest.raises(_pickle_stream.NotStreamable, match=rf"at byte {where + 1} \(KeyError"):
        _pickle_stream.stream(io.BytesIO(data), print)


def _by_marks(value) -> bytes:
    """``value`` (dicts, lists, str, int) pickled with MARK-built lists (LIST, never
    EMPTY_LIST): a trace built in one step, which the stream cannot hand over event by event."""
    if isinstance(value, dict):
        return b"}(" + b"".join(_by_marks(k) + _by_marks(v) for k, v in value.items()) + b"u"
    if isinstance(value, list):
        return b"(" + b"".join(map(_by_marks, value)) + b"l"
    if isinstance(value, str):
        return _unicode(value)
    return b"J" + value.to_bytes(4, "little", signed=True)


@pytest.mark.parametrize("how", ["protocol-0", "protocol-1", "lists-by-mark"])
def test_summary_of_a_snapshot_the_stream_cannot_hand_over_is_still_its_summary(how, tmp_path):
    # read whole (protocols 0 and 1: not streamable) or built whole (its traces by LIST, then
    # counted from the result): the same text as of the snapshot itself, for each device
    snapshot = _distinct_stacks(60)
    snapshot["device_traces"].insert(0, [])  # the default device: the first with events
    path = tmp_path / "whole.pickle"
    if how == "lists-by-mark":
        path.write_bytes(b"\x80\x04" + _by_marks(snapshot) + b".")
    else:
        path.write_bytes(pickle.dumps(snapshot, protocol=int(how[-1])))
    assert memory.load(path) == snapshot
    for device in (None, 0, 1):
        assert memory.summary(path, top=3, device=device) == memory.summary(
            snapshot, top=3, device=device
        )
    assert "120 events" in memory.summary(path) and "0 events" in memory.summary(path, device=0)


_CHUNKS = [2, 3, 9, 16, 17, 33, 100, 4096]
_PIECES = [1, 5, 64, 1 << 26]


@settings(max_examples=60, deadline=None)
@given(
    snapshot=snapshots_of_values(),
    protocol=st.sampled_from(PROTOCOLS),
    chunk=st.sampled_from(_CHUNKS),
    piece=st.sampled_from(_PIECES),
)
def test_what_it_builds_does_not_depend_on_where_the_file_is_cut_into_reads(
    snapshot, protocol, chunk, piece
):
    # reads of `chunk` bytes (an opcode, its argument or its data cut anywhere, in pass 1 and
    # in pass 2; 2 at least, the header checked in the first read), a long string read in
    # pieces of `piece` bytes: what pickle builds, as ever
    with (
        mock.patch.object(_pickle_stream, "_CHUNK", chunk),
        mock.patch.object(_pickle_stream, "_PIECE", piece),
    ):
        _check_against_pickle(snapshot, protocol, may_refuse_late=True)


@pytest.mark.parametrize("chunk", _CHUNKS)
@pytest.mark.parametrize("piece", _PIECES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_rare_opcodes_and_long_runs_do_not_depend_on_the_read_cuts(chunk, piece, protocol):
    # each hand-built opcode between two cuts; long runs of opcodes without data (small ints,
    # empty dicts and lists, memo fetches; right after LONG1 and a string, which read data)
    # across the cuts; values memoized after 300 others, fetched again (LONG_BINGET) outside
    # a MARK and right after one (a list of shared frames)
    with (
        mock.patch.object(_pickle_stream, "_CHUNK", chunk),
        mock.patch.object(_pickle_stream, "_PIECE", piece),
    ):
        for fragment in _RARE.values():
            data = b"\x80\x05(" + fragment + _unicode("s" * (chunk % 40)) + fragment + b"l."
            assert _stream(data) == (pickle.loads(data), [])
        shared, other = {"k": 1}, {"k": 2}
        value = [list(range(700)), [{} for _ in range(60)], [[]] * 60, [-(2**31)] * 40]
        value += [[str(i) for i in range(300)], shared, other, shared, [other, shared, other]]
        value += [[2**40, *range(300)], ["s", *range(300)]]
        data = pickle.dumps(value, protocol=protocol)
        assert _stream(data) == (value, [])


_TRACES = _unicode("device_traces")


@pytest.mark.parametrize(
    "data",
    [
        # the top-level dict, its events handed over, is popped: the result is None
        b"\x80\x04}(" + _TRACES + b"](](K\x07K\x08eeu0N.",
        # its device_traces key is set again, to another list: the events are not in it
        b"\x80\x04}(" + _TRACES + b"](](K\x07K\x08ee" + _TRACES + b"]u.",
        # a trace, its events handed over, is popped from the traces' MARK and another list
        # takes its place (device 0)
        b"\x80\x04}(" + _TRACES + b"](](K\x07K\x08e0]eu.",
        # a trace, its events handed over, is popped: device 0 of a traces list that is empty
        b"\x80\x04}(" + _TRACES + b"](](K\x07K\x08e0eu.",
    ],
    ids=["top-level-dict-popped", "key-set-again", "trace-replaced", "trace-dropped"],
)
def test_events_handed_over_from_a_list_pickle_does_not_keep_there_are_refused(data):
    # whatever pickle builds, the events handed over must be those of device_traces[d] of the
    # result, else the stream is refused (after the fact) and the caller reads it whole
    pickle.loads(data)  # a valid pickle
    handed = []
    with pytest.raises(
        _pickle_stream.NotStreamable,
        match=r"^the streamed lists are not the top-level device_traces$",
    ) as refused:
        _pickle_stream.stream(io.BytesIO(data), lambda d, e: handed.append((d, e)))
    assert refused.value.handed and handed == [(0, 7), (0, 8)]


@pytest.mark.parametrize(
    "data",
    [
        b"\x80\x04}0].",  # a list pushed on an empty stack once the top-level dict is gone
        b"\x80\x04}0(" + _TRACES + b"](](K\x07eel.",  # "device_traces", then a list, in a MARK
        b"\x80\x04}0](" + _TRACES + b"](](K\x07eee.",  # the same, appended to a list
    ],
    ids=["list-after-the-dict", "key-in-a-list-mark", "key-in-an-appends-mark"],
)
def test_a_list_after_device_traces_outside_the_top_level_dict_is_built_not_streamed(data):
    # the top-level dict was popped: what follows "device_traces" is no trace of it
    assert _stream(data) == (pickle.loads(data), [])


class _Tracked(io.BytesIO):
    """A file that refuses to be read whole (a read of any size, or of -1)."""

    def read(self, size=-1):
        assert size is not None and size >= 0, "the whole file asked for at once"
        return super().read(size)


def test_the_file_is_read_in_pieces_as_the_events_go_not_whole():
    # 4 KiB chunks and pieces: a 100 KB string before the traces is read in pieces, and the
    # first event is handed over long before the file's end (a reader that read on to the end,
    # or asked for the whole file, would hold it all: what streaming is for)
    snapshot = {"pad": "x" * 100_000, "device_traces": [[{"i": i} for i in range(100_000)]]}
    f = _Tracked(pickle.dumps(snapshot, protocol=4))
    size = len(f.getvalue())
    where = []
    with (
        mock.patch.object(_pickle_stream, "_CHUNK", 4096),
        mock.patch.object(_pickle_stream, "_PIECE", 4096),
    ):
        result = _pickle_stream.stream(f, lambda d, e: where.append(f.tell()))
    assert result == {"pad": "x" * 100_000, "device_traces": [[]]} and len(where) == 100_000
    assert where[0] < 100_000 + 3 * 4096 < size / 4


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_value_fetched_only_inside_a_run_of_fetches_is_kept(protocol):
    # values memoized after 300 others are fetched with LONG_BINGET; `second` and `third` are
    # fetched again only as the second and third of a run (a list of shared frames), so pass 1
    # must read each fetch of the run, not only its first (the run is not in the buffer's last
    # bytes: more values follow it)
    first, second, third = {"k": 1}, {"k": 2}, {"k": 3}
    value = [[str(i) for i in range(300)], first, second, third, [first, second, third]]
    value.append(list(range(100)))
    data = pickle.dumps(value, protocol=protocol)
    ops = [op.name for op, _, _ in pickletools.genops(data)]
    assert ["MARK", *["LONG_BINGET"] * 3, "APPENDS"] in [ops[i : i + 5] for i in range(len(ops))]
    result, events = _stream(data)
    assert (result, events) == (value, [])
    assert result[4][1] is result[2] and result[4][2] is result[3]


def test_a_length_beyond_the_file_sets_nothing_aside_in_the_whole_read(tmp_path):
    # protocol 1 is read whole, by pickle's own reader: a BINSTRING claiming 2 GiB in a file of
    # 9 bytes was a read of 2 GiB set aside first (or a MemoryError); now the file's 4 bytes
    import tracemalloc

    path = tmp_path / "claims.pickle"
    path.write_bytes(b"T" + (2**31 - 1).to_bytes(4, "little") + b"abc.")
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as info:
            memory.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(info.value) == f"{path}: not a pickled memory snapshot (pickle data was truncated)"
    assert peak < 1 << 20
