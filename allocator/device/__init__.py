"""Backends: the raw devices under the allocator (``cpu``, ``sim``, ``cuda``).

:func:`make_device` builds the one a configuration names. See :mod:`allocator.device.base` for
the interface and the order of calls every backend keeps.
"""

from __future__ import annotations

from .._config import AllocatorConfig
from .base import Block, Device, DeviceAllocationError
from .cpu import CpuDevice
from .sim import SimDevice

__all__ = ["Block", "CpuDevice", "Device", "DeviceAllocationError", "SimDevice", "make_device"]


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
