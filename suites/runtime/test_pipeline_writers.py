"""One writer per state file, and never a stranger's file (issue 37 items 1-3, 5 and 6).

A run holds an exclusive ``flock`` on its state file from creation (or ``--resume``) to its end,
across its ``exec()`` restarts; a second ``train --resume`` or a ``state create --force`` of the
same file is refused at once with one line naming the file and the holder's pid, and changes
nothing. ``--force`` replaces only a state file. A run removes its file only while the path
still names it, and a failure to remove it is one warning. A writer killed between ``os.link``
and the unlink of its temporary leaves a second name of the state file, which the next open
removes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import stat
import subprocess
import sys

import pytest

from runtime.pipeline import (
    LOCK_FD_ENV,
    PRESETS,
    StateFile,
    StateFileBusy,
    main,
)

from . import _targets
from ._knobs import pinned_env
from .test_pipeline_crash import _nonzero_pages, _result

SMALL = PRESETS["stories110m"].with_overrides(n_layers=1, compile_budget=1000)
TRAIN = ["train", "--layers", "1", "--budget", "1000", "--steps", "1", "--dry-run", "--sparse"]
# one layer, seven compiles per process: two exec() restarts in the step
RESTARTS = ["train", "--layers", "1", "--budget", "50", "--steps", "1", "--dry-run", "--sparse"]
PROG = "python -m runtime.pipeline"


def _busy(path, pid) -> str:
    return (
        f"state file {path} is in use by pid {pid}, which holds its lock (a train run or a state"
        " create --force): wait for it to end"
    )


def _fingerprint(path) -> tuple:
    """What any write, truncation or replacement of ``path`` changes: inode, size, blocks,
    mtime, and every page that holds data (read past the holes: the file is sparse)."""
    st = os.stat(path)
    pages = _nonzero_pages(str(path), 0, st.st_size)
    return st.st_ino, st.st_size, st.st_blocks, st.st_mtime_ns, pages


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVMEM_")}
    return {**env, "DEVMEM_BACKEND": "cpu"}


def _cli(*argv) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runtime.pipeline", *map(str, argv)],
        capture_output=True, text=True, env=_env(), timeout=120,
    )  # fmt: skip


@contextlib.contextmanager
def _paused_run(argv, path, after: str):
    """A ``train`` run of ``argv`` on ``path`` in another process, stopped (SIGSTOP) as soon as
    it has printed a stderr line starting with ``after``; resumed (SIGCONT) when the block
    ends, and its outcome (return code, stdout, stderr) put in the yielded dict."""
    run = subprocess.Popen(
        [sys.executable, "-m", "runtime.pipeline", *argv, "--state", str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    seen, result = [], {"pid": run.pid}
    try:
        for line in run.stderr:
            seen.append(line)
            if line.startswith(after):
                run.send_signal(signal.SIGSTOP)
                break
        assert seen and seen[-1].startswith(after), "".join(seen)
        yield result
    finally:
        run.send_signal(signal.SIGCONT)
        out, err = run.communicate(timeout=120)
        result.update(returncode=run.returncode, stdout=out, stderr="".join(seen) + err)


# -- item 1: two trainers on one file ---------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of RESTARTS: its tensors and passes (``_result``)."""
    path = tmp_path_factory.mktemp("reference") / "reference.state"
    done = _cli(*RESTARTS, "--keep-state", "--state", path)
    assert done.returncode == 0, done.stderr
    return _result(str(path))


@pytest.mark.parametrize(
    ("after", "keep"),
    [
        ("[pipeline] Stories110M", ["--keep-state"]),  # in the first process image
        ("[pipeline] resumed:", ["--keep-state"]),  # after its first exec() restart
        ("[pipeline] resumed:", []),  # and a run that removes its file at the end
    ],
)
def test_a_second_writer_is_refused_while_a_run_holds_the_file(
    death, tmp_path, reference, after, keep
):
    path = tmp_path / "c.state"
    with _paused_run([*RESTARTS, *keep], path, after) as first:
        before = _fingerprint(path)
        for argv in (
            [*RESTARTS, *keep, "--resume", "--state", str(path)],
            [*RESTARTS, *keep, "--force", "--state", str(path)],
            ["state", "create", str(path), "--layers", "1", "--budget", "50", "--force"],
        ):
            second = death.run(_targets.train, argv, env=pinned_env("cpu"), style="fork")
            second.assert_exited(1)
            assert second.duration_s < 30  # at once: the lock is not waited for
            assert second.stdout == ""
            assert second.stderr == f"{PROG}: error: {_busy(path, first['pid'])}\n"
            assert _fingerprint(path) == before  # nothing of the first run's state changed
        assert os.listdir(tmp_path) == ["c.state"]
    assert first["returncode"] == 0, first["stderr"]
    summary = json.loads(first["stdout"].splitlines()[-1])
    assert (summary["restarts"], summary["steps_done"]) == (2, 1)
    if keep:
        assert _result(str(path)) == reference  # the same tensors and passes
    else:
        assert summary["state_file"] is None and not path.exists()


