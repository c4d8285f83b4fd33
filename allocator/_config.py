"""The allocator's configuration: one frozen value, read from the environment once per process.

The process-wide default allocator builds its :class:`AllocatorConfig` from the environment at
first use and never re-reads it, like the native original, which parses its variables once. In a
forked child the cached value is dropped (``os.register_at_fork``), so the child re-reads its own
environment. Tests that need another configuration build ``Allocator(config=...)`` directly.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Callable, Mapping

from ._errors import ConfigError
from ._per_process import PerProcess

__all__ = [
    "ARENA_DEBUG_MODES",
    "BACKENDS",
    "HISTORY_MODES",
    "STREAM_CHECK_MODES",
    "AllocatorConfig",
    "default_config",
    "parse_cache_cap",
]

BACKENDS = ("cpu", "sim", "cuda")
"""Backend names, in the order suites run them."""

ARENA_DEBUG_MODES = ("off", "abort", "raise")
"""Use-after-free detector modes (``DEVMEM_ARENA_DEBUG``)."""

HISTORY_MODES = ("off", "on", "stacks")
"""Memory history modes (``DEVMEM_HISTORY``): off, on without stacks, on with stacks."""

STREAM_CHECK_MODES = ("off", "abort", "raise")
"""Stream race check modes (``DEVMEM_STREAM_CHECK``), as the detector's."""

_HISTORY_VALUES = {"": "off", "0": "off", "1": "on", "stacks": "stacks"}

_U64_MAX = (1 << 64) - 1
_DIGITS = re.compile(r"[0-9]+")
_GIB = 1 << 30


def parse_cache_cap(value: str | None) -> tuple[int, str | None]:
    """Parse a ``DEVMEM_CACHE_CAP_BYTES`` value.

    Args:
        value: the variable's text, or ``None`` when it is unset.

    Returns:
        ``(cap_bytes, warning)``. ``cap_bytes`` is 0 (unbounded) for an unset, empty or ``0``
        value and for anything malformed; ``warning`` is ``None`` unless the value was malformed,
        in which case it is the exact line of DESIGN 2.1. Only plain ASCII decimal digits whose
        value fits in 64 bits are accepted: ``1MiB``, ``-1``, ``0x10``, `` 1024`` (spaces) and a
        26-digit number all give the warning.
    """
    if value is None or value == "":
        return 0, None
    if _DIGITS.fullmatch(value) and int(value) <= _U64_MAX:
        return int(value), None
    warning = (
        f"devmem: ignoring DEVMEM_CACHE_CAP_BYTES={value!r}: expected an unsigned decimal byte"
        " count; the cache stays unbounded"
    )
    return 0, warning


