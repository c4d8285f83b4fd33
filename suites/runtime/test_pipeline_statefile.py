"""The ``exec()``-restart state file: a round trip, and a clear error for every corrupt file
(too small, bad sentinel, bad version, truncated, random bytes), never a crash or a wrong state.
From the seed's ``mmap_state_open`` review (``../shared/seeds/ane-pipeline-and-checkpointing.txt``).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import mmap
import os
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.pipeline import (
    HEADER_BYTES,
    PRESETS,
    SLOT_OFFSETS,
    Action,
    CompileConfig,
    ModelConfig,
    ModelDims,
    Phase,
    SchedulerState,
    StateFile,
    StateFileError,
    StateHeader,
    global_bytes,
    journal_bytes,
    layer_activation_bytes,
    layer_weight_bytes,
    main,
    state_file_bytes,
)
from runtime.pipeline._statefile import Layout

from . import _targets
from ._knobs import pinned_env

TINY = ModelConfig("tiny", ModelDims(8, 16, 2, 2, 3, 32, 4), CompileConfig(accum_steps=3))


def _state() -> SchedulerState:
    return SchedulerState(Phase.BACKWARD, 0, 1, 2, 5, 0.25, 1.5)


@pytest.fixture
def tiny_file(tmp_path):
    """A closed state file for TINY with a scheduler state and some tensors written."""
    path = tmp_path / "tiny.state"
    with StateFile.create(path, TINY, checkpoint_policy="sqrt", scheduler=_state()) as state:
        state.layer_weights(2)[:] = 2.0
        state.layer_acts(0)[-1] = 7.0
        state.global_region()[0] = 3.0
    return path


def test_a_created_file_undid_nothing_and_knows_its_path(tmp_path):
    path = tmp_path / "new.state"
    with StateFile.create(path, TINY) as state:
        assert (state.rolled_back, state.path, state.readonly) == (0, str(path), False)
        assert not state.header.delete_when_done  # by default the caller keeps the file
    before = path.read_bytes()
    with pytest.raises(FileExistsError) as info:
        StateFile.create(path, dataclasses.replace(TINY, name="other"))
    assert str(info.value) == f"[Errno 17] state file {path} exists: '{path}'"
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["new.state"]


def test_round_trip(tiny_file):
    assert os.path.getsize(tiny_file) == state_file_bytes(TINY)
    with StateFile.open(tiny_file) as state:
        header = state.header
        assert dataclasses.replace(header.config, preset="") == TINY
        assert header.scheduler == _state()
        assert (header.checkpoint_policy, header.checkpoint_interval) == ("sqrt", 0)
        assert np.all(state.layer_weights(2) == 2.0)
        assert np.all(state.layer_weights(1) == 0.0)
        assert state.layer_acts(0)[-1] == 7.0
        assert state.global_region()[0] == 3.0
        counts = tuple(range(len(Action)))
        state.write_header(dataclasses.replace(header, restarts=4, action_counts=counts))
    with StateFile.open(tiny_file) as state:
        assert (state.header.restarts, state.header.action_counts) == (4, counts)


def test_region_major_layout(tiny_file):
    w, a = layer_weight_bytes(TINY.dims), layer_activation_bytes(TINY.dims)
    with StateFile.open(tiny_file) as state:
        layout = state.header.layout
    assert layout.layer_weights == HEADER_BYTES
    assert layout.layer_adam == HEADER_BYTES + 3 * w
    assert layout.layer_grads == layout.layer_adam + 3 * 2 * w
    assert layout.layer_acts == layout.layer_grads + 3 * w
    assert layout.global_ == layout.layer_acts + 3 * a
    assert layout.journal == layout.global_ + 16 * 8 * (32 + 1)
    assert layout.total_size == layout.journal + journal_bytes(TINY.dims) == layout.journal + 8192


def test_the_journal_is_a_page_plus_64_bytes_per_layer_rounded_up_to_pages():
    for n_layers in (*range(1, 200), 4032, 4033, 4095, 4096, 10**6):
        size = journal_bytes(dataclasses.replace(TINY.dims, n_layers=n_layers))
        assert size % 4096 == 0 and 0 <= size - (4096 + 64 * n_layers) < 4096, n_layers


def test_a_header_without_a_layout_packs_as_its_models_layout():
    # StateHeader(layout=None): pack() and to_dict() use Layout.for_dims(its dims)
    bare = StateHeader(TINY, "all", 0, _state())
    full = dataclasses.replace(bare, layout=Layout.for_dims(TINY.dims))
    assert bare.pack() == full.pack()
    assert bare.to_dict() == full.to_dict()
    assert bare.to_dict()["total_size"] == state_file_bytes(TINY)


def test_a_file_created_by_a_bare_name_lands_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with StateFile.create("bare.state", TINY, sparse=True) as state:
        assert state.path == "bare.state"
    assert os.listdir(tmp_path) == ["bare.state"]
    with StateFile.open(tmp_path / "bare.state", readonly=True) as state:
        assert state.header.config.name == "tiny"


def test_a_file_made_after_the_check_is_still_never_replaced(tmp_path, monkeypatch):
    # another process creates the name between the lexists() check and the os.link()
    path = tmp_path / "raced.state"
    path.write_bytes(b"theirs")
    monkeypatch.setattr(os.path, "lexists", lambda name: False)
    with pytest.raises(FileExistsError) as info:
        StateFile.create(path, TINY)
    assert (info.value.errno, info.value.strerror, info.value.filename) == (
        errno.EEXIST,
        f"state file {path} exists",
        str(path),
    )
    assert path.read_bytes() == b"theirs" and os.listdir(tmp_path) == ["raced.state"]


def test_without_hard_links_the_file_is_moved_into_place(tmp_path, monkeypatch):
    # a file system without hard links (FAT): os.link fails, os.replace places the file
    def no_links(src, dst):
        raise PermissionError(errno.EPERM, "Operation not permitted", src)

    monkeypatch.setattr(os, "link", no_links)
    StateFile.create(tmp_path / "fat.state", TINY, scheduler=_state()).close()
    assert os.listdir(tmp_path) == ["fat.state"]
    with StateFile.open(tmp_path / "fat.state", readonly=True) as state:
        assert state.header.scheduler == _state()


def test_a_created_file_is_readable_by_all_writable_by_its_owner(tmp_path):
    # mkstemp makes its file 0600; a state file is an ordinary data file: 0644
    StateFile.create(tmp_path / "m", TINY).close()
    assert os.stat(tmp_path / "m").st_mode & 0o7777 == 0o644


def test_a_mapping_failure_after_the_rename_propagates_and_keeps_the_file(tmp_path, monkeypatch):
    def no_mapping(*args, **kwargs):
        raise OSError(errno.ENOMEM, "no mapping today")

    monkeypatch.setattr(mmap, "mmap", no_mapping)
    for overwrite in (False, True):  # placed by os.link (then unlink) or by os.replace
        with pytest.raises(OSError, match=r"no mapping today") as info:
            StateFile.create(tmp_path / "placed", TINY, overwrite=overwrite)
        assert info.value.errno == errno.ENOMEM  # not the temporary's FileNotFoundError
        assert os.listdir(tmp_path) == ["placed"]
    monkeypatch.undo()
    with StateFile.open(tmp_path / "placed", readonly=True) as state:
        assert state.header.generation == 0


def test_accessors_reject_a_layer_out_of_range(tiny_file):
    with StateFile.open(tiny_file) as state:
        for accessor in (
            state.layer_weights,
            state.layer_adam,
            state.layer_grads,
            state.layer_acts,
        ):
            name = accessor.__name__
            for layer in (-1, 3):
                with pytest.raises(
                    IndexError, match=rf"{name}\({layer}\): expected a layer in 0 \.\. 2"
                ):
                    accessor(layer)
            with pytest.raises(TypeError) as info:
                accessor(1.0)
            assert str(info.value) == "layer must be an int, got float 1.0"


def test_close_with_a_live_view_says_so_and_stays_usable(tiny_file):
    state = StateFile.open(tiny_file)
    view = state.layer_grads(1)
    with pytest.raises(ValueError) as info:
        state.close()
    assert str(info.value) == (
        f"state file {tiny_file}: cannot close while arrays from layer_weights() and the other"
        " accessors are alive; drop them first"
    )
    view[0] = 1.0
    del view
    state.close()
    state.close()  # idempotent
    with pytest.raises(ValueError, match="is closed"):
        state.layer_grads(0)


# -- corrupt files ---------------------------------------------------------------------------------


def _rewrite(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.mark.parametrize("size", [0, 100, HEADER_BYTES - 1])
def test_a_file_smaller_than_the_header(tmp_path, size):
    path = tmp_path / "small"
    path.write_bytes(b"\0" * size)
    with pytest.raises(
        StateFileError, match=rf"is {size} bytes, smaller than its 4096-byte header"
    ):
        StateFile.open(path)


def test_a_file_of_just_the_header_is_truncated(tiny_file):
    os.truncate(tiny_file, HEADER_BYTES)  # as big as the header: not "smaller than" it
    with pytest.raises(StateFileError) as info:
        StateFile.open(tiny_file)
    assert str(info.value) == (
        f"state file {tiny_file} is truncated: expected {state_file_bytes(TINY)} bytes, got 4096"
    )


def test_bad_sentinel_says_both_values(tiny_file):
    _rewrite(tiny_file, 0, struct.pack("<I", 0xDEADBEEF))
    with pytest.raises(
        StateFileError,
        match=r"is not a pipeline state file: sentinel 0xDEADBEEF \(expected 0x414E4550 'ANEP'\)",
    ):
        StateFile.open(tiny_file)


@pytest.mark.parametrize(("version", "hint"), [(1, " (recreate the file)"), (3, "")])
def test_another_version_names_the_field_and_the_version(tiny_file, version, hint):
    _rewrite(tiny_file, 4, struct.pack("<I", version))
    with pytest.raises(StateFileError) as info:
        StateFile.open(tiny_file)
    assert str(info.value) == (
        f"state file {tiny_file}: field 'version' is {version}, this build reads version 2"
        f" only{hint}"
    )  # the old message called it "not a pipeline state file"


def test_truncated_says_expected_and_actual_sizes(tiny_file):
    total = state_file_bytes(TINY)
    os.truncate(tiny_file, total - 1)
    with pytest.raises(
        StateFileError, match=rf"is truncated: expected {total} bytes, got {total - 1}"
    ):
        StateFile.open(tiny_file)


def test_a_flipped_header_byte_fails_the_checksum(tiny_file):
    _rewrite(tiny_file, SLOT_OFFSETS[0] + 12, b"T")  # the model's name
    with pytest.raises(
        StateFileError,
        match=r"corrupt header: slot 0: checksum mismatch \(stored 0x[0-9A-F]{8}, computed"
        r" 0x[0-9A-F]{8}\); slot 1: checksum mismatch",
    ):
        StateFile.open(tiny_file)


def test_a_consistent_but_impossible_header_is_rejected(tiny_file):
    bad = StateHeader(TINY, "sqrt", 0, dataclasses.replace(_state(), group=3))
    _rewrite(tiny_file, SLOT_OFFSETS[0], bad.pack())
    with pytest.raises(StateFileError, match=r"slot 0: group=3: expected 0 <= group < 1"):
        StateFile.open(tiny_file)


def test_a_wrong_size_field_is_named_not_called_truncated(tiny_file):
    with StateFile.open(tiny_file) as state:
        header = state.header
    layout = dataclasses.replace(header.layout, total_size=header.layout.total_size + 4096)
    _rewrite(tiny_file, SLOT_OFFSETS[0], dataclasses.replace(header, layout=layout).pack())
    with pytest.raises(StateFileError) as info:
        StateFile.open(tiny_file)
    message = str(info.value)
    assert "slot 0: field total_size=" in message and "does not match the layout" in message
    assert "truncated" not in message


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_corruption_is_an_error_or_the_same_state(tiny_file, data):
    original = tiny_file.read_bytes()
    with StateFile.open(tiny_file) as state:
        header = state.header
    blob = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4), label="writes")):
        where = data.draw(st.integers(0, len(blob) - 1), label="offset")
        blob[where] = data.draw(st.integers(0, 255), label="byte")
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(blob))), label="truncate to")
    if cut is not None:
        del blob[cut:]
    path = tiny_file.with_suffix(".fuzz")
    path.write_bytes(bytes(blob))
    try:
        with StateFile.open(path) as state:
            assert state.header == header  # opened: it must be the very same state
    except StateFileError as exc:
        assert str(path) in str(exc)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=3 * HEADER_BYTES))
def test_random_bytes_are_a_clear_error(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("fuzz") / "random.state"
    path.write_bytes(blob)
    with pytest.raises(StateFileError):
        StateFile.open(path)


def test_a_missing_file_is_a_plain_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        StateFile.open(tmp_path / "absent")


# -- the state CLI ---------------------------------------------------------------------------------


def test_state_create_and_show(tmp_path, capsys):
    path = str(tmp_path / "s")
    # Stories42M (a 743 MB sparse file): it also runs under a file size limit (ulimit -f) of a
    # few GiB, as a mutation run may set one against mutants that reserve huge files
    assert main(["state", "create", path, "--model", "stories42m", "--sparse"]) == 0
    out = capsys.readouterr().out
    size = state_file_bytes(PRESETS["stories42m"])
    assert out == f"created {path}: Stories42M (8 layers, dim 512), {size:,} bytes (sparse)\n"
    assert os.stat(path).st_size == size and os.stat(path).st_blocks * 512 < 1 << 20
    assert main(["state", "show", path, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["sentinel"], info["version"], info["model"]) == ("0x414E4550", 2, "Stories42M")
    assert info["offsets"]["layer_weights"] == 4096 and info["total_size"] == size
    assert main(["state", "show", path]) == 0
    text = capsys.readouterr().out
    assert "model Stories42M: dim=512" in text and f"total_size={size}" in text


def test_state_show_of_a_corrupt_file_exits_1(tmp_path, capsys):
    path = tmp_path / "bad"
    path.write_bytes(b"x" * 10)
    assert main(["state", "show", str(path)]) == 1
    err = capsys.readouterr().err
    assert "error: state file" in err and "smaller than its 4096-byte header" in err
    assert main(["state", "show", str(tmp_path / "absent")]) == 1
    assert "cannot open state file" in capsys.readouterr().err


# -- commits ----------------------------------------------------------------------------------


def test_commit_writes_tensors_and_header_together(tiny_file):
    with StateFile.open(tiny_file) as state:
        header = state.header
        offset = state.offset("layer_grads", 1, 3)
        new = dataclasses.replace(header, restarts=7)
        state.commit(new, [(offset, np.float32(2.5).tobytes())])
        assert (state.header.generation, state.header.restarts) == (header.generation + 1, 7)
    with StateFile.open(tiny_file) as state:
        assert state.layer_grads(1)[3] == 2.5 and state.header.restarts == 7
        assert state.rolled_back == 0


def test_commit_refuses_before_writing_anything(tiny_file):
    before = tiny_file.read_bytes()
    with StateFile.open(tiny_file) as state:
        header, layout = state.header, state.header.layout
        with pytest.raises(ValueError, match=r"a write at 0 \(4 bytes\) is outside the tensors"):
            state.commit(header, [(0, b"abcd")])
        with pytest.raises(ValueError, match=r"is outside the tensors"):
            state.commit(header, [(layout.journal - 2, b"abcd")])
        too_many = [(layout.layer_weights, b"x" * 4)] * 400  # 400 x 16 bytes > 8 KiB journal
        with pytest.raises(ValueError, match=r"the originals of 400 writes take 9600 journal"):
            state.commit(header, too_many)
        other = dataclasses.replace(header, config=PRESETS["stories110m"])
        with pytest.raises(ValueError, match="commit: the header's model needs layout"):
            state.commit(other)
        with pytest.raises(ValueError, match=r"restarts=2147483648: the state file holds 0 \.\."):
            state.commit(dataclasses.replace(header, restarts=2**31))
        counts = (0, 0, 0, 2**32, 0, 0)
        with pytest.raises(ValueError, match=r"action_counts\[EXEC_RESTART\]=4294967296"):
            state.commit(dataclasses.replace(header, action_counts=counts))
        with pytest.raises(KeyError):
            state.offset("layer_nothing", 0)
        with pytest.raises(IndexError, match=r"layer_grads\(0\)\[99999\]: out of range"):
            state.offset("layer_grads", 0, 99999)
    assert tiny_file.read_bytes() == before
    with StateFile.open(tiny_file, readonly=True) as state:
        with pytest.raises(ValueError, match="is open read-only"):
            state.commit(state.header)
        assert not state.layer_grads(0).flags.writeable


# -- the decoded header as plain data, and the global region -------------------------------------


def test_to_dict_in_full(tmp_path):
    path = tmp_path / "owned.state"
    with StateFile.create(path, TINY, scheduler=_state(), delete_when_done=True) as state:
        counts = (1, 2, 3, 4, 5, 6)
        state.write_header(dataclasses.replace(state.header, restarts=3, action_counts=counts))
    with StateFile.open(path, readonly=True) as state:
        info = state.header.to_dict()
    w, a = layer_weight_bytes(TINY.dims), layer_activation_bytes(TINY.dims)
    acts = HEADER_BYTES + 3 * (w + 2 * w + w)
    assert info == {
        "sentinel": "0x414E4550",
        "version": 2,
        "generation": 1,
        "model": "tiny",
        "dims": {"dim": 8, "hidden_dim": 16, "n_heads": 2, "n_kv_heads": 2, "n_layers": 3,
                 "vocab_size": 32, "seq_len": 4},
        "compile": {"compile_budget": 119, "kernels_per_layer": 5, "static_per_layer": 1,
                    "accum_steps": 3, "headroom_pct": 0.1},
        "checkpoint": {"policy": "all", "interval": 0},
        "scheduler": {"phase": "BACKWARD", "group": 0, "step": 1, "accum_step": 2,
                      "total_steps": 5, "learning_rate": 0.25, "last_loss": 1.5},
        "restarts": 3,
        "actions": {"COMPILE_GROUP": 1, "RUN_FORWARD_GROUP": 2, "RUN_BACKWARD_GROUP": 3,
                    "EXEC_RESTART": 4, "WEIGHT_UPDATE": 5, "STEP_DONE": 6},
        "delete_when_done": True,
        "offsets": {"layer_weights": HEADER_BYTES, "layer_adam": HEADER_BYTES + 3 * w,
                    "layer_grads": HEADER_BYTES + 9 * w, "layer_acts": acts,
                    "global": acts + 3 * a, "journal": acts + 3 * a + global_bytes(TINY.dims)},
        "total_size": state_file_bytes(TINY),
    }  # fmt: skip


def test_to_dict_refuses_a_header_without_one_count_per_action():
    header = StateHeader(TINY, "all", 0, _state(), action_counts=(1, 2))
    with pytest.raises(ValueError):
        header.to_dict()  # as pack() refuses it: never a dict that leaves actions out
    with pytest.raises(ValueError, match=r"action_counts: expected 6 counts, one per Action"):
        header.pack()


def test_the_global_region_is_every_global_float32_and_no_more(tiny_file):
    with StateFile.open(tiny_file) as state:
        region = state.global_region()
        assert region.dtype == np.float32
        assert region.shape == (global_bytes(TINY.dims) // 4,)
        region[-1] = 1.25  # the last global float, just before the journal
        offset = state.header.layout.journal - 4
        del region
    with open(tiny_file, "rb") as f:
        f.seek(offset)
        assert f.read(4) == np.float32(1.25).tobytes()


# -- commits: edges of the journal and of the tensors ---------------------------------------------


class _RecordedMapping:
    """A state file's mapping that logs each write (byte range) and each flush (page range)."""

    def __init__(self, mapping):
        self.mapping, self.log = mapping, []

    def __getitem__(self, key):
        return self.mapping[key]

    def __setitem__(self, key, value):
        self.mapping[key] = value
        self.log.append(("write", key.start, key.stop))

    def __len__(self):
        return len(self.mapping)

    def flush(self, offset=0, size=None):  # mmap.flush's defaults: to the end
        stop = len(self.mapping) if size is None else offset + size
        self.log.append(("flush", offset, stop))
        span = (offset,) if size is None else (offset, size)
        return self.mapping.flush(*span)

    def close(self):
        self.mapping.close()


