"""The state file's owner rules and input checks (issue 21 items 2-5 and 10): a user's file is
never truncated, replaced without ``--force`` or deleted; a full disk is an error naming the
path and the bytes, with nothing left behind; every value is checked against its header field
before the disk is touched; ``state show`` opens read-only; JSON holds no NaN; an ``exec()``
restart keeps the interpreter's options.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile

import pytest

from runtime.pipeline import (
    INT32_MAX,
    PRESETS,
    CompileConfig,
    ModelConfig,
    ModelDims,
    SchedulerState,
    StateFile,
    check_header_fields,
    interpreter_options,
    main,
    restart_argv,
    state_file_bytes,
)

from . import _targets
from ._knobs import pinned_env

SMALL = ["--layers", "1", "--budget", "1000"]
TRAIN = ["train", *SMALL, "--steps", "1", "--dry-run", "--sparse"]


def _exits_2(argv, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


def _names(directory) -> list[str]:
    return sorted(os.listdir(directory))


# -- item 2: never truncate, replace or delete a file the run did not create -------------------


def _fingerprint(path) -> tuple:
    """What any write, truncation or replacement of ``path`` changes (reading a 520 MB file
    whole in every test would be slow): inode, size, blocks, mtime, the header page."""
    st = os.stat(path)
    with open(path, "rb") as f:
        return st.st_ino, st.st_size, st.st_blocks, st.st_mtime_ns, f.read(8192)


@pytest.fixture
def users_file(tmp_path):
    """A state file the user made with ``state create``, and its fingerprint."""
    path = tmp_path / "run.state"
    assert main(["state", "create", str(path), *SMALL, "--sparse"]) == 0
    return path, _fingerprint(path)


def test_train_refuses_an_existing_file_without_resume_or_force(users_file, capsys):
    path, before = users_file
    capsys.readouterr()
    assert main([*TRAIN, "--state", str(path)]) == 1
    assert capsys.readouterr().err.endswith(
        f"error: state file {path} exists: pass --resume to continue the run it holds, or"
        " --force to replace it\n"
    )
    assert _fingerprint(path) == before  # main at 6c47d36 truncated it, then deleted it


def test_state_create_refuses_an_existing_file(users_file, capsys):
    path, before = users_file
    assert main(["state", "create", str(path), "--model", "llama7b", "--sparse"]) == 1
    assert "exists: pass --resume" in capsys.readouterr().err
    assert _fingerprint(path) == before


def test_force_replaces_the_file_and_the_run_keeps_what_it_did_not_create(users_file, capsys):
    path, _ = users_file
    assert main([*TRAIN, "--state", str(path), "--force", "--keep-state"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["state_file"] == str(path) and summary["steps_done"] == 1
    with StateFile.open(path) as state:
        assert state.header.scheduler.step == 1 and not state.header.delete_when_done
    assert _names(path.parent) == ["run.state"]  # no temporary file left


def test_a_resumed_run_deletes_only_a_file_its_run_created(tmp_path, capsys):
    kept, scratch = tmp_path / "kept", tmp_path / "scratch"
    # created with --keep-state: a later --resume without it still keeps the file
    for path, keep in ((kept, ["--keep-state"]), (scratch, [])):
        with StateFile.create(
            path,
            PRESETS["stories110m"].with_overrides(n_layers=1, compile_budget=1000),
            scheduler=SchedulerState(total_steps=1),
            sparse=True,
            delete_when_done=not keep,
        ):
            pass
        assert main([*TRAIN, "--state", str(path), "--resume"]) == 0
        summary = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert summary["state_file"] == (str(path) if keep else None)
    assert _names(tmp_path) == ["kept"]


def test_a_kill_inside_state_create_force_leaves_the_old_file_whole(death, users_file):
    path, before = users_file
    env = {**pinned_env("cpu"), "DEVMEM_PIPELINE_KILL_AT": "0:create"}
    argv = ["state", "create", str(path), "--model", "stories42m", "--sparse", "--force"]
    death.run(_targets.train, argv, env=env, style="fork").assert_died(signal="SIGKILL")
    assert _fingerprint(path) == before  # main at 6c47d36 had truncated it to 0 bytes here
    leftovers = [n for n in _names(path.parent) if n != "run.state"]
    (leftover,) = leftovers  # the temporary file, named as documented: .NAME.XXXX.tmp
    assert leftover.startswith(".run.state.") and leftover.endswith(".tmp")


_STALLED_WRITER = """
import os, sys, time
from runtime.pipeline import PRESETS, StateFile

