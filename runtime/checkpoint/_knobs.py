"""The runtime's knobs, read from the environment once per process.

=========================== ==========================================================
``DEVMEM_CKPT_POLICY``      the default checkpoint policy: ``all`` (default), ``boundary``,
                            ``sqrt``, ``every_n``, ``none``, ``sequential``, ``revolve``
``DEVMEM_CKPT_INTERVAL``    the policy's parameter: ``every_n``'s interval,
                            ``sequential``'s segments, ``revolve``'s snapshots; unset means
                            the policy's default. Ignored by the other policies
``DEVMEM_COMPILE_HEADROOM`` the compile-budget headroom, a fraction in (0, 1); default 0.1
=========================== ==========================================================

Like the allocator's ``DEVMEM_*`` variables they are parsed at the first use in a process and
never again; a forked child drops the cached value (``os.register_at_fork``) and reads its own
environment. A malformed value is one warning line on stderr naming the variable and the
default used instead, e.g. ``devmem: ignoring DEVMEM_CKPT_INTERVAL='0': expected a positive
decimal integer; using the policy's default``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import threading
from collections.abc import Callable, Mapping

from .._warnings import warn_once

__all__ = ["DEFAULT_HEADROOM", "POLICY_NAMES", "CheckpointKnobs", "knobs"]

DEFAULT_HEADROOM = 0.10
"""The compile-budget headroom used when a configured one is not in (0, 1) (the seed's 10%)."""

POLICY_NAMES = ("all", "boundary", "sqrt", "every_n", "none", "sequential", "revolve")
"""Checkpoint policy names, the seed's five first."""

_DIGITS = re.compile(r"[0-9]+")


@dataclasses.dataclass(frozen=True)
class CheckpointKnobs:
    """The runtime's knobs as one value.

    Attributes:
        policy: the default checkpoint policy's name (one of :data:`POLICY_NAMES`).
        interval: the policy's parameter, or ``None`` for its default.
        headroom: the compile-budget headroom, ``0 < headroom < 1``.
    """

    policy: str = "all"
    interval: int | None = None
    headroom: float = DEFAULT_HEADROOM

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        warn: Callable[[str], None] | None = None,
    ) -> CheckpointKnobs:
        """Parse the knobs from ``environ`` (default ``os.environ``).

        Unset or empty variables take their defaults. A malformed value is reported by one
        ``warn(line)`` call (default: the line on stderr, once per run:
        :func:`runtime._warnings.warn_once`) and replaced by the default; this
        never raises. Policy names are case-insensitive (``SQRT`` is ``sqrt``).
        """
        env = os.environ if environ is None else environ
        if warn is None:
            warn = warn_once

        def ignore(name: str, value: str, expected: str, fallback: str) -> None:
            warn(f"devmem: ignoring {name}={value!r}: expected {expected}; using {fallback}")

        policy = "all"
        raw = env.get("DEVMEM_CKPT_POLICY", "")
        if raw:
            if raw.lower() in POLICY_NAMES:
                policy = raw.lower()
            else:
                ignore("DEVMEM_CKPT_POLICY", raw, f"one of {', '.join(POLICY_NAMES)}", "all")
        interval = None
        raw = env.get("DEVMEM_CKPT_INTERVAL", "")
        if raw:
            if _DIGITS.fullmatch(raw) and int(raw) >= 1:
                interval = int(raw)
            else:
                ignore(
                    "DEVMEM_CKPT_INTERVAL",
                    raw,
                    "a positive decimal integer",
                    "the policy's default",
                )
        headroom = DEFAULT_HEADROOM
        raw = env.get("DEVMEM_COMPILE_HEADROOM", "")
        if raw:
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
            if 0 < value < 1:
                headroom = value
            else:
                ignore(
                    "DEVMEM_COMPILE_HEADROOM",
                    raw,
                    "a fraction between 0 and 1, exclusive",
                    f"{DEFAULT_HEADROOM:g}",
                )
        return cls(policy=policy, interval=interval, headroom=headroom)


_cached: CheckpointKnobs | None = None
_lock = threading.Lock()


def knobs() -> CheckpointKnobs:
    """The process's knobs, read from ``os.environ`` at the first call only (a warning, if any,
    is printed then, once). A forked child reads its own environment at its first call."""
    global _cached
    value = _cached
    if value is None:
        with _lock:
            if _cached is None:
                _cached = CheckpointKnobs.from_env()
            value = _cached
    return value


def _drop_in_child() -> None:
    global _cached, _lock
    _cached = None
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_drop_in_child)