def _flushed(log, start, stop, after) -> int:
    """The index of the first flush in ``log`` after index ``after`` covering [start, stop)."""
    return next(
        i
        for i, (kind, a, b) in enumerate(log)
        if i > after and kind == "flush" and a <= start and stop <= b
    )


def test_a_commit_flushes_the_journal_then_the_writes_then_the_header(tiny_file):
    # the order that makes a kill (or a power cut) at any point leave one generation or the other
    with StateFile.open(tiny_file) as state:
        offset = state.offset("layer_grads", 1, 3)
        recorded = state._map = _RecordedMapping(state._map)
        state.commit(state.header, [(offset, b"\x01" * 8)])
        log, journal, slot = recorded.log, state.header.layout.journal, SLOT_OFFSETS[1]
        assert log[0][:2] == ("write", journal)  # the journal first, in two halves
        journal_end = max(b for kind, a, b in log if kind == "write" and a >= journal)
        journaled = _flushed(log, journal, journal_end, 0)
        write = log.index(("write", offset, offset + 8))
        assert journaled < write
        written = _flushed(log, offset, offset + 8, write)
        header = next(i for i, (kind, a, _) in enumerate(log) if kind == "write" and a == slot)
        assert written < header
        _flushed(log, slot, slot + 1, max(i for i, e in enumerate(log) if e[0] == "write"))
        del log[:]
        state.close()  # a read-write file is flushed whole before it is unmapped
        assert log == [("flush", 0, state.header.layout.total_size)]