def stall(fd, data, offset):  # the space is reserved, the header not yet written
    print("writing", flush=True)
    time.sleep(300)

os.pwrite = stall
config = PRESETS["stories110m"].with_overrides(n_layers=1)
StateFile.create(sys.argv[1], config, overwrite=True, sparse=sys.argv[2] == "sparse")
"""


@contextlib.contextmanager
def _stalled_writer(path, sparse="sparse"):
    """A live ``state create`` of ``path`` in another process, stopped in the middle of writing
    its temporary file (under its lock); killed (SIGKILL) at the end unless it was already."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVMEM_")}
    child = subprocess.Popen(
        [sys.executable, "-c", _STALLED_WRITER, str(path), sparse],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert child.stdout.readline() == "writing\n"
        yield child
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def _temporaries(path) -> list[str]:
    return [n for n in _names(path.parent) if n.startswith(f".{path.name}.")]


def test_a_writer_killed_mid_write_leaves_a_temporary_the_next_create_removes(tmp_path, capsys):
    path = tmp_path / "run.state"
    with _stalled_writer(path, sparse="reserved") as child:
        child.kill()  # SIGKILL: no handler, no cleanup
        assert child.wait() == -signal.SIGKILL
    (leftover,) = _temporaries(path)
    size = os.stat(tmp_path / leftover).st_size
    assert size == state_file_bytes(PRESETS["stories110m"].with_overrides(n_layers=1))
    assert main(["state", "create", str(path), *SMALL, "--sparse"]) == 0
    assert _temporaries(path) == [] and _names(tmp_path) == ["run.state"]
    assert capsys.readouterr().err == (
        f"devmem: removed {tmp_path / leftover} ({size:,} bytes), a temporary state file left"
        " by a killed writer\n"
    )
    # another state file's temporaries, live or not, are not this one's to remove
    other = tmp_path / "run.state.b"
    with _stalled_writer(other) as child:
        child.kill()
    StateFile.create(path, PRESETS["stories110m"].with_overrides(n_layers=1), overwrite=True)
    assert len(_temporaries(other)) == 1 and capsys.readouterr().err == ""


def test_a_live_writers_temporary_is_left_alone(tmp_path, capsys, monkeypatch):
    path = tmp_path / "run.state"
    config = PRESETS["stories110m"].with_overrides(n_layers=1)
    with _stalled_writer(path):
        (live,) = _temporaries(path)
        before = _fingerprint(tmp_path / live)
        StateFile.create(path, config, sparse=True).close()  # the same file, created meanwhile
        StateFile.create(path, config, sparse=True, overwrite=True).close()
        assert _temporaries(path) == [live] and _fingerprint(tmp_path / live) == before
        assert capsys.readouterr().err == ""
        # teeth: a cleaner that does not ask for the lock takes the live writer's file
        monkeypatch.setattr(fcntl, "flock", lambda fd, op: None)
        StateFile.create(path, config, sparse=True, overwrite=True).close()
        assert _temporaries(path) == []
        assert f"devmem: removed {tmp_path / live} " in capsys.readouterr().err


def test_only_dead_temporaries_of_the_same_file_are_removed(tmp_path, capsys):
    path = tmp_path / "run.state"
    dead = tmp_path / ".run.state.zzzzzzzz.tmp"  # as mkstemp names it, and no writer's lock
    dead.write_bytes(b"x" * 3000)
    kept = [
        ".aaa",  # sorted first: the scan goes on past what is not a temporary
        ".run.state.abc.tmp",  # mkstemp's random part is 8 characters
        ".run.state.ABCDEFGH.tmp",  # of a-z, 0-9 and _
        ".run.state.abcdefgh.bak",
        "run.state.abcdefgh.tmp",
    ]
    for name in kept:
        (tmp_path / name).write_bytes(b"")
    os.symlink(dead, tmp_path / ".run.state.00000000.tmp")  # a link is never followed
    os.mkfifo(tmp_path / ".run.state.0000000a.tmp")  # nor a FIFO opened (it would block)
    live = os.open(tmp_path / ".run.state.0000000b.tmp", os.O_CREAT | os.O_RDWR)
    try:
        fcntl.flock(live, fcntl.LOCK_EX)  # its writer lives (here: this process)
        StateFile.create(path, PRESETS["stories110m"].with_overrides(n_layers=1), sparse=True)
    finally:
        os.close(live)
    assert sorted(_names(tmp_path)) == sorted(
        [*kept, "run.state", ".run.state.00000000.tmp", ".run.state.0000000a.tmp",
         ".run.state.0000000b.tmp"]
    )  # fmt: skip
    assert capsys.readouterr().err == (
        f"devmem: removed {dead} (3,000 bytes), a temporary state file left by a killed writer\n"
    )


def test_a_temporary_replaced_during_the_check_is_skipped_and_the_scan_goes_on(
    tmp_path, monkeypatch, capsys
):
    # the first temporary's name is taken over by another file between open() and unlink()
    # (simulated: samestat says "not the inode locked"): skipped, the next one still removed
    first, second = tmp_path / ".s.aaaaaaaa.tmp", tmp_path / ".s.bbbbbbbb.tmp"
    first.write_bytes(b"1")
    second.write_bytes(b"22")
    real, calls = os.path.samestat, []

    def samestat(a, b):
        calls.append(a)
        return len(calls) > 1 and real(a, b)

    monkeypatch.setattr(os.path, "samestat", samestat)
    StateFile.create(tmp_path / "s", PRESETS["stories110m"].with_overrides(n_layers=1), sparse=True)
    assert _names(tmp_path) == [first.name, "s"]
    assert capsys.readouterr().err == (
        f"devmem: removed {second} (2 bytes), a temporary state file left by a killed writer\n"
    )


def test_a_lock_that_cannot_be_taken_is_an_error_with_nothing_left(tmp_path, monkeypatch):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(OSError) as info:
        StateFile.create(tmp_path / "s", PRESETS["stories110m"].with_overrides(n_layers=1))
    assert info.value.errno == errno.ENOLCK
    assert _names(tmp_path) == []


def test_a_temporary_removed_before_its_writer_locks_it_is_made_again(tmp_path, monkeypatch):
    # a cleaner may take the lock of a temporary created an instant ago, before its writer's
    # flock: the writer then sees its name gone and makes another file
    real, removed = fcntl.flock, []

    def flock(fd, operation):
        if not removed and operation == fcntl.LOCK_EX:
            (name,) = _names(tmp_path)
            os.unlink(tmp_path / name)
            removed.append(name)
        return real(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    config = PRESETS["stories110m"].with_overrides(n_layers=1)
    StateFile.create(tmp_path / "s", config, sparse=True).close()
    assert len(removed) == 1 and _names(tmp_path) == ["s"]
    with StateFile.open(tmp_path / "s", readonly=True) as state:
        assert state.header.config.dims == config.dims


# -- item 3: a full disk ----------------------------------------------------------------------


def test_a_file_size_limit_is_an_error_naming_path_and_bytes_with_nothing_left(death, tmp_path):
    path = tmp_path / "run.state"
    size = state_file_bytes(PRESETS["stories110m"].with_overrides(n_layers=1))
    outcome = death.run(
        _targets.main_with_file_size_limit,
        1 << 20,
        ["state", "create", str(path), "--layers", "1"],
        env=pinned_env("cpu"),
        style="fork",
    )
    outcome.assert_exited(
        1, match=rf"cannot reserve {size:,} bytes for state file {path}: File too large"
    )
    assert _names(tmp_path) == []  # main at 6c47d36 left a 0-byte file


def test_no_space_is_an_error_naming_path_and_bytes_with_nothing_left(
    tmp_path, monkeypatch, capsys
):
    def full(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    path = tmp_path / "run.state"
    assert main(["state", "create", str(path), *SMALL]) == 1
    size = state_file_bytes(PRESETS["stories110m"].with_overrides(n_layers=1))
    assert (
        f"cannot create state file {path}: cannot reserve {size:,} bytes for state file {path}:"
        " No space left on device" in capsys.readouterr().err
    )
    assert _names(tmp_path) == []
    # a dry run reserves the pages it writes: the header, the 8 KiB journal, two floats' pages
    assert main([*TRAIN[:-1], "--state", str(path)]) == 1
    assert (
        f"cannot create state file {path}: cannot reserve 20,480 bytes for state file {path}:"
        " No space left on device" in capsys.readouterr().err
    )
    assert _names(tmp_path) == []


@pytest.mark.parametrize("sparse", [False, True])
def test_a_failed_reservation_keeps_its_errno_and_names_the_file(tmp_path, monkeypatch, sparse):
    # callers tell ENOSPC from EFBIG by errno, and find the file in OSError.filename
    def fail(fd, *sizes):
        raise OSError(errno.EFBIG, "File too large")

    monkeypatch.setattr(os, "ftruncate" if sparse else "posix_fallocate", fail)
    path = tmp_path / "run.state"
    config = PRESETS["stories110m"].with_overrides(n_layers=1)
    with pytest.raises(OSError) as info:
        StateFile.create(path, config, sparse=sparse)
    verb = "size" if sparse else "reserve"
    assert (info.value.errno, info.value.filename) == (errno.EFBIG, str(path))
    assert info.value.strerror == (
        f"cannot {verb} {state_file_bytes(config):,} bytes for state file {path}: File too large"
    )
    assert _names(tmp_path) == []


def test_the_space_is_reserved_unless_sparse(tmp_path):
    config = ModelConfig("small", ModelDims(64, 128, 2, 2, 4, 1000, 16), CompileConfig())
    StateFile.create(tmp_path / "reserved", config).close()
    StateFile.create(tmp_path / "sparse", config, sparse=True).close()
    size = state_file_bytes(config)
    assert size > 1 << 20
    assert os.stat(tmp_path / "reserved").st_blocks * 512 >= size
    assert os.stat(tmp_path / "sparse").st_blocks * 512 < size // 4


# -- item 4: every value against its field, before the disk ------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--budget", "3000000000"],
            "argument --budget: expected an integer in 1 .. 2,147,483,647",
        ),
        (["--steps", "3000000000"], "argument --steps: expected an integer in 1 .. 2,147,483,647"),
        (["--budget", "1e40"], "argument --budget: expected an integer in 1 .. 2,147,483,647"),
        (["--interval", "2147483648"], "argument --interval: expected an integer in 1 .."),
        (["--layers", "1000001"], "argument --layers: expected an integer in 1 .. 1,000,000"),
        (["--lr", "1e400"], "argument --lr: expected a finite number, got '1e400'"),
        (["--lr", "nan"], "argument --lr: expected a finite number, got 'nan'"),
        (["--lr", "1e300"], "argument --lr: expected a number within float32's range"),
        (["--headroom=-inf"], "argument --headroom: expected a finite number, got '-inf'"),
    ],
)
def test_an_out_of_range_value_is_one_line_and_touches_nothing(users_file, capsys, argv, message):
    path, before = users_file
    base = ["train", "--steps", "1", "--dry-run", "--state", str(path), "--force"]
    err = _exits_2([*base, *argv], capsys)
    assert message in err and "Traceback" not in err
    assert _fingerprint(path) == before  # main at 6c47d36: struct.error after truncating it


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"compile_budget": INT32_MAX + 1}, "compile_budget=2147483648: the state file holds 0 .."),
        ({"accum_steps": 2**40}, "accum_steps=1099511627776"),
        ({"kernels_per_layer": 2**31}, "^kernels_per_layer=2147483648: the state file holds 0 .."),
        ({"static_per_layer": 2**32}, "^static_per_layer=4294967296: the state file holds 0 .."),
        ({"headroom_pct": float("nan")}, "headroom_pct=nan: the state file holds finite"),
    ],
)
def test_create_checks_the_fields_before_the_disk(tmp_path, change, field):
    base = PRESETS["stories110m"].with_overrides(n_layers=1)
    config = ModelConfig(base.name, base.dims, CompileConfig(**{**vars(base.compile), **change}))
    with pytest.raises(ValueError, match=field):
        StateFile.create(tmp_path / "s", config, sparse=True)
    assert _names(tmp_path) == []


