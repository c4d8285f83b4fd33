"""Checkpoint-count correctness: one child per configuration (preset x policy x interval x
headroom, set through the knobs), from the ANE seed's review
(``../shared/seeds/ane-pipeline-and-checkpointing.txt``).

Each child reads ``DEVMEM_CKPT_POLICY``, ``DEVMEM_CKPT_INTERVAL`` and
``DEVMEM_COMPILE_HEADROOM`` once, plans the preset, and runs the chain on its default allocator
(``DEVMEM_BACKEND``). The parent checks that the knobs took effect, that the compile groups and
the saved set are what the issue's rules give (computed here independently), and that
``n_checkpointed`` equals the saved set's size and the executor's count of kept activations.
The mutant is the seed's arithmetic count (7 for SQRT over 32 layers, where 8 are saved).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

import harness
from harness import Config

from . import _targets

POLICY, INTERVAL, HEADROOM = "DEVMEM_CKPT_POLICY", "DEVMEM_CKPT_INTERVAL", "DEVMEM_COMPILE_HEADROOM"
LAYERS = {"stories42m": 8, "stories110m": 12, "llama1b": 22, "llama7b": 32}

# Compile-group starts by hand: usable = int(119 * (1 - h)) in float32, 6 kernels per layer:
# h=0.10: 107 -> 17 layers per group; 0.05: 113 -> 18; 0.20: 95 -> 15; 0.5: 59 -> 9.
GROUP_STARTS = {
    0.10: {"stories42m": [0], "stories110m": [0], "llama1b": [0, 17], "llama7b": [0, 17]},
    0.05: {"stories42m": [0], "stories110m": [0], "llama1b": [0, 18], "llama7b": [0, 18]},
    0.20: {"stories42m": [0], "stories110m": [0], "llama1b": [0, 15], "llama7b": [0, 15, 30]},
    0.5: {
        "stories42m": [0],
        "stories110m": [0, 9],
        "llama1b": [0, 9, 18],
        "llama7b": [0, 9, 18, 27],
    },
}


def expected_saved(policy: str, n: int, interval: int | None, starts: list[int]) -> list[int]:
    """The saved set, straight from issue 12's rules."""
    if policy == "all":
        saved = set(range(n))
    elif policy == "none":
        saved = {0}
    elif policy == "boundary":
        saved = set(starts) | {n - 1}
    elif policy in ("sqrt", "every_n"):
        k = math.isqrt(n) if policy == "sqrt" else interval or 4
        saved = set(range(0, n, k)) | {n - 1}
    elif policy == "sequential":  # checkpoint_sequential: the last segment runs plain
        segments = interval or math.isqrt(n)
        saved = set(range((segments - 1) * (n // segments), n))
    else:  # revolve: only the last layer goes straight from forward to backward
        saved = {n - 1}
    return sorted(saved)


@dataclass(frozen=True)
class Case:
    preset: str
    policy: str
    interval: int | None = None
    headroom: float | None = None

    @property
    def id(self) -> str:
        parts = [self.preset, self.policy]
        if self.interval is not None:
            parts.append(f"i{self.interval}")
        if self.headroom is not None:
            parts.append(f"h{self.headroom:g}")
        return "-".join(parts)

    @property
    def env(self) -> dict[str, str | None]:
        return {
            POLICY: self.policy,
            INTERVAL: None if self.interval is None else str(self.interval),
            HEADROOM: None if self.headroom is None else str(self.headroom),
        }


CASES = {
    case.id: case
    for preset in LAYERS
    for case in [
        *(Case(preset, policy) for policy in ("all", "sqrt", "none", "revolve")),
        *(Case(preset, "boundary", headroom=h) for h in (None, 0.05, 0.20, 0.5)),
        *(Case(preset, "every_n", interval=i) for i in (None, 3, 8)),
        *(Case(preset, "sequential", interval=i) for i in (None, 2, 3)),
        Case(preset, "revolve", interval=2),
    ]
}


def check_counts(case: Case, got: dict) -> None:
    """The parent's check of one child's report; raises AssertionError naming what is wrong."""
    __tracebackhide__ = True
    n = LAYERS[case.preset]
    headroom = 0.10 if case.headroom is None else case.headroom
    assert got["knobs"] == {"policy": case.policy, "interval": case.interval, "headroom": headroom}
    assert got["group_starts"] == GROUP_STARTS[headroom][case.preset], "compile groups"
    saved = expected_saved(case.policy, n, case.interval, got["group_starts"])
    assert got["saved"] == saved, f"saved set {got['saved']}, expected {saved}"
    assert got["n_checkpointed"] == len(saved), (
        f"n_checkpointed={got['n_checkpointed']} but {len(saved)} layers are saved: {saved}"
    )
    assert got["kept"] == saved, f"the executor kept {got['kept']}, the plan saves {saved}"
    assert got["n_checkpointed"] == len(got["kept"])
    assert got["forward_calls"] == got["predicted_forward_calls"]
    assert got["peak_bytes"] == got["predicted_peak_bytes"]
    assert got["result"] == got["expected_result"]


@harness.matrix([Config(case_id, case.env) for case_id, case in CASES.items()])
def test_checkpoint_counts(death, pin, config):
    case = CASES[config.id]
    outcome = death.run(_targets.checkpoint_counts, case.preset, env=pin(**config.env))
    got = outcome.assert_clean().returned
    assert got["backend"] == pin()["DEVMEM_BACKEND"]
    check_counts(case, got)


SEED_MISCOUNTS = ["llama7b-sqrt", "stories110m-every_n-i3", "stories42m-every_n"]


@pytest.mark.parametrize("case_id", SEED_MISCOUNTS)
def test_teeth_the_seeds_arithmetic_count_is_caught(death, pin, case_id):
    case = CASES[case_id]
    outcome = death.run(
        _targets.checkpoint_counts, case.preset, "arithmetic_count", env=pin(**case.env)
    )
    got = outcome.assert_clean().returned
    with pytest.raises(AssertionError, match=r"n_checkpointed=\d+ but \d+ layers are saved"):
        check_counts(case, got)
    saved = len(expected_saved(case.policy, LAYERS[case.preset], case.interval, [0, 17]))
    assert got["n_checkpointed"] == saved - 1  # the seed missed the extra last layer


def test_check_counts_catches_an_executor_that_keeps_too_little():
    case = CASES["llama7b-sqrt"]
    saved = expected_saved("sqrt", 32, None, [0, 17])
    good = {
        "knobs": {"policy": "sqrt", "interval": None, "headroom": 0.10},
        "group_starts": [0, 17],
        "saved": saved,
        "n_checkpointed": len(saved),
        "kept": saved,
        "forward_calls": [1],
        "predicted_forward_calls": [1],
        "peak_bytes": 1,
        "predicted_peak_bytes": 1,
        "result": 1.0,
        "expected_result": 1.0,
    }
    check_counts(case, good)
    with pytest.raises(AssertionError, match="the executor kept"):
        check_counts(case, {**good, "kept": saved[:-1]})
    with pytest.raises(AssertionError, match="compile groups"):
        check_counts(case, {**good, "group_starts": [0, 18]})
