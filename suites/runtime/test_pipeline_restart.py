"""The exec() restart, as a death test in the exec style: ``train`` replaces its own process
image at every ``EXEC_RESTART`` and the resumed run keeps its model and plan.

The seed's restart (``execl(argv[0], argv[0], "--pipeline-resume", path)``,
``../shared/seeds/ane-pipeline-and-checkpointing.txt``) dropped every other argument, so a
LLaMA-7B run resumed as the default Stories110M; that restart is the mutant here.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

import pytest

from harness import DeathTestFailure, Outcome
from runtime.pipeline import (
    PRESETS,
    SchedulerState,
    StateFile,
    main,
    plan_pipeline,
    restart_argv,
    simulate,
    state_file_bytes,
)

from . import _targets
from ._knobs import pinned_env

ARGV = [
    "train",
    "--model",
    "llama7b",
    "--checkpoint",
    "sqrt",
    "--steps",
    "1",
    "--dry-run",
    "--sparse",
]


def _skip_unless_a_file_of_llama7b_fits() -> None:
    """Skip where ``RLIMIT_FSIZE`` (``ulimit -f``) forbids LLaMA-7B's sparse 110 GB state file:
    a mutation run may cap file sizes at a few GiB against mutants that reserve huge files."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    size = state_file_bytes(PRESETS["llama7b"])
    if limit != resource.RLIM_INFINITY and limit < size:
        pytest.skip(f"LLaMA-7B's state file is {size:,} bytes; RLIMIT_FSIZE is {limit:,}")


def check_resumed(outcome: Outcome) -> dict:
    """The run ended cleanly, in the process it started in (exec keeps the pid), as the model
    and plan it was started with, after every restart the scheduler asked for."""
    __tracebackhide__ = True
    outcome.assert_exited(0)
    summary = json.loads(outcome.stdout.strip().splitlines()[-1])
    config = PRESETS["llama7b"]
    expected = Counter(action.name for action in simulate(config, 1))
    assert summary["model"] == "LLaMA-7B", f"resumed as {summary['model']}"
    assert summary["groups"] == [
        [g.start, g.end, g.total_kernels] for g in plan_pipeline(config).groups
    ]
    assert summary["checkpoint"] == {"policy": "sqrt", "n_checkpointed": 8}
    assert summary["restarts"] == expected["EXEC_RESTART"] == 7
    assert summary["actions"] == dict(expected)
    assert summary["steps_done"] == 1
    assert summary["pid"] == outcome.pid, "the run left its process instead of exec()ing itself"
    assert outcome.stderr.count("[pipeline] resumed:") == 7
    return summary


def test_exec_restart_keeps_model_and_plan(death, tmp_path):
    _skip_unless_a_file_of_llama7b_fits()
    state = str(tmp_path / "run.state")
    outcome = death.run(
        _targets.train, [*ARGV, "--state", state], env=pinned_env("cpu"), style="exec"
    )
    check_resumed(outcome)
    assert not (tmp_path / "run.state").exists()  # removed after the run (no --keep-state)


def test_teeth_a_restart_that_drops_argv_is_caught(death, tmp_path):
    _skip_unless_a_file_of_llama7b_fits()
    state = str(tmp_path / "run.state")
    outcome = death.run(
        _targets.train,
        [*ARGV, "--state", state],
        "restart_drops_argv",
        env=pinned_env("cpu"),
        style="exec",
    )
    with pytest.raises(DeathTestFailure, match="exited with status 2"):
        check_resumed(outcome)
    assert "the following arguments are required: --steps" in outcome.stderr


def test_restart_argv_is_the_full_argv_plus_resume(monkeypatch):
    # an interpreter started without options (an xdist worker runs with -u: see
    # test_pipeline_files for the options)
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "pytest"])
    argv = [*ARGV, "--state", "/tmp/s"]
    command = restart_argv(argv)
    assert command == [sys.executable, "-m", "runtime.pipeline", *argv, "--resume"]
    assert restart_argv([*argv, "--resume"]) == command


def test_a_resume_of_another_models_file_is_refused(tmp_path, capsys):
    path = tmp_path / "s"
    StateFile.create(path, PRESETS["stories42m"], checkpoint_policy="sqrt", sparse=True).close()
    argv = ["train", "--steps", "1", "--state", str(path), "--dry-run", "--resume"]
    assert main(argv) == 1  # the seed's resume: Stories110M, the default model
    err = capsys.readouterr().err
    assert "cannot resume from" in err
    assert "written for Stories42M (8 layers, dim 512)" in err
    assert "but this run is Stories110M (12 layers, dim 768)" in err


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--checkpoint", "none"], "checkpoint policy 'sqrt' (interval 2), this run uses 'none'"),
        (["--checkpoint", "sqrt", "--steps", "2"], "--steps 1, this run has --steps 2"),
    ],
)
def test_a_resume_with_other_settings_is_refused(tmp_path, capsys, extra, match):
    path = tmp_path / "s"
    scheduler = SchedulerState(total_steps=1)
    StateFile.create(
        path,
        PRESETS["stories42m"],
        checkpoint_policy="sqrt",
        checkpoint_interval=2,  # sqrt's for 8 layers
        scheduler=scheduler,
        sparse=True,
    ).close()
    argv = ["train", "--model", "stories42m", "--steps", "1", *extra]
    assert main([*argv, "--state", str(path), "--dry-run", "--resume"]) == 1
    assert match in capsys.readouterr().err


def test_train_needs_dry_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--steps", "1", "--state", str(tmp_path / "s")])
    assert exit_info.value.code == 2
    assert "live ANE training is not implemented; pass --dry-run" in capsys.readouterr().err


def test_train_without_restarts_runs_in_process(tmp_path, capsys):
    # one layer, a budget of 1000: 20 compiles of 6 kernels fit one process
    argv = ["train", "--layers", "1", "--budget", "1000", "--steps", "1", "--dry-run", "--sparse"]
    assert main([*argv, "--state", str(tmp_path / "s"), "--keep-state"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["model"], summary["restarts"], summary["steps_done"]) == ("Stories110M", 0, 1)
    assert summary["actions"]["WEIGHT_UPDATE"] == 1
    with StateFile.open(tmp_path / "s") as state:
        assert state.header.scheduler.step == 1
        assert state.layer_grads(0)[0] == 0.0  # cleared by the weight update
        assert state.layer_weights(0)[0] == pytest.approx(-3e-4 * 10)  # lr * 10 passes


def test_a_kept_state_file_counts_the_runs_end_as_its_json_does(tmp_path, capsys):
    """``STEP_DONE`` is committed to the file at the run's end, once: a kept file's counters
    are the run's JSON ``actions`` (before, the file said 0 where the JSON said 1), and a
    ``--resume`` of a finished file counts it no second time."""
    path = str(tmp_path / "run.state")
    argv = ["train", "--layers", "1", "--budget", "1000", "--steps", "1", "--dry-run"]
    argv += ["--sparse", "--keep-state", "--state", path]
    for run in (argv, [*argv, "--resume"]):
        assert main(run) == 0
        actions = json.loads(capsys.readouterr().out.splitlines()[-1])["actions"]
        with StateFile.open(path, readonly=True) as state:
            in_file = dict(zip(actions, state.header.action_counts, strict=True))
        assert actions["STEP_DONE"] == 1
        assert in_file == actions
