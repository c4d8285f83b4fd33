"""What every ``python -m`` command line of the project does with the project's own errors.

A bad ``DEVMEM_*`` value (:class:`~allocator.ConfigError`), an unavailable backend, a device
that runs out of memory (``DEVMEM_SIM_CAPACITY_BYTES=100``) or a stream race in ``raise`` mode
is the user's setting or the workload's limit, not a bug of the command: it is one line on
stderr, ``<prog>: error: <ExceptionType>: <message>``, and exit status 1, never a traceback.
Anything else (a bug) keeps its traceback. A closed stdout (``| head``) ends the command
quietly, as ``cat`` does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from ._errors import AllocatorError
from .device._happens_before import StreamRaceError

__all__ = ["ERRORS", "run_command"]

ERRORS: tuple[type[BaseException], ...] = (AllocatorError, StreamRaceError)
"""The allocator's errors that a command line reports in one line."""


def one_line(exc: BaseException) -> str:
    """``ExceptionType: message``, the message's lines joined by ``; ``."""
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_command(
    main: Callable[[], int | None],
    prog: str,
    errors: tuple[type[BaseException], ...] = (),
) -> int:
    """Run a command line's ``main()`` and return its exit status.

    Args:
        main: the command line; returns its exit status (``None`` is 0).
        prog: how the user called it, e.g. ``"python -m runtime.ring"``; starts the error line.
        errors: the caller's own error types to report the same way, beside :data:`ERRORS`.

    Returns:
        ``main()``'s status; 1 after one error line for an error of :data:`ERRORS` or
        ``errors``, or when stdout was closed early.
    """
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:  # stdout closed early (`| head`): exit quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (*ERRORS, *errors) as exc:
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr, flush=True)
        return 1
    return 0 if status is None else status
