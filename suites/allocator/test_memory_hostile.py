"""Files that are not snapshots, made to hurt a reader: cut, flipped, nested deep, or sharing one
value a billion billion times over (issue 38, items 3 and 4).

Every one is one ``error:`` line and exit status 1 from ``python -m allocator.memory summary``
and ``plot``, in well under a second, never a traceback: the real snapshots PyTorch wrote
(``data/``) and one of ours, cut at random places or with random bytes changed (hypothesis),
and hand-written pickles a few hundred bytes long that made the readers run for minutes
(``repr`` of a shared structure) or overflow Python's stack.
"""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator import Allocator, AllocatorConfig, memory

from . import _stress

DATA = Path(__file__).parent / "data"
REAL = {
    name: (DATA / f"{name}.pickle").read_bytes()
    for name in ("torch-train-step", "gpt2-train-steps")
}


def _ours() -> bytes:
    alloc = Allocator(AllocatorConfig(backend="sim"))
    with alloc.history():
        _stress.arena_stress(alloc, n=256, k=8, arenas=2)
        alloc.held = [alloc.full(256, 1.0) for _ in range(4)]
    return pickle.dumps(alloc.snapshot(), protocol=4)


OURS = _ours()
FILES = {**REAL, "ours": OURS}


def one_error_line(tmp_path: Path, capsys, data: bytes, command: str = "summary") -> str:
    """Run the command on ``data``; returns its one error line (asserting status 1, nothing on
    stdout but for a successful run, and a run of under 10 s of CPU: the clock a busy machine
    does not stretch)."""
    path = tmp_path / "f.pickle"
    path.write_bytes(data)
    picture = tmp_path / "t.png"
    argv = [command, str(path), *(["-o", str(picture)] if command == "plot" else [])]
    start = time.process_time()
    status = memory.main(argv)
    took = time.process_time() - start
    out, err = capsys.readouterr()
    assert took < 10, f"{command} took {took:.1f} s of CPU"
    if status == 0:  # a change the format tolerates (a byte of a string, a time)
        assert err == "" and out
        return ""
    assert status == 1
    assert err.startswith(f"python -m allocator.memory {command}: error: {path}: ")
    assert err.count("\n") == 1 and len(err) < 1000, err
    assert "Traceback" not in err
    return err


def test_a_pickle_cut_after_its_third_byte_is_one_error_line(tmp_path, capsys):
    err = one_error_line(tmp_path, capsys, b"\x80\x04h")  # BINGET with its index cut off
    assert err.endswith("not a pickled memory snapshot (pickle data was truncated)\n")


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_cut_of_the_first_and_last_bytes_is_one_error_line(tmp_path, capsys, name):
    data = FILES[name]
    for cut in [*range(1, 40), *range(len(data) - 40, len(data))]:
        assert one_error_line(tmp_path, capsys, data[:cut])


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=st.sampled_from(sorted(FILES)), where=st.floats(0, 1, exclude_max=True))
def test_a_snapshot_cut_anywhere_is_one_error_line(tmp_path, capsys, name, where):
    data = FILES[name]
    assert one_error_line(tmp_path, capsys, data[: int(where * len(data))])


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=st.sampled_from(sorted(FILES)),
    flips=st.lists(
        st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), min_size=1, max_size=4
    ),
)
def test_a_snapshot_with_bytes_changed_is_summed_up_or_one_error_line(
    tmp_path, capsys, name, flips
):
    data = bytearray(FILES[name])
    for where, bits in flips:
        data[int(where * len(data))] ^= bits
    one_error_line(tmp_path, capsys, bytes(data))


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=st.sampled_from(sorted(FILES)),
    flips=st.lists(
        st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), min_size=1, max_size=3
    ),
)
def test_a_snapshot_with_bytes_changed_is_drawn_or_one_error_line(tmp_path, capsys, name, flips):
    pytest.importorskip("matplotlib")
    data = bytearray(FILES[name])
    for where, bits in flips:
        data[int(where * len(data))] ^= bits
    one_error_line(tmp_path, capsys, bytes(data), "plot")


