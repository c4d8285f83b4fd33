"""The child side of a death test: set the process up, run the target, report, leave.

This module runs inside every death-test child, in all three styles. It must stay standalone:
standard library only, no import of the rest of :mod:`harness`, and certainly not pytest. The
exec runner and the forkserver zygote load it by file path (like xdist's ``remote.py``, it does
not need the package to be importable), so a child starts fast and drags nothing in.

Order of operations in :func:`run_child` (each step relies on the ones before it):

0. the child's pid into its seal (see below), before anything else, so that the zygote, which
   guards the child, can find its process group from the first instant it could start another;
1. own process group, killed when the parent dies (Linux), core dumps off, signal handlers and
   mask reset to what a fresh interpreter has;
2. stdin from ``/dev/null``, stdout and stderr onto the parent's capture files (file-descriptor
   level), fresh ``sys.stdout``/``sys.stderr`` over them;
3. ``faulthandler`` on the child's own stderr, also on :data:`DUMP_SIGNAL`, which the parent
   sends once the deadline has passed to get every thread's Python stack (no watchdog thread:
   the harness adds no thread to the child);
4. the environment, ``sys.path`` and working directory of the request (before the target's
   module is imported, so module-level reads see them), with ``DEVMEM_DEATH_CHILD=1``;
5. a ``started`` record; import and call the target; one final record; ``os._exit``.

A forkserver child inherits steps 1 (but its group and death), 3 and 4 from its zygote, which
did them before the fork (``run_child(set_up_by_parent=True)``, see :func:`set_up_ahead`); a
spare (a child the zygote forked ahead of its request, see ``_zygote.py``) took its group and
its death signal when it was forked, and does step 0 first once it has taken a request.

Status channel: a file of records, one JSON object per line; the ``event`` key names it:

- ``{"event": "note", "message": str}``: a harness line for the outcome's notes (a part of the
  test process's state the child could not take, see :func:`apply_state`); before ``started``,
  but a warning filter's, which waits until the target is imported (its module may define
  the category).
- ``{"event": "started", "pid": int}``: the child is set up and about to import the target.
- ``{"event": "returned", "value": <plain data>}``: the target returned; exit status 0.
- ``{"event": "raised", "type", "bases", "message", "traceback"}``: the target raised; exit
  status 1. ``bases`` names the exception type's base classes, nearest first (not ``object``).
- ``{"event": "exit", "code": int}``: the target raised ``SystemExit``; exit status ``code``.
- ``{"event": "harness_error", "message", "traceback"}``: the harness failed in the child
  (bad request, target module failed to import, returned value not plain data).

The *seal* is the child's page (:data:`SEAL_BYTES`) of its parent's guard table (see
``harness._guard``), mapped into the child's memory before anything else happens. It holds the
child's pid (at offset 0, ASCII digits and a newline) and, at :data:`SEAL_FINAL_AT`, whether
the final record (``returned``, ``raised``, ``exit`` or ``harness_error``) was delivered:
``{"event": ..., "delivered": bool, "error": str|null}``, NUL-padded. It is written through
memory, so a target that closed the channel's descriptor, reused its number, or set
``RLIMIT_FSIZE`` to 0 cannot stop it: a status that could not be delivered is then known to the
parent, which reports a harness error instead of a silent None.

The parent decodes these in ``harness._protocol``; the two must agree.
"""

from __future__ import annotations

import _signal  # the signal module's C half: no enum conversions (a child's set-up is timed)
import faulthandler
import gc
import importlib
import importlib.util
import io
import json
import mmap
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

SEAL_BYTES = 4096
"""Size of a child's seal: one page of the guard table."""

SEAL_FINAL_AT = 64
"""Offset in the seal of the final-record verdict (the pid line comes before it)."""

SETTING_KEYS = ("environ", "env", "sys_path", "sys_path_after", "cwd", "invalidate_caches")
"""The parts of a request that set the process up (its environment, ``sys.path``, working
directory and import caches) rather than name the target. A forkserver request file holds
them apart, on its second line (see ``_zygote.py``): the zygote applies them before it forks,
and compares them to see whether a child it forked ahead fits the request."""

FINAL_EVENTS = ("returned", "raised", "exit", "harness_error")
"""Events that end a child's status: the seal says whether the one sent was delivered."""

