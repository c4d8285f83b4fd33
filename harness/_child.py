"""The child side of a death test: set the process up, run the target, report, leave.

This module runs inside every death-test child, in all three styles. It must stay standalone:
standard library only, no import of the rest of :mod:`harness`, and certainly not pytest. The
exec runner and the forkserver zygote load it by file path (like xdist's ``remote.py``, it does
not need the package to be importable), so a child starts fast and drags nothing in.

Order of operations in :func:`run_child` (each step relies on the ones before it):

1. own process group, killed when the parent dies (Linux), core dumps off, signal handlers and
   mask reset to what a fresh interpreter has;
2. stdin from ``/dev/null``, stdout and stderr onto the parent's capture files (file-descriptor
   level), fresh ``sys.stdout``/``sys.stderr`` over them;
3. ``faulthandler`` on the child's own stderr, also on :data:`DUMP_SIGNAL`, which the parent
   sends shortly before its deadline to get every thread's Python stack (no watchdog thread:
   the harness adds no thread to the child);
4. the environment, ``sys.path`` and working directory of the request (before the target's
   module is imported, so module-level reads see them), with ``DEVMEM_DEATH_CHILD=1``;
5. a ``started`` record; import and call the target; one final record; ``os._exit``.

Status channel: one JSON object per line on ``status_fd``; the ``event`` key names it:

- ``{"event": "started", "pid": int}``: the child is set up and about to import the target.
- ``{"event": "returned", "value": <plain data>}``: the target returned; exit status 0.
- ``{"event": "raised", "type", "message", "traceback"}``: the target raised; exit status 1.
- ``{"event": "exit", "code": int}``: the target raised ``SystemExit``; exit status ``code``.
- ``{"event": "harness_error", "message", "traceback"}``: the harness failed in the child
  (bad request, target module failed to import, returned value not plain data).

The parent decodes these in ``harness._protocol``; the two must agree.
"""

from __future__ import annotations

import faulthandler
import importlib
import io
import json
import os
import signal
import sys
import traceback

try:
    import resource
except ImportError:  # not on every platform
    resource = None  # type: ignore[assignment]

ENV_FLAG = "DEVMEM_DEATH_CHILD"
"""Environment variable set to ``1`` inside every death-test child."""

DUMP_SIGNAL = signal.SIGUSR2
"""The signal on which a child dumps its Python stacks into its stderr (sent by the parent)."""

EXIT_RAISED = 1
"""Exit status of a child whose target raised (what CPython uses for an uncaught exception)."""

EXIT_HARNESS_ERROR = 121
"""Exit status of a child that could not run its target; the status record says why."""

PLAIN_TYPES = "None, bool, int, float, str, list, dict with str keys"

_PR_SET_PDEATHSIG = 1
_prctl = None  # libc's prctl, loaded by prepare() (in the parent, so a forked child need not)
_keep_alive: list[object] = []  # the parent's stream objects: never let them flush into our files


def prepare() -> None:
    """Load what a child needs from libc. Call once in the process that forks the children."""
    global _prctl
    if _prctl is not None or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        _prctl = False


def read_all(fd: int) -> bytes:
    """All the bytes of the file open on ``fd``, read with ``pread`` from offset 0.

    The descriptor's own offset is neither used nor moved, and ``fd`` stays open. Raises
    OSError as ``os.pread`` does (a bad descriptor, one not open for reading).
    """
    chunks: list[bytes] = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def plain_problem(value: object, where: str) -> str | None:
    """Say why ``value`` is not JSON plain data, or return None if it is.

    Plain data is None, bool, int, float, str, and lists and dicts (with str keys) of plain
    data, by exact type: tuples, subclasses and NumPy scalars are refused so that a value comes
    back from the child exactly as it went in. ``where`` names the value in the message.
    """
    found = _find_problem(value, set())
    if found is None:
        return None
    path, message = found
    return f"{where}{''.join(reversed(path))} {message}"


