"""Child environments that pin every ``DEVMEM_*`` knob."""

from __future__ import annotations

KNOBS = (
    "DEVMEM_BACKEND",
    "DEVMEM_CACHE_CAP_BYTES",
    "DEVMEM_ARENA_DEBUG",
    "DEVMEM_SIM_CAPACITY_BYTES",
    "DEVMEM_SIM_LATENCY_US",
    "DEVMEM_HISTORY",
    "DEVMEM_STREAM_CHECK",
)

SIM_LATENCY_US = 10
"""The suites' ``sim`` kernel latency (pytest's ``--sim-latency-us``, which the root conftest
sets here): :func:`pinned_env` gives it to a ``sim`` child that does not pin its own, and the
``make_alloc`` fixture to the allocators it builds, so that the race check runs in every ``sim``
item (with latency 0 no race can be seen)."""


def pinned_env(backend: str, **knobs: str | None) -> dict[str, str | None]:
    """An environment for a death-test child that pins every knob.

    ``DEVMEM_BACKEND`` is ``backend``; the knobs given (e.g. ``DEVMEM_ARENA_DEBUG="1"``) are
    set; on ``sim``, ``DEVMEM_SIM_LATENCY_US`` is :data:`SIM_LATENCY_US` unless given; on
    ``cuda``, ``DEVMEM_STREAM_CHECK`` is ``1`` (the stream check, aborting) unless given; every
    other knob is unset (``None``), so a child never inherits a setting from the parent
    (``ci/check.sh`` runs these suites with ``DEVMEM_ARENA_DEBUG=1 DEVMEM_CACHE_CAP_BYTES=1``
    exported).

    Raises:
        ValueError: a knob name is not one of :data:`KNOBS`.
    """
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise ValueError(f"pinned_env(): unknown knobs {unknown}; expected some of {KNOBS}")
    env: dict[str, str | None] = dict.fromkeys(KNOBS)
    env["DEVMEM_BACKEND"] = backend
    if backend == "sim":
        env["DEVMEM_SIM_LATENCY_US"] = str(SIM_LATENCY_US)
    elif backend == "cuda":
        env["DEVMEM_STREAM_CHECK"] = "1"  # the stream check, as sim's race check
    env.update(knobs)
    return env
