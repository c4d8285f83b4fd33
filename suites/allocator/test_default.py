"""The process-wide default allocator: configuration read once per process, re-read in a fork
child, module-level functions, silent finalizers at interpreter exit, the public surface."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest

import allocator
import harness
from allocator._per_process import PerProcess
from allocator.device import backend_unavailable_reason

from . import _default_probes
from ._knobs import pinned_env

WARNING = (
    "devmem: ignoring DEVMEM_CACHE_CAP_BYTES='1MiB': expected an unsigned decimal byte count;"
    " the cache stays unbounded"
)


def test_the_environment_is_read_once_and_the_warning_printed_once(death):
    env = pinned_env("sim", DEVMEM_CACHE_CAP_BYTES="1MiB")
    outcome = death.run(_default_probes.read_twice, env=env).assert_clean()
    assert outcome.returned == {"backend": "sim", "cap": 0, "same": True}
    assert outcome.stderr.count(WARNING) == 1


def test_a_fork_child_rereads_its_own_environment():
    allocator.get_allocator()  # the parent's default allocator exists and is cached
    try:
        outcome = harness.run_child(
            _default_probes.default_backend, env=pinned_env("sim"), style="fork"
        )
    except harness.HarnessError as exc:  # a CUDA test marked this process fork-unsafe
        pytest.skip(f"fork refused in this process: {exc}")
    assert outcome.assert_clean().returned == "sim"


@pytest.mark.parametrize(
    ("device", "cap", "expected"),
    [
        ("sim", "1048576", {"cache_bytes": 1048576, "cap_evictions": 28}),
        ("sim", "0", {"cache_bytes": 8388608, "cap_evictions": 0}),
        ("cpu", "1048576", {"cache_bytes": 0, "cap_evictions": 0}),
        ("cpu", "0", {"cache_bytes": 0, "cap_evictions": 0}),
    ],
)
def test_done_when_cache_cap_in_a_fresh_interpreter(device, cap, expected):
    env = pinned_env(device, DEVMEM_CACHE_CAP_BYTES=cap)
    outcome = harness.run_child(_default_probes.done_when_cache_cap, env=env, style="exec")
    assert outcome.assert_clean().returned == expected


FINALIZE_AT_EXIT = """
import allocator as dm
kept = [dm.full(16, 1.0) for _ in range(8)]
view = kept[0].view(2, 4)
dm.arena_enter()  # left open on purpose
inside = [dm.full(32, 2.0) for _ in range(8)]
cycle = [dm.full(8, 3.0)]
cycle.append(cycle)
"""


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_finalizers_are_silent_at_interpreter_exit(device):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVMEM_")}
    env["DEVMEM_BACKEND"] = device
    result = subprocess.run(
        [sys.executable, "-c", FINALIZE_AT_EXIT],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert (result.returncode, result.stderr) == (0, "")


def test_every_public_name_is_exported_once_and_documented():
    package = allocator  # harness checks its own in suites/harness/test_plumbing.py
    names = package.__all__
    assert len(names) == len(set(names)), "a name is exported twice"
    for name in names:
        value = getattr(package, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert inspect.getdoc(value), f"{package.__name__}.{name} has no docstring"
        if inspect.isclass(value):
            assert value.__module__ == package.__name__, f"{name} reports {value.__module__}"


def test_module_level_functions_forward_to_the_default_allocator():
    methods = {
        name
        for name, _ in inspect.getmembers(allocator.Allocator, inspect.isfunction)
        if not name.startswith("_") and "__mutmut_" not in name  # mutmut's mutant copies
    }
    functions = {name for name in allocator.__all__ if inspect.isfunction(getattr(allocator, name))}
    assert methods <= functions, f"methods without a module-level function: {methods - functions}"
    for name in methods:
        doc = inspect.getdoc(getattr(allocator, name))
        assert doc.startswith("On the default allocator:"), name


def test_a_per_process_value_is_built_once_and_again_in_a_forked_child(death):
    built = []

    def factory() -> int:
        built.append(len(built) + 1)
        return built[-1]

    value = PerProcess(factory)
    assert (value.get(), value.get(), built) == (1, 1, [1])

    def in_child() -> list[int]:
        return [value.get(), value.get()]  # dropped at the fork: built anew, once

    assert death.run(in_child, style="fork").assert_clean().returned == [2, 2]
    assert value.get() == 1


def test_backend_names_are_checked():
    assert backend_unavailable_reason("cpu") is None and backend_unavailable_reason("sim") is None
    with pytest.raises(ValueError) as info:
        backend_unavailable_reason("tpu")
    assert str(info.value) == "backend='tpu': expected one of cpu, sim, cuda"
