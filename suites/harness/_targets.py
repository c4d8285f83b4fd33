"""Targets for the harness self-tests: run in death-test children, so no pytest import here."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time


def abort_with(message: str) -> None:
    """Write ``message`` to stderr, then abort (SIGABRT)."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    os.abort()


def segfault() -> None:
    """Read address 0: SIGSEGV."""
    sys.stderr.write("about to read address 0\n")
    ctypes.string_at(0)


def exit_with(code: int) -> None:
    """Leave through ``os._exit(code)``: no status record, just the exit status."""
    print("exiting", code, flush=True)
    os._exit(code)


def system_exit(code: int) -> None:
    """Raise ``SystemExit(code)`` (``sys.exit``)."""
    sys.exit(code)


def give_back(*args: object) -> dict:
    """Return the arguments, the pid and the death-child flag; print a line to stdout."""
    print("giving back", len(args))
    return {"args": list(args), "pid": os.getpid(), "flag": os.environ.get("DEVMEM_DEATH_CHILD")}


class TargetError(Exception):
    """An exception type that is not a builtin."""


def raise_error(message: str) -> None:
    """Raise :class:`TargetError` from a nested call."""
    _deeper(message)


def _deeper(message: str) -> None:
    raise TargetError(message)


def return_tuple() -> tuple:
    """Return a tuple: not JSON plain data."""
    return (1, 2)


def return_object() -> object:
    """Return an arbitrary object: not JSON plain data."""
    return threading.Lock()


def lives() -> None:
    """Say so on stderr and return normally."""
    print("still alive", file=sys.stderr)


def hang_forever() -> None:
    """Sleep forever in small steps (the stack dump names this function)."""
    while True:
        time.sleep(0.05)


def hang_with_grandchild() -> None:
    """Fork a grandchild that sleeps, print its pid, then hang."""
    print(_spawn_sleeper(), flush=True)
    hang_forever()


def leave_grandchild() -> int:
    """Fork a grandchild that sleeps, and return its pid at once."""
    return _spawn_sleeper()


def _spawn_sleeper() -> int:
    pid = os.fork()
    if pid == 0:
        try:
            time.sleep(60)
        finally:
            os._exit(0)
    return pid


def kill_parent_and_hang() -> None:
    """SIGKILL this child's parent (in forkserver style: the zygote), then hang."""
    os.kill(os.getppid(), signal.SIGKILL)
    hang_forever()


def ignore_sigterm_and_hang() -> None:
    """Ignore SIGTERM, so only SIGKILL ends this child."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    hang_forever()


def write_lots(stream: str, megabytes: int, last_line: str) -> None:
    """Write ``megabytes`` MiB of numbered lines to ``stream`` ("stdout" or "stderr"), then
    ``last_line``."""
    fd = 1 if stream == "stdout" else 2
    block = b"".join(b"line %06d of filler text, 40 bytes\n" % i for i in range(1024 * 32))
    block = block[: 1 << 20]
    for _ in range(megabytes):
        os.write(fd, block)
    os.write(fd, last_line.encode() + b"\n")


SET_UP = {
    "core_limit": [0, 0],
    "sigint": True,
    "sigpipe": True,
    "sigterm": True,
    "sighup": True,
    "blocked": [],
    "faulthandler": True,
    "dump_signal_caught": True,
}
"""What :func:`hygiene` reports of a child's process state set up as documented: no core
files, SIGINT Python's own handler, SIGPIPE ignored, SIGTERM and SIGHUP at their default
action, no signal blocked, ``faulthandler`` on, and the stack-dump signal caught."""


def set_up_of(seen: dict) -> dict:
    """The entries of :data:`SET_UP` in ``seen`` (what :func:`hygiene` returned)."""
    return {key: seen[key] for key in SET_UP}


def hygiene() -> dict:
    """Report how the harness set this child up."""
    import faulthandler
    import resource
    import signal

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    deathsig = ctypes.c_int(0)
    prctl(2, ctypes.byref(deathsig), 0, 0, 0)  # PR_GET_PDEATHSIG
    with open("/proc/self/status") as status:  # the signals the kernel says it catches
        caught = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
    return {
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "core_limit": list(resource.getrlimit(resource.RLIMIT_CORE)),
        "stdin": os.path.realpath(f"/proc/self/fd/{sys.stdin.fileno()}"),
        "deathsig": deathsig.value,
        "flag": os.environ.get("DEVMEM_DEATH_CHILD"),
        "pytest_imported": "pytest" in sys.modules,
        "harness_imported": "harness" in sys.modules,
        "modules": sorted(name for name in ("colorsys", "numpy") if name in sys.modules),
        "cwd": os.getcwd(),
        "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
        "sigpipe": signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN,
        "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
        "sighup": signal.getsignal(signal.SIGHUP) == signal.SIG_DFL,
        "blocked": sorted(int(signum) for signum in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "faulthandler": faulthandler.is_enabled(),
        # harness._child.DUMP_SIGNAL, by its number: this module never imports the harness
        "dump_signal_caught": bool(caught >> (int(signal.SIGUSR2) - 1) & 1),
    }


def open_descriptors() -> dict[str, str]:
    """The descriptors open in this child, each with what it is open on (``/proc/self/fd``)."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[name] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own, closed by now
            pass
    return found


