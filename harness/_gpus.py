"""One GPU per pytest-xdist worker, through ``CUDA_VISIBLE_DEVICES``.

``pytest -n N --gpus auto`` (or ``--gpus 4``, or ``--gpus 0,2``) pins each worker to one GPU,
chosen from its worker id (``gw3`` takes the fourth GPU of the list, modulo its length), before
any test can initialize CUDA; death-test children inherit the variable. GPUs are listed with
``nvidia-smi -L``, never with a CUDA call, so listing them does not make the process
fork-unsafe. Each worker lists the GPUs of its own machine, so the same option works for
remote workers (``--tx 4*ssh=host//python=...``).
"""

from __future__ import annotations

import re

from devmem_gpus import VISIBLE, list_gpus
from harness._errors import HarnessError

__all__ = ["VISIBLE", "gpu_for_worker", "list_gpus", "resolve_gpus"]


def resolve_gpus(spec: str) -> list[str]:
    """The GPU list a ``--gpus`` value names.

    Args:
        spec: ``auto`` (every GPU :func:`list_gpus` finds), a count ``N`` (GPUs ``0..N-1``), or
            a comma-separated list of ids (``0,2`` or GPU UUIDs).

    Raises:
        HarnessError: ``spec`` is empty, a count below 1, or a list with an entry that is
            neither an index nor a GPU/MIG UUID (``banana``, ``1.5``), or ``auto`` finds no GPU (the
            message says why).
    """
    spec = spec.strip()
    if spec == "auto":
        ids, reason = list_gpus()
        if not ids:
            raise HarnessError(f"--gpus auto found no GPU: {reason}")
        return ids
    if spec.isdigit():
        if int(spec) < 1:
            raise HarnessError(f"--gpus {spec}: expected a count >= 1, 'auto' or a list of ids")
        return [str(i) for i in range(int(spec))]
    ids = [part.strip() for part in spec.split(",")]
    bad = [part for part in ids if not _GPU_ID.fullmatch(part)]
    if bad:
        raise HarnessError(
            f"--gpus {spec!r}: expected 'auto', a count N >= 1, or a comma-separated list of"
            " GPU indices or UUIDs (e.g. 0,2 or GPU-8e3f...); "
            + (f"{bad[0]!r} is neither" if any(ids) else "got nothing")
        )
    return ids


_GPU_ID = re.compile(r"\d+|(?:GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]*")
"""What ``CUDA_VISIBLE_DEVICES`` accepts per entry: an index, or a GPU or MIG UUID."""


def gpu_for_worker(worker_id: str | None, gpus: list[str]) -> str:
    """The GPU of an xdist worker: ``gw<i>`` takes ``gpus[i % len(gpus)]``; a process that is
    not a worker (``worker_id`` None) takes the first.

    Raises:
        HarnessError: ``gpus`` is empty, or ``worker_id`` is not of the form ``gw<i>``.
    """
    if not gpus:
        raise HarnessError("no GPU to pin to")
    if worker_id is None:
        return gpus[0]
    match = re.fullmatch(r"gw(\d+)", worker_id)
    if match is None:
        raise HarnessError(f"unexpected xdist worker id {worker_id!r}; expected gw<number>")
    return gpus[int(match.group(1)) % len(gpus)]
