"""Fixtures of the harness self-tests."""

from __future__ import annotations

import pytest

import harness

RUN_STYLES = ("fork", "forkserver", "exec")


@pytest.fixture(params=RUN_STYLES)
def style(request: pytest.FixtureRequest) -> str:
    """Each concrete style in turn: a test that takes it runs once per style."""
    return request.param


@pytest.fixture
def run(style: str):
    """``run(target, *args, **kwargs)``: :func:`harness.run_child` in the style under test."""

    def run(target, *args, **kwargs) -> harness.Outcome:
        kwargs.setdefault("timeout", 30.0)
        return harness.run_child(target, *args, style=style, **kwargs)

    return run