@pytest.mark.parametrize("point", ["write", "written", "header"])
def test_a_kill_inside_a_commit_of_odd_sized_writes_is_undone(death, tiny_file, point):
    """Writes of 2, 17, 5 and 0 bytes, the third ending where the journal begins: their journal
    records are padded to 8 bytes, and the one open after the kill restores every byte."""
    with StateFile.open(tiny_file, readonly=True) as state:
        layout, generation = state.header.layout, state.header.generation
    before = tiny_file.read_bytes()[HEADER_BYTES : layout.journal]
    writes = [
        (layout.layer_weights + 1, b"\x01\x02"),
        (layout.layer_grads + 3, b"\x03" * 17),
        (layout.journal - 5, b"\x04" * 5),
        (layout.layer_adam, b""),  # its record ends the journal
    ]
    env = pinned_env("cpu")
    env["DEVMEM_PIPELINE_KILL_AT"] = f"{generation + 1}:{point}"
    plain = [[offset, data.hex()] for offset, data in writes]
    outcome = death.run(_targets.commit_writes, str(tiny_file), plain, env=env, style="fork")
    outcome.assert_died(signal="SIGKILL")
    assert tiny_file.read_bytes()[HEADER_BYTES : layout.journal] != before  # bytes were written
    with StateFile.open(tiny_file) as state:
        assert (state.header.generation, state.rolled_back) == (generation, 24)
    assert tiny_file.read_bytes()[HEADER_BYTES : layout.journal] == before