def test_the_largest_values_fit_their_fields():
    base = PRESETS["stories110m"].with_overrides(n_layers=1)
    compile_ = CompileConfig(INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX, 0.5)
    config = ModelConfig("n" * 32, base.dims, compile_)  # the name: 32 UTF-8 bytes, the most
    scheduler = SchedulerState(step=INT32_MAX, total_steps=INT32_MAX, accum_step=INT32_MAX)
    kwargs = {"checkpoint_interval": INT32_MAX, "scheduler": scheduler}
    check_header_fields(config, checkpoint_policy="p" * 16, **kwargs)  # raises nothing


def test_a_file_of_2_to_the_64_bytes_or_more_is_refused():
    # dims whose file is exactly 2**64 bytes (found by solving the layout's size for the
    # vocabulary): one embedding row less fits; that size, and one row more, do not
    dims = ModelDims(262144, 1429801984, 1, 1, 1025, 309640222, 5)
    assert state_file_bytes(ModelConfig("huge", dims, CompileConfig())) == 2**64
    row = 16 * dims.dim  # an embedding row, with its Adam state and gradient
    for vocab, size in ((dims.vocab_size, 2**64), (dims.vocab_size + 1, 2**64 + row)):
        config = ModelConfig("huge", dataclasses.replace(dims, vocab_size=vocab), CompileConfig())
        with pytest.raises(ValueError) as info:
            check_header_fields(config)
        assert str(info.value) == f"state file size {size} bytes: the header holds less than 2**64"
    check_header_fields(
        ModelConfig(
            "huge", dataclasses.replace(dims, vocab_size=dims.vocab_size - 1), CompileConfig()
        )
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"checkpoint_policy": "p" * 17}, "checkpoint policy 'ppppppppppppppppp': the state file"
         " holds at most 16 UTF-8 bytes"),
        ({"checkpoint_interval": 2**31},
         "checkpoint_interval=2147483648: the state file holds 0 .. 2147483647"),
        ({"scheduler": SchedulerState(learning_rate=float("inf"))},
         "learning_rate=inf: the state file holds finite numbers only"),
        ({"scheduler": SchedulerState(group=2**31)},
         "group=2147483648: the state file holds 0 .. 2147483647"),
        ({"scheduler": SchedulerState(accum_step=2**31)},
         "accum_step=2147483648: the state file holds 0 .. 2147483647"),
    ],
)  # fmt: skip
def test_create_checks_the_policy_and_scheduler_before_the_disk(tmp_path, change, message):
    """Into a directory that does not exist: any disk access would be an OSError instead."""
    config = PRESETS["stories110m"].with_overrides(n_layers=1)
    with pytest.raises(ValueError) as info:
        StateFile.create(tmp_path / "absent" / "s", config, sparse=True, **change)
    assert str(info.value) == message


