"""Forkserver scenarios that start, kill or replace zygotes: each runs in a fresh interpreter.

The self-tests run these with ``style="exec"``: the child is then a root process of its own,
whose zygotes are its own to start, kill and reap, so the test process's zygote (shared by
every test of an xdist worker, or of a ``pytest --forked`` run) is left alone. Each returns
plain data for the test to check; none imports pytest.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import harness
from harness import _forkserver
from suites.harness import _procs, _targets


def _brief(outcome: harness.Outcome) -> dict:
    return {
        "kind": outcome.kind,
        "error": outcome.error,
        "returned": outcome.returned,
        "duration_s": outcome.duration_s,
        "pid": outcome.pid,
    }


def zygote_killed_then_restarted() -> dict:
    """A zygote killed between two children is restarted for the second."""
    first = harness.run_child(_targets.parent_pid, style="forkserver", timeout=30)
    zygote = _forkserver.current().pid
    os.kill(zygote, signal.SIGKILL)
    dead = _procs.wait_until_dead(zygote)
    second = harness.run_child(_targets.parent_pid, style="forkserver", timeout=30)
    return {
        "first": _brief(first),
        "zygote": zygote,
        "dead": dead,
        "second": _brief(second),
        "new_zygote": _forkserver.current().pid,
    }


def zygote_dies_mid_request() -> dict:
    """The zygote dies while its child runs: a harness error at once; the next child is fine."""
    broken = harness.run_child(_targets.kill_parent_and_hang, style="forkserver", timeout=20)
    child_dead = _procs.wait_until_dead(broken.pid)
    after = harness.run_child(_targets.give_back, style="forkserver", timeout=30)
    return {"broken": _brief(broken), "child_dead": child_dead, "after": _brief(after)}


def zygote_shut_down_and_started_again() -> dict:
    """What atexit does: goodbye, and the zygote is reaped; the next child starts a new one."""
    harness.run_child(_targets.give_back, style="forkserver", timeout=30)
    zygote = _forkserver.current().pid
    _forkserver._shutdown_at_exit()
    gone = _forkserver.current() is None
    dead = _procs.wait_until_dead(zygote)
    zombies = _procs.zombies_of({os.getpid()})
    again = harness.run_child(_targets.give_back, style="forkserver", timeout=30)
    return {
        "zygote": zygote,
        "gone": gone,
        "dead": dead,
        "zombies": zombies,
        "again": _brief(again),
        "new_zygote": _forkserver.current().pid,
    }


def preloads() -> dict:
    """Each preload list has its zygote; a failing preload is a harness error naming it."""
    harness.set_forkserver_preload([])
    before = harness.run_child(_targets.hygiene, style="forkserver", timeout=30)
    harness.set_forkserver_preload(["colorsys"])
    after = harness.run_child(_targets.hygiene, style="forkserver", timeout=30)
    harness.set_forkserver_preload(["suites.harness._no_such_preload"])
    failed = harness.run_child(_targets.give_back, style="forkserver", timeout=30)
    harness.set_forkserver_preload([])
    recovered = harness.run_child(_targets.give_back, style="forkserver", timeout=30)
    return {
        "before": _brief(before),
        "after": _brief(after),
        "failed": _brief(failed),
        "recovered": _brief(recovered),
    }


def forkserver_from_short_lived_threads(count: int) -> list:
    """``count`` forkserver children, each from a thread that ends once its child has, then
    one from the main thread: ``[kind, zygote pid or error]`` each, or ``["raised", repr]``."""
    results: list = []

    def one() -> None:
        try:
            outcome = harness.run_child(_targets.parent_pid, style="forkserver", timeout=30)
        except BaseException as exc:
            results.append(["raised", repr(exc)])
        else:
            results.append([outcome.kind, outcome.returned or outcome.error])

    for _ in range(count):
        thread = threading.Thread(target=one)
        thread.start()
        thread.join()
    one()
    return results


def forkserver_with_a_long_sys_path(kib: int) -> dict:
    """A forkserver child while ``sys.path`` is ``kib`` KiB longer than usual."""
    sys.path.extend(f"/nonexistent/{i:05d}/{'x' * 1000}" for i in range(kib))
    outcome = harness.run_child(_targets.give_back, style="forkserver", timeout=30)
    return {"sys_path_bytes": len(repr(sys.path)), **_brief(outcome)}


SIGKILLED_PYTEST = """
import os
import threading