def test_a_commit_may_write_nothing_or_up_to_the_journal(tiny_file):
    with StateFile.open(tiny_file) as state:
        journal = state.header.layout.journal
        state.commit(state.header, [(journal - 4, np.float32(6.5).tobytes()), (journal, b"")])
        assert state.global_region()[-1] == 6.5 and state.header.generation == 1


def test_commit_sets_the_layout_of_a_header_built_without_one(tiny_file):
    with StateFile.open(tiny_file) as state:
        layout = state.header.layout
        state.commit(StateHeader(TINY, "sqrt", 0, _state(), restarts=2))
        assert (state.header.layout, state.header.generation) == (layout, 1)
        assert (
            state.offset("layer_grads", 2)
            == layout.layer_grads + 2 * (layout.layer_acts - layout.layer_grads) // 3
        )
    with StateFile.open(tiny_file) as state:
        assert (state.header.restarts, state.header.layout) == (2, layout)


def test_offset_names_the_accessor_and_the_last_float(tiny_file):
    with StateFile.open(tiny_file, readonly=True) as state:
        floats = layer_weight_bytes(TINY.dims) // 4
        last = state.offset("layer_grads", 2, floats - 1)
        assert last == state.header.layout.layer_acts - 4
        with pytest.raises(IndexError) as info:
            state.offset("layer_grads", 3)
        assert str(info.value) == "layer_grads(3): expected a layer in 0 .. 2"
        with pytest.raises(IndexError) as info:
            state.offset("layer_grads", 0, floats)
        assert str(info.value) == f"layer_grads(0)[{floats}]: out of range"