STATE_RLIMITS = (
    "RLIMIT_AS",
    "RLIMIT_CPU",
    "RLIMIT_DATA",
    "RLIMIT_FSIZE",
    "RLIMIT_LOCKS",
    "RLIMIT_MEMLOCK",
    "RLIMIT_MSGQUEUE",
    "RLIMIT_NICE",
    "RLIMIT_NOFILE",
    "RLIMIT_NPROC",
    "RLIMIT_RSS",
    "RLIMIT_RTPRIO",
    "RLIMIT_RTTIME",
    "RLIMIT_SIGPENDING",
    "RLIMIT_STACK",
)
"""The resource limits a child takes from the test process's request (``request["state"]``,
see :func:`apply_state`): all but ``RLIMIT_CORE``, which is 0 in every child."""

NOT_IN_CHILD = ("pytest", "_pytest", "pluggy", "xdist", "execnet", "harness")
"""Top-level packages whose warning categories a child does not import to set a filter: the
harness never imports pytest, nor its own package, into a child (a filter on one of their
categories acts only in a process that imported them: the filter is set once the target's
module is imported, if that imported them, and such a child is told nothing of it)."""

_PR_SET_PDEATHSIG = 1
_prctl = None  # libc's prctl, loaded by prepare() (in the parent, so a forked child need not)
_streams: tuple | None = None  # stdin, stdout, stderr wrappers over 0, 1, 2, made by prepare()
_keep_alive: list[object] = []  # the parent's stream objects: never let them flush into our files


def prepare() -> None:
    """Load what a child needs from libc, and make its ``sys.std*`` objects (over descriptors
    0, 1, 2, never used here), so that a forked child need not: fewer of the parent's pages
    copied in each child. Call in the process that forks the children (again: no effect)."""
    global _prctl, _streams
    if _streams is None:  # made once here, used (unwritten, as new) by every forked child
        try:
            _streams = _make_streams()
        except (OSError, ValueError):  # a descriptor 0 to 2 closed here: each child makes them
            _streams = None
    if _prctl is not None or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        _prctl = ctypes.CDLL(None, use_errno=True).prctl
        _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        _prctl.restype = ctypes.c_int
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
    back from the child exactly as it went in. Lists and dicts nest at most
    :data:`MAX_NESTING` deep, and an int has at most :data:`MAX_INT_BITS` bits, so that both
    ends can encode and decode it (JSON's codecs recurse, and CPython converts at most 4300
    digits of an int). ``where`` names the value in the message. Never raises.
    """
    try:
        found = _find_problem(value, set(), 0)
    except RecursionError:  # a list or dict nested deeper than the stack, under MAX_NESTING
        return f"{where} is nested too deeply to check"
    if found is None:
        return None
    path, message = found
    if len(path) > 12:
        path = ["[...]", *path[-12:]]  # innermost first: keep the outermost dozen
    return f"{where}{''.join(reversed(path))} {message}"


MAX_NESTING = 100
"""Levels of lists and dicts that a plain value may nest."""

MAX_INT_BITS = 14_000
"""Bits an int of a plain value may have (4214 decimal digits; CPython converts at most 4300)."""


def _find_problem(value: object, path_ids: set[int], depth: int) -> tuple[list[str], str] | None:
    """(path to the bad part, innermost last-appended; what is wrong), or None."""
    kind = type(value)
    if kind is int:
        bits = value.bit_length()  # type: ignore[attr-defined]
        if bits > MAX_INT_BITS:
            return [], (
                f"is an int of {bits} bits, too long to send as JSON (at most {MAX_INT_BITS} "
                "bits; pass it as a str)"
            )
        return None
    if value is None or kind in (bool, float, str):
        return None
    if kind is not list and kind is not dict:
        return [], f"has type {type_name(kind)}, which is not JSON plain data ({PLAIN_TYPES})"
    if id(value) in path_ids:
        return [], "contains itself (a reference cycle)"
    if depth >= MAX_NESTING:
        return [], f"nests lists and dicts more than {MAX_NESTING} deep"
    path_ids.add(id(value))
    try:
        if kind is list:
            for index, item in enumerate(value):  # type: ignore[arg-type]
                found = _find_problem(item, path_ids, depth + 1)
                if found is not None:
                    found[0].append(f"[{index}]")
                    return found
            return None
        for key, item in value.items():  # type: ignore[union-attr]
            if type(key) is not str:
                return [], (
                    f"has a key {_short_repr(key)} of type {type_name(type(key))}; keys must be str"
                )
            found = _find_problem(item, path_ids, depth + 1)
            if found is not None:
                found[0].append(f"[{_short_repr(key)}]")
                return found
        return None
    finally:
        path_ids.discard(id(value))


def _short_repr(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters; never raises."""
    try:
        text = repr(value)
    except Exception:
        return f"<{type(value).__name__} object>"
    return text if len(text) <= limit else text[: limit - 5] + "[...]"