import harness
from suites.harness import _targets


def test_children_that_hang_with_grandchildren():
    folder = os.environ["SURVIVORS_DIR"]
    threads = [
        threading.Thread(
            target=harness.run_child,
            args=(_targets.spawn_sleepers_and_hang, os.path.join(folder, style), 3),
            kwargs={"style": style, "timeout": 600},
        )
        for style in ("fork", "forkserver", "exec")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
"""


def sigkill_a_pytest_process(folder: str) -> dict:
    """Run a real pytest process whose test runs a child in each style (each starts three
    ``sleep`` grandchildren and hangs), SIGKILL it once they all run, and see who survives.

    This process makes itself a child subreaper (Linux), so that the orphans of the killed
    pytest come to it and are reaped here, whatever they are, and kills any survivor after
    counting it: nothing is left behind on the machine either way.
    """
    import ctypes
    import json
    import subprocess
    import time

    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    styles = ("fork", "forkserver", "exec")
    with open(os.path.join(folder, "test_inner.py"), "w") as out:
        out.write(SIGKILLED_PYTEST)
    env = {**os.environ, "SURVIVORS_DIR": folder, "PYTHONPATH": os.pathsep.join(sys.path)}
    if env.get("MUTANT_UNDER_TEST") == "stats":
        # under mutmut's first run the inner pytest's trampolines (harness._child's start_ticks
        # runs at import) would look for mutmut's configuration in ``folder``: run it
        # unmutated there (a mutant's run still applies)
        env["MUTANT_UNDER_TEST"] = ""
    inner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:hypothesispytest",
            "-p",
            "suites._mutmut",  # inert outside mutmut; in it, its zygote is mutated too
            "test_inner.py",
        ],
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    started = True
    deadline = time.monotonic() + 60
    while not all(os.path.exists(os.path.join(folder, style)) for style in styles):
        if inner.poll() is not None or time.monotonic() > deadline:
            started = False
            break
        time.sleep(0.02)
    inner.send_signal(signal.SIGKILL)
    inner.wait()
    if not started:
        return {"started": False}
    seen = {}
    for style in styles:
        with open(os.path.join(folder, style)) as record:
            seen[style] = json.load(record)
    children = sorted(seen[style]["child"] for style in styles)
    sleepers = sorted(pid for style in styles for pid in seen[style]["sleepers"])
    zygote = seen["forkserver"]["parent"]
    everyone = [*children, zygote, *sleepers]
    survivors = [pid for pid in everyone if not _procs.wait_until_dead(pid, 10.0)]
    in_groups = _procs.live_members(set(children))
    for pid in survivors + in_groups:  # clean up after a failure: count them, then end them
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.1)
    while True:  # reap every orphan that came to us
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                time.sleep(0.05)
                if not _procs.zombies_of({os.getpid()}):
                    break
        except ChildProcessError:
            break
    return {
        "started": True,
        "inner": inner.pid,
        "fork_parent": seen["fork"]["parent"],
        "zygote": zygote,
        "everyone": everyone,
        "survivors": survivors,
        "in_groups": in_groups,
    }


def harness_warning_filter() -> list:
    """The filters on :class:`harness.HarnessWarning` this child has (its module imports the
    harness, as a nested death test's does), as ``[action, message pattern]``."""
    import warnings

    return [
        [action, getattr(message, "pattern", message)]
        for action, message, category, _module, _lineno in warnings.filters
        if category is harness.HarnessWarning
    ]