def test_the_journal_takes_originals_up_to_its_capacity_exactly(tiny_file):
    """TINY's journal is 8192 bytes: a 24-byte head (magic, generation, count, size, CRC), then
    per write a 16-byte record and the original bytes padded to 8: 8152 bytes fit, 8160 not."""
    with StateFile.open(tiny_file) as state:
        start = state.header.layout.layer_adam
        with pytest.raises(ValueError) as info:
            state.commit(state.header, [(start, b"\x05" * 8160)])
        assert str(info.value) == (
            "commit: the originals of 1 writes take 8176 journal bytes, the journal holds 8168"
        )
        assert state.header.generation == 0
        state.commit(state.header, [(start, b"\x05" * 8152)])
        assert state.header.generation == 1
        assert bytes(state.layer_adam(0)[:4].tobytes()) == b"\x05" * 16


# -- the journal as bytes (module docstring): a 24-byte head (magic "JRNL", the generation it
# undoes, the record count, the payload size, a CRC-32 of head and payload), then per record its
# offset and length (two uint64) and the original bytes, padded to 8 ---------------------------


def _write_journal(path, records, *, count=None, payload=None, crc_over=None) -> None:
    """Write a journal for generation 0 of ``path`` (a closed TINY file) holding ``records``;
    ``count`` and ``payload`` override the head's fields, ``crc_over`` the bytes after the head
    that the CRC covers (default: the records)."""
    body = b"".join(
        struct.pack("<QQ", offset, len(data)) + data + bytes(-len(data) % 8)
        for offset, data in records
    )
    with StateFile.open(path, readonly=True) as state:
        start = state.header.layout.journal
    head = struct.pack(
        "<IQII",
        0x4C4E524A,
        0,
        len(records) if count is None else count,
        len(body) if payload is None else payload,
    )
    covered = body if crc_over is None else crc_over(body)
    crc = zlib.crc32(covered, zlib.crc32(head))
    _rewrite(path, start, head + struct.pack("<I", crc) + body)


