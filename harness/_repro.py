"""The repro command: a shell line that reruns a child in the exec style."""

from __future__ import annotations

import itertools
import os
import shlex
import sys
import tempfile
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
_numbers = itertools.count(1)


def set_request_dir(provider: Callable[[], str] | None) -> None:
    """Say where the request files of long repro commands go: ``provider()`` returns a
    directory (the plugin gives the running test's temporary directory, made at the first
    call); None: one new directory under the system's temp directory, for this process."""
    global _request_dir
    _request_dir = provider


def _request_file(text: str) -> str:
    """Write a request to a new file (crash-safely: a temp file, then ``os.replace``)."""
    global _fallback_dir
    directory = _request_dir() if _request_dir is not None else None
    if directory is None:
        if _fallback_dir is None or not os.path.isdir(_fallback_dir):
            _fallback_dir = tempfile.mkdtemp(prefix="devmem-repro-")
        directory = _fallback_dir
    path = os.path.join(directory, f"request-{os.getpid()}-{next(_numbers)}.json")
    temp = f"{path}.tmp"
    with open(temp, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(temp, path)
    return path


def repro_command(request: ChildRequest) -> str:
    """A shell command that reruns the child of ``request`` (exec style) and shows its ending.

    The environment part lists the overrides only (relative to the shell it runs in, as the
    child's environment is relative to the parent's). The request JSON carries the target, the
    arguments, ``sys.path`` and the working directory. For an exec-style child this is its argv
    minus the options that tie it to the parent (``--status-fd``, ``--parent-pid``), with the
    request inline even where the child read it from a descriptor (``--request-fd``), or,
    when it is longer than :data:`INLINE_REQUEST_BYTES`, in a file it names
    (``--request-file``; see :func:`set_request_dir`). A file that cannot be written leaves
    the request inline.
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
    words += ["--request", text]
    if len(text.encode()) > INLINE_REQUEST_BYTES:
        try:
            words[-2:] = ["--request-file", _request_file(text)]
        except OSError:
            pass
    command = " ".join(shlex.quote(word) for word in words)
    if not request.target.importable:
        command += "  # the target is not importable (a closure?): only style='fork' runs it"
    return command