_PROBE = """
import json, os, sys
from runtime.pipeline import LOCK_FD_ENV, StateFile, StateFileBusy
path = sys.argv[1]
try:
    StateFile.open(path).close()
    fresh = "opened"
except StateFileBusy as exc:
    fresh = str(exc)
with StateFile.open(path, inherited_fd=int(os.environ[LOCK_FD_ENV])) as state:
    adopted = state.header.generation
print(json.dumps({"fresh": fresh, "adopted": adopted, "pid": os.getpid()}))
"""


def _handover_and_exec(path: str, inherit: bool) -> None:
    """A death-test child: create ``path``, hand its locked descriptor over an ``exec()`` as
    ``train`` does at a restart, into a probe that tries to lock the file anew and then
    adopts the descriptor. ``inherit=False`` is the mutant: a descriptor closed by the exec."""
    if not inherit:
        os.set_inheritable = lambda fd, inheritable: None  # the default: close-on-exec
    state = StateFile.create(path, SMALL, sparse=True)
    os.environ[LOCK_FD_ENV] = str(state.handover())
    os.execv(sys.executable, [sys.executable, "-c", _PROBE, path])


@pytest.mark.parametrize("inherit", [True, False], ids=["handover", "teeth-closed-on-exec"])
def test_the_lock_is_held_across_an_exec_restart(death, tmp_path, inherit):
    path = str(tmp_path / "s")
    outcome = death.run(_handover_and_exec, path, inherit, env=pinned_env("cpu"), style="fork")
    outcome.assert_exited(0)
    probe = json.loads(outcome.stdout.splitlines()[-1])
    # the new process image: the same pid, the lock still held by the inherited descriptor
    held = probe["fresh"] == _busy(path, probe["pid"])
    assert held == inherit, probe
    assert probe["adopted"] == 0


def test_a_read_write_open_holds_the_lock_until_close(tmp_path):
    path = tmp_path / "s"
    StateFile.create(path, SMALL, sparse=True).close()
    with StateFile.open(path) as state:
        before = _fingerprint(path)
        with pytest.raises(StateFileBusy) as info:
            StateFile.open(path)
        assert (str(info.value), info.value.pid) == (_busy(path, os.getpid()), os.getpid())
        with pytest.raises(StateFileBusy):
            StateFile.create(path, SMALL, sparse=True, overwrite=True)
        with StateFile.open(path, readonly=True) as reader:  # reading takes no lock
            assert reader.header == state.header
        assert _fingerprint(path) == before and os.listdir(tmp_path) == ["s"]
    StateFile.open(path).close()  # released by close()
    with StateFile.create(tmp_path / "new", SMALL, sparse=True), pytest.raises(StateFileBusy):
        StateFile.open(tmp_path / "new")  # held from creation


def test_an_inherited_descriptor_of_another_file_is_left_alone(tmp_path):
    StateFile.create(tmp_path / "a", SMALL, sparse=True).close()
    StateFile.create(tmp_path / "b", SMALL, sparse=True).close()
    with StateFile.open(tmp_path / "b") as other:
        with StateFile.open(tmp_path / "a", inherited_fd=other._fd) as state:
            assert state._fd != other._fd
        reader = os.open(tmp_path / "a", os.O_RDONLY)  # the right file, but read-only
        try:
            with StateFile.open(tmp_path / "a", inherited_fd=reader) as state:
                assert state._fd != reader
            os.fstat(reader)  # still open: not the file's to close
        finally:
            os.close(reader)


