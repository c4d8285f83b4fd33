"""One warning line per run, also across ``exec()`` restarts.

A knob's bad value is one warning line on stderr (``devmem: ignoring DEVMEM_CKPT_POLICY=...``).
The knobs are read once per process, and the pipeline's ``train`` is several processes, one
``os.execv`` after another: each new process image would print the same line again. So a line
printed here is remembered, and :func:`handover` puts what was printed into the environment
(``RUNTIME_WARNED``, one line per line; not a knob) just before an ``exec()``, for the next
image to stay quiet about. A forked child starts afresh, like the knobs' cache: it prints
its own warnings.
"""

from __future__ import annotations

import os
import sys
import threading

__all__ = ["WARNED_ENV", "handover", "warn_once"]

WARNED_ENV = "RUNTIME_WARNED"
"""The warning lines printed earlier in this run, handed to a new process image by
:func:`handover` (not a knob: the process that reads it removes it from its environment)."""

_printed: set[str] | None = None
_lock = threading.Lock()


def _load() -> set[str]:
    global _printed
    if _printed is None:
        inherited = os.environ.pop(WARNED_ENV, "")
        _printed = {line for line in inherited.split("\n") if line}
    return _printed


def warn_once(line: str) -> None:
    """Print ``line`` on stderr, unless this run printed it already (in this process, or in
    one that ``exec()``-ed into it after :func:`handover`)."""
    with _lock:
        printed = _load()
        if line in printed:
            return
        printed.add(line)
    print(line, file=sys.stderr, flush=True)


def handover() -> None:
    """Put the lines printed so far into ``os.environ`` for the image an ``exec()`` starts."""
    with _lock:
        printed = _load()
        if printed:
            os.environ[WARNED_ENV] = "\n".join(sorted(printed))


def _drop_in_child() -> None:
    global _printed, _lock
    _printed = None
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_drop_in_child)