def _weights_after_open(path) -> tuple[int, float]:
    with StateFile.open(path) as state:
        return state.rolled_back, float(state.layer_weights(0)[0])


def test_a_journal_that_ends_at_the_files_end_is_replayed(tiny_file):
    start = HEADER_BYTES  # layer 0's first weight float, 0.0 in the file
    size = state_file_bytes(TINY)
    with StateFile.open(tiny_file, readonly=True) as state:
        payload = size - state.header.layout.journal - 24
    record = [(start, np.float32(9.5).tobytes())]
    _write_journal(tiny_file, record, payload=payload, crc_over=lambda b: b + bytes(payload - 24))
    assert _weights_after_open(tiny_file) == (4, 9.5)


def test_a_journal_whose_payload_overruns_the_file_is_not_replayed(tiny_file):
    size = state_file_bytes(TINY)
    with StateFile.open(tiny_file, readonly=True) as state:
        rest = size - state.header.layout.journal - 24  # what the file holds after the head
    record = [(HEADER_BYTES, np.float32(9.5).tobytes())]
    _write_journal(tiny_file, record, payload=rest + 1, crc_over=lambda b: b + bytes(rest - 24))
    assert _weights_after_open(tiny_file) == (0, 0.0)  # torn or foreign: no change under way


def test_a_journal_with_more_records_than_its_payload_is_corrupt(tiny_file):
    _write_journal(tiny_file, [(HEADER_BYTES, b"\x00" * 4)], count=2)
    with pytest.raises(StateFileError) as info:
        StateFile.open(tiny_file)
    assert str(info.value) == f"state file {tiny_file}: corrupt journal (record overrun)"