def test_a_force_that_raced_an_open_is_seen_and_the_new_file_opened(tmp_path, monkeypatch):
    # between the open() of the name and the lock, another --force replaced the file: the
    # lock taken is the old inode's, so the name is checked and the new file opened instead
    path = tmp_path / "s"
    StateFile.create(path, SMALL, sparse=True).close()
    real, replaced = fcntl.flock, []

    def flock(fd, operation):
        if not replaced and operation == fcntl.LOCK_EX | fcntl.LOCK_NB:  # the open's lock
            replaced.append(1)
            StateFile.create(path, SMALL, sparse=True, overwrite=True).close()
        return real(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    with StateFile.open(path) as state:
        assert os.path.samestat(os.fstat(state._fd), os.stat(path))


def test_the_holder_is_found_in_proc_locks_or_not_named(tmp_path, monkeypatch):
    path = tmp_path / "s"
    with StateFile.create(path, SMALL, sparse=True):
        real_open = open

        def no_proc(name, *args, **kwargs):
            if name == "/proc/locks":
                raise PermissionError(13, "Permission denied", name)
            return real_open(name, *args, **kwargs)

        monkeypatch.setattr("builtins.open", no_proc)
        with pytest.raises(StateFileBusy) as info:
            StateFile.open(path)
        assert info.value.pid is None
        assert str(info.value) == _busy(path, "?").replace("pid ?", "another process")


# -- item 2: a run removes only the file it created --------------------------------------------


def test_a_run_does_not_remove_a_file_put_at_its_path(tmp_path, monkeypatch, capsys):
    path, users = tmp_path / "c.state", tmp_path / "users.state"
    StateFile.create(users, SMALL, sparse=True).close()
    real_commit = StateFile.commit

    def commit(self, header, writes=()):
        real_commit(self, header, writes)
        if header.scheduler.step == header.scheduler.total_steps:  # the run's last commit
            os.replace(users, path)  # `mv users.state c.state`: no lock asked for

    monkeypatch.setattr(StateFile, "commit", commit)
    assert main([*TRAIN, "--state", str(path)]) == 0
    before = _fingerprint(path)
    out, err = capsys.readouterr()
    assert json.loads(out.splitlines()[-1])["state_file"] is None  # the run's file is gone
    assert err.endswith(
        f"{PROG}: warning: not removing {path}: it no longer names the state file this run"
        " created (it was removed or replaced since)\n"
    )
    assert os.listdir(tmp_path) == ["c.state"] and _fingerprint(path) == before
    with StateFile.open(path, readonly=True) as state:  # the user's, untouched
        assert state.header.generation == 0


# -- item 3: --force replaces only a state file ------------------------------------------------


def _make(kind: str, path) -> str:
    """Make a ``kind`` of file at ``path``; return how the refusal names it."""
    if kind == "text":
        path.write_text("thesis\n")
        return "a regular file of 7 bytes without the state file's sentinel ('ANEP')"
    if kind == "empty":
        path.write_bytes(b"")
        return "a regular file of 0 bytes without the state file's sentinel ('ANEP')"
    if kind == "fifo":
        os.mkfifo(path)
        return "a FIFO (named pipe)"
    if kind == "directory":
        path.mkdir()
        return "a directory"
    if kind == "symlink":
        StateFile.create(path.with_name("target.state"), SMALL, sparse=True).close()
        path.symlink_to("target.state")
        return "a symbolic link"
    if kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()
        return "a socket"
    if kind == "device":  # /dev/null's numbers; as root, main at 7cf9cfa replaced /dev/null
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a device node needs root")
        return "a character device"
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["text", "empty", "fifo", "directory", "symlink", "socket", "device"]
)
@pytest.mark.parametrize("command", ["state create", "train"])
def test_force_refuses_anything_but_a_state_file(tmp_path, capsys, kind, command):
    path = tmp_path / "notes.txt"
    what = _make(kind, path)
    before = os.lstat(path)
    argv = (
        ["state", "create", str(path), "--layers", "1", "--sparse", "--force"]
        if command == "state create"
        else [*TRAIN, "--state", str(path), "--force"]
    )
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.endswith(
        f"{PROG}: error: refusing to replace {path}: --force replaces only a pipeline state file,"
        f" and it is {what}\n"
    )
    after = os.lstat(path)
    assert (after.st_ino, after.st_mode, after.st_size) == (
        before.st_ino,
        before.st_mode,
        before.st_size,
    )
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_force_replaces_a_state_file_of_any_version(tmp_path, capsys):
    path = tmp_path / "old.state"
    path.write_bytes(b"PENA" + (1).to_bytes(4, "little") + bytes(100))  # version 1: 'ANEP'
    assert main(["state", "create", str(path), "--layers", "1", "--sparse", "--force"]) == 0
    with StateFile.open(path, readonly=True) as state:
        assert state.header.generation == 0