def _parse_count(name: str, value: str | None, default: int, *, minimum: int) -> int:
    if value is None or value == "":
        return default
    if not _DIGITS.fullmatch(value) or int(value) < minimum:
        raise ConfigError(f"{name}={value!r}: expected a decimal integer >= {minimum}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class AllocatorConfig:
    """Every knob of an :class:`~allocator.Allocator`, as one immutable value.

    Attributes:
        backend: ``"cpu"`` (the NumPy stub, no reuse cache), ``"sim"`` (a simulated device with
            a capacity, a reuse cache and completion events) or ``"cuda"`` (CuPy).
            From ``DEVMEM_BACKEND``; default ``"cpu"``.
        cache_cap_bytes: the reuse cache's byte cap; 0 means unbounded.
            From ``DEVMEM_CACHE_CAP_BYTES`` (see :func:`parse_cache_cap`).
        arena_debug: the use-after-free detector: ``"off"``, ``"abort"`` (write the report to
            stderr and ``os.abort()``) or ``"raise"`` (raise :class:`UseAfterFreeError`).
            From ``DEVMEM_ARENA_DEBUG``: unset, empty or ``0`` is off, ``raise`` is raise, any
            other value is abort.
        sim_capacity_bytes: the simulated device's size in bytes (accounting only).
            From ``DEVMEM_SIM_CAPACITY_BYTES``; default 4 GiB.
        sim_latency_us: the simulated kernel latency in microseconds of the logical stream
            clock; 0 completes every kernel at once. From ``DEVMEM_SIM_LATENCY_US``.
        history: the memory history from the allocator's first allocation on: ``"off"``,
            ``"on"`` (events without stacks) or ``"stacks"`` (with the Python stack of each).
            From ``DEVMEM_HISTORY``: unset, empty or ``0`` is off, ``1`` on, ``stacks`` stacks.
        stream_check: the stream race check of the ``cuda`` backend (docs/streams-guide.md):
            ``"off"``, ``"abort"`` (write the race's line to stderr and ``os.abort()``) or
            ``"raise"`` (raise :class:`~allocator.StreamRaceError`). On ``sim`` the check runs
            whenever ``sim_latency_us`` > 0, and ``"raise"`` makes it raise there too. From
            ``DEVMEM_STREAM_CHECK``: unset, empty or ``0`` is off, ``raise`` is raise, any
            other value is abort.

    Raises:
        ValueError: a field is out of range or names an unknown backend or mode.
        TypeError: a numeric field is not an ``int``.
    """

    backend: str = "cpu"
    cache_cap_bytes: int = 0
    arena_debug: str = "off"
    sim_capacity_bytes: int = 4 * _GIB
    sim_latency_us: int = 0
    history: str = "off"
    stream_check: str = "off"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}: expected one of {', '.join(BACKENDS)}")
        if self.arena_debug not in ARENA_DEBUG_MODES:
            raise ValueError(
                f"arena_debug={self.arena_debug!r}: expected one of {', '.join(ARENA_DEBUG_MODES)}"
            )
        if self.stream_check not in STREAM_CHECK_MODES:
            raise ValueError(
                f"stream_check={self.stream_check!r}: expected one of"
                f" {', '.join(STREAM_CHECK_MODES)}"
            )
        if self.history not in HISTORY_MODES:
            raise ValueError(
                f"history={self.history!r}: expected one of {', '.join(HISTORY_MODES)}"
            )
        for name, low, high in (
            ("cache_cap_bytes", 0, _U64_MAX),
            ("sim_capacity_bytes", 1, _U64_MAX),
            ("sim_latency_us", 0, _U64_MAX),
        ):
            value = getattr(self, name)
            if type(value) is not int:
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
            if not low <= value <= high:
                raise ValueError(f"{name}={value}: expected {low} <= {name} <= 2**64-1")

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        warn: Callable[[str], None] | None = None,
    ) -> AllocatorConfig:
        """Build a configuration from ``DEVMEM_*`` variables.

        Args:
            environ: the variables to read; default ``os.environ``.
            warn: called with the warning line for a malformed ``DEVMEM_CACHE_CAP_BYTES``;
                default writes the line to ``sys.stderr``. The process-wide default
                configuration is read once, so the warning appears once per process.

        Raises:
            ConfigError: (a ``ValueError``) ``DEVMEM_BACKEND``, ``DEVMEM_SIM_CAPACITY_BYTES``,
                ``DEVMEM_SIM_LATENCY_US`` or ``DEVMEM_HISTORY`` holds a value it cannot use; the
                message names the variable. (A malformed cap is not an error: it warns and stays
                unbounded.)
        """
        env = os.environ if environ is None else environ
        backend = env.get("DEVMEM_BACKEND") or "cpu"
        if backend not in BACKENDS:
            raise ConfigError(f"DEVMEM_BACKEND={backend!r}: expected one of {', '.join(BACKENDS)}")
        cap, warning = parse_cache_cap(env.get("DEVMEM_CACHE_CAP_BYTES"))
        if warning is not None:
            if warn is None:
                print(warning, file=sys.stderr, flush=True)
            else:
                warn(warning)
        debug = env.get("DEVMEM_ARENA_DEBUG", "")
        mode = "off" if debug in ("", "0") else "raise" if debug == "raise" else "abort"
        check = env.get("DEVMEM_STREAM_CHECK", "")
        stream_check = "off" if check in ("", "0") else "raise" if check == "raise" else "abort"
        history = env.get("DEVMEM_HISTORY", "")
        if history not in _HISTORY_VALUES:
            raise ConfigError(f"DEVMEM_HISTORY={history!r}: expected 0, 1 or stacks")
        return cls(
            backend=backend,
            cache_cap_bytes=cap,
            arena_debug=mode,
            sim_capacity_bytes=_parse_count(
                "DEVMEM_SIM_CAPACITY_BYTES",
                env.get("DEVMEM_SIM_CAPACITY_BYTES"),
                4 * _GIB,
                minimum=1,
            ),
            sim_latency_us=_parse_count(
                "DEVMEM_SIM_LATENCY_US", env.get("DEVMEM_SIM_LATENCY_US"), 0, minimum=0
            ),
            history=_HISTORY_VALUES[history],
            stream_check=stream_check,
        )


_default = PerProcess(AllocatorConfig.from_env)


def default_config() -> AllocatorConfig:
    """The process-wide configuration, read from ``os.environ`` at the first call only.

    A forked child drops the cached value and reads its own environment at its first call.

    Raises:
        ValueError: as :meth:`AllocatorConfig.from_env`.
    """
    return _default.get()