def test_check_header_fields_names_the_field():
    dims, compile_ = ModelDims(8, 16, 2, 2, 1, 32, 4), CompileConfig()
    with pytest.raises(ValueError, match=r"model name 'x+': the state file holds at most 32"):
        check_header_fields(ModelConfig("x" * 33, dims, compile_))
    small = ModelConfig("x", dims, compile_)
    with pytest.raises(ValueError, match=r"checkpoint policy 'p+': .* at most 16"):
        check_header_fields(small, checkpoint_policy="p" * 17)
    with pytest.raises(ValueError, match="learning_rate=inf"):
        check_header_fields(small, scheduler=SchedulerState(learning_rate=float("inf")))
    with pytest.raises(ValueError, match="total_steps=2147483648"):
        check_header_fields(small, scheduler=SchedulerState(total_steps=INT32_MAX + 1))


# -- item 5: read-only show, JSON without NaN --------------------------------------------------


def test_state_show_opens_read_only(users_file, monkeypatch, capsys):
    path, before = users_file
    flags = []
    real_open = os.open

    def spy(name, flag, *args, **kwargs):
        if os.fspath(name) == str(path):
            flags.append(flag)
        return real_open(name, flag, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    assert main(["state", "show", str(path), "--json"]) == 0
    assert flags == [os.O_RDONLY]  # main at 6c47d36: O_RDWR, refused on a read-only file
    assert json.loads(capsys.readouterr().out)["generation"] == 0
    assert _fingerprint(path) == before


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_non_finite_headroom_is_refused_not_printed_as_nan(capsys, value):
    err = _exits_2(["plan", f"--headroom={value}", "--json"], capsys)
    assert f"argument --headroom: expected a finite number, got '{value}'" in err


def test_a_huge_headroom_falls_back_without_an_overflow_warning(capsys):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # `python -W error`: numpy's overflow warning raised
        assert main(["plan", "--headroom", "1e40", "--json"]) == 0
    captured = capsys.readouterr()
    assert "warning: --headroom 1e+40 is not in (0, 1); using 0.1" in captured.err
    assert _strict(captured.out)["compile"]["effective_headroom"] == pytest.approx(0.1)


def test_the_json_outputs_are_strict_json(tmp_path, capsys):
    assert main(["plan", "--json", "--headroom", "5"]) == 0  # out of (0, 1): 0.1, warned
    assert _strict(capsys.readouterr().out)["compile"]["headroom_pct"] == 5.0
    path = str(tmp_path / "s")
    assert main([*TRAIN, "--state", path, "--keep-state"]) == 0
    _strict(capsys.readouterr().out.splitlines()[-1])
    assert main(["state", "show", path, "--json"]) == 0
    _strict(capsys.readouterr().out)


# -- item 10: interpreter options survive the restart ------------------------------------------


@pytest.mark.parametrize(
    ("orig", "options"),
    [
        (["py", "-m", "runtime.pipeline", "train"], []),
        (
            ["py", "-X", "dev", "-W", "error", "-O", "-m", "runtime.pipeline"],
            ["-X", "dev", "-W", "error", "-O"],
        ),
        (["py", "-Wdefault", "-OO", "-Xdev", "-mrunner"], ["-Wdefault", "-OO", "-Xdev"]),
        (["py", "-bW", "error", "-I", "script.py", "-X", "no"], ["-bW", "error", "-I"]),
        (["py", "-Em", "mod"], ["-E"]),
        (["py", "-c", "code", "-O"], []),
        (["py", "--check-hash-based-pycs", "always", "-"], ["--check-hash-based-pycs", "always"]),
    ],
)
def test_interpreter_options_are_read_from_orig_argv(orig, options):
    assert interpreter_options(orig) == options


def test_restart_argv_keeps_the_interpreter_options(monkeypatch):
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-X", "dev", "-O", "-m", "x", "a"])
    assert restart_argv(["train", "--state", "s"]) == [
        sys.executable, "-X", "dev", "-O", "-m", "runtime.pipeline", "train", "--state", "s",
        "--resume",
    ]  # fmt: skip


def test_an_exec_restart_runs_under_the_same_interpreter_options(tmp_path):
    # one layer, seven compiles per process: two restarts; -X importtime prints its table
    # header once per process image, so three headers mean the option survived both restarts
    argv = ["train", "--layers", "1", "--budget", "50", "--steps", "1", "--dry-run", "--sparse"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVMEM_")}
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "runtime.pipeline", *argv, "--state",
         str(tmp_path / "s")],
        capture_output=True, text=True, env={**env, "DEVMEM_BACKEND": "cpu"}, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.splitlines()[-1])["restarts"] == 2
    assert run.stderr.count("import time: self [us] | cumulative | imported package") == 3