def test_a_journal_record_outside_the_tensors_is_corrupt(tiny_file):
    _write_journal(tiny_file, [(HEADER_BYTES - 4, b"\x00" * 8)])
    with pytest.raises(StateFileError) as info:
        StateFile.open(tiny_file)
    assert str(info.value) == (
        f"state file {tiny_file}: corrupt journal: record at {HEADER_BYTES - 4} (8 bytes) is"
        " outside the tensors"
    )


def test_names_ending_in_any_character_round_trip(tmp_path):
    config = dataclasses.replace(TINY, name="tiny-XX")
    with StateFile.create(tmp_path / "x", config, checkpoint_policy="MAX") as state:
        assert state.header.config.name == "tiny-XX"
    with StateFile.open(tmp_path / "x") as state:
        assert (state.header.config.name, state.header.checkpoint_policy) == ("tiny-XX", "MAX")


# -- a slot with a valid checksum and a bad field (slot layout: generation Q, flags I, the model
# name 32s, 7 dims, 4 compile ints and the headroom double, the policy 16s and its interval at
# byte 112, the scheduler's phase, group, step, accum_step at 116 .. 131, total_steps, the
# learning rate and the last loss at 136 and 144, the restarts at 152), named in the error


def _slot_with(tiny_file, offset: int, data: bytes) -> None:
    """Rewrite slot 0 of ``tiny_file`` with ``data`` at ``offset`` and a matching CRC-32."""
    with StateFile.open(tiny_file, readonly=True) as state:
        fields = bytearray(state.header.pack()[:-4])
    fields[offset : offset + len(data)] = data
    _rewrite(tiny_file, SLOT_OFFSETS[0], bytes(fields) + struct.pack("<I", zlib.crc32(fields)))


@pytest.mark.parametrize(
    ("offset", "data", "error"),
    [
        (12, b"\xff", "the model or policy name is not UTF-8"),
        (96, b"\xfe", "the model or policy name is not UTF-8"),
        (8, struct.pack("<I", 6), "flags=0x6: unknown flags"),
        (116, struct.pack("<i", 9), "phase=9: expected one of [1, 2, 3]"),
        (112, struct.pack("<i", -1), "interval=-1: expected >= 0"),
        (152, struct.pack("<i", -2), "restarts=-2: expected >= 0"),
        (120, struct.pack("<i", 1), "group=1: expected 0 <= group < 1"),
        (124, struct.pack("<i", 6), "step=6/5 accum_step=2/3 out of range"),
        (128, struct.pack("<i", 3), "step=1/5 accum_step=3/3 out of range"),
        (
            136,
            struct.pack("<d", math.nan),
            "learning_rate=nan: the state file holds finite numbers only",
        ),
        (
            144,
            struct.pack("<d", -math.inf),
            "last_loss=-inf: the state file holds finite numbers only",
        ),
    ],
)
def test_a_bad_field_with_a_valid_checksum_is_named(tiny_file, offset, data, error):
    _slot_with(tiny_file, offset, data)
    with pytest.raises(StateFileError) as info:
        StateFile.open(tiny_file)
    assert str(info.value).startswith(
        f"state file {tiny_file}: corrupt header: slot 0: {error}; slot 1: checksum mismatch"
    )