def env_values(*names: str) -> list:
    """The values of ``names`` in this child's environment (None when unset)."""
    return [os.environ.get(name) for name in names]


def import_numpy() -> str:
    """Import NumPy and return its version."""
    import numpy

    return str(numpy.__version__)


def auto_styles() -> dict:
    """Which style ``auto`` picks here: alone, with another thread, after mark_fork_unsafe.

    Run it in a fresh interpreter (exec style): it calls the harness from inside a child.
    """
    import harness
    from suites.harness import _targets

    alone = harness.run_child(_targets.give_back, timeout=30).style
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        threaded = harness.run_child(_targets.give_back, timeout=30).style
    finally:
        stop.set()
        thread.join()
    harness.mark_fork_unsafe("test: pretend CUDA is initialized")
    marked = harness.run_child(_targets.give_back, timeout=30).style
    try:
        harness.run_child(_targets.give_back, style="fork")
        refused = None
    except harness.HarnessError as exc:
        refused = str(exc)
    return {
        "alone": alone,
        "threaded": threaded,
        "marked": marked,
        "refused": refused,
        "reason": harness.fork_unsafe_reason(),
    }


def checked_styles() -> dict:
    """Which style ``auto`` picks once a fork-safety check says no, and what fork's refusal says.

    Run it in a fresh interpreter (exec style): it registers a check for the whole process.
    """
    import harness
    from suites.harness import _targets

    state = {"unsafe": None}
    harness.add_fork_safety_check(lambda: state["unsafe"])
    before = harness.run_child(_targets.give_back, timeout=30).style
    state["unsafe"] = "test: a library initialized CUDA"
    after = harness.run_child(_targets.give_back, timeout=30).style
    try:
        harness.run_child(_targets.give_back, style="fork")
        refused = None
    except harness.HarnessError as exc:
        refused = str(exc)
    state["unsafe"] = 42  # a broken check is reported, naming it
    try:
        harness.fork_unsafe_reason()
        broken = None
    except harness.HarnessError as exc:
        broken = str(exc)
    return {"before": before, "after": after, "refused": refused, "broken": broken}


def parent_pid() -> int:
    """This child's parent: the test process (fork, exec) or the zygote (forkserver)."""
    return os.getppid()


def reset_dump_signal_and_hang() -> None:
    """Give SIGUSR2 (the stack-dump signal) its default action, which kills, then hang."""
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    hang_forever()


def abort_on_dump_signal_and_hang() -> None:
    """Abort (SIGABRT) when SIGUSR2 comes, then hang: a timeout must not pass as an abort."""
    signal.signal(signal.SIGUSR2, lambda *_: os.abort())
    hang_forever()


def typo() -> object:
    """Return a name that does not exist: NameError, a bug in Python, not a death."""
    return undefined_name  # type: ignore[name-defined]  # noqa: F821


class ArenaError(RuntimeError):
    """Stands in for the allocator's UseAfterFreeError (``DEVMEM_ARENA_DEBUG=raise``)."""


def raise_use_after_free() -> None:
    """Raise with the detector's line, as the allocator does in ``raise`` mode."""
    raise ArenaError("use-after-arena-free: buffer_add lhs was reclaimed by arena_exit at depth 0")


def limit_file_size_and_return() -> int:
    """Set RLIMIT_FSIZE to 0 (no file may grow), then return 42."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
    return 42


def close_descriptors_and_return() -> int:
    """Close descriptors 3 to 4095, then return 42."""
    os.closerange(3, 4096)
    return 42


def reuse_descriptors_and_return() -> int:
    """Close descriptors 3 to 4095 and open /dev/null into the freed numbers, then return 42:
    the status channel's number now names a file that swallows whatever is written to it."""
    os.closerange(3, 4096)
    for _ in range(32):
        os.open(os.devnull, os.O_WRONLY)
    return 42


def flood(pid_file: str, megabytes: int) -> None:
    """Write this child's pid to ``pid_file``, then ``megabytes`` MiB to stdout, and a last
    line."""
    with open(pid_file, "w") as out:
        out.write(str(os.getpid()))
    write_lots("stdout", megabytes, "THE LAST LINE")


def spawn_sleepers_and_hang(pid_file: str, count: int) -> None:
    """Start ``count`` ``sleep`` grandchildren, write this child's pid, its parent's and theirs
    to ``pid_file`` (as JSON), then hang."""
    import json
    import subprocess

    sleepers = [subprocess.Popen(["sleep", "600"]).pid for _ in range(count)]
    with open(pid_file + ".tmp", "w") as out:
        json.dump({"child": os.getpid(), "parent": os.getppid(), "sleepers": sleepers}, out)
    os.rename(pid_file + ".tmp", pid_file)
    hang_forever()