# -- issue 37 item 7: read-only paths read with pread, never through the mapping --------------


def _show_with_the_tail_unmappable(path: str) -> None:
    """A death-test child: ``state show path`` where every page of the mapping past the
    header page raises SIGBUS when read (the file is cut to its header once mapped), as a
    sparse file's never-written pages do on a full tmpfs."""
    import mmap

    real = mmap.mmap

    def mapping(fd, *args, **kwargs):
        mapped = real(fd, *args, **kwargs)
        os.truncate(path, 4096)
        return mapped

    mmap.mmap = mapping
    raise SystemExit(main(["state", "show", path]))


def test_state_show_reads_nothing_through_the_mapping(death, users_file):
    path, _ = users_file
    outcome = death.run(
        _show_with_the_tail_unmappable, str(path), env=pinned_env("cpu"), style="fork"
    )
    outcome.assert_exited(0)  # main at 7cf9cfa read the journal through it: SIGBUS
    assert f"{path}: state file version 2 (sentinel 0x414E4550), generation 0" in outcome.stdout


_FULL_TMPFS = """
set -e
mount -t tmpfs -o size=1m none "$1"
"$2" -m runtime.pipeline state create "$1/s" --layers 1 --sparse
dd if=/dev/zero of="$1/fill" bs=4k 2>/dev/null || true
"$2" -m runtime.pipeline state show "$1/s"
"""


