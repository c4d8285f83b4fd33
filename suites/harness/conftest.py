"""Fixtures of the harness self-tests."""

from __future__ import annotations

import pytest

import harness
from harness._forkserver import forkserver_preload

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


@pytest.fixture
def preloading():
    """``preloading(module)``: switch to this process's forkserver preload list plus
    ``module`` (a fresh zygote for it); the list is put back after the test."""
    before = list(forkserver_preload())

    def preload(module: str) -> None:
        harness.set_forkserver_preload([*before, module])

    try:
        yield preload
    finally:
        harness.set_forkserver_preload(before)


QUIET_PLUGINS = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")
"""Plugins a pytest subprocess of the self-tests does without (hypothesis costs ~0.6 s to load)."""


@pytest.fixture
def runpytest(pytester: pytest.Pytester):
    """``runpytest(*args)``: pytest in a subprocess of ``pytester``, without the plugins of
    :data:`QUIET_PLUGINS` (also in its xdist workers, which get the same arguments)."""

    def run(*args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess(*QUIET_PLUGINS, *args)

    return run