def test_an_annotation_past_the_end_of_the_trace_marks_its_end(tmp_path, capsys):
    # a byte changed in a trace_index (found by the test above): the picture indexed past its
    # points, an IndexError
    pytest.importorskip("matplotlib")
    event = {"action": "alloc", "addr": 0, "size": 64}
    note = {"action": "release", "trace_index": 10**6, "reason": "release()"}
    snapshot = {"segments": [], "device_traces": [[event]], "devmem": {"annotations": [note]}}
    assert one_error_line(tmp_path, capsys, pickle.dumps(snapshot, protocol=4), "plot") == ""


# -- hand-written hostile pickles (protocol 4, opcodes by hand: pickle.dumps cannot write them) --


def _text(s: str) -> bytes:
    raw = s.encode()
    return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE


def snapshot_around(value: bytes, where: str = "event") -> bytes:
    """A snapshot pickle with the object that ``value``'s opcodes build at ``where``: the first
    event of device 0, devmem's backend, or an arena exit's depth."""
    head = b"\x80\x04}(" + _text("segments") + b"]"
    if where == "event":
        return head + _text("device_traces") + b"](](" + value + b"eeu."
    if where == "backend":
        return head + _text("devmem") + b"}(" + _text("backend") + value + b"uu."
    note = b"}(" + _text("action") + _text("arena_exit") + _text("depth") + value + b"u"
    return head + _text("devmem") + b"}(" + _text("annotations") + b"](" + note + b"euu."


def laughs(depth: int = 39, width: int = 10) -> bytes:
    """A list of ``width`` references to a list of ``width`` references to ... ``depth`` deep:
    a few hundred bytes, ``width ** depth`` leaves when walked without sharing."""
    out = _text("lol") + b"\x940"  # memo 0 (then popped)
    for level in range(depth):
        out += b"]\x94(" + (b"h" + bytes([level])) * width
        out += b"e0"  # APPENDS, POP: the list stays in the memo only
    return out + b"h" + bytes([depth])


def nested(depth: int = 1100) -> bytes:
    """A list in a list in ... ``depth`` deep."""
    return b"]" * depth + b"a" * (depth - 1)


@pytest.mark.parametrize("where", ["event", "backend", "depth"])
@pytest.mark.parametrize("command", ["summary", "plot"])
def test_a_billion_laughs_is_one_error_line_in_milliseconds(tmp_path, capsys, where, command):
    pytest.importorskip("matplotlib.figure")  # imported before the clock starts
    data = snapshot_around(laughs(), where)
    assert len(data) < 1100
    start = time.process_time()
    err = one_error_line(tmp_path, capsys, data, command)
    assert time.process_time() - start < 1.0
    field = {
        "event": "device_traces[0][0] is list",
        "backend": "devmem.backend is list",
        "depth": "devmem.annotations[0].depth is list",
    }[where]
    assert (
        f"not a memory snapshot: {field} [[[[...], [...], [...], [...], ...], ..., expected" in err
    )


@pytest.mark.parametrize("depth", [1100, 100_000])  # a RecursionError in repr from 3.11, 3.12
@pytest.mark.parametrize("where", ["event", "backend", "depth"])
@pytest.mark.parametrize("command", ["summary", "plot"])
def test_a_list_nested_1100_deep_is_one_error_line(tmp_path, capsys, where, command, depth):
    err = one_error_line(tmp_path, capsys, snapshot_around(nested(depth), where), command)
    assert "is list [[[[...]]]], expected" in err, err


def test_a_huge_int_where_a_size_goes_is_refused_not_printed(tmp_path, capsys):
    big = b"\x8a\xff" + b"\x7f" * 255  # LONG1 of 255 bytes: an int of 2,039 bits
    event = b"}(" + _text("action") + _text("alloc") + _text("addr") + b"K\x00" + _text("size")
    err = one_error_line(tmp_path, capsys, snapshot_around(event + big + b"u"))
    assert (
        "device_traces[0][0].size is int <an int of 2039 bits>, expected an int of at most 64"
        in err
    )


