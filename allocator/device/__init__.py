"""Backends: the raw devices under the allocator (``cpu``, ``sim``, ``cuda``).

:func:`make_device` builds the one a configuration names. See :mod:`allocator.device.base` for
the interface and the order of calls every backend keeps.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess

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

    ``cpu`` and ``sim`` always run. For ``cuda`` it checks that CuPy is installed and that
    ``nvidia-smi -L`` lists a GPU, so that a pytest parent can decide to skip without creating
    a CUDA context (which would make forking it unsafe).

    Raises:
        ValueError: ``backend`` is not a known backend name.
    """
    if backend in ("cpu", "sim"):
        return None
    if backend != "cuda":
        raise ValueError(f"backend={backend!r}: expected one of cpu, sim, cuda")
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install 'devmem-harness[cuda]')"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no NVIDIA driver: nvidia-smi is not on PATH"
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi -L failed: {exc}"
    if listing.returncode != 0 or "GPU" not in listing.stdout:
        detail = (listing.stderr or listing.stdout).strip() or f"exit status {listing.returncode}"
        return f"no GPU visible to nvidia-smi -L ({detail})"
    return None
