"""Leaks: a process that left the child's process group and still holds its output.

After a child has ended, its process group is killed (grandchildren included) and the
parent reads its stdout and stderr to their end. A grandchild that left the group (``setsid``,
or ``setpgid`` to a group of its own) escapes that kill; if it still holds the child's stdout
or stderr, the pipe has a writer left, and what it writes from then on is lost. cargo-nextest
calls such a test *leaky* and says so; here it is a note of the outcome naming the process.
"""

from __future__ import annotations

import os
import select
import time

GRACE_S = 0.2
"""Seconds a pipe's writers get to close it after the child ended (the group kill's victims
are dying; the zygote closes its copies once it has reported the child's end)."""


def leak_notes(streams: tuple, child_pid: int | None, ours: tuple[int, ...] = ()) -> list[str]:
    """Notes naming the processes outside the child's process group that still hold one of
    ``streams`` (the capture's ``Stream`` objects: ``name``, ``read_fd``, ``eof``) open for
    writing, once the child has ended.

    Args:
      streams: the child's stdout and stderr streams.
      child_pid: the child's pid (its process group's id).
      ours: pids whose children are the harness's own (the zygote's): a sibling child started
        meanwhile by another thread may hold the pipe until it has closed what it inherited,
        and is no leak.

    Returns:
      One note per stream held, or none (the usual case costs one ``poll`` per stream).
    """
    notes = []
    for stream in streams:
        if stream.eof or stream.read_fd < 0 or stream.write_fd is not None:
            continue
        if _writers_gone(stream.read_fd):
            continue
        holders = _holders(stream.read_fd, child_pid, (os.getpid(), *ours))
        if holders:
            names = ", ".join(f"{pid} ({name})" for pid, name in holders)
            notes.append(
                f"devmem-harness: the child's {stream.name} is still held open by "
                f"{names}, outside its process group (left with setsid or setpgid): it "
                "outlived the child and the group kill did not reach it (a leak); what it "
                "writes now is not kept"
            )
    return notes


def _writers_gone(fd: int) -> bool:
    """Whether every writer of the pipe read on ``fd`` has closed it, within :data:`GRACE_S`."""
    poller = select.poll()
    poller.register(fd, select.POLLHUP)
    until = time.monotonic() + GRACE_S
    while True:
        events = poller.poll(max(0.0, until - time.monotonic()) * 1000)
        if any(mask & (select.POLLHUP | select.POLLERR) for _, mask in events):
            return True
        if time.monotonic() >= until:
            return False
        if events:  # data waiting (POLLIN): poll reports it at once, so look again shortly
            time.sleep(0.01)


def _holders(fd: int, group: int | None, parents: tuple[int, ...]) -> list[tuple[int, str]]:
    """``(pid, command name)`` of the processes, other than ``parents`` and their children,
    outside process group ``group``, that have the pipe of ``fd`` open."""
    try:
        wanted = f"pipe:[{os.fstat(fd).st_ino}]"
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    found = []
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            held = any(
                os.readlink(f"/proc/{pid}/fd/{name}") == wanted
                for name in os.listdir(f"/proc/{pid}/fd")
            )
            if not held:
                continue
            with open(f"/proc/{pid}/stat", "rb") as stat:
                text = stat.read()
        except OSError:  # gone, or not ours to look at
            continue
        name = text[text.index(b"(") + 1 : text.rindex(b")")].decode(errors="replace")
        fields = text.rsplit(b")", 1)[1].split()
        ppid, pgrp = int(fields[1]), int(fields[2])
        if pid in parents or ppid in parents or pgrp == group:  # the zygote closes its copies
            continue  # once it has reported the child's end: late, on a loaded machine
        found.append((pid, name))
    return found
