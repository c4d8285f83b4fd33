"""Child environments that pin every knob the runtime suites depend on."""

from __future__ import annotations

from suites.allocator._knobs import pinned_env as pinned_allocator_env

RUNTIME_KNOBS = (
    "DEVMEM_CKPT_POLICY",
    "DEVMEM_CKPT_INTERVAL",
    "DEVMEM_COMPILE_HEADROOM",
    "DEVMEM_PIPELINE_KILL_AT",  # a test knob: a stray one would kill children
)


def pinned_env(backend: str, **knobs: str | None) -> dict[str, str | None]:
    """An environment that pins the allocator's knobs (``DEVMEM_BACKEND`` = ``backend``, the
    others unset) and the runtime's (those given set, the others unset), so a child never
    inherits a setting from the parent.

    Raises:
        ValueError: a knob name is not one of :data:`RUNTIME_KNOBS`.
    """
    unknown = sorted(set(knobs) - set(RUNTIME_KNOBS))
    if unknown:
        raise ValueError(f"pinned_env(): unknown knobs {unknown}; expected some of {RUNTIME_KNOBS}")
    env = pinned_allocator_env(backend)
    env.update(dict.fromkeys(RUNTIME_KNOBS))
    env.update(knobs)
    return env
