"""Fixtures of the runtime suites."""

from __future__ import annotations

import functools

import pytest

from ._knobs import pinned_env


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "interop: compares with a real third-party library (PyTorch); skips with the reason"
        " when it is not installed (ci/check.sh --interop installs it and runs -m interop)",
    )


@pytest.fixture
def pin(backend: str):
    """``pin(**knobs)``: :func:`pinned_env` for the backend under test."""
    return functools.partial(pinned_env, backend)
