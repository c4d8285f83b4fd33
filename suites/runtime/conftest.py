"""Fixtures of the runtime suites."""

from __future__ import annotations

import functools

import pytest

from ._knobs import pinned_env


@pytest.fixture
def pin(backend: str):
    """``pin(**knobs)``: :func:`pinned_env` for the backend under test."""
    return functools.partial(pinned_env, backend)