def test_a_name_that_changes_during_the_check_is_looked_at_again(tmp_path, monkeypatch):
    # the name is a state file when lstat() looks, then a text file when it is opened
    path = tmp_path / "s"
    StateFile.create(path, SMALL, sparse=True).close()
    real_open, swapped = os.open, []

    def swap(name, flags, *args, **kwargs):
        if os.fspath(name) == str(path) and not swapped:
            swapped.append(1)
            (tmp_path / "notes").write_text("thesis\n")
            os.replace(tmp_path / "notes", path)
        return real_open(name, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", swap)
    with pytest.raises(ValueError, match="it is a regular file of 7 bytes without the state"):
        StateFile.create(path, SMALL, sparse=True, overwrite=True)
    assert path.read_text() == "thesis\n"


# -- item 5: a removal that fails is a warning, after the run's result -------------------------


def test_a_failed_removal_is_one_warning_and_the_summary_is_printed(tmp_path, monkeypatch, capsys):
    path = tmp_path / "c.state"
    real_unlink = os.unlink

    def immutable(name, *args, **kwargs):  # as `chattr +i` on the directory makes it
        if os.fspath(name) == str(path):
            raise PermissionError(1, "Operation not permitted", os.fspath(name))
        return real_unlink(name, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", immutable)
    assert main([*TRAIN, "--state", str(path)]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out.splitlines()[-1])
    assert (summary["steps_done"], summary["state_file"]) == (1, str(path))
    assert "Traceback" not in err and err.endswith(
        f"{PROG}: warning: cannot remove state file {path}: Operation not permitted; it is kept\n"
    )
    assert path.exists()


# -- item 6: a second name left by a writer killed between os.link and the unlink ---------------


def _killed_after_link(argv: list) -> None:
    """A death-test child: run ``argv`` with a SIGKILL at the unlink of the temporary file."""
    real_unlink = os.unlink

    def unlink(name, *args, **kwargs):
        if os.path.basename(os.fspath(name)).startswith("."):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_unlink(name, *args, **kwargs)

    os.unlink = unlink
    raise SystemExit(main(argv))


def _second_name(death, tmp_path, path) -> str:
    argv = [*TRAIN[:-1], "--state", str(path)]  # reserved: the space a second name keeps
    outcome = death.run(_killed_after_link, argv, env=pinned_env("cpu"), style="fork")
    outcome.assert_died(signal="SIGKILL")
    (hidden,) = [n for n in os.listdir(tmp_path) if n.startswith(".")]
    assert os.path.samestat(os.stat(tmp_path / hidden), os.stat(path))
    return str(tmp_path / hidden)


def test_the_next_open_removes_a_second_name_left_by_a_killed_writer(death, tmp_path, capsys):
    path = tmp_path / "c.state"
    hidden = _second_name(death, tmp_path, path)
    assert main([*TRAIN[:-1], "--state", str(path), "--resume"]) == 0
    assert (
        f"devmem: removed {hidden} a second name of state file c.state left by a writer killed"
        " while placing it (its space stays with the state file)\n"
    ) in capsys.readouterr().err
    assert os.listdir(tmp_path) == []  # the run removed its file: nothing keeps its space


def test_force_removes_the_second_name_of_the_file_it_replaces(death, tmp_path, capsys):
    path = tmp_path / "c.state"
    hidden = _second_name(death, tmp_path, path)
    assert main(["state", "create", str(path), "--layers", "1", "--sparse", "--force"]) == 0
    assert f"devmem: removed {hidden} a second name of state file c.state" in (
        capsys.readouterr().err
    )
    assert os.listdir(tmp_path) == ["c.state"]
