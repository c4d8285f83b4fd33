"""The CI tooling's tests, and what several of them share."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def read_toml(path: Path) -> dict:
    """``path`` parsed (``tomllib`` from Python 3.11; ``tomli`` before, or the calling test
    skips: the check is in the test, not at import, so a module's other tests still run)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover (Python 3.10)
        import pytest

        tomllib = pytest.importorskip("tomli")
    return tomllib.loads(path.read_text())


def path_without_a_driver(tmp_path) -> str:
    """A ``PATH`` for a subprocess on which ``nvidia-smi`` is not found, whatever this machine
    has: ``/usr/bin`` and ``/bin`` (where a GPU machine's driver puts it) mirrored into
    ``tmp_path / "no-driver"`` by symlinks, less ``nvidia-smi``; and this interpreter's own
    directory first (a venv's)."""
    mirror = tmp_path / "no-driver"
    mirror.mkdir()
    for directory in ("/usr/bin", "/bin"):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            if name != "nvidia-smi" and not (mirror / name).exists():
                (mirror / name).symlink_to(os.path.join(directory, name))
    return os.pathsep.join([os.path.dirname(sys.executable), str(mirror)])