def type_name(kind: type) -> str:
    """A type's name as the status records give it: ``ValueError``, ``pkg.mod.MyError``.

    A class of the parent's script, which a forkserver or exec child loads again as
    ``__mp_main__`` (see :func:`_load_main`), is named as the child can import it, and as the
    parent names it: ``__main__.MyError`` (the child's ``__main__`` is that module too), so a
    verdict on it is the fork style's.
    """
    module = getattr(kind, "__module__", "builtins")
    name = getattr(kind, "__qualname__", kind.__name__)
    if module == MP_MAIN and sys.modules.get("__main__") is sys.modules.get(MP_MAIN):
        module = "__main__"
    return name if module == "builtins" else f"{module}.{name}"


MP_MAIN = "__mp_main__"
"""The name a child loads the parent's ``__main__`` script under (as multiprocessing does)."""


_encode_str = json.encoder.encode_basestring_ascii
"""JSON text of a str, as ``json.dumps`` writes it (its own, C, function)."""


def _scalar_json(value: object) -> str | None:
    """JSON text of None, a bool, an int or a str (exact types); None for anything else."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    kind = type(value)
    if kind is int:
        return int.__repr__(value)  # type: ignore[arg-type]
    if kind is str:
        return _encode_str(value)
    return None


def encode_record(fields: dict[str, object]) -> str:
    """The JSON text of a status record or seal verdict ``fields`` (str keys only), as
    ``json.dumps(fields, default=repr)`` writes it.

    Values that are None, bools, ints, strs or lists of those are written here: the json
    module's encoder, set up at each call, would cost a forked child tens of copy-on-write
    page faults (see :func:`harness._reap.first_wait`); other values go through it.

    Raises:
      ValueError: an int too long to convert to decimal (as ``json.dumps`` does).
    """
    parts = []
    for name, value in fields.items():
        text = _scalar_json(value)
        if text is None and type(value) is list:
            items = []
            for item in value:
                item_text = _scalar_json(item)
                if item_text is None:
                    break
                items.append(item_text)
            else:
                text = "[" + ", ".join(items) + "]"
        if text is None:
            return json.dumps(fields, default=repr)
        parts.append(_encode_str(name) + ": " + text)
    return "{" + ", ".join(parts) + "}"


def _map_page(fd: int, offset: int) -> mmap.mmap:
    """Map the page at ``offset`` of the guard table open on ``fd`` into this process."""
    return mmap.mmap(fd, SEAL_BYTES, offset=offset)


class _Status:
    """Writes status records to the parent's channel (or, for a repro run, a line to stderr).

    With a channel, the seal at its start is mapped first and the child's pid written into it;
    each final record is then checked (the write succeeded, on the file it was written to at
    the start) and the verdict written into the seal through memory.
    """

    def __init__(
        self,
        fd: int | None,
        seal: object,
        *,
        echo: bool,
        identity: tuple[int, int] | None = None,
    ) -> None:
        self.pid = os.getpid()  # the child's: a copy the target forks must not report
        self.fd = fd
        self.echo = echo  # may harness errors go to sys.stderr (is it ours yet)?
        self.seal = None
        self.identity = identity  # (st_dev, st_ino) of fd, taken before the fork, or None
        self.seal_at = 0
        if seal is not None:
            try:
                where, offset = seal  # type: ignore[misc]
                if isinstance(where, int):  # a descriptor of the table
                    self.seal = _map_page(where, offset)
                else:  # the table mapped already, inherited through fork
                    self.seal, self.seal_at = where, offset
                line = b"%d\n" % os.getpid()
                self.seal[self.seal_at : self.seal_at + len(line)] = line
            except (OSError, ValueError, TypeError):
                self.seal = None  # the parent then finds no seal
        if fd is not None and identity is None:
            try:
                info = os.fstat(fd)
                self.identity = (info.st_dev, info.st_ino)
            except OSError:
                pass

    def emit(self, event: str, **fields: object) -> bool:
        """Send one record; False if it could not be encoded (nothing was sent then).

        Does nothing in any process but the child itself (a copy the target forked).
        """
        if os.getpid() != self.pid:
            return True
        try:
            data = (encode_record({"event": event, **fields}) + "\n").encode()
        except Exception:  # a value the checks let through and JSON cannot take after all
            if event != "harness_error":
                return False
            data = b'{"event": "harness_error", "message": "(unencodable message)"}\n'
        if self.fd is None:
            if event not in ("started", "raised"):  # a raise already printed its traceback
                try:
                    detail = json.dumps(fields, default=repr)
                    print(f"devmem-death: {event} {detail}", file=sys.stderr, flush=True)
                except Exception:
                    pass
            return True
        final = event in FINAL_EVENTS
        error = None
        try:
            if final:  # the target ran since we looked: is the descriptor still the channel?
                info = os.fstat(self.fd)
                if (info.st_dev, info.st_ino) != self.identity:
                    raise OSError(f"descriptor {self.fd} is no longer the status channel")
            while data:
                data = data[os.write(self.fd, data) :]
        except OSError as exc:  # the target closed the channel, or limited file sizes
            error = f"{type(exc).__name__}: {exc}"
        if final:
            self._seal_final(event, error)
        return True

    def started(self) -> None:
        """Send the ``started`` record, ``emit("started", pid=...)`` without its general steps
        (each a few copy-on-write page faults in a forked child): it is written before the
        target runs, by the child itself, and is not final."""
        if self.fd is None:  # a repro run: emit prints nothing for it either
            return
        data = b'{"event": "started", "pid": %d}\n' % self.pid
        try:
            while data:
                data = data[os.write(self.fd, data) :]
        except OSError:  # as emit: the parent then finds no "started", a harness error
            pass

    def _seal_final(self, event: str, error: str | None) -> None:
        if self.seal is None:
            return
        verdict = encode_record({"event": event, "delivered": error is None, "error": error})
        data = verdict.encode()[: SEAL_BYTES - SEAL_FINAL_AT - 1] + b"\0"
        start = self.seal_at + SEAL_FINAL_AT
        self.seal[start : start + len(data)] = data

    def harness_error(self, message: str, exc: BaseException | None = None) -> None:
        if os.getpid() != self.pid:
            return
        try:
            text = "".join(traceback.format_exception(exc)) if exc is not None else ""
        except Exception:
            text = ""
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
    seal: object = None,
    status_identity: tuple[int, int] | None = None,
    set_up_by_parent: bool = False,
):
    """Run one death-test child in this (freshly forked or exec'd) process. Never returns.

    Args:
      request: the decoded request: ``target`` ("module:qualname"), ``args`` (list),
        ``environ`` (the child's whole environment, or None to keep this one), ``env``
        (overrides applied after it; None unsets), ``sys_path`` (or None, with
        ``sys_path_after``: entries to append to the interpreter's own), ``cwd``,
        ``main_path`` (file to load as ``__main__`` for a ``__main__:`` target, or None),
        ``module_path`` (the file of the target's module, loaded by path when the module
        cannot be imported by name, or is found elsewhere; None for a str target) and
        ``invalidate_caches`` (refresh the import system's directory caches, for a
        long-lived zygote).
      stdout_fd, stderr_fd: descriptors to move onto 1 and 2; None leaves 1 and 2 as they are.
      status_fd: descriptor of the status channel; None (a repro run) reports on stderr.
      parent_pid: the pid this child must die with; None skips the parent-death setup.
      new_group: put the child in its own process group (False when already done by exec).
      target: the callable itself (fork style), instead of importing ``request["target"]``.
      seal: the child's page of its parent's guard table: ``(fd, offset)`` of the table's
        file, or ``(mapping, offset)`` of the table already mapped (an ``mmap`` or memoryview
        inherited through fork); None for a repro run.
      status_identity: ``(st_dev, st_ino)`` of ``status_fd``, taken by the process that forks
        (the child then need not: see below), or None.
      set_up_by_parent: the process that forked this one ran :func:`set_up_ahead` and applied
        the request's environment, ``sys.path``, working directory and import caches itself
        (the zygote does, before each fork): this child inherited them, and skips those steps.

    A forked child shares every page with its parent until it writes one (a copy-on-write
    fault, tens of microseconds on a virtual machine), so the harness's own steps here touch
    as little as they can: no collection of the parent's objects runs during them (the
    collector is off, except while the target runs if it was on), records are encoded without
    the json module's encoder for plain values, and what can be prepared before the fork is.
    """
    collecting = gc.isenabled()
    gc.disable()
    status = _Status(status_fd, seal, echo=stderr_fd is None, identity=status_identity)
    try:
        _isolate(parent_pid, new_group)
        if not set_up_by_parent:
            _reset_signals_and_limits()
        _redirect(stdout_fd, stderr_fd)
        status.echo = True
        if not set_up_by_parent:
            _arm_faulthandler()
            _apply_request(request)
        state = request.get("state")
        missed: list[str] = []
        complete = True
        if state is not None:
            for note in apply_state(state, filters=False):
                status.emit("note", message=note)
            if state.get("warnings") is not None:
                missed, complete = _apply_warning_filters(state["warnings"])
        if request.get("coverage") is not None:
            _restart_coverage(request["coverage"])
        status.started()
    except BaseException as exc:
        status.harness_error(f"could not set up the child: {type(exc).__name__}: {exc}", exc)
        _leave(EXIT_HARNESS_ERROR)

    spec = request.get("target", "?")
    if target is None:
        try:
            target = _resolve(spec, request.get("main_path"), request.get("module_path"))
        except BaseException as exc:
            status.harness_error(
                f"could not import the target {spec!r} in the child: {type(exc).__name__}: {exc}",
                exc,
            )
            _leave(EXIT_HARNESS_ERROR)
    if not complete:  # a category of the target's module (the script run as __main__, loaded
        # as __mp_main__; a test module loaded by path; the harness, for a nested death test),
        # which a fork child has too: now it is here
        try:
            missed = _apply_warning_filters(state["warnings"])[0]
        except BaseException as exc:
            status.harness_error(f"could not set up the child: {type(exc).__name__}: {exc}", exc)
            _leave(EXIT_HARNESS_ERROR)
    for note in missed:
        status.emit("note", message=note)

    args = request.get("args", ())
    if collecting:
        gc.enable()
    try:
        value = target(*args)  # type: ignore[operator]
    except SystemExit as exc:
        gc.disable()
        code = _system_exit_code(exc)
        status.emit("exit", code=code)
        _leave(code)
    except BaseException as exc:
        gc.disable()
        _report_raise(status, exc)
        _leave(EXIT_RAISED)
    gc.disable()
    if os.getpid() != status.pid:  # a copy the target forked returned: as a plain interpreter
        _leave(0)
    try:
        problem = plain_problem(value, "the value returned by the target")
        if problem is None and not status.emit("returned", value=value):
            problem = "the value returned by the target could not be encoded as JSON"
    except BaseException as exc:  # the final path is total: any failure here is the harness's
        problem = f"reporting the value returned by the target failed: {_describe(exc)}"
    if problem:
        status.harness_error(problem)
        _leave(EXIT_HARNESS_ERROR)
    _leave(0)  # an undelivered record is in the seal: the parent reports it, whatever the code


def _report_raise(status: _Status, exc: BaseException) -> None:
    """Print the target's traceback as python would, and (in the child itself) send it as a
    ``raised`` record; a failure to do so is a harness error. Never raises."""
    try:
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        text = "".join(traceback.format_exception(type(exc), exc, tb))  # without our frame
    except BaseException as problem:
        text = f"{_describe(exc)}\n(its traceback could not be formatted: {_describe(problem)})\n"
    try:
        sys.stderr.write(text)
    except BaseException:
        pass
    if os.getpid() != status.pid:  # a copy the target forked: a traceback and status 1, no more
        return
    try:
        sent = status.emit(
            "raised",
            type=type_name(type(exc)),
            bases=[type_name(base) for base in type(exc).__mro__[1:] if base is not object],
            message=_safe_str(exc),
            traceback=text,
        )
        problem = None if sent else "the raised exception could not be encoded as JSON"
    except BaseException as failure:
        problem = f"reporting the exception the target raised failed: {_describe(failure)}"
    if problem:
        status.harness_error(problem)
        _leave(EXIT_HARNESS_ERROR)


def _describe(exc: BaseException) -> str:
    """``Type: message`` of an exception; never raises."""
    return f"{type(exc).__name__}: {_safe_str(exc)}"


def start_ticks(pid: int) -> str | None:
    """When process ``pid`` started, in clock ticks after boot (``/proc/<pid>/stat`` field 22),
    as a str: with the pid it names one process for good. None if it is gone (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when ``parent_pid`` (its parent) dies (Linux).

    Exits at once if the parent is already gone (it died before the request took effect).
    """
    prepare()
    if _prctl:
        _prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(EXIT_HARNESS_ERROR)


def set_up_ahead() -> bool:
    """Put this process, which forks children (the forkserver's zygote), in the state each
    child's own set-up would put it in: the signal dispositions and mask, no core files, and
    ``faulthandler`` armed on descriptor 2 (whatever descriptor 2 is when it fires). Its
    children inherit that state through fork, and skip those steps
    (``run_child(set_up_by_parent=True)``): fewer of its pages copied in each child. Call
    it after anything that may change that state has run (a preload's imports).

    Returns:
      Whether it succeeded (if not, the children must set themselves up).
    """
    try:
        _reset_signals_and_limits()
        _arm_faulthandler()
    except (OSError, ValueError, RuntimeError):
        return False
    return True


def _isolate(parent_pid: int | None, new_group: bool) -> None:
    if new_group:
        os.setpgid(0, 0)
    if parent_pid is not None:
        die_with_parent(parent_pid)


def _reset_signals_and_limits() -> None:
    if resource is not None:
        try:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        except (ValueError, OSError):
            pass
    _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
    for signum in _RESET_SIGNALS:
        _signal.signal(signum, _signal.SIG_DFL)
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    _signal.signal(_signal.SIGPIPE, _signal.SIG_IGN)


_SIGKILL = int(signal.SIGKILL)
_RESET_SIGNALS = tuple(
    int(getattr(signal, name))
    for name in ("SIGHUP", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGCHLD")
    if hasattr(signal, name)
)
"""Signals whose handler a child resets to the default action (SIGINT gets Python's own,
SIGPIPE is ignored, as in a fresh interpreter)."""


def _make_streams() -> tuple:
    """New ``sys.stdin``, ``sys.stdout`` and ``sys.stderr`` objects over descriptors 0, 1, 2."""
    return (
        io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8"),  # /dev/null
        _text_stream(1, write_through=False),
        _text_stream(2, write_through=True),
    )


def _redirect(stdout_fd: int | None, stderr_fd: int | None) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    if devnull != 0:  # 0 itself when this process had no stdin: keep it, it is /dev/null now
        os.dup2(devnull, 0)
        os.close(devnull)
    for fd, target_fd in ((stdout_fd, 1), (stderr_fd, 2)):
        if fd is not None and fd != target_fd:
            os.dup2(fd, target_fd)
            os.close(fd)
    _keep_alive.extend((sys.stdin, sys.stdout, sys.stderr))
    # prepare() made them in the process that forks, never used there: each forked child gets
    # its own unused copy (an exec'd child makes them here)
    global _streams
    stdin, stdout, stderr = _streams if _streams is not None else _make_streams()
    _streams = None  # ours now: a child of this child (a nested death test) makes its own
    sys.stdin = sys.__stdin__ = stdin
    sys.stdout = sys.__stdout__ = stdout
    sys.stderr = sys.__stderr__ = stderr


def _text_stream(fd: int, *, write_through: bool) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        io.FileIO(fd, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
        write_through=write_through,
    )


def _arm_faulthandler() -> None:
    # descriptor 2 (sys.stderr's, made by _redirect) by number: no call on the file object
    faulthandler.enable(file=2, all_threads=True)
    # register() installs no handler where this process inherited a registration of the
    # signal (a nested death test's parent is a child), and the reset before has put the
    # signal back to its default action: unregister first, so that register installs it
    faulthandler.unregister(DUMP_SIGNAL)
    faulthandler.register(DUMP_SIGNAL, file=2, all_threads=True, chain=False)


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
    if os.environ.get(ENV_FLAG) != "1":  # set already in a zygote's child (see _zygote)
        os.environ[ENV_FLAG] = "1"
    if request.get("sys_path") is not None:
        sys.path[:] = request["sys_path"]
    elif request.get("sys_path_after") is not None:  # PYTHONPATH/PYTHONHOME made ours: keep it
        runner_dir = os.path.dirname(os.path.abspath(__file__))
        own = [entry for entry in sys.path if entry != runner_dir]
        sys.path[:] = own + [entry for entry in request["sys_path_after"] if entry not in own]
    if request.get("cwd"):
        os.chdir(request["cwd"])
    if request.get("invalidate_caches"):
        importlib.invalidate_caches()


def apply_state(state: dict, *, filters: bool = True) -> list[str]:
    """Give this child the test process's umask, resource limits, nice value, warning filters,
    ``sys.dont_write_bytecode`` and int-to-str digit limit (``harness._state.process_state``),
    where they differ from its own.

    Returns:
      A note for each part that could not be applied (a hard limit above this process's own,
      which only a privileged process may raise; a nice value below its own; a warning filter
      whose category could not be found): the child runs with its own value there.
      ``filters=False`` leaves the warning filters alone (``run_child`` sets them itself, and
      again once the target is imported when a category was missing: the target's module, a
      script run as ``__main__`` say, may define it).
    """
    notes: list[str] = []
    for name, value in (state.get("environ") or {}).items():  # an exec child's start-up
        if value is None:  # variables, which it started without (see harness._exec)
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if state.get("umask") is not None:
        os.umask(state["umask"])
    for name, wanted in (state.get("rlimits") or {}).items():
        number = getattr(resource, name, None) if resource is not None else None
        if number is None:
            continue
        wanted = tuple(wanted)
        have = resource.getrlimit(number)
        if have == wanted:
            continue
        try:
            resource.setrlimit(number, wanted)
        except (OSError, ValueError) as exc:
            soft = wanted[0] if have[1] == resource.RLIM_INFINITY else min(wanted[0], have[1])
            soft = have[1] if wanted[0] == resource.RLIM_INFINITY else soft
            try:
                resource.setrlimit(number, (soft, have[1]))
            except (OSError, ValueError):
                pass
            got = resource.getrlimit(number)
            notes.append(
                f"devmem-harness: the child could not take the test process's {name} "
                f"{_limit_text(wanted)} ({exc}); it runs with {_limit_text(got)}"
            )
    nice = state.get("nice")
    if nice is not None:
        have = os.getpriority(os.PRIO_PROCESS, 0)
        if have != nice:
            try:
                os.setpriority(os.PRIO_PROCESS, 0, nice)
            except OSError as exc:
                notes.append(
                    f"devmem-harness: the child could not take the test process's nice value "
                    f"{nice} ({exc.strerror}: lowering it takes a privilege); it runs at {have}"
                )
    if filters and state.get("warnings") is not None:
        notes.extend(_apply_warning_filters(state["warnings"])[0])
    if state.get("dont_write_bytecode") is not None:
        sys.dont_write_bytecode = bool(state["dont_write_bytecode"])
    digits = state.get("int_max_str_digits")
    if digits is not None and hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(digits)
    return notes


def _limit_text(limit: tuple) -> str:
    return "(" + ", ".join("unlimited" if n == -1 else str(n) for n in limit) + ")"


def _apply_warning_filters(filters: list) -> tuple[list[str], bool]:
    """Replace this process's warning filters with ``filters`` (``[action, message, category,
    module, lineno]``, first wins).

    Returns:
      A note naming those whose category is not found (its module not imported here, and not
      importable; none for the packages of :data:`NOT_IN_CHILD`), and whether every filter
      was set.
    """
    import warnings

    made, missing, complete = [], [], True
    for action, message, category, module, lineno in filters:
        found = _warning_category(category)
        if found is None:
            complete = False
            if category.partition(".")[0] not in NOT_IN_CHILD:
                missing.append(f"{action}::{category}")
            continue
        made.append((action, message or "", found, module or "", lineno))
    warnings.resetwarnings()
    for action, message, category, module, lineno in made:
        warnings.filterwarnings(action, message, category, module, lineno, append=True)
    if not missing:
        return [], complete
    return [
        "devmem-harness: the child could not set the test process's warning filters "
        f"{', '.join(missing)}: their categories could not be imported here"
    ], complete


def _warning_category(name: str) -> type | None:
    """The warning class named ``name`` (``UserWarning``, ``pkg.mod.MyWarning``, a nested
    ``pkg.mod.Outer.MyWarning``): a builtin, or one of a module imported here already, or
    importable; None if none is found. The longest prefix of ``name`` that is a module wins."""
    parts = name.split(".")
    if len(parts) == 1:
        parts = ["builtins", name]
    for cut in range(len(parts) - 1, 0, -1):
        module_name, qualname = ".".join(parts[:cut]), parts[cut:]
        if module_name == "__main__":
            module_name = MP_MAIN if MP_MAIN in sys.modules else module_name
        if module_name.partition(".")[0] in NOT_IN_CHILD and module_name not in sys.modules:
            continue  # never imported for a filter; a shorter prefix may be imported already
        try:
            obj: object = sys.modules.get(module_name) or importlib.import_module(module_name)
        except Exception:  # not a module (a class of a shorter prefix), or not importable
            continue
        try:
            for part in qualname:
                obj = getattr(obj, part)
        except Exception:
            return None
        return obj if isinstance(obj, type) and issubclass(obj, Warning) else None
    return None


_coverage: tuple | None = None  # (pid, coverage.Coverage) to save at _leave (see below)


def _restart_coverage(orders: dict) -> None:
    """In a fork-style child of a test process measuring coverage without coverage.py's own
    fork and ``_exit`` support (a test process that did not find the project's coverage
    configuration: pytest started in a subdirectory): measure what this child runs into a data
    file of its own (``orders["config"]``: the test process's configuration, serialized), and
    save it when the child leaves (:func:`_leave`), as that support would have."""
    global _coverage
    try:
        import coverage

        parent = coverage.Coverage.current()
        if orders.get("restart") and parent is not None:
            parent._auto_save = False  # its data is the test process's: never ours to save
            parent.stop()
            parent = None
        if parent is None:
            parent = coverage.Coverage(config_file=":data:" + orders["config"], data_suffix=True)
            parent._warn_no_data = False
            parent.start()
        _coverage = (os.getpid(), parent) if orders.get("save") else None
    except Exception:  # no coverage here after all: the child runs unmeasured
        _coverage = None


def _resolve(spec: str, main_path: str | None, module_path: str | None = None) -> object:
    module_name, sep, qualname = spec.partition(":")
    if not sep or not module_name or not qualname:
        raise ValueError(f"target must be 'module:qualname', got {spec!r}")
    main = sys.modules.get("__main__")
    if module_name == "__main__" and main_path and getattr(main, "__file__", None) != main_path:
        module = _load_main(main_path)  # a fresh interpreter: its __main__ is our runner
    elif module_path and not _importable_as(module_name, module_path):
        module = _load_by_path(module_name, module_path)
    else:
        module = importlib.import_module(module_name)
    obj: object = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _importable_as(module_name: str, path: str) -> bool:
    """Whether importing ``module_name`` here gives the module of file ``path``.

    Not when the name cannot be found (pytest's ``--import-mode=importlib`` names test modules
    ``tests.test_x`` without putting their directory on ``sys.path``), nor when it is found
    in another file.
    """
    module = sys.modules.get(module_name)
    if module is not None:
        found = getattr(module, "__file__", None)
    else:
        try:
            spec = importlib.util.find_spec(module_name)
        except (ImportError, ValueError):
            return False
        found = spec.origin if spec is not None else None
    return isinstance(found, str) and _same_file(found, path)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _load_by_path(module_name: str, path: str) -> object:
    """Load the file ``path`` as module ``module_name`` (what pytest's importlib mode does)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load module {module_name!r} from {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def _load_main(path: str) -> object:
    """Load the parent's ``__main__`` script as ``__mp_main__`` (what multiprocessing does):
    by its module's name when the parent ran it with ``python -m pkg.script`` (its relative
    imports need its package: see :func:`_main_module_name`), else by its file's path."""
    name = _main_module_name(path)
    if name is not None:
        import runpy
        import types

        module = types.ModuleType(MP_MAIN)
        module.__dict__.update(runpy.run_module(name, run_name=MP_MAIN, alter_sys=True))
        sys.modules[MP_MAIN] = sys.modules["__main__"] = module
        return module
    spec = importlib.util.spec_from_file_location(MP_MAIN, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the parent's __main__ from {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MP_MAIN] = sys.modules["__main__"] = module
    spec.loader.exec_module(module)
    return module


def _main_module_name(path: str) -> str | None:
    """The name the parent's ``__main__`` file ``path`` was run by, with ``python -m``: a
    dotted name under an entry of ``sys.path`` (the parent's) that imports as that file. None
    for a script run by its path, whose directory is then on ``sys.path`` (its first entry),
    or a file no name imports as."""
    directory = os.path.dirname(path)
    entries = [os.path.abspath(entry or os.curdir) for entry in sys.path]
    if any(_same_file(directory, entry) for entry in entries):
        return None
    for entry in entries:
        relative = os.path.relpath(path, entry)
        parts = os.path.splitext(relative)[0].split(os.sep)
        if relative.startswith(os.pardir) or not all(part.isidentifier() for part in parts):
            continue
        name = ".".join(parts)
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = getattr(spec, "origin", None)
        if isinstance(origin, str) and _same_file(origin, path):
            return name
    return None


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
    # A target that ran death tests of its own started a zygote: say goodbye and reap it, as
    # atexit would have (os._exit runs no atexit handler, and an orphan is never reaped where
    # init does not reap). Looked up, not imported: this module stands alone.
    forkserver = sys.modules.get("harness._forkserver")
    if forkserver is not None and forkserver._owner == os.getpid():
        try:
            forkserver._shutdown_at_exit()
        except Exception:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if _coverage is not None and _coverage[0] == os.getpid():  # not a copy the target forked
        try:
            _coverage[1].stop()
            _coverage[1].save()
        except Exception:
            pass
    os._exit(code)
