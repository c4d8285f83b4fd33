"""OOM flush on a small ``sim`` device, a child per configuration: a device allocation failure
flushes the reuse cache (waiting on events) and retries once; a request that can never fit
raises ``DeviceOutOfMemory`` with every field of DESIGN 2.4 and changes no live count."""

from __future__ import annotations

import re

import pytest

import harness
from harness import Config, Outcome

from . import _probes
from ._knobs import pinned_env

MIB = 1 << 20
SMALL_DEVICE = {"DEVMEM_SIM_CAPACITY_BYTES": str(MIB)}
FIELDS = ["requested", "live", "peak", "allocs", "frees", "cache", "device_free", "device_total"]


def check_fits_after_flush(outcome: Outcome) -> None:
    outcome.assert_clean()
    report = outcome.returned
    stats = report["stats"]
    assert report["size"] == 131072 and report["sum"] == 131072.0
    assert stats["oom_flushes"] == 1, f"oom_flushes is {stats['oom_flushes']}, expected 1"
    assert (stats["cache_bytes"], stats["live_bytes"]) == (0, MIB // 2)
    assert stats["device_frees"] == 4


def check_never_fits(outcome: Outcome) -> None:
    outcome.assert_clean()
    report = outcome.returned
    assert report["error"] == "DeviceOutOfMemory" and report["is_memory_error"]
    assert report["requested_bytes"] == 2 * MIB
    values = dict(re.findall(r"(\w+)=(\d+)", report["message"]))
    assert sorted(values) == sorted(FIELDS), report["message"]
    stats = report["stats"]
    assert values == {
        "requested": str(2 * MIB),
        "live": "64",
        "peak": "64",
        "allocs": "1",
        "frees": "0",
        "cache": "0",
        "device_free": str(MIB - 64),
        "device_total": str(MIB),
    }
    assert report["message"].startswith("out of device memory on sim: requested=2097152 bytes")
    assert report["live_before"] == report["live_after"] == stats["live_bytes"] == 64
    assert stats["oom_flushes"] == 1 and report["held"] == 16.0


CASES = {"fits-after-flush": check_fits_after_flush, "never-fits": check_never_fits}


@harness.matrix([Config(case, SMALL_DEVICE) for case in CASES])
def test_oom_flush(death, config):
    outcome = death.run(
        _probes.oom_flush, config.id, config=config, env=pinned_env("sim", **config.env)
    )
    CASES[config.id](outcome)


def test_teeth_an_allocator_that_never_flushes_is_caught(death):
    outcome = death.run(
        _probes.oom_flush, "fits-after-flush", "no_oom_flush", env=pinned_env("sim", **SMALL_DEVICE)
    )
    with pytest.raises(harness.DeathTestFailure, match="DeviceOutOfMemory"):
        check_fits_after_flush(outcome)
