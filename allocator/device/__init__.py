"""Backends: the raw devices under the allocator (``cpu``, ``sim``, ``cuda``).

:func:`make_device` builds the one a configuration names. See :mod:`allocator.device.base` for
the interface and the order of calls every backend keeps.
"""

from __future__ import annotations

import importlib.util

from devmem_gpus import list_gpus

from .._config import AllocatorConfig
from .base import Block, Device, DeviceAllocationError, fork_unsafe_reason
from .cpu import CpuDevice
from .sim import SimDevice

__all__ = [
    "Block",
    "CpuDevice",
    "Device",
    "DeviceAllocationError",
    "SimDevice",
    "backend_unavailable_reason",
    "fork_unsafe_reason",
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
        return SimDevice(
            config.sim_capacity_bytes, config.sim_latency_us, config.stream_check == "raise"
        )
    from .cuda import CudaDevice  # imported lazily: CuPy is an optional extra

    return CudaDevice(stream_check=config.stream_check, stacks=config.history == "stacks")


def backend_unavailable_reason(backend: str) -> str | None:
    """Why ``backend`` cannot run here, or ``None`` if it can; never initializes CUDA here.

    ``cpu`` and ``sim`` always run. For ``cuda``, in order: CuPy must be installed; a GPU must
    be visible (``nvidia-smi -L`` and ``CUDA_VISIBLE_DEVICES``, :func:`devmem_gpus.list_gpus`);
    and a child interpreter must compile and run one tiny kernel
    (:func:`allocator.device.cuda.kernel_probe_reason`), so that a missing NVRTC or a broken
    driver makes the backend unavailable, with the reason, instead of failing mid-suite. The
    kernel runs in a child so that this process (a pytest parent that forks death tests) never
    creates a CUDA context. Call it once per process and keep the answer: the child takes a
    few seconds.

    Raises:
        ValueError: ``backend`` is not a known backend name.
    """
    if backend in ("cpu", "sim"):
        return None
    if backend != "cuda":
        raise ValueError(f"backend={backend!r}: expected one of cpu, sim, cuda")
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install 'devmem-harness[cuda]')"
    gpus, reason = list_gpus()
    if not gpus:
        return reason
    from .cuda import kernel_probe_reason  # imports no CuPy itself

    return kernel_probe_reason()