def _find_problem(value: object, path_ids: set[int]) -> tuple[list[str], str] | None:
    """(path to the bad part, innermost last-appended; what is wrong), or None."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return None
    if kind is not list and kind is not dict:
        return [], f"has type {_type_name(kind)}, which is not JSON plain data ({PLAIN_TYPES})"
    if id(value) in path_ids:
        return [], "contains itself (a reference cycle)"
    path_ids.add(id(value))
    try:
        if kind is list:
            for index, item in enumerate(value):  # type: ignore[arg-type]
                found = _find_problem(item, path_ids)
                if found is not None:
                    found[0].append(f"[{index}]")
                    return found
            return None
        for key, item in value.items():  # type: ignore[union-attr]
            if type(key) is not str:
                return [], f"has a key {key!r} of type {_type_name(type(key))}; keys must be str"
            found = _find_problem(item, path_ids)
            if found is not None:
                found[0].append(f"[{key!r}]")
                return found
        return None
    finally:
        path_ids.discard(id(value))


def _type_name(kind: type) -> str:
    module = getattr(kind, "__module__", "builtins")
    name = getattr(kind, "__qualname__", kind.__name__)
    return name if module == "builtins" else f"{module}.{name}"


class _Status:
    """Writes status records to the parent's channel (or, for a repro run, a line to stderr)."""

    def __init__(self, fd: int | None, *, echo: bool) -> None:
        self.fd = fd
        self.echo = echo  # may harness errors go to sys.stderr (is it ours yet)?

    def emit(self, event: str, **fields: object) -> None:
        if self.fd is None:
            if event not in ("started", "raised"):  # a raise already printed its traceback
                detail = json.dumps(fields, default=repr)
                print(f"devmem-death: {event} {detail}", file=sys.stderr, flush=True)
            return
        data = (json.dumps({"event": event, **fields}, default=repr) + "\n").encode()
        try:
            while data:
                data = data[os.write(self.fd, data) :]
        except OSError:  # the target closed the channel: the exit status must do
            pass

    def harness_error(self, message: str, exc: BaseException | None = None) -> None:
        text = "".join(traceback.format_exception(exc)) if exc is not None else ""
        if self.echo:
            try:
                sys.stderr.write(f"devmem-death: harness error in the child: {message}\n{text}")
                sys.stderr.flush()
            except Exception:
                pass
        self.emit("harness_error", message=message, traceback=text)


