"""The runtime's knobs: parsed once per process, re-read by a fork child, one warning line for a
malformed value naming the variable and the default used instead."""

from __future__ import annotations

import pytest

import harness
from runtime.checkpoint import CheckpointKnobs, checkpoint_plan, knobs

from . import _targets
from ._knobs import pinned_env


def _parse(**env: str) -> tuple[CheckpointKnobs, list[str]]:
    lines: list[str] = []
    return CheckpointKnobs.from_env(env, warn=lines.append), lines


def test_defaults_when_unset_or_empty():
    assert _parse() == (CheckpointKnobs("all", None, 0.10), [])
    empty = {"DEVMEM_CKPT_POLICY": "", "DEVMEM_CKPT_INTERVAL": "", "DEVMEM_COMPILE_HEADROOM": ""}
    assert _parse(**empty) == (CheckpointKnobs("all", None, 0.10), [])


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"DEVMEM_CKPT_POLICY": "sqrt"}, CheckpointKnobs("sqrt", None, 0.10)),
        ({"DEVMEM_CKPT_POLICY": "EVERY_N"}, CheckpointKnobs("every_n", None, 0.10)),
        ({"DEVMEM_CKPT_INTERVAL": "8"}, CheckpointKnobs("all", 8, 0.10)),
        ({"DEVMEM_COMPILE_HEADROOM": "0.2"}, CheckpointKnobs("all", None, 0.2)),
        ({"DEVMEM_COMPILE_HEADROOM": "5e-2"}, CheckpointKnobs("all", None, 0.05)),
    ],
)
def test_valid_values(env, expected):
    assert _parse(**env) == (expected, [])


@pytest.mark.parametrize(
    ("name", "value", "line"),
    [
        (
            "DEVMEM_CKPT_POLICY",
            "sqrtt",
            "devmem: ignoring DEVMEM_CKPT_POLICY='sqrtt': expected one of all, boundary, sqrt,"
            " every_n, none, sequential, revolve; using all",
        ),
        *(
            (
                "DEVMEM_CKPT_INTERVAL",
                value,
                f"devmem: ignoring DEVMEM_CKPT_INTERVAL={value!r}: expected a positive decimal"
                " integer; using the policy's default",
            )
            for value in ("0", "-3", "4.0", " 4", "four", "0x10")
        ),
        *(
            (
                "DEVMEM_COMPILE_HEADROOM",
                value,
                f"devmem: ignoring DEVMEM_COMPILE_HEADROOM={value!r}: expected a fraction between"
                " 0 and 1, exclusive; using 0.1",
            )
            for value in ("0", "1", "1.5", "-0.1", "nan", "inf", "10%")
        ),
    ],
)
def test_a_malformed_value_is_one_warning_and_the_default(name, value, line):
    knobs, lines = _parse(**{name: value})
    assert knobs == CheckpointKnobs()
    assert lines == [line]


def test_read_once_per_process_with_one_warning(death):
    env = pinned_env("cpu", DEVMEM_CKPT_POLICY="sqrt", DEVMEM_CKPT_INTERVAL="zero")
    outcome = death.run(_targets.read_knobs_twice, env=env).assert_clean()
    assert outcome.returned == {"policy": "sqrt", "interval": None, "headroom": 0.1, "same": True}
    assert outcome.stderr.count("devmem: ignoring DEVMEM_CKPT_INTERVAL='zero'") == 1


def test_a_fork_child_rereads_its_own_environment(monkeypatch):
    from runtime.checkpoint import _knobs

    # the value cached here must not outlive the test: with the cache left at 'none', a later
    # in-process `train` in this worker saw 'none' where its death-test children read 'all'
    monkeypatch.setattr(_knobs, "_cached", None)
    monkeypatch.setenv("DEVMEM_CKPT_POLICY", "none")
    assert knobs().policy == "none"  # the parent's value is read and cached
    try:
        outcome = harness.run_child(
            _targets.knobs_policy, env=pinned_env("cpu", DEVMEM_CKPT_POLICY="revolve"), style="fork"
        )
    except harness.HarnessError as exc:  # a CUDA test marked this process fork-unsafe
        pytest.skip(f"fork refused in this process: {exc}")
    assert outcome.assert_clean().returned == "revolve"


def test_the_policy_knob_is_the_default_policy(death):
    outcome = death.run(
        _targets.checkpoint_counts,
        "llama7b",
        env=pinned_env("cpu", DEVMEM_CKPT_POLICY="every_n", DEVMEM_CKPT_INTERVAL="6"),
    )
    got = outcome.assert_clean().returned
    saved = [0, 6, 12, 18, 24, 30, 31]
    assert (got["policy"], got["interval"], got["saved"]) == ("every_n", 6, saved)


def test_an_explicit_interval_wins_and_is_checked():
    plan = checkpoint_plan("every_n", 10, interval=3)
    assert plan.saved == (0, 3, 6, 9)
    with pytest.raises(ValueError, match=r"interval=3: policy 'sqrt' takes none"):
        checkpoint_plan("sqrt", 10, interval=3)


# -- the policy table takes the policies' defaults, not the knob (issue 21 item 9) -------------


def test_the_policy_table_ignores_the_interval_knob(monkeypatch, capsys):
    from runtime.checkpoint import _knobs
    from runtime.pipeline import main

    assert main(["plan", "--model", "stories110m", "--checkpoint", "sqrt", "--json"]) == 0
    plain = capsys.readouterr().out
    assert main(["plan", "--model", "stories110m", "--checkpoint", "sqrt"]) == 0
    table = capsys.readouterr().out.split("=== Policies compared")[1]
    # 13 segments for 12 layers: main at 6c47d36 took the knob for `sequential` and crashed
    monkeypatch.setattr(_knobs, "_cached", CheckpointKnobs(interval=13))
    assert main(["plan", "--model", "stories110m", "--checkpoint", "sqrt", "--json"]) == 0
    assert capsys.readouterr().out == plain
    assert main(["plan", "--model", "stories110m", "--checkpoint", "sqrt"]) == 0
    assert capsys.readouterr().out.split("=== Policies compared")[1] == table
    assert "  sequential         3              4" in table
    assert "  every_n            4              4" in table


# -- sqrt at perfect squares ------------------------------------------------------------------


def check_sqrt_interval() -> None:
    """``floor(sqrtf(N))`` is ``isqrt(N)`` below 2**22, at and around every perfect square,
    and the plans at 16 and 64 layers save every 4th and every 8th layer."""
    import math

    from runtime.checkpoint import default_interval

    # through default_interval, as the plans take it (a mutant patches the planner's own
    # sqrt_interval, which the package's re-exported name would not see)
    for k in range(1, 2048):
        for n in (k * k - 1, k * k, k * k + 1):
            if n >= 1:
                assert default_interval("sqrt", n) == math.isqrt(n), f"sqrt_interval({n})"
    assert checkpoint_plan("sqrt", 16).saved == (0, 4, 8, 12, 15)
    assert checkpoint_plan("sqrt", 64).saved == (*range(0, 64, 8), 63)
    assert checkpoint_plan("sqrt", 64).interval == 8


def test_sqrt_at_perfect_squares():
    check_sqrt_interval()


def test_teeth_a_float64_sqrt_minus_epsilon_is_caught(monkeypatch):
    from . import _mutants

    _mutants.patch("sqrt_float64_minus_epsilon", monkeypatch)
    with pytest.raises(AssertionError, match=r"sqrt_interval\(1\)|sqrt_interval\(4\)"):
        check_sqrt_interval()
