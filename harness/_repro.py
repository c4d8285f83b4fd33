"""The repro command: a shell line that reruns a child in the exec style."""

from __future__ import annotations

import os
import shlex
import sys

from harness._child import ENV_FLAG
from harness._request import ChildRequest

RUNNER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_exec_runner.py")
"""The exec runner script, run by file path so a child never imports the harness package."""


def repro_command(request: ChildRequest) -> str:
    """A shell command that reruns the child of ``request`` (exec style) and shows its ending.

    The environment part lists the overrides only (relative to the shell it runs in, as the
    child's environment is relative to the parent's). The request JSON carries the target, the
    arguments, ``sys.path`` and the working directory. For an exec-style child this is its argv
    minus the options that tie it to the parent (``--status-fd``, ``--parent-pid``), with the
    request inline even where the child read it from a descriptor (``--request-fd``).
    """
    words = ["env"]
    for name, value in request.overrides.items():
        if value is None:
            words += ["-u", name]
    for name, value in request.overrides.items():
        if value is not None and name != ENV_FLAG:
            words.append(f"{name}={value}")
    words += [f"{ENV_FLAG}=1", sys.executable, RUNNER_PATH, "--request", request.portable_json()]
    command = " ".join(shlex.quote(word) for word in words)
    if not request.target.importable:
        command += "  # the target is not importable (a closure?): only style='fork' runs it"
    return command
