"""The CUDA backend on CuPy (placeholder until the CUDA issue lands)."""

from __future__ import annotations

from .._errors import BackendUnavailable
from .base import Device

__all__ = ["CudaDevice"]


class CudaDevice(Device):
    """Not available yet."""

    name = "cuda"

    def __init__(self) -> None:
        raise BackendUnavailable("the cuda backend is not built yet")
