"""The detector death test: one child per configuration (TorchLean's
``runArenaDetectorDeathTest``, ``../shared/seeds/torchlean-cuda-arena-and-cache-cap.txt``).

A detected use-after-free must abort the process, which cannot be caught in-process, so each
configuration runs in its own child and the parent asserts how it ended.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest

import harness
from harness import Config, DeathTestFailure, Outcome

from . import _probes

ON = {"DEVMEM_ARENA_DEBUG": "1"}


def _line(op: str, role: str, depth: int = 0) -> str:
    return f"use-after-arena-free: {op} {role} was reclaimed by arena_exit at depth {depth}"


def _aborts_with(line: str) -> Callable[[Outcome], None]:
    def check(outcome: Outcome) -> None:
        outcome.assert_aborted(match=rf"(?m)^{re.escape(line)}$")

    return check


def _clean_with(returned: dict) -> Callable[[Outcome], None]:
    def check(outcome: Outcome) -> None:
        outcome.assert_clean()
        assert outcome.returned == returned, f"{outcome!r} returned {outcome.returned!r}"

    return check


def _raises_uaf(outcome: Outcome) -> None:
    outcome.assert_raised("allocator.UseAfterFreeError")
    assert outcome.raised is not None
    assert outcome.raised.type == "allocator.UseAfterFreeError"
    assert outcome.raised.message == _line("buffer_add", "lhs")


@dataclass(frozen=True)
class Case:
    """One configuration: the child's detector setting, the probe it runs, the parent's check."""

    env: dict[str, str | None]
    probe: Callable
    args: tuple
    check: Callable[[Outcome], None]


PLANTED, VALID = _probes.planted_use_after_free, _probes.valid_promotion
CASES = {
    "positive": Case(ON, PLANTED, ("add",), _aborts_with(_line("buffer_add", "lhs"))),
    "negative": Case(ON, VALID, (), _clean_with({"sum": 64.0})),
    "control": Case({"DEVMEM_ARENA_DEBUG": None}, PLANTED, ("add",), _clean_with({"size": 0})),
    "raise-mode": Case({"DEVMEM_ARENA_DEBUG": "raise"}, PLANTED, ("add",), _raises_uaf),
    "ternary": Case(ON, PLANTED, ("fma",), _aborts_with(_line("buffer_fma", "arg0"))),
    "unary": Case(ON, PLANTED, ("sum",), _aborts_with(_line("buffer_sum", "arg"))),
    "readback": Case(ON, PLANTED, ("read",), _aborts_with(_line("buffer_read", "arg"))),
    "inner-epoch": Case(ON, PLANTED, ("inner",), _aborts_with(_line("buffer_add", "lhs", 1))),
}


@harness.matrix([Config(case_id, case.env) for case_id, case in CASES.items()])
def test_detector(death, pin, config):
    case = CASES[config.id]
    case.check(death.run(case.probe, *case.args, config=config, env=pin(**config.env)))


def test_teeth_a_detector_that_checks_only_sizes_is_caught(death, pin):
    case = CASES["positive"]
    outcome = death.run(case.probe, *case.args, "detector_checks_only_sizes", env=pin(**ON))
    with pytest.raises(DeathTestFailure, match="exited with status 0"):
        case.check(outcome)
    assert outcome.returned == {"size": 0}  # the silent slip the detector exists to catch


def test_teeth_a_control_that_inherits_the_parents_detector_is_caught(death, pin, monkeypatch):
    monkeypatch.setenv("DEVMEM_ARENA_DEBUG", "1")
    env = pin()
    del env["DEVMEM_ARENA_DEBUG"]  # the bug: the control forgets to pin the detector off
    case = CASES["control"]
    with pytest.raises(DeathTestFailure, match="SIGABRT"):
        case.check(death.run(case.probe, *case.args, env=env))
