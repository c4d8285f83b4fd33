"""Every ``python -m`` command line of the project, under every knob's bad value.

A bad ``DEVMEM_*`` value is the user's setting, and a device out of memory the workload's
limit: each command line says so in one line on stderr, ``<prog>: error: ...``, with exit status
1, never with a traceback. A knob whose bad value is a warning prints it once per run, however
many processes the run is (the pipeline's ``exec()`` restarts). The entry points are found, not
listed: a new one without a command here fails :func:`test_every_entry_point_is_exercised`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import allocator
from runtime import ring

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("allocator", "harness", "runtime")


def _entry_points() -> set[str]:
    """``python -m`` modules of the packages: a package's ``__main__.py``, or a public module
    with an ``if __name__ == "__main__":`` block (private ones, ``_zygote``, are internals)."""
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if path.name == "__main__.py":
                found.add(module.rpartition(".")[0])
            elif not any(part.startswith("_") for part in path.relative_to(ROOT).parts) and (
                re.search(r"^if __name__ == .__main__.:", path.read_text(), re.M)
            ):
                found.add(module)
    return found


# module -> (arguments; whether the command builds the default allocator from DEVMEM_*)
COMMANDS = {
    "runtime.ring": (["run", "--workload", "tiles", "--k", "4"], True),
    "runtime.pipeline": (["plan", "--model", "stories42m", "--checkpoint", "sqrt"], False),
    "allocator.memory": (["summary", "{snapshot}"], False),
}

# knob -> a bad value, and what it does (DESIGN 2.1, the README's knobs table)
ERROR_KNOBS = {  # ConfigError where the allocator is built
    "DEVMEM_BACKEND": "gpu",
    "DEVMEM_SIM_CAPACITY_BYTES": "4GiB",
    "DEVMEM_SIM_LATENCY_US": "-1",
    "DEVMEM_HISTORY": "yes",
}
WARNING_KNOBS = {  # one warning line, then the default
    "DEVMEM_CACHE_CAP_BYTES": "1MiB",
    "DEVMEM_CKPT_POLICY": "bogus",
    "DEVMEM_CKPT_INTERVAL": "0",
    "DEVMEM_COMPILE_HEADROOM": "2",
    "DEVMEM_PIPELINE_KILL_AT": "soon",
}
ON_KNOBS = {"DEVMEM_ARENA_DEBUG": "yes", "DEVMEM_STREAM_CHECK": "yes"}  # a check turned on
SETTINGS = [  # each error alone; the warnings and checks together (each warns at most once)
    *({k: v} for k, v in ERROR_KNOBS.items()),
    {**WARNING_KNOBS, **ON_KNOBS},
    {"DEVMEM_BACKEND": "sim", "DEVMEM_SIM_CAPACITY_BYTES": "100"},  # out of device memory
]


def _env(settings: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVMEM_", "COV_"))}
    return {**env, **settings}


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory) -> str:
    alloc = allocator.Allocator(allocator.AllocatorConfig(backend="sim"))
    with alloc.history():
        kept = alloc.full(16, 1.0)
    path = tmp_path_factory.mktemp("entry") / "s.pickle"
    alloc.dump_snapshot(path)
    del kept
    return str(path)


def test_every_entry_point_is_exercised():
    assert _entry_points() == set(COMMANDS), "add the new entry point's command to COMMANDS"


def test_every_knob_has_a_bad_value_here():
    from suites.docs.test_knobs import knobs_in_code

    assert {**ERROR_KNOBS, **WARNING_KNOBS, **ON_KNOBS}.keys() == knobs_in_code()


def _check_one_line(result: subprocess.CompletedProcess, prog: str, where: str) -> None:
    assert "Traceback" not in result.stderr, f"{where}: a traceback:\n{result.stderr}"
    assert result.returncode in (0, 1), f"{where}: exit status {result.returncode}"
    if result.returncode == 1:
        errors = [line for line in result.stderr.splitlines() if ": error: " in line]
        assert len(errors) == 1 and errors[0].startswith(f"{prog}: error: "), (
            f"{where}: not one error line:\n{result.stderr}"
        )


@pytest.mark.parametrize("module", sorted(COMMANDS))
@pytest.mark.parametrize(
    "settings", SETTINGS, ids=lambda s: " ".join(f"{k}={v}" for k, v in s.items())
)
def test_a_bad_setting_is_one_line_never_a_traceback(module, settings, snapshot):
    args, builds_allocator = COMMANDS[module]
    args = [a.format(snapshot=snapshot) for a in args]
    prog = f"python -m {module}"
    result = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    where = f"{' '.join(f'{k}={v}' for k, v in settings.items())} {prog} {' '.join(args)}"
    _check_one_line(result, prog, where)
    warnings = [line for line in result.stderr.splitlines() if line.startswith("devmem: ignoring")]
    assert len(warnings) == len(set(warnings)), f"{where}: a warning repeated:\n{result.stderr}"
    if set(settings) <= set(WARNING_KNOBS) | set(ON_KNOBS):
        assert result.returncode == 0, f"{where}: a warning knob stopped the command"
    elif builds_allocator:
        assert result.returncode == 1, f"{where}: the bad setting went unnoticed"
        name = "ConfigError" if len(settings) == 1 else "DeviceOutOfMemory"
        assert f"{prog}: error: {name}: " in result.stderr, result.stderr


def test_ring_backend_option_honours_the_other_knobs(monkeypatch):
    """``--backend sim`` is ``DEVMEM_BACKEND=sim``: one configuration path, so the simulated
    device's size (and every other knob) comes from the environment either way."""
    argv = ["run", "--workload", "tiles", "--k", "4", "--backend", "sim"]
    monkeypatch.setenv("DEVMEM_SIM_CAPACITY_BYTES", "100")
    with pytest.raises(allocator.DeviceOutOfMemory, match="device_total=100"):
        ring.main(argv)
    monkeypatch.setenv("DEVMEM_SIM_CAPACITY_BYTES", "4GiB")
    with pytest.raises(allocator.ConfigError, match="DEVMEM_SIM_CAPACITY_BYTES='4GiB'"):
        ring.main(argv)


def test_a_warning_is_printed_once_per_run_across_exec_restarts(tmp_path):
    """``train`` is one process image after another (two ``exec()`` restarts here); each
    reads the knobs afresh, and the run still prints each warning once."""
    settings = {"DEVMEM_CKPT_POLICY": "bogus", "DEVMEM_PIPELINE_KILL_AT": "soon"}
    args = ["train", "--layers", "1", "--budget", "50", "--steps", "1", "--dry-run", "--sparse"]
    args += ["--headroom", "5", "--state", str(tmp_path / "run.state")]
    result = subprocess.run(
        [sys.executable, "-m", "runtime.pipeline", *args],
        cwd=ROOT,
        env=_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert '"restarts": 2' in result.stdout
    warnings = [line for line in result.stderr.splitlines() if not line.startswith("[pipeline]")]
    assert sorted(warnings) == [
        "devmem: ignoring DEVMEM_CKPT_POLICY='bogus': expected one of all, boundary, sqrt,"
        " every_n, none, sequential, revolve; using all",
        "devmem: ignoring DEVMEM_PIPELINE_KILL_AT='soon': expected GEN:POINT with POINT one of"
        " create, journal, journaled, write, written, header, committed; not killing",
        "python -m runtime.pipeline: warning: --headroom 5.0 is not in (0, 1); using 0.1",
    ], result.stderr