def test_state_show_of_a_sparse_file_on_a_full_tmpfs(tmp_path):
    """The real case, where a user namespace may mount a 1 MiB tmpfs: the disk is full, the
    sparse file's journal page was never written; main at 7cf9cfa died of SIGBUS here."""
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("unshare -rm (a user namespace to mount a tmpfs in) is not available here")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVMEM_")}
    run = subprocess.run(
        ["unshare", "-rm", "sh", "-c", _FULL_TMPFS, "sh", str(tmp_path), sys.executable],
        capture_output=True, text=True, env={**env, "DEVMEM_BACKEND": "cpu"}, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "state file version 2 (sentinel 0x414E4550), generation 0" in run.stdout


# -- issue 37 item 8: the headroom warning prints the value given ------------------------------


@pytest.mark.parametrize(
    ("value", "warning"),
    [
        ("0.9999999999", "--headroom 0.9999999999 is 1.0 in float32, not in (0, 1); using 0.1"),
        ("1e-50", "--headroom 1e-50 is 0.0 in float32, not in (0, 1); using 0.1"),
        ("1.0000001", "--headroom 1.0000001 is not in (0, 1); using 0.1"),
        ("-0.5", "--headroom -0.5 is not in (0, 1); using 0.1"),
    ],
)
def test_the_headroom_warning_prints_the_value_given(capsys, value, warning):
    assert main(["plan", f"--headroom={value}", "--json"]) == 0
    err = capsys.readouterr().err  # main at 7cf9cfa: "--headroom 1 is not in (0, 1)"
    assert err == f"python -m runtime.pipeline: warning: {warning}\n"


# -- issue 37 item 9: a dry run reserves only the pages it writes ------------------------------


def _dry_run_on_a_small_disk(argv: list) -> None:
    """A death-test child: ``argv`` on a disk that refuses to reserve more than 64 MiB in all
    (``posix_fallocate`` fails with ENOSPC past that)."""
    real, reserved = os.posix_fallocate, []

    def fallocate(fd, offset, length):
        if sum(reserved) + length > 64 << 20:
            raise OSError(errno.ENOSPC, "No space left on device")
        reserved.append(length)
        return real(fd, offset, length)

    os.posix_fallocate = fallocate
    raise SystemExit(main(argv))


def test_a_dry_run_of_llama7b_needs_no_103_gib(death, tmp_path):
    path = tmp_path / "llama.state"
    argv = ["train", "--model", "llama7b", "--steps", "1", "--dry-run", "--state", str(path)]
    env = {**pinned_env("cpu"), "DEVMEM_PIPELINE_KILL_AT": "1:committed"}  # before a restart
    outcome = death.run(_dry_run_on_a_small_disk, argv, env=env, style="fork")
    outcome.assert_died(signal="SIGKILL")  # main at 7cf9cfa: exit 1, cannot reserve 103 GiB
    size = state_file_bytes(PRESETS["llama7b"])
    assert os.stat(path).st_size == size == 110_566_125_568
    assert os.stat(path).st_blocks * 512 < 1 << 20
    assert (
        "[pipeline] dry run: the state file is sparse but for the 274,432 bytes it writes,"
        f" reserved (of {size:,}; --sparse reserves none)\n"
    ) in outcome.stderr


def test_a_dry_run_writes_only_pages_it_reserved(death):
    """Two layers, two steps, every commit: the file's allocated blocks after the run are the
    ones reserved at its creation (a write elsewhere would allocate, and could SIGBUS)."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=base) as scratch:
        path = os.path.join(scratch, "s")
        argv = ["train", "--layers", "2", "--budget", "1000", "--steps", "2", "--dry-run"]
        outcome = death.run(
            _targets.train, [*argv, "--keep-state", "--state", path], env=pinned_env("cpu"),
            style="fork",
        )  # fmt: skip
        outcome.assert_exited(0)
        # the header page, the 8 KiB journal, a page per layer's first weight and gradient
        reserved = 4096 + 8192 + 2 * 2 * 4096
        assert os.stat(path).st_blocks * 512 == reserved
        with StateFile.open(path, readonly=True) as state:
            assert state.header.scheduler.step == 2
