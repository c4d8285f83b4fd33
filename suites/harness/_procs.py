"""Process-table helpers for the harness self-tests (Linux /proc)."""

from __future__ import annotations

import os
import time


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of ``pid``, or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return fields[0].decode(), int(fields[1])


def zombies_of(parents: set[int]) -> list[int]:
    """Pids of zombie processes whose parent is in ``parents``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[0] == "Z" and stat[1] in parents:
                found.append(int(entry))
    return found


def wait_until_dead(pid: int, within_s: float = 5.0) -> bool:
    """True once ``pid`` is gone or a zombie (its reaper's business), polling up to ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def live_members(pgids: set[int]) -> list[int]:
    """Pids of processes, zombies aside, whose process group is in ``pgids``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] not in (b"Z", b"X") and int(fields[2]) in pgids:
            found.append(int(entry))
    return found


def resident_bytes() -> int:
    """This process's resident set size (``VmRSS``), in bytes."""
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


EXEC_START_S = 1.5
"""Extra seconds a test's deadline gives an exec-style child, a fresh interpreter: a test that
needs the child to reach its target (handlers armed) before the deadline must not race its
start-up on a loaded machine (or under mutmut, whose copy of ``_child.py`` imports mutmut)."""


def deadline_s(style: str, seconds: float) -> float:
    """``seconds``, plus :data:`EXEC_START_S` for the exec style."""
    return seconds + EXEC_START_S if style == "exec" else seconds


def children_of(pid: int) -> list[int]:
    """Pids of the children of process ``pid`` (its main thread's) that are alive (neither
    zombies nor gone), in no set order."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            found = [int(child) for child in children.read().split()]
    except FileNotFoundError:
        return []
    return [child for child in found if (_stat(child) or ("X",))[0] not in ("Z", "X")]


def open_fds() -> list[int]:
    """This process's open descriptors, sorted (the listing's own included: the same one each
    time, so two listings compare equal when nothing else was opened or closed)."""
    return sorted(int(name) for name in os.listdir("/proc/self/fd"))
