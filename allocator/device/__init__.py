"""Backends: the raw devices under the allocator (``cpu``, ``sim``, ``cuda``).

:func:`make_device` builds the one a configuration names. See :mod:`allocator.device.base` for
the interface and the order of calls every backend keeps.
"""

from __future__ import annotations

import importlib.util

from .._config import AllocatorConfig
from .base import Block, Device, DeviceAllocationError
from .cpu import CpuDevice
from .sim import SimDevice

__all__ = [
    "Block",
    "CpuDevice",
    "Device",
    "DeviceAllocationError",
    "SimDevice",
    "backend_unavailable_reason",
    "make_device",
]


def make_device(config: AllocatorConfig) -> Device:
    """Build the backend that ``config.backend`` names.

    Raises:
        BackendUnavailable: the backend cannot run on this machine (``cuda`` without CuPy, a
            driver or a GPU); the message gives the reason.
    """
    if config.backend == "cpu":
        return CpuDevice()
    if config.backend == "sim":
        return SimDevice(config.sim_capacity_bytes, config.sim_latency_us)
    from .cuda import CudaDevice  # imported lazily: CuPy is an optional extra

    return CudaDevice()


def backend_unavailable_reason(backend: str) -> str | None:
    """Why ``backend`` cannot run here, or ``None`` if it can; never initializes CUDA.

    ``cpu`` and ``sim`` always run. For ``cuda`` it checks that CuPy is installed and that a GPU
    is visible (:func:`harness.list_gpus`: ``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi -L``), so
    that a pytest parent can decide to skip without creating a CUDA context (which would make
    forking it unsafe).

    Raises:
        ValueError: ``backend`` is not a known backend name.
    """
    if backend in ("cpu", "sim"):
        return None
    if backend != "cuda":
        raise ValueError(f"backend={backend!r}: expected one of cpu, sim, cuda")
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install 'devmem-harness[cuda]')"
    import harness

    gpus, reason = harness.list_gpus()
    return None if gpus else reason