def test_a_frame_list_shared_by_every_event_is_read_once(tmp_path, capsys):
    # 20,000 events sharing one list of 20,000 frames: a 0.3 MB file; each event costing its
    # frames (a key of 20,000 ids) made 4e8 steps of the reader
    frames = [{"filename": "model.py", "line": 7, "name": "f"}] * 20_000
    events = [
        {"action": "alloc", "addr": 64 * i, "size": 64, "frames": frames} for i in range(20_000)
    ]
    blocks = [{"size": 64, "state": "active_allocated"}]
    snapshot = {
        "segments": [{"total_size": 64 * 20_000, "blocks": blocks * 20_000}],
        "device_traces": [events],
    }
    data = pickle.dumps(snapshot, protocol=4)
    assert len(data) < 600_000
    start = time.process_time()
    assert one_error_line(tmp_path, capsys, data) == ""
    assert time.process_time() - start < 3  # 0.3 s; before, minutes


@pytest.mark.parametrize("protocol", [1, 4])  # read whole, and streamed
@pytest.mark.parametrize("shared", ["trace", "segment", "blocks"])
def test_a_trace_or_segment_the_file_shares_is_refused(tmp_path, capsys, protocol, shared):
    # one object written once and referred to 20,000 times: read in full, 20,000 times its size
    events = [{"action": "alloc", "addr": 64 * i, "size": 64} for i in range(500)]
    blocks = [{"size": 64, "state": "inactive"}]
    segment = {"total_size": 64, "blocks": blocks}
    snapshot = {"segments": [segment], "device_traces": [events]}
    if shared == "trace":
        snapshot["device_traces"] = [events] * 20_000
        first, again = "device_traces[0]", "device_traces[1]"
    elif shared == "segment":
        snapshot["segments"] = [segment] * 20_000
        first, again = "segments[0]", "segments[1]"
    else:
        snapshot["segments"] = [{"total_size": 64, "blocks": blocks} for _ in range(20_000)]
        first, again = "segments[0].blocks", "segments[1].blocks"
    start = time.process_time()
    err = one_error_line(tmp_path, capsys, pickle.dumps(snapshot, protocol=protocol))
    assert time.process_time() - start < 5
    assert f"not a memory snapshot: {again} is {first} again; a snapshot shares no" in err, err


# -- teeth: each check above, run on the defect patched back in (DESIGN 4) -----------------------


def test_teeth_a_first_pass_reading_past_its_buffer_is_caught(tmp_path, monkeypatch):
    from allocator import _pickle_stream

    def unguarded(f):  # the defect: pass 1 reads a cut argument past the end, unchecked
        reader = _pickle_stream._Reader(f)
        if len(reader.buf) < 2 or reader.buf[0] != 0x80:
            raise _pickle_stream.NotStreamable("not a pickle of protocol 2 or later")
        return _pickle_stream._fetched_from(reader)

    monkeypatch.setattr(_pickle_stream, "_fetched", unguarded)
    path = tmp_path / "t.pickle"
    path.write_bytes(b"\x80\x04h")
    with pytest.raises(IndexError):  # a traceback, where one_error_line wants one line
        memory.main(["summary", str(path)])


def test_teeth_an_unbounded_repr_in_an_error_is_caught(tmp_path, monkeypatch):
    from allocator import _timeline

    monkeypatch.setattr(_timeline, "shown_value", repr)  # the defect: repr of the file's value
    path = tmp_path / "deep.pickle"
    path.write_bytes(snapshot_around(nested(100_000)))  # deeper than any Python's repr goes
    with pytest.raises(RecursionError):
        memory.main(["summary", str(path)])


def test_teeth_a_shared_trace_read_in_full_is_caught(tmp_path, capsys, monkeypatch):
    from allocator import _timeline

    monkeypatch.setattr(_timeline, "_own", lambda value, where, owners: None)  # the defect
    with pytest.raises(AssertionError):
        test_a_trace_or_segment_the_file_shares_is_refused(tmp_path, capsys, 1, "segment")