def run_child(
    request: dict,
    *,
    stdout_fd: int | None,
    stderr_fd: int | None,
    status_fd: int | None,
    parent_pid: int | None,
    new_group: bool = True,
    target: object = None,
):
    """Run one death-test child in this (freshly forked or exec'd) process. Never returns.

    Args:
      request: the decoded request: ``target`` ("module:qualname"), ``args`` (list),
        ``environ`` (the child's whole environment, or None to keep this one), ``env``
        (overrides applied after it; None unsets), ``sys_path``, ``cwd``, ``main_path`` (file
        to load as ``__main__`` for a ``__main__:`` target, or None) and
        ``invalidate_caches`` (refresh the import system's directory caches, for a long-lived
        zygote).
      stdout_fd, stderr_fd: descriptors to move onto 1 and 2; None leaves 1 and 2 as they are.
      status_fd: descriptor of the status channel; None (a repro run) reports on stderr.
      parent_pid: the pid this child must die with; None skips the parent-death setup.
      new_group: put the child in its own process group (False when already done by exec).
      target: the callable itself (fork style), instead of importing ``request["target"]``.
    """
    status = _Status(status_fd, echo=stderr_fd is None)
    try:
        _isolate(parent_pid, new_group)
        _redirect(stdout_fd, stderr_fd)
        status.echo = True
        _arm_faulthandler()
        _apply_request(request)
        status.emit("started", pid=os.getpid())
    except BaseException as exc:
        status.harness_error(f"could not set up the child: {type(exc).__name__}: {exc}", exc)
        _leave(EXIT_HARNESS_ERROR)

    spec = request.get("target", "?")
    if target is None:
        try:
            target = _resolve(spec, request.get("main_path"))
        except BaseException as exc:
            status.harness_error(
                f"could not import the target {spec!r} in the child: {type(exc).__name__}: {exc}",
                exc,
            )
            _leave(EXIT_HARNESS_ERROR)

    try:
        value = target(*request.get("args", ()))  # type: ignore[operator]
    except SystemExit as exc:
        code = _system_exit_code(exc)
        status.emit("exit", code=code)
        _leave(code)
    except BaseException as exc:
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        text = "".join(traceback.format_exception(type(exc), exc, tb))  # without our frame
        try:
            sys.stderr.write(text)
        except Exception:
            pass
        status.emit(
            "raised",
            type=_type_name(type(exc)),
            message=_safe_str(exc),
            traceback=text,
        )
        _leave(EXIT_RAISED)

    problem = plain_problem(value, "the value returned by the target")
    if problem:
        status.harness_error(problem)
        _leave(EXIT_HARNESS_ERROR)
    status.emit("returned", value=value)
    _leave(0)


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when ``parent_pid`` (its parent) dies (Linux).

    Exits at once if the parent is already gone (it died before the request took effect).
    """
    prepare()
    if _prctl:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(EXIT_HARNESS_ERROR)


def _isolate(parent_pid: int | None, new_group: bool) -> None:
    if new_group:
        os.setpgid(0, 0)
    if parent_pid is not None:
        die_with_parent(parent_pid)
    if resource is not None:
        try:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        except (ValueError, OSError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for name in ("SIGHUP", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGCHLD"):
        signum = getattr(signal, name, None)
        if signum is not None:
            signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)


def _redirect(stdout_fd: int | None, stderr_fd: int | None) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for fd, target_fd in ((stdout_fd, 1), (stderr_fd, 2)):
        if fd is not None and fd != target_fd:
            os.dup2(fd, target_fd)
            os.close(fd)
    _keep_alive.extend((sys.stdin, sys.stdout, sys.stderr))
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = sys.__stdout__ = _text_stream(1, write_through=False)
    sys.stderr = sys.__stderr__ = _text_stream(2, write_through=True)


def _text_stream(fd: int, *, write_through: bool) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        io.FileIO(fd, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
        write_through=write_through,
    )


def _arm_faulthandler() -> None:
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(DUMP_SIGNAL, file=sys.stderr, all_threads=True, chain=False)


def _apply_request(request: dict) -> None:
    environ = request.get("environ")
    if environ is not None:
        for name in [name for name in os.environ if name not in environ]:
            del os.environ[name]
        for name, value in environ.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
    for name, value in (request.get("env") or {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    os.environ[ENV_FLAG] = "1"
    if request.get("sys_path") is not None:
        sys.path[:] = request["sys_path"]
    if request.get("cwd"):
        os.chdir(request["cwd"])
    if request.get("invalidate_caches"):
        importlib.invalidate_caches()


def _resolve(spec: str, main_path: str | None) -> object:
    module_name, sep, qualname = spec.partition(":")
    if not sep or not module_name or not qualname:
        raise ValueError(f"target must be 'module:qualname', got {spec!r}")
    main = sys.modules.get("__main__")
    if module_name == "__main__" and main_path and getattr(main, "__file__", None) != main_path:
        module = _load_main(main_path)  # a fresh interpreter: its __main__ is our runner
    else:
        module = importlib.import_module(module_name)
    obj: object = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _load_main(path: str) -> object:
    """Load the parent's ``__main__`` script as ``__mp_main__`` (what multiprocessing does)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("__mp_main__", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the parent's __main__ from {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["__mp_main__"] = sys.modules["__main__"] = module
    spec.loader.exec_module(module)
    return module


def _system_exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:
        pass
    return 1


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"<unprintable {type(exc).__name__}>"


def _leave(code: int):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)
