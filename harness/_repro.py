"""The repro command: a shell line that reruns a child in the exec style."""

from __future__ import annotations

import atexit
import itertools
import os
import shlex
import sys
import tempfile
import threading
from collections.abc import Callable

from harness._child import ENV_FLAG
from harness._request import ChildRequest

RUNNER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_exec_runner.py")
"""The exec runner script, run by file path so a child never imports the harness package."""

INLINE_REQUEST_BYTES = 16 * 1024
"""A longer request is written to a file that the repro command names (``--request-file``),
instead of inline: a shell refuses one argument over 128 KiB, and a failure message should
not carry megabytes."""

_request_dir: Callable[[], str] | None = None
_fallback_dir: str | None = None  # outside pytest: one temporary directory per process
_owner: int | None = None  # the pid that made it (a forked copy makes its own)
_made: list[str] = []  # the fallback directories this process made (one, unless one vanished)
_unkept: dict[str, None] = {}  # files in them written for no failure (insertion order)
_numbers = itertools.count(1)
_lock = threading.RLock()


def set_request_dir(provider: Callable[[], str] | None) -> None:
    """Say where the request files of long repro commands go: ``provider()`` returns a
    directory (the plugin gives the running test's temporary directory, made at the first
    call); None: one new directory under the system's temp directory, for this process, made
    at its first file and cleaned at its exit (see :class:`PendingRepro`).

    A command takes the provider set when its child ran, whenever its file is written."""
    global _request_dir
    _request_dir = provider


def _request_file(text: str, provider: Callable[[], str] | None) -> tuple[str, bool]:
    """Write a request to a new file (crash-safely: a temp file, then ``os.replace``).

    Returns:
      The path, and whether it is in this process's fallback directory (cleaned at exit).

    Raises:
      OSError: the directory or the file could not be made.
    """
    global _fallback_dir, _owner
    directory = provider() if provider is not None else None
    fallback = directory is None
    if directory is None:
        with _lock:
            if _owner != os.getpid():  # the first, or a forked copy: its parent's are not its
                _made.clear()
                _unkept.clear()
                _owner = os.getpid()
                atexit.register(_clean_fallback_dirs, _owner)
            if (
                _fallback_dir is None
                or _fallback_dir not in _made
                or not os.path.isdir(_fallback_dir)
            ):
                _fallback_dir = tempfile.mkdtemp(prefix="devmem-repro-")
                _made.append(_fallback_dir)
            directory = _fallback_dir
    path = os.path.join(directory, f"request-{os.getpid()}-{next(_numbers)}.json")
    temp = f"{path}.tmp"
    with open(temp, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(temp, path)
    return path, fallback


def _clean_fallback_dirs(owner: int) -> None:
    """At exit: remove the request files this process wrote into its fallback directories for
    no failure, then each directory that this left empty. Files a failure named, and anything
    else in them (a user's), stay, and so does their directory."""
    if os.getpid() != owner:
        return
    with _lock:
        paths, directories = list(_unkept), list(_made)
        _unkept.clear()
        _made.clear()
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass
    for directory in directories:
        try:
            os.rmdir(directory)  # only if empty: never what someone else put there
        except OSError:
            pass


class PendingRepro:
    """A repro command whose request is long (over :data:`INLINE_REQUEST_BYTES`): the file the
    command names is written when the command is first read, not when the child ran, so a
    child nobody asks about leaves no file behind.

    A failure message reads it (:meth:`command` with ``keep=True``), and so does reading
    :attr:`harness.Outcome.repro`. Outside pytest (no directory provider), the files go to
    one temporary directory per process, ``devmem-repro-*``, and at the process's exit the
    files that no failure named are removed, then the directory if it is empty: a failure's
    request file stays, for its command to be rerun. Under pytest they go to the test's
    temporary directory, which pytest keeps and rotates.

    Args:
      words: the command's words before the request's (``env ... python runner``).
      text: the request JSON.
      suffix: what follows the quoted words (a shell comment, or "").
      provider: the directory provider in force when the child ran, or None.
    """

    def __init__(
        self, words: list[str], text: str, suffix: str, provider: Callable[[], str] | None
    ) -> None:
        self._words = words
        self._text = text
        self._suffix = suffix
        self._provider = provider
        self._command: str | None = None
        self._path: str | None = None

    def command(self, *, keep: bool = False) -> str:
        """The shell command, its request file written at the first call (inline in the
        command when the file cannot be written).

        Args:
          keep: a failure shows the command, so its file must outlive this process (the
            fallback directory's clean-up at exit leaves it).
        """
        with _lock:
            if self._command is None:
                words = [*self._words, "--request", self._text]
                fallback = False
                try:
                    self._path, fallback = _request_file(self._text, self._provider)
                    words[-2:] = ["--request-file", self._path]
                except OSError:
                    pass
                if fallback:
                    _unkept[self._path] = None
                self._command = _quote(words) + self._suffix
            if keep and self._path is not None:
                _unkept.pop(self._path, None)
            return self._command

    def __reduce__(self) -> tuple:
        """Pickled as the plain command (its file written): a provider may not pickle."""
        return (str, (self.command(),))

    def __repr__(self) -> str:
        state = "pending" if self._command is None else repr(self._command)
        return f"<PendingRepro {state}>"


def _quote(words: list[str]) -> str:
    return " ".join(shlex.quote(word) for word in words)


def repro_command(request: ChildRequest) -> str | PendingRepro:
    """A shell command that reruns the child of ``request`` (exec style) and shows its ending.

    The environment part lists the overrides only (relative to the shell it runs in, as the
    child's environment is relative to the parent's). The request JSON carries the target, the
    arguments, ``sys.path`` and the working directory. For an exec-style child this is its argv
    minus the options that tie it to the parent (``--status-fd``, ``--parent-pid``), with the
    request inline even where the child read it from a descriptor (``--request-fd``).

    Returns:
      The command; or, for a request longer than :data:`INLINE_REQUEST_BYTES`, a
      :class:`PendingRepro`, whose command names a file (``--request-file``; see
      :func:`set_request_dir`) written when the command is first read. A file that cannot be
      written leaves the request inline.
    """
    words = ["env"]
    for name, value in request.overrides.items():
        if value is None:
            words += ["-u", name]
    for name, value in request.overrides.items():
        if value is not None and name != ENV_FLAG:
            words.append(f"{name}={value}")
    text = request.portable_json()
    words += [f"{ENV_FLAG}=1", sys.executable, RUNNER_PATH]
    suffix = ""
    if not request.target.importable:
        suffix = "  # the target is not importable (a closure?): only style='fork' runs it"
    if len(text.encode()) > INLINE_REQUEST_BYTES:
        return PendingRepro(words, text, suffix, _request_dir)
    return _quote([*words, "--request", text]) + suffix
