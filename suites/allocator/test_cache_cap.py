"""The cache-cap test: one child per cap value, since the cap is read once per process
(TorchLean's ``runCacheCapTest``, ``../shared/seeds/torchlean-cuda-arena-and-cache-cap.txt``).

Each child allocates 32 buffers of 65536 floats (256 KiB blocks), releases them all (8 MiB
returned) and reports its statistics; the parent checks the bound.
"""

from __future__ import annotations

import re

import pytest

import harness
from harness import Config, Outcome

from . import _probes

BLOCK = 65536 * 4
RETURNED = 32 * BLOCK
MIB = 1 << 20
WARNING = (
    "devmem: ignoring DEVMEM_CACHE_CAP_BYTES={!r}: expected an unsigned decimal byte count;"
    " the cache stays unbounded"
)

# id -> (DEVMEM_CACHE_CAP_BYTES, the cap the child must parse, whether it warns)
CAPS = {
    "capped-1MiB": ("1048576", MIB, False),
    "unbounded-0": ("0", 0, False),
    "unset": (None, 0, False),
    "malformed-1MiB": ("1MiB", 0, True),
    "malformed-26-digits": ("99999999999999999999999999", 0, True),
}


def check_cap(outcome: Outcome, backend: str, value: str | None, native: int, warns: bool):
    """The parent's checks of one cache-cap child."""
    outcome.assert_clean()
    report = outcome.returned
    stats = report["stats"]
    warning = WARNING.format(value)
    if warns:
        assert re.search(rf"(?m)^{re.escape(warning)}$", outcome.stderr), outcome.stderr
        assert outcome.stderr.count("ignoring DEVMEM_CACHE_CAP_BYTES") == 1, "warn once"
    else:
        assert "ignoring DEVMEM_CACHE_CAP_BYTES" not in outcome.stderr
    assert report["parsed_cap"] == native
    assert (stats["live_bytes"], stats["free_count"]) == (0, 32)
    if backend == "cpu":
        # the stub keeps no cache: the bound holds trivially, nothing was exercised
        assert (stats["cache_bytes"], stats["cache_cap_bytes"]) == (0, 0)
        return "cpu keeps no cache: cache_bytes == 0, the cap is not exercised"
    assert stats["cache_cap_bytes"] == native
    if native:
        cache = stats["cache_bytes"]
        assert cache <= native, f"cache_bytes {cache} over the cap {native}"
        assert cache >= BLOCK, f"cache_bytes {cache} below one block"
        assert cache + BLOCK > native, f"the cap is not binding: {cache} + a block fits"
        assert cache == MIB and stats["cap_evictions"] == 28
    else:
        assert (stats["cache_bytes"], stats["cap_evictions"]) == (RETURNED, 0)
    return f"{backend}: cache_bytes == {stats['cache_bytes']}"


@harness.matrix([Config(cap_id, {"DEVMEM_CACHE_CAP_BYTES": v}) for cap_id, (v, *_) in CAPS.items()])
def test_cache_cap(death, pin, backend, config, note):
    value, native, warns = CAPS[config.id]
    outcome = death.run(_probes.cache_cap, config=config, env=pin(**config.env))
    note(check_cap(outcome, backend, value, native, warns))


@pytest.mark.backends("sim", "cuda")  # the cpu stub keeps no cache: no cap to ignore
def test_teeth_a_cache_that_ignores_its_cap_is_caught(death, pin, backend):
    outcome = death.run(
        _probes.cache_cap, 65536, 32, "cache_ignores_cap", env=pin(DEVMEM_CACHE_CAP_BYTES="1048576")
    )
    with pytest.raises(AssertionError, match="over the cap"):
        check_cap(outcome, backend, "1048576", MIB, False)
    assert outcome.returned["stats"]["cache_bytes"] == RETURNED


@pytest.mark.backends("sim", "cuda")  # on the cpu stub every cap gives cache_bytes == 0
def test_teeth_a_child_that_inherits_a_hostile_cap_is_caught(death, pin, backend, monkeypatch):
    monkeypatch.setenv("DEVMEM_CACHE_CAP_BYTES", "1")
    env = pin()
    del env["DEVMEM_CACHE_CAP_BYTES"]  # the bug: the unbounded control forgets to pin the cap
    outcome = death.run(_probes.cache_cap, env=env)
    with pytest.raises(AssertionError):
        check_cap(outcome, backend, "0", 0, False)
    assert outcome.returned["parsed_cap"] == 1
