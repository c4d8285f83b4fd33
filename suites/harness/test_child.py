"""The child side on its own (``harness._child``): :func:`run_child` in a process this test
forks, with the request, descriptors and seal it is given, checked against the protocol its
module docstring documents (exit status, status records, seal, what lands on stdout/stderr);
and the helpers the exec runner and the zygote load by path.

The styles' own tests reach most of this through ``harness.run_child``; these reach the parts
that only an exec'd child or a zygote's child take (whole environments, ``sys_path_after``,
targets loaded by path or from a script's ``__main__``, a seal given as a descriptor) and the
repro mode, in a fork, where they can be checked exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import gc
import importlib
import io
import json
import locale
import mmap
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types

import pytest

import harness
from harness import _child
from harness._child import (
    EXIT_HARNESS_ERROR,
    SEAL_BYTES,
    SEAL_FINAL_AT,
    plain_problem,
    read_all,
    start_ticks,
)
from harness._protocol import decode_seal
from suites.harness import _procs, _targets


@dataclasses.dataclass
class Child:
    """What a child left: how it ended, its records, streams and seal page."""

    status: int
    records: list[dict]
    stdout: str
    stderr: str
    seal: bytes

    @property
    def exit_code(self) -> int | None:
        return os.waitstatus_to_exitcode(self.status) if os.WIFEXITED(self.status) else None

    @property
    def events(self) -> list[str]:
        return [record["event"] for record in self.records]


def _wait(pid: int, within_s: float = 20.0) -> int:
    deadline = time.monotonic() + within_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"child {pid} did not end within {within_s} s")
        time.sleep(0.005)


def fork_child(
    request: dict,
    *,
    target: object = None,
    status: bool = True,
    seal: object = "mapping",
    identity: object = "parent",
    before=None,
    given: bool = True,
    parent: bool = True,
) -> Child:
    """Fork, and in the child call ``run_child(request, ...)`` with temp files for stdout,
    stderr and the status channel (``status=False``: none, a repro run), and a seal page
    (``"mapping"``: an inherited shared mapping; ``"fd"``: the second page of a file, by
    descriptor; None: no seal; anything else: given as it is). ``identity``: the channel's
    ``(st_dev, st_ino)`` as the forking process takes it (``"parent"``), None (the child
    takes it) or a given pair. ``before()`` runs in the child first. ``given=False``: the
    files are on descriptors 1 and 2 already, as in an exec'd child, and ``run_child`` is
    given None for them. ``parent=False``: no parent to die with (a repro run)."""
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(tempfile.TemporaryFile()) for _ in range(4)]
        page = stack.enter_context(mmap.mmap(-1, SEAL_BYTES))
        out, err, channel, table = (file.fileno() for file in files)
        GIVEN.update(stdout=out, stderr=err)
        os.ftruncate(table, 2 * SEAL_BYTES)
        seal_arg = {"mapping": (page, 0), "fd": (table, SEAL_BYTES), None: None}.get(seal, seal)
        if identity == "parent":
            info = os.fstat(channel)
            identity = (info.st_dev, info.st_ino)
        parent_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                if not given:
                    os.dup2(out, 1)
                    os.dup2(err, 2)
                    sys.stderr = _stderr_over_2()
                if before is not None:
                    before()
                _child.run_child(
                    request,
                    stdout_fd=out if given else None,
                    stderr_fd=err if given else None,
                    status_fd=channel if status else None,
                    parent_pid=parent_pid if parent else None,
                    target=target,
                    seal=seal_arg,
                    status_identity=identity,
                )
            finally:
                os._exit(99)
        wait_status = _wait(pid)
        text = [os.pread(fd, 1 << 24, 0).decode() for fd in (out, err, channel)]
        page_bytes = os.pread(table, SEAL_BYTES, SEAL_BYTES) if seal == "fd" else page[:]
    records = [json.loads(line) for line in text[2].splitlines()]
    return Child(wait_status, records, text[0], text[1], page_bytes)


def _stderr_over_2() -> io.TextIOWrapper:
    """A ``sys.stderr`` over descriptor 2, as a fresh interpreter has."""
    return io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)


GIVEN: dict[str, int] = {}
"""The descriptors the last :func:`fork_child` gave its child (``stdout``, ``stderr``)."""


def request_for(target: str = "?", **fields: object) -> dict:
    return {"target": target, "args": [], "cwd": None, **fields}


# -- the protocol, in a fork ----------------------------------------------------------------


def test_a_returned_value_is_one_started_and_one_returned_record_and_a_delivered_seal():
    child = fork_child(request_for(args=[2, "x"]), target=lambda a, b: {"got": [a, b]})

    assert child.exit_code == 0
    assert child.records == [
        {"event": "started", "pid": child.records[0]["pid"]},
        {"event": "returned", "value": {"got": [2, "x"]}},
    ]
    seal = decode_seal(child.seal)
    assert (seal.pid, seal.final, seal.delivered, seal.error) == (
        child.records[0]["pid"],
        "returned",
        True,
        None,
    )
    assert child.seal[SEAL_FINAL_AT:].rstrip(b"\0") == (
        b'{"event": "returned", "delivered": true, "error": null}'
    )


def test_a_seal_given_as_a_descriptor_is_that_page_of_the_file():
    child = fork_child(request_for(), target=lambda: 5, seal="fd")

    assert child.exit_code == 0
    assert child.seal.startswith(b"%d\n" % child.records[0]["pid"])
    assert decode_seal(child.seal).final == "returned"


def test_without_a_seal_the_records_still_go_out():
    child = fork_child(request_for(), target=lambda: 5, seal=None)

    assert (child.exit_code, child.events) == (0, ["started", "returned"])
    assert child.seal == bytes(SEAL_BYTES)


@pytest.mark.parametrize("identity", [None, "parent"])
def test_the_final_record_goes_to_the_status_channel_checked_in_the_child(identity):
    # None: the child takes the channel's identity itself, before the target runs
    child = fork_child(request_for(), target=lambda: 1, identity=identity)
    assert (child.exit_code, child.events) == (0, ["started", "returned"])
    assert decode_seal(child.seal).delivered


def test_a_channel_that_is_not_the_one_named_is_not_written_and_the_seal_says_so():
    child = fork_child(request_for(), target=lambda: 1, identity=(0, 0))

    assert child.exit_code == 0  # the parent reports the undelivered record from the seal
    assert child.events == ["started"]
    seal = decode_seal(child.seal)
    assert (seal.final, seal.delivered) == ("returned", False)
    assert seal.error is not None
    assert seal.error.startswith("OSError: descriptor ")
    assert seal.error.endswith(" is no longer the status channel")


def test_a_raise_is_a_raised_record_with_its_bases_and_status_1():
    def target():
        raise KeyError("gone")

    child = fork_child(request_for(), target=target)

    assert child.exit_code == _child.EXIT_RAISED == 1
    raised = child.records[-1]
    assert (raised["event"], raised["type"], raised["message"]) == ("raised", "KeyError", "'gone'")
    assert raised["bases"] == ["LookupError", "Exception", "BaseException"]
    assert raised["traceback"].startswith("Traceback (most recent call last):")
    assert raised["traceback"].endswith("KeyError: 'gone'\n")
    assert raised["traceback"] in child.stderr
    assert decode_seal(child.seal).final == "raised"


@pytest.mark.parametrize(
    ("code", "status", "stderr"),
    [(None, 0, ""), (0, 0, ""), (3, 3, ""), (256 + 7, 7, ""), (-1, 255, ""), ("bye", 1, "bye\n")],
)
def test_system_exit_is_an_exit_record_and_that_status(code, status, stderr):
    def target():
        sys.exit(code)

    child = fork_child(request_for(), target=target)

    assert child.exit_code == status
    assert child.records[-1] == {"event": "exit", "code": status}
    assert child.stderr == stderr
    assert decode_seal(child.seal).final == "exit"


def test_a_value_that_is_not_plain_data_is_a_harness_error_with_status_121():
    child = fork_child(request_for(), target=lambda: (1, 2))

    assert child.exit_code == EXIT_HARNESS_ERROR == 121
    assert child.events == ["started", "harness_error"]
    assert child.records[-1]["message"] == (
        "the value returned by the target has type tuple, which is not JSON plain data "
        f"({_child.PLAIN_TYPES})"
    )
    assert child.records[-1]["traceback"] == ""
    assert child.stderr.startswith(
        "devmem-death: harness error in the child: the value returned by the target has type tuple"
    )
    assert decode_seal(child.seal).final == "harness_error"


def test_the_environment_is_set_up_as_documented(monkeypatch):
    monkeypatch.setenv("DEVMEM_T_KEEP", "old")
    monkeypatch.setenv("DEVMEM_T_DROP", "x")

    def target():
        return {
            "keep": os.environ.get("DEVMEM_T_KEEP"),
            "drop": os.environ.get("DEVMEM_T_DROP"),
            "set": os.environ.get("DEVMEM_T_SET"),
            "flag": os.environ.get(_child.ENV_FLAG),
            "stdin": sys.stdin.read(),
            "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
            "sigpipe": signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN,
            "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
            "group": os.getpgid(0) == os.getpid(),
            "blocked": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])),
            "core": list(resource.getrlimit(resource.RLIMIT_CORE)),
            "moved": [_is_open(GIVEN["stdout"]), _is_open(GIVEN["stderr"])],
        }

    def before():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1, signal.SIGTERM])

    env = {"DEVMEM_T_DROP": None, "DEVMEM_T_SET": "new"}
    child = fork_child(request_for(env=env), target=target, before=before)

    assert child.records[-1]["value"] == {
        "keep": "old",
        "drop": None,
        "set": "new",
        "flag": "1",
        "stdin": "",
        "sigint": True,
        "sigpipe": True,
        "sigterm": True,
        "group": True,
        "blocked": [],
        "core": [0, 0],
        "moved": [False, False],  # onto 1 and 2, the originals closed
    }


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _streams_made(where: str):
    """A ``before`` for :func:`fork_child`: the child's std streams made by ``prepare()`` in the
    process that forks (``"prepared"``, the fork style) or in the child itself (``"fresh"``,
    as an exec'd child makes them)."""

    def before() -> None:
        if where == "fresh":
            _child._streams = None
        else:
            _child.prepare()

    return before


STREAMS_MADE = pytest.mark.parametrize("where", ["prepared", "fresh"])


@STREAMS_MADE
def test_stdout_is_line_buffered_and_stderr_written_through_so_a_killed_child_leaves_both(where):
    def target():
        print("a line")
        sys.stdout.write("no newline: kept in the buffer")
        sys.stderr.write("straight out")
        os.kill(os.getpid(), signal.SIGKILL)

    child = fork_child(request_for(), target=target, before=_streams_made(where))

    assert os.WTERMSIG(child.status) == signal.SIGKILL
    assert (child.stdout, child.stderr) == ("a line\n", "straight out")


@STREAMS_MADE
def test_output_is_utf_8_with_undecodable_characters_escaped_and_flushed_at_the_end(where):
    def target():
        sys.stdout.write("é \udc80 end")  # a lone surrogate: escaped, not an error
        sys.stderr.write("ü")

    child = fork_child(request_for(), target=target, before=_streams_made(where))

    assert child.exit_code == 0
    assert child.stdout == "é \\udc80 end"
    assert child.stderr == "ü"


def test_the_parents_buffered_output_never_reaches_the_child_s_files():
    def before():
        stale = io.TextIOWrapper(io.FileIO(os.dup(1), "w"), encoding="utf-8")
        stale.write("the parent's unflushed text")  # buffered, never flushed by the parent
        sys.stdout = stale

    child = fork_child(request_for(), target=lambda: None, before=before)

    assert child.exit_code == 0
    assert child.stdout == ""


def test_a_crash_dumps_every_thread_and_the_dump_signal_leaves_the_child_running():
    def target():
        os.kill(os.getpid(), _child.DUMP_SIGNAL)  # the parent's signal at a deadline
        time.sleep(0.05)
        print("still running", flush=True)
        faulthandler._sigsegv()

    child = fork_child(request_for(), target=target)

    assert os.WTERMSIG(child.status) == signal.SIGSEGV
    assert child.stdout == "still running\n"
    # both the dump and the crash show the current thread among all threads
    assert child.stderr.count("Current thread 0x") == 2, child.stderr
    assert "Fatal Python error: Segmentation fault" in child.stderr


def test_a_whole_environment_replaces_this_one(monkeypatch):
    monkeypatch.setenv("DEVMEM_T_GONE", "x")
    monkeypatch.setenv("DEVMEM_T_SAME", "same")
    environ = {"DEVMEM_T_SAME": "same", "DEVMEM_T_NEW": "new", "PATH": os.environ["PATH"]}

    child = fork_child(request_for(environ=environ), target=lambda: dict(os.environ))

    assert child.records[-1]["value"] == {**environ, _child.ENV_FLAG: "1"}


def test_sys_path_is_replaced_or_appended_to_and_cwd_is_set(tmp_path):
    runner_dir = os.path.dirname(_child.__file__)
    extra = str(tmp_path / "extra")

    def before():
        sys.path[:] = ["/own/a", runner_dir, "/own/b"]

    got = fork_child(
        request_for(sys_path=["/given/a", "/given/b"], cwd=str(tmp_path)),
        target=lambda: [sys.path, os.getcwd()],
        before=before,
    )
    assert got.records[-1]["value"] == [["/given/a", "/given/b"], str(tmp_path)]

    after = fork_child(
        request_for(sys_path=None, sys_path_after=["/own/b", extra, extra + "2"]),
        target=lambda: sys.path,
        before=before,
    )
    assert after.records[-1]["value"] == ["/own/a", "/own/b", extra, extra + "2"]

    kept = fork_child(request_for(sys_path=None), target=lambda: sys.path, before=before)
    assert kept.records[-1]["value"] == ["/own/a", runner_dir, "/own/b"]


@pytest.mark.parametrize("invalidate", [True, False])
def test_a_request_may_refresh_the_import_caches(invalidate):
    def before():
        importlib.invalidate_caches = lambda: os.environ.__setitem__("DEVMEM_T_FRESH", "1")

    child = fork_child(
        request_for(invalidate_caches=invalidate),
        target=lambda: os.environ.get("DEVMEM_T_FRESH"),
        before=before,
    )
    assert child.records[-1]["value"] == ("1" if invalidate else None)


# -- targets by name ------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["no colon", ":f", "os:", ""])
def test_a_target_that_is_not_module_colon_qualname_is_a_harness_error(spec):
    child = fork_child(request_for(spec))

    assert child.exit_code == EXIT_HARNESS_ERROR
    assert child.records[-1]["message"] == (
        f"could not import the target {spec!r} in the child: ValueError: target must be "
        f"'module:qualname', got {spec!r}"
    )
    assert child.records[-1]["traceback"].startswith("Traceback (most recent call last):")


def test_a_target_by_name_is_imported_and_its_qualname_followed():
    child = fork_child(request_for("os.path:join", args=["a", "b"]))
    assert child.records[-1] == {"event": "returned", "value": os.path.join("a", "b")}

    nested = fork_child(request_for("json:JSONDecoder.decode", args=[None, "[]"]))
    assert nested.exit_code == 1  # JSONDecoder.decode(None, "[]"): an AttributeError of None
    assert nested.records[-1]["type"] == "AttributeError"


def _write_module(directory, name: str, body: str) -> str:
    path = directory / f"{name}.py"
    path.write_text(body)
    return str(path)


def test_a_module_that_cannot_be_imported_by_name_is_loaded_from_its_file(tmp_path):
    body = "import sys\nSELF = sys.modules[__name__]\ndef f(x):\n    return [SELF.__name__, x]\n"
    path = _write_module(tmp_path, "devmem_t_by_path", body)

    child = fork_child(request_for("devmem_t_by_path:f", args=[3], module_path=path))

    # registered in sys.modules before its code runs, as an import does
    assert child.records[-1] == {"event": "returned", "value": ["devmem_t_by_path", 3]}


def test_a_module_found_in_another_file_is_loaded_from_the_given_one(tmp_path):
    first = tmp_path / "a"
    second = tmp_path / "b"
    first.mkdir()
    second.mkdir()
    _write_module(first, "devmem_t_twice", "WHICH = 'first'\n")
    path = _write_module(second, "devmem_t_twice", "WHICH = 'second'\n")

    child = fork_child(
        request_for("devmem_t_twice:WHICH.upper", module_path=path, sys_path=[str(first)])
    )
    assert child.records[-1] == {"event": "returned", "value": "SECOND"}

    by_name = fork_child(
        request_for("devmem_t_twice:WHICH.upper", module_path=None, sys_path=[str(first)])
    )
    assert by_name.records[-1] == {"event": "returned", "value": "FIRST"}


def test_a_module_importable_as_its_file_is_imported_by_name(tmp_path):
    package = tmp_path / "devmem_t_pkg"
    package.mkdir()
    _write_module(package, "__init__", "")
    body = "import sys\ndef f():\n    return hasattr(sys.modules['devmem_t_pkg'], 'mod')\n"
    path = _write_module(package, "mod", body)

    # imported by name, it is bound in its package; loaded by path, it would not be
    child = fork_child(
        request_for("devmem_t_pkg.mod:f", module_path=path, sys_path=[str(tmp_path), *sys.path])
    )
    assert child.records[-1] == {"event": "returned", "value": True}


def test_a_module_registered_under_its_name_is_used_as_it_is(tmp_path):
    # what pytest's importlib mode does: the test module is in sys.modules, not importable
    path = _write_module(tmp_path, "devmem_t_registered", "def f():\n    return 'from the file'\n")

    def before():
        module = types.ModuleType("devmem_t_registered")
        module.__file__ = path
        module.f = lambda: "the registered one"
        sys.modules["devmem_t_registered"] = module

    child = fork_child(request_for("devmem_t_registered:f", module_path=path), before=before)
    assert child.records[-1] == {"event": "returned", "value": "the registered one"}


def test_importable_as_compares_files():
    assert _child._importable_as("json", json.__file__)
    assert not _child._importable_as("json", os.__file__)
    assert not _child._importable_as("devmem_t_no_such_module", os.__file__)
    assert not _child._importable_as("devmem_t_no_such_package.x", os.__file__)
    assert not _child._importable_as("sys", os.__file__)  # built in: no file
    assert not _child._importable_as("json", "/devmem/t/no/such/file.py")


def test_a_module_that_fails_to_load_by_path_is_not_left_in_sys_modules(tmp_path):
    path = _write_module(tmp_path, "devmem_t_broken", "raise RuntimeError('broken at import')\n")

    with pytest.raises(RuntimeError, match="broken at import"):
        _child._load_by_path("devmem_t_broken", path)
    assert "devmem_t_broken" not in sys.modules
    body = "import sys\ndel sys.modules[__name__]\nraise RuntimeError('gone at import')\n"
    gone = _write_module(tmp_path, "devmem_t_gone", body)
    with pytest.raises(RuntimeError, match="gone at import"):  # its own error, nothing else
        _child._load_by_path("devmem_t_gone", gone)
    with pytest.raises(ImportError, match="cannot load module 'devmem_t_x' from"):
        _child._load_by_path("devmem_t_x", str(tmp_path / "not-python.txt"))


def test_a_main_target_is_loaded_from_the_script_as_mp_main(tmp_path):
    body = (
        "import sys\n"
        "def answer(x):\n"
        "    names = [n for n in sys.modules if getattr(sys.modules[n], 'answer', 0) is answer]\n"
        "    return [__name__, x * 2, sorted(names)]\n"
    )
    script = _write_module(tmp_path, "script", body)

    child = fork_child(request_for("__main__:answer", args=[21], main_path=script))

    # what multiprocessing does: the script is both __mp_main__ and __main__ in the child
    assert child.records[-1] == {
        "event": "returned",
        "value": ["__mp_main__", 42, ["__main__", "__mp_main__"]],
    }
    missing = fork_child(request_for("__main__:answer", main_path=str(tmp_path / "x.txt")))
    assert missing.exit_code == EXIT_HARNESS_ERROR
    assert "ImportError: cannot load the parent's __main__ from" in missing.records[-1]["message"]


# -- repro mode: no status channel ----------------------------------------------------------


def test_without_a_channel_the_ending_is_a_line_on_stderr():
    returned = fork_child(request_for(), target=lambda: {"v": 5}, status=False, seal=None)
    assert returned.exit_code == 0
    assert returned.stderr == 'devmem-death: returned {"value": {"v": 5}}\n'

    def leave():
        sys.exit(4)

    exited = fork_child(request_for(), target=leave, status=False, seal=None)
    assert (exited.exit_code, exited.stderr) == (4, 'devmem-death: exit {"code": 4}\n')

    def fail():
        raise ValueError("v")

    raised = fork_child(request_for(), target=fail, status=False, seal=None)
    assert raised.exit_code == 1
    assert raised.stderr.startswith("Traceback (most recent call last):")
    assert raised.stderr.endswith("ValueError: v\n")  # the traceback only, as python prints it
    assert "devmem-death" not in raised.stderr


# -- helpers the exec runner and the zygote use ---------------------------------------------


def test_read_all_reads_the_whole_file_from_its_start_and_leaves_the_offset():
    data = bytes(range(256)) * (5 * 4096 + 3)  # over 5 MiB: several reads
    with tempfile.TemporaryFile() as file:
        file.write(data)
        file.seek(100)
        assert read_all(file.fileno()) == data
        assert file.tell() == 100
        assert read_all(file.fileno()) == data  # still open, and readable again
    with tempfile.TemporaryFile() as empty:
        assert read_all(empty.fileno()) == b""


def _ticks(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        text = stat.read()
    return text[text.rindex(b")") + 2 :].split()[19].decode()


def test_start_ticks_is_field_22_of_proc_stat(tmp_path):
    assert start_ticks(os.getpid()) == _ticks(os.getpid())
    # a command name with ") " in it cannot shift the fields
    odd = tmp_path / ") 1 2 3 4 5 6"
    odd.symlink_to(sys.executable)
    sleeper = subprocess.Popen([str(odd), "-c", "import time; time.sleep(30)"])
    try:
        with open(f"/proc/{sleeper.pid}/stat", "rb") as stat:
            assert b") 1 2" in stat.read()
        assert start_ticks(sleeper.pid) == _ticks(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert start_ticks(sleeper.pid) is None  # gone


def test_die_with_parent_exits_at_once_when_the_parent_is_gone_already():
    for parent, expected in ((lambda: os.getppid(), 0), (lambda: os.getppid() + 1, 121)):
        pid = os.fork()
        if pid == 0:
            try:
                _child.die_with_parent(parent())
            finally:
                os._exit(0)
        assert os.waitstatus_to_exitcode(_wait(pid)) == expected


@pytest.mark.parametrize("prctl", ["loaded", "fresh"])
def test_a_child_dies_with_its_parent(prctl, monkeypatch):
    if prctl == "fresh":  # libc's prctl not loaded in the process that forks: the child loads it
        monkeypatch.setattr(_child, "_prctl", None)
    read_fd, write_fd = os.pipe()
    middle = os.fork()
    if middle == 0:  # the parent: fork the child, then wait to be killed
        try:
            os.close(read_fd)
            child = os.fork()
            if child == 0:
                _child.die_with_parent(os.getppid())
                os.write(write_fd, b"%d\n" % os.getpid())
                time.sleep(60)
            else:
                os.close(write_fd)  # a child that failed leaves the pipe at its end of file
                time.sleep(60)
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        line = pipe.readline()
    assert line, "die_with_parent failed in the child"
    child = int(line)
    os.kill(middle, signal.SIGKILL)
    _wait(middle)
    assert _procs.wait_until_dead(child), f"child {child} outlived its parent"


def test_a_child_runs_its_target_where_libc_s_prctl_cannot_be_loaded(monkeypatch):
    import ctypes

    def no_libc(*args, **kwargs):
        raise OSError("no libc here")

    monkeypatch.setattr(_child, "_prctl", None)
    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    child = fork_child(request_for(), target=lambda: 7)
    assert child.exit_code == 0, child.stderr
    assert child.records[-1] == {"event": "returned", "value": 7}
    assert child.stderr == ""


# -- plain data -----------------------------------------------------------------------------


def _nested(depth: int, leaf: object) -> object:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def test_a_problem_s_path_keeps_the_outermost_dozen_steps():
    assert plain_problem(_nested(12, ()), "v") == (
        "v" + "[0]" * 12 + f" has type tuple, which is not JSON plain data ({_child.PLAIN_TYPES})"
    )
    assert plain_problem(_nested(13, ()), "v") == (
        "v" + "[0]" * 12 + f"[...] has type tuple, which is not JSON plain data "
        f"({_child.PLAIN_TYPES})"
    )
    assert plain_problem({"a": [1, {"b": {3}}]}, "v") == (
        f"v['a'][1]['b'] has type set, which is not JSON plain data ({_child.PLAIN_TYPES})"
    )


def test_plain_data_limits_are_exact():
    assert plain_problem(_nested(100, 1), "v") is None
    assert plain_problem(_nested(101, 1), "v") == (
        "v" + "[0]" * 12 + "[...] nests lists and dicts more than 100 deep"
    )
    assert plain_problem(2**14_000 - 1, "v") is None
    assert plain_problem(-(2**14_000), "v") == (
        "v is an int of 14001 bits, too long to send as JSON (at most 14000 bits; pass it as a str)"
    )
    nested_dicts: object = 1
    for _ in range(101):
        nested_dicts = {"k": nested_dicts}
    assert plain_problem(nested_dicts["k"], "v") is None  # 100 deep
    assert plain_problem(nested_dicts, "v") == (
        "v" + "['k']" * 12 + "[...] nests lists and dicts more than 100 deep"
    )
    shared = [1]
    assert plain_problem([shared, shared, {"k": shared}], "v") is None  # shared, not a cycle
    cycle: list = [1]
    cycle.append({"c": cycle})
    assert plain_problem(cycle, "v") == "v[1]['c'] contains itself (a reference cycle)"
    assert plain_problem([True, 1.5, None, "s", {}], "v") is None


# -- failures of the harness's own steps ----------------------------------------------------


def test_a_set_up_that_fails_is_a_harness_error_on_the_channel_and_stderr(tmp_path):
    missing = str(tmp_path / "gone")
    child = fork_child(request_for(cwd=missing), target=lambda: 1)

    assert child.exit_code == EXIT_HARNESS_ERROR
    assert child.events == ["harness_error"]  # never started
    message = child.records[0]["message"]
    assert message.startswith("could not set up the child: FileNotFoundError: ")
    assert missing in message
    assert child.records[0]["traceback"].startswith("Traceback (most recent call last):")
    assert child.stderr.startswith(f"devmem-death: harness error in the child: {message}\n")
    assert decode_seal(child.seal).final == "harness_error"


def test_a_request_without_args_calls_the_target_with_none_and_without_target_names_it_so():
    child = fork_child({}, target=lambda *args: list(args))
    assert child.records[-1] == {"event": "returned", "value": []}

    nameless = fork_child({})
    assert nameless.records[-1]["message"] == (
        "could not import the target '?' in the child: ValueError: target must be "
        "'module:qualname', got '?'"
    )


@pytest.mark.skipif(
    not hasattr(sys, "set_int_max_str_digits"), reason="this Python converts ints of any length"
)
def test_a_value_json_cannot_take_after_all_is_a_harness_error():
    def target():
        sys.set_int_max_str_digits(640)  # the target's own limit: 10**700 has 701 digits
        return 10**700

    child = fork_child(request_for(), target=target)

    assert child.exit_code == EXIT_HARNESS_ERROR
    assert child.records[-1]["message"] == (
        "the value returned by the target could not be encoded as JSON"
    )


def test_a_failure_while_reporting_the_returned_value_is_a_harness_error_that_names_it():
    class Key:  # a dict key whose repr, called to say the key is not a str, leaves
        def __repr__(self):
            raise SystemExit(3)

    child = fork_child(request_for(), target=lambda: {Key(): 1})

    assert child.exit_code == EXIT_HARNESS_ERROR
    assert child.events == ["started", "harness_error"]
    assert child.records[-1]["message"] == (
        "reporting the value returned by the target failed: SystemExit: 3"
    )
    assert "harness error in the child: reporting the value returned" in child.stderr


def test_an_exception_that_cannot_be_printed_is_still_reported():
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no")

    def target():
        raise Unprintable

    child = fork_child(request_for(), target=target)

    assert child.exit_code == 1
    assert child.records[-1]["message"] == "<unprintable Unprintable>"
    assert child.records[-1]["type"].endswith("Unprintable")


def test_without_a_channel_a_harness_error_is_written_to_stderr_twice_over():
    child = fork_child(request_for(), target=lambda: (1,), status=False, seal=None)

    assert child.exit_code == EXIT_HARNESS_ERROR
    lines = child.stderr.splitlines()
    problem = (
        "the value returned by the target has type tuple, which is not JSON plain data "
        f"({_child.PLAIN_TYPES})"
    )
    assert lines[0] == f"devmem-death: harness error in the child: {problem}"
    assert lines[1] == (
        "devmem-death: harness_error " + json.dumps({"message": problem, "traceback": ""})
    )


def test_a_seal_that_cannot_be_mapped_is_left_out():
    child = fork_child(request_for(), target=lambda: 2, seal=(-1, 0))
    assert child.records[-1] == {"event": "returned", "value": 2}
    bad = fork_child(request_for(), target=lambda: 2, seal="not a pair")
    assert bad.records[-1] == {"event": "returned", "value": 2}


def test_a_main_target_of_the_running_main_module_is_not_loaded_again(tmp_path):
    script = _write_module(tmp_path, "script", "def answer():\n    return 'loaded again'\n")

    def before():
        main = types.ModuleType("__main__")
        main.__file__ = script
        main.answer = lambda: "the running one"
        sys.modules["__main__"] = main

    child = fork_child(request_for("__main__:answer", main_path=script), before=before)
    assert child.records[-1] == {"event": "returned", "value": "the running one"}


def test_a_key_s_repr_is_cut_to_60_characters():
    assert plain_problem({10**59: 1}, "v") == (
        f"v has a key {10**59} of type int; keys must be str"  # 60 characters: whole
    )
    assert plain_problem({10**60: 1}, "v") == (
        f"v has a key {str(10**60)[:55]}[...] of type int; keys must be str"
    )


def test_a_main_path_is_for_main_targets_only(tmp_path):
    script = _write_module(tmp_path, "script", "raise SystemExit('the script ran')\n")

    child = fork_child(request_for("os.path:join", args=["a", "b"], main_path=script))
    assert child.records[-1] == {"event": "returned", "value": os.path.join("a", "b")}


def test_a_main_module_without_a_file_is_replaced_by_the_script(tmp_path):
    script = _write_module(tmp_path, "script", "def answer():\n    return 'the script'\n")

    def before():
        sys.modules["__main__"] = types.ModuleType("__main__")  # python -c: no __file__

    child = fork_child(request_for("__main__:answer", main_path=script), before=before)
    assert child.records[-1] == {"event": "returned", "value": "the script"}


def test_a_qualname_is_everything_after_the_first_colon():
    child = fork_child(request_for("os:path:join"))

    assert child.exit_code == EXIT_HARNESS_ERROR
    assert child.records[-1]["message"] == (
        "could not import the target 'os:path:join' in the child: AttributeError: module 'os' "
        "has no attribute 'path:join'"
    )


def test_a_raise_s_traceback_is_python_s_own_text():
    def target():
        raise KeyError("gone")

    child = fork_child(request_for(), target=target)

    lines = child.records[-1]["traceback"].splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[1].startswith('  File "') and lines[1].endswith(", in target")
    assert lines[-1] == "KeyError: 'gone'"


def test_a_traceback_that_cannot_be_formatted_is_replaced_by_a_line_saying_so():
    def before():
        def refuse(*args, **kwargs):
            raise RuntimeError("cannot format")

        traceback.format_exception = refuse

    def target():
        raise KeyError("gone")

    child = fork_child(request_for(), target=target, before=before)

    expected = (
        "KeyError: 'gone'\n(its traceback could not be formatted: RuntimeError: cannot format)\n"
    )
    assert child.exit_code == 1
    assert child.records[-1]["traceback"] == expected
    assert child.stderr == expected


def test_an_exception_whose_str_leaves_the_interpreter_is_a_harness_error():
    class Leaving(Exception):
        def __str__(self):
            raise SystemExit("no str")

    def target():
        raise Leaving

    child = fork_child(request_for(), target=target)

    assert child.exit_code == EXIT_HARNESS_ERROR
    assert child.events == ["started", "harness_error"]
    assert child.records[-1]["message"] == (
        "reporting the exception the target raised failed: SystemExit: no str"
    )


@STREAMS_MADE
def test_the_child_s_std_streams_are_over_0_1_2_and_never_close_them(where):
    def target():
        numbers = [stream.fileno() for stream in (sys.stdin, sys.stdout, sys.stderr)]
        # the target drops the harness's stream objects: the descriptors stay open
        sys.stdin = sys.__stdin__ = sys.stdout = sys.__stdout__ = io.StringIO()
        sys.stderr = sys.__stderr__ = io.StringIO()
        gc.collect()
        os.write(1, b"fd 1 open")
        os.write(2, b"fd 2 open")
        return [numbers, os.read(0, 10).decode()]

    child = fork_child(request_for(), target=target, before=_streams_made(where))

    assert child.records[-1] == {"event": "returned", "value": [[0, 1, 2], ""]}
    assert (child.stdout, child.stderr) == ("fd 1 open", "fd 2 open")


def test_output_is_utf_8_whatever_the_locale():
    def before():
        _child._streams = None  # made in the child, under its locale
        locale.setlocale(locale.LC_CTYPE, "C")

    def target():
        sys.stdout.write("é")

    child = fork_child(request_for(), target=target, before=before)

    assert child.stdout == "é"


class Outer:
    class NestedError(Exception):
        """Named by its qualified name."""


def test_a_class_of_mp_main_is_named_as_main_only_where_main_is_that_module(monkeypatch):
    # a forkserver or exec child loads the parent's script as __mp_main__ and makes it
    # __main__ too: its classes are named as the parent names them; anywhere else the module's
    # own name stands
    script = types.ModuleType(_child.MP_MAIN)
    of_script = type("MyError", (Exception,), {"__module__": _child.MP_MAIN})
    of_package = type("MyError", (Exception,), {"__module__": "pkg.mod"})
    monkeypatch.delitem(sys.modules, _child.MP_MAIN, raising=False)
    assert _child.type_name(of_script) == "__mp_main__.MyError"  # no __mp_main__ loaded
    monkeypatch.setitem(sys.modules, _child.MP_MAIN, script)
    assert _child.type_name(of_script) == "__mp_main__.MyError"  # __main__ is another module
    monkeypatch.setitem(sys.modules, "__main__", script)
    assert _child.type_name(of_script) == "__main__.MyError"
    assert _child.type_name(of_package) == "pkg.mod.MyError"
    assert _child.type_name(ValueError) == "ValueError"


def test_a_nested_exception_class_is_named_by_its_qualified_name():
    def target():
        raise Outer.NestedError("inner")

    child = fork_child(request_for(), target=target)

    assert child.records[-1]["type"] == f"{__name__}.Outer.NestedError"


def test_warning_filters_that_fail_once_the_target_is_imported_are_a_harness_error(monkeypatch):
    # a filter's category not found at set-up is looked for again once the target's module is
    # imported (it may be defined there); that second look failing ends the child as set-up
    # failures do, named, with its traceback
    looks = []

    def filters(warnings: list) -> tuple[list[str], bool]:
        looks.append(warnings)
        if len(looks) == 1:
            return [], False  # a category not found yet
        raise RuntimeError("the filters broke")

    monkeypatch.setattr(_child, "_apply_warning_filters", filters)
    child = fork_child(request_for(state={"warnings": []}), target=lambda: 1)

    assert child.exit_code == EXIT_HARNESS_ERROR
    assert child.events == ["started", "harness_error"]
    message = child.records[-1]["message"]
    assert message == "could not set up the child: RuntimeError: the filters broke"
    assert child.records[-1]["traceback"].startswith("Traceback (most recent call last):")
    assert child.records[-1]["traceback"].endswith("RuntimeError: the filters broke\n")
    assert child.stderr.startswith(f"devmem-death: harness error in the child: {message}\n")


def test_a_set_up_failure_before_the_streams_are_moved_is_echoed_only_onto_the_child_s_own():
    def before():
        os.setsid()  # a session leader cannot make a process group: set-up fails

    # exec style: 1 and 2 are the capture pipes already, so the error is echoed there
    own = fork_child(request_for(), target=lambda: 1, before=before, given=False)
    assert own.exit_code == EXIT_HARNESS_ERROR
    message = own.records[0]["message"]
    assert message.startswith("could not set up the child: PermissionError: ")
    assert own.stderr.startswith(f"devmem-death: harness error in the child: {message}\n")

    # fork style: 2 is still the parent's stderr then, which must get nothing
    with tempfile.TemporaryFile() as inherited:

        def before_with_parent_stderr():
            os.dup2(inherited.fileno(), 2)
            sys.stderr = _stderr_over_2()
            before()

        forked = fork_child(request_for(), target=lambda: 1, before=before_with_parent_stderr)
        assert forked.records[0]["message"] == message
        assert (forked.stderr, os.pread(inherited.fileno(), 100, 0)) == ("", b"")


def test_a_harness_error_s_traceback_is_python_s_text_or_nothing():
    child = fork_child(request_for(cwd="/devmem/t/no/such/dir"), target=lambda: 1)
    lines = child.records[0]["traceback"].splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[1].startswith('  File "')
    assert lines[-1].startswith("FileNotFoundError: ")

    def before():
        def refuse(*args, **kwargs):
            raise RuntimeError("cannot format")

        traceback.format_exception = refuse

    unformatted = fork_child(
        request_for(cwd="/devmem/t/no/such/dir"), target=lambda: 1, before=before
    )
    record = unformatted.records[0]
    assert (record["event"], record["traceback"]) == ("harness_error", "")
    assert unformatted.stderr == f"devmem-death: harness error in the child: {record['message']}\n"


def test_a_child_that_is_its_own_root_reaps_the_zygote_it_started_before_it_leaves():
    from harness import _forkserver

    def target():
        # as in an exec'd child, which imports the harness afresh: the root is this process
        _forkserver.ROOT = (os.getpid(), start_ticks(os.getpid()))
        harness.run_child(_targets.give_back, style="forkserver", timeout=30).assert_clean()
        return [connection.pid for connection in _forkserver._connections.values()]

    child = fork_child(request_for(), target=target)

    zygotes = child.records[-1]["value"]
    assert len(zygotes) == 1
    try:
        assert _procs._stat(zygotes[0]) is None  # gone and reaped before the child ended
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(zygotes[0], signal.SIGKILL)


def test_a_child_without_the_forkserver_module_leaves_as_usual():
    def before():  # an exec'd child whose target never imported the harness
        sys.modules.pop("harness._forkserver")

    child = fork_child(request_for(), target=lambda: "done", before=before)

    assert (child.exit_code, child.records[-1]) == (0, {"event": "returned", "value": "done"})


@pytest.mark.parametrize(("then", "status"), [("return", 0), ("raise", 1), ("exit", 5)])
def test_a_copy_the_target_forks_exits_as_a_plain_interpreter_would(then, status):
    def target():
        pid = os.fork()
        if pid == 0:  # the copy, with the harness's frames below it
            if then == "raise":
                raise ValueError("in the copy")
            if then == "exit":
                sys.exit(5)
            return "from the copy"
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    child = fork_child(request_for(), target=target)

    assert child.records == [
        {"event": "started", "pid": child.records[0]["pid"]},
        {"event": "returned", "value": status},
    ]


# -- what is prepared, and written, without the json module's encoder -----------------------


def test_plain_records_are_written_without_the_json_module_s_encoder(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("json.dumps called for a plain record")

    monkeypatch.setattr(_child.json, "dumps", refuse)
    fields = {"event": "returned", "a": None, "b": True, "c": False, "d": -7, "e": "s\u2028"}
    fields["f"] = [None, True, False, 3, "x"]
    assert _child.encode_record(fields) == (
        '{"event": "returned", "a": null, "b": true, "c": false, "d": -7, "e": "s\\u2028", '
        '"f": [null, true, false, 3, "x"]}'
    )


def test_other_values_are_written_as_json_dumps_with_repr_writes_them():
    for fields in ({"v": {3}}, {"v": [1, (2,)]}, {"v": 1.5, "w": {"k": None}}):
        assert _child.encode_record(fields) == json.dumps(fields, default=repr)


def test_prepare_makes_the_std_streams_a_forked_child_takes():
    def target():
        _child._streams = None
        _child.prepare()
        made = _child._streams
        return [type(made).__name__, [stream.fileno() for stream in made]]

    child = fork_child(request_for(), target=target)
    assert child.records[-1]["value"] == ["tuple", [0, 1, 2]]


def test_a_process_without_stdin_prepares_no_streams_and_its_children_make_their_own():
    def before():
        _child._streams = None
        os.close(0)
        _child.prepare()
        assert _child._streams is None  # FileIO(0) failed: each child makes its own

    child = fork_child(request_for(), target=lambda: sys.stdin.fileno(), before=before)

    assert child.records[-1] == {"event": "returned", "value": 0}


def test_a_child_whose_streams_are_in_place_already_keeps_them():
    def target():
        print("out")
        sys.stderr.write("err")
        return [sys.stdin.read(), os.path.samefile("/proc/self/fd/0", os.devnull)]

    def before():  # stdin something else than /dev/null: a pipe
        read_end, _ = os.pipe()
        os.dup2(read_end, 0)

    child = fork_child(request_for(), target=target, given=False, before=before)  # as exec'd

    assert child.records[-1] == {"event": "returned", "value": ["", True]}
    assert (child.stdout, child.stderr) == ("out\n", "err")


def test_without_a_parent_to_die_with_the_child_makes_its_streams_itself():
    def before():
        _child._streams = None  # nothing prepared: die_with_parent (which prepares) never runs

    def target():
        print("out")
        return [stream.fileno() for stream in (sys.stdin, sys.stdout, sys.stderr)]

    child = fork_child(request_for(), target=target, before=before, parent=False)

    assert child.records[-1] == {"event": "returned", "value": [0, 1, 2]}
    assert child.stdout == "out\n"