def entry_modules() -> list[str]:
    """The module names (``__name__``) of the frames below the target that run
    ``harness/_child.py``, nearest first."""
    names = []
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(os.sep + os.path.join("harness", "_child.py")):
            names.append(frame.f_globals["__name__"])
        frame = frame.f_back
    return names


def interpreter_flags() -> dict:
    """What the interpreter was started with: dev mode, warning options."""
    return {"dev_mode": sys.flags.dev_mode, "warnoptions": list(sys.warnoptions)}


def fork_copy_raises(then: str) -> None:
    """Fork a copy of this process in which the exception escapes (as a target's own worker
    process might); wait for the copy, then ``then``: ``"return"`` or ``"abort"``."""
    pid = os.fork()
    if pid == 0:
        raise ValueError("raised in the target's own forked copy")
    os.waitpid(pid, 0)
    if then == "abort":
        abort_with("CHECK failed: the real child aborts")


def fork_copy_returns(then: str) -> str:
    """Fork a copy of this process that returns from the target; wait for it, then ``then``:
    ``"raise"`` or ``"return"``."""
    pid = os.fork()
    if pid == 0:
        return "returned by the copy"
    os.waitpid(pid, 0)
    if then == "raise":
        raise KeyError("raised by the real child")
    return "returned by the real child"


def fork_copy_exits(code: int) -> None:
    """Fork a copy of this process that raises SystemExit(code); wait for it, return."""
    pid = os.fork()
    if pid == 0:
        sys.exit(code)
    _, status = os.waitpid(pid, 0)
    print("copy exit status", os.waitstatus_to_exitcode(status), file=sys.stderr, flush=True)


def deep_list(depth: int) -> list:
    """A list nested ``depth`` deep: ``[[[...]]]``."""
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def return_huge_int() -> int:
    """Return 10**5000: too many digits for JSON (CPython converts at most 4300)."""
    return 10**5000


def return_deep_list(depth: int) -> list:
    """Return a list nested ``depth`` deep."""
    return deep_list(depth)


def return_unencodable_key() -> dict:
    """Return a dict whose key's repr cannot be made (an int of 5001 digits)."""
    return {10**5000: 1}


def write_z_and_exit(megabytes: int) -> None:
    """Write ``megabytes`` MiB of ``z`` (no digit, no ``MiB``) to stderr, then exit with 3."""
    block = b"z" * (1 << 20)
    for _ in range(megabytes):
        os.write(2, block)
    os._exit(3)


def straddle_the_cut_and_exit(head: int, tail: int) -> None:
    """Write stderr so that the harness's cut falls between ``A`` and ``B``: ``head - 1``
    bytes and ``A``, 512 KiB of ``-``, then ``B`` and ``tail - 1`` bytes; then exit with 3."""
    os.write(2, b"." * (head - 1) + b"A")
    os.write(2, b"-" * (1 << 19))
    os.write(2, b"B" + b"." * (tail - 1))
    os._exit(3)


def exit_with_a_typo(code: int) -> None:
    """Mean ``sys.exit(code)`` but write ``sys.exti``: AttributeError, not an exit."""
    print("leaving with", code, file=sys.stderr, flush=True)
    sys.exti(code)  # type: ignore[attr-defined]


def import_probe(name: str) -> dict:
    """Import module ``name`` and say where it came from, and what sys.path and the
    environment say."""
    import importlib

    module = importlib.import_module(name)
    return {
        "file": module.__file__,
        "sys_path": list(sys.path),
        "PYTHONPATH": os.environ.get("PYTHONPATH"),
        "base_prefix": sys.base_prefix,
    }


def abort_with_length(text: str) -> None:
    """Say how long ``text`` is on stderr, then abort."""
    abort_with(f"got {len(text)} characters")


def kill_self_with(signum: int) -> None:
    """Send this process signal ``signum`` (its default action: terminate)."""
    os.kill(os.getpid(), signum)
    time.sleep(10)


def nested_fork_child() -> dict:
    """Print a line, then run a fork-style death test of its own that prints one: each line
    must come out once, in its own child's stdout."""
    import harness

    print("outer child", flush=True)
    inner = harness.run_child(give_back, 1, style="fork", timeout=30)
    return {"inner_stdout": inner.stdout, "inner_kind": inner.kind}


def collector_state() -> dict:
    """Whether the cyclic garbage collector is on while the target runs, and whether a
    collection finds a cycle made here."""
    import gc

    class Node:
        pass

    node = Node()
    node.self = node
    del node
    return {"enabled": gc.isenabled(), "collected": gc.collect() > 0}