def test_the_headroom_round_trips(tmp_path):
    config = dataclasses.replace(TINY, compile=CompileConfig(accum_steps=3, headroom_pct=0.25))
    StateFile.create(tmp_path / "h", config).close()
    with StateFile.open(tmp_path / "h") as state:
        assert state.header.config.compile.headroom_pct == 0.25


# -- the kill knob's torn writes: half the journal, half the header slot (KILL_POINTS) -----------


def _killed_copy(death, tiny_file, tmp_path, point: str, writes) -> bytes:
    path = tmp_path / f"killed-{point}"
    path.write_bytes(tiny_file.read_bytes())
    env = pinned_env("cpu")
    env["DEVMEM_PIPELINE_KILL_AT"] = f"1:{point}"
    plain = [[offset, data.hex()] for offset, data in writes]
    death.run(_targets.commit_writes, str(path), plain, env=env, style="fork").assert_died(
        signal="SIGKILL"
    )
    return path.read_bytes()


def test_the_journal_kill_point_leaves_half_the_journal(death, tiny_file, tmp_path):
    with StateFile.open(tiny_file, readonly=True) as state:
        start = state.header.layout.journal
    writes = [(HEADER_BYTES + 2 * layer_weight_bytes(TINY.dims), b"\x07" * 64)]  # over 2.0s
    size = 24 + 16 + 64  # the journal's head, the record, the original 2.0 floats
    torn = _killed_copy(death, tiny_file, tmp_path, "journal", writes)[start : start + size]
    whole = _killed_copy(death, tiny_file, tmp_path, "journaled", writes)[start : start + size]
    assert torn[: size // 2] == whole[: size // 2]
    assert torn[size // 2 :] == bytes(size - size // 2) != whole[size // 2 :]


def test_the_header_kill_point_leaves_half_the_new_slot(death, tiny_file, tmp_path):
    with StateFile.open(tiny_file, readonly=True) as state:
        size = len(state.header.pack())
    slot = SLOT_OFFSETS[1]  # a new file's header is in slot 0: the commit writes slot 1
    torn = _killed_copy(death, tiny_file, tmp_path, "header", [])[slot : slot + size]
    whole = _killed_copy(death, tiny_file, tmp_path, "committed", [])[slot : slot + size]
    assert torn[: size // 2] == whole[: size // 2]
    assert torn[size // 2 :] == bytes(size - size // 2) != whole[size // 2 :]


# -- pack(): every field checked against its width before struct sees it --------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"checkpoint_policy": "p" * 17}, "checkpoint policy 'ppppppppppppppppp': the state file"
         " holds at most 16 UTF-8 bytes"),
        ({"checkpoint_interval": -1},
         "checkpoint_interval=-1: the state file holds 0 .. 2147483647"),
        ({"scheduler": SchedulerState(step=2**31, total_steps=2**31)},
         "step=2147483648: the state file holds 0 .. 2147483647"),
        ({"scheduler": SchedulerState(learning_rate=math.nan)},
         "learning_rate=nan: the state file holds finite numbers only"),
        ({"restarts": 2**31}, "restarts=2147483648: the state file holds 0 .. 2147483647"),
        ({"action_counts": (0, 0, 0, 0, 2**32, 0)},
         "action_counts[WEIGHT_UPDATE]=4294967296: the state file holds 0 .. 4294967295"),
        ({"action_counts": (0, -1, 0, 0, 0, 0)},
         "action_counts[RUN_FORWARD_GROUP]=-1: the state file holds 0 .. 4294967295"),
        ({"generation": 2**64},
         "generation=18446744073709551616: the state file holds 0 .. 2**64-1"),
        ({"generation": -1}, "generation=-1: the state file holds 0 .. 2**64-1"),
    ],
)  # fmt: skip
def test_pack_refuses_a_value_its_field_cannot_hold(change, message):
    header = dataclasses.replace(StateHeader(TINY, "all", 0, _state()), **change)
    with pytest.raises(ValueError) as info:
        header.pack()
    assert str(info.value) == message


def test_the_largest_generation_packs():
    header = StateHeader(TINY, "all", 0, _state(), generation=2**64 - 1)
    assert header.pack()[:8] == b"\xff" * 8


def test_the_largest_counts_round_trip(tiny_file):
    counts = (2**32 - 1, 64, 0, 1, 2**31, 7)
    with StateFile.open(tiny_file) as state:
        state.write_header(
            dataclasses.replace(state.header, restarts=2**31 - 1, action_counts=counts)
        )
    with StateFile.open(tiny_file) as state:
        assert (state.header.restarts, state.header.action_counts) == (2**31 - 1, counts)
