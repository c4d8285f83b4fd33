"""Entry point of an exec-style death-test child: ``python _exec_runner.py [options]``.

Run as a script by file path (never ``-m``), so the ``harness`` package, and with it pytest,
is never imported: this file and ``_child.py`` beside it are all a child loads before the
target. Standard library only.

Usage::

    python .../harness/_exec_runner.py --request JSON
    python .../harness/_exec_runner.py --request-file PATH
    python .../harness/_exec_runner.py --request-fd FD --status-fd FD --parent-pid PID
        --seal FD:OFFSET

``--state`` carries the test process's umask, resource limits, nice value and warning filters
(``harness._state.process_state``), which the child takes. ``--request`` carries the request
as JSON (``target``, ``args``, ``sys_path``, ``cwd``,
``main_path``, ``module_path``); ``--request-fd`` reads the same JSON from a descriptor instead
(used when it is too long for one argument), ``--request-file`` from a file (what a long
request's repro command names). The other options bind the child to its parent
(``--seal``: its page of the parent's guard table); a repro command leaves them out, and the
runner then reports the outcome on stderr.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys


def _load_child():
    """``_child.py`` beside this file, loaded by path (not entered in ``sys.modules``) under
    the name it has in a fork-style child, ``harness._child``: one name in every style (its
    functions' ``__module__``, which mutmut's trampolines also go by)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_child.py")
    spec = importlib.util.spec_from_file_location("harness._child", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def start_coverage() -> None:
    """Measure coverage with the test process's configuration when it measures
    (``COVERAGE_PROCESS_CONFIG``, see ``harness._coverage``): coverage.py's own start-up hook
    has done it already where its ``.pth`` file ran (then nothing happens here)."""
    if os.environ.get("COVERAGE_PROCESS_CONFIG"):
        try:
            import coverage

            coverage.process_startup()
        except Exception:  # no coverage.py here: the child runs unmeasured
            pass


def _parse(argv: list[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    known = (
        "--request",
        "--request-fd",
        "--request-file",
        "--status-fd",
        "--parent-pid",
        "--seal",
        "--state",
    )
    it = iter(argv)
    for arg in it:
        if arg not in known:
            sys.exit(f"_exec_runner: unknown argument {arg!r}; expected {', '.join(known)}")
        value = next(it, None)
        if value is None:
            sys.exit(f"_exec_runner: {arg} needs a value")
        options[arg] = value
    if sum(name in options for name in ("--request", "--request-fd", "--request-file")) != 1:
        sys.exit(
            "_exec_runner: give exactly one of --request JSON, --request-fd FD and "
            "--request-file PATH"
        )
    return options


def main(argv: list[str]) -> None:
    """Decode the request from ``argv`` and run the child; never returns."""
    options = _parse(argv)
    start_coverage()
    child = _load_child()
    if "--request" in options:
        request = json.loads(options["--request"])
    elif "--request-file" in options:
        with open(options["--request-file"], encoding="utf-8") as file:
            request = json.load(file)
    else:
        request_fd = int(options["--request-fd"])
        request = json.loads(child.read_all(request_fd))
        os.close(request_fd)
    if "--state" in options:  # the test process's umask, limits, warning filters...
        request["state"] = json.loads(options["--state"])
    status_fd = int(options["--status-fd"]) if "--status-fd" in options else None
    parent_pid = int(options["--parent-pid"]) if "--parent-pid" in options else None
    seal = None
    if "--seal" in options:
        fd, _, offset = options["--seal"].partition(":")
        seal = (int(fd), int(offset))
    child.run_child(
        request,
        stdout_fd=None,
        stderr_fd=None,
        status_fd=status_fd,
        parent_pid=parent_pid,
        new_group=False,  # the parent started a new session; a repro stays in the shell's job
        seal=seal,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
