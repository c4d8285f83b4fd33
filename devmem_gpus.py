"""The GPUs this process may use, listed without initializing CUDA.

Shared by the allocator (whose ``cuda`` backend is unavailable where no GPU is visible) and the
harness (``--gpus auto``), which must not import each other. It asks ``nvidia-smi -L``, never a
CUDA call, so listing GPUs does not make the process unsafe to fork.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

__all__ = ["VISIBLE", "list_gpus"]

VISIBLE = "CUDA_VISIBLE_DEVICES"


def list_gpus() -> tuple[list[str], str | None]:
    """The GPUs this process may use, without initializing CUDA.

    Returns:
        ``(ids, None)`` when ``nvidia-smi -L`` lists at least one GPU: the ids in
        ``CUDA_VISIBLE_DEVICES`` when it is set, else the indices listed. Otherwise
        ``([], reason)`` saying why there are none (no driver, ``nvidia-smi`` failed, no GPU
        listed, ``CUDA_VISIBLE_DEVICES`` set but empty).
    """
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "no NVIDIA driver: nvidia-smi is not on PATH"
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"nvidia-smi -L failed: {exc}"
    ids = re.findall(r"^GPU (\d+):", listing.stdout, flags=re.MULTILINE)
    if listing.returncode != 0 or not ids:
        detail = (listing.stderr or listing.stdout).strip() or f"exit status {listing.returncode}"
        return [], f"no GPU visible to nvidia-smi -L ({detail})"
    visible = os.environ.get(VISIBLE)
    if visible is not None:
        ids = [part.strip() for part in visible.split(",") if part.strip()]
        if not ids:
            return [], f"{VISIBLE} is set but empty"
    return ids, None
