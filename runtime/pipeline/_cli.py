"""``python -m runtime.pipeline``: plan a model's pipeline, manage state files, dry-run training.

Commands::

    plan  --model NAME [--layers N] [--budget B] [--headroom H]
          [--checkpoint POLICY] [--interval K] [--json]
    state create PATH --model NAME [--layers N] [--budget B] [--headroom H] [--force] [--sparse]
    state show PATH [--json]
    train --model NAME [--checkpoint POLICY] [--interval K] --steps N --state PATH --dry-run
          [--lr LR] [--keep-state] [--resume | --force] [--sparse]

``train`` drives the scheduler and commits every action to the state file (tensors and header
together, crash-safe: ``docs/pipeline-state.md``), holding the file's lock (an exclusive
``flock``) for the whole run: a second writer of the file is refused at once, naming the
holder's pid. At each ``EXEC_RESTART`` it ``os.execv``\\ s itself with the interpreter's
options, its full argument list and ``--resume`` (the seed's restart kept only
``--pipeline-resume PATH``, so a LLaMA-7B run resumed as the default Stories110M), handing
the locked descriptor to the new process image (its number in ``PIPELINE_STATE_LOCK_FD``); the
new process (or one started by hand with ``--resume`` after a crash) checks that the file was
written for the same model, compile config, policy and step count, undoes a change a kill left
half-done, and goes on. Without ``--resume`` it creates the file (sparse, but for the pages a
dry run writes, unless ``--sparse``: none reserved) and refuses an existing one unless
``--force``, which replaces only a state file; it removes the file at the end only if its run
created it, ``--keep-state`` was not given and the path still names that file (a failure to
remove it is one warning line). Progress goes to stderr; the run ends with one JSON object
on stdout: ``model``, ``preset``, ``restarts``, ``steps_done``, ``actions`` (a count per
action), ``groups``, ``checkpoint``, ``state_file`` (``null`` once removed, or when its path
names another file by then), ``pid``.

Every integer option is checked against its header field (``--budget``, ``--steps``,
``--interval``: 1 .. 2**31-1; ``--layers``: 1 .. 1,000,000) and every number must be finite,
before anything touches the disk.

Exit status: 0 on success, 1 for an unusable, existing or uncreatable state file, one another
process holds, a ``--force`` of something that is not a state file, or a resume that does not
match the file, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable, Sequence

import numpy as np

from .._warnings import handover as warnings_handover
from .._warnings import warn_once
from ..checkpoint import POLICY_NAMES, CheckpointPlan, checkpoint_plan
from ._model import (
    DEFAULT_PRESET,
    PRESETS,
    ModelConfig,
    layer_gradient_bytes,
    layer_weight_bytes,
)
from ._plan import PipelinePlan, plan_pipeline, preset
from ._report import model_summary, plan_report, policy_table, render_plan
from ._scheduler import Action, Scheduler, SchedulerState
from ._statefile import (
    HEADER_BYTES,
    INT32_MAX,
    LOCK_FD_ENV,
    Layout,
    StateFile,
    StateFileError,
    StateHeader,
)

__all__ = ["main", "restart_argv"]

PROG = "python -m runtime.pipeline"


class UsageError(Exception):
    """Bad arguments found after parsing (exit status 2)."""


class RunError(Exception):
    """A run that cannot go on: an unusable state file or a mismatched resume (status 1)."""


MAX_LAYERS = 1_000_000
"""The largest ``--layers`` (the plan lists every layer)."""


def _int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a decimal integer in ``low .. high`` (argparse names the option)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"expected an integer in {low} .. {high:,}, got {text!r}"
            )
        return value

    return parse


_positive_int = _int_in(1, INT32_MAX)


def _finite(text: str) -> float:
    """An argparse type: a finite number (JSON and the state file hold no NaN or infinity)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
        if text.strip().lower() not in ("nan", "+nan", "-nan"):
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _finite_float32(text: str) -> float:
    """An argparse type: a finite number within float32's range (the dry run's weight update
    computes in float32: a larger learning rate would write infinities into the file)."""
    value = _finite(text)
    if abs(value) > _FLOAT32_MAX:
        raise argparse.ArgumentTypeError(
            f"expected a number within float32's range (|x| <= {_FLOAT32_MAX:.4g}), got {text!r}"
        )
    return value


def _parser() -> argparse.ArgumentParser:
    model = argparse.ArgumentParser(add_help=False)
    group = model.add_argument_group("model")
    group.add_argument(
        "--model",
        choices=sorted(PRESETS),
        default=DEFAULT_PRESET,
        help=f"preset (default {DEFAULT_PRESET})",
    )
    group.add_argument(
        "--layers",
        type=_int_in(1, MAX_LAYERS),
        help=f"override the preset's layer count (1 .. {MAX_LAYERS:,})",
    )
    group.add_argument(
        "--budget", type=_positive_int, help=f"compile budget, 1 .. {INT32_MAX} (default 119)"
    )
    group.add_argument(
        "--headroom",
        type=_finite,
        help="compile-budget headroom in (0, 1) (default DEVMEM_COMPILE_HEADROOM, else 0.1);"
        " other values fall back to 0.1 with a warning",
    )
    ckpt = argparse.ArgumentParser(add_help=False)
    group = ckpt.add_argument_group("checkpointing")
    group.add_argument(
        "--checkpoint",
        choices=POLICY_NAMES,
        type=str.lower,
        help="checkpoint policy (default DEVMEM_CKPT_POLICY, else all)",
    )
    group.add_argument(
        "--interval",
        type=_positive_int,
        help="the policy's parameter: every_n's interval, sequential's segments, revolve's"
        f" snapshots, 1 .. {INT32_MAX} (default DEVMEM_CKPT_INTERVAL, else the policy's"
        " default)",
    )

    files = argparse.ArgumentParser(add_help=False)
    group = files.add_argument_group("state file")
    group.add_argument(
        "--force",
        action="store_true",
        help="replace an existing state file (atomically; only a state file no run holds;"
        " default: refuse it)",
    )
    group.add_argument(
        "--sparse",
        action="store_true",
        help="do not reserve the file's space: instant and takes no disk, but a full disk"
        " then kills the run with SIGBUS (train, a dry run, reserves only the pages it writes"
        " without it)",
    )

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Plan an ANE training pipeline: compile groups, memory, FLOPs, activation"
        " checkpoints; manage its exec()-restart state file; dry-run its scheduler.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    plan = commands.add_parser(
        "plan", parents=[model, ckpt], help="print the pipeline and checkpoint plan"
    )
    plan.add_argument("--json", action="store_true", help="print one JSON object")

    state = commands.add_parser("state", help="create or inspect a state file")
    state_commands = state.add_subparsers(dest="state_command", required=True, metavar="ACTION")
    create = state_commands.add_parser("create", parents=[model, files], help="create a state file")
    create.add_argument("path", metavar="PATH")
    show = state_commands.add_parser("show", help="print a state file's header")
    show.add_argument("path", metavar="PATH")
    show.add_argument("--json", action="store_true", help="print one JSON object")

    train = commands.add_parser(
        "train", parents=[model, ckpt, files], help="dry-run training with exec() restarts"
    )
    train.add_argument(
        "--steps", type=_positive_int, required=True, help=f"training steps, 1 .. {INT32_MAX}"
    )
    train.add_argument("--state", required=True, metavar="PATH", help="the state file")
    train.add_argument(
        "--dry-run",
        action="store_true",
        help="simulate the kernels (required: live ANE training is not implemented)",
    )
    train.add_argument(
        "--lr",
        type=_finite_float32,
        default=3e-4,
        help="learning rate, finite, within float32's range (default 3e-4)",
    )
    train.add_argument(
        "--keep-state",
        action="store_true",
        help="keep the state file this run creates (a file it did not create is always kept)",
    )
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in the state file (after exec() or a crash)",
    )
    return parser


def _warn(message: str) -> None:
    warn_once(f"{PROG}: warning: {message}")  # once per run, not once per exec() restart


def _config(args: argparse.Namespace) -> ModelConfig:
    h = args.headroom  # cast to float32 only inside (0, 1): no overflow warning
    if h is not None and not 0 < h < 1:
        _warn(f"--headroom {h!r} is not in (0, 1); using 0.1")
    elif h is not None and not 0 < np.float32(h) < 1:  # the header holds a float32
        _warn(f"--headroom {h!r} is {float(np.float32(h))!r} in float32, not in (0, 1); using 0.1")
    return preset(
        args.model, n_layers=args.layers, compile_budget=args.budget, headroom_pct=args.headroom
    )


def _plans(args: argparse.Namespace) -> tuple[PipelinePlan, CheckpointPlan]:
    config = _config(args)
    try:
        plan = plan_pipeline(config)
        ckpt = checkpoint_plan(
            args.checkpoint,
            config.dims.n_layers,
            interval=args.interval,
            group_starts=plan.group_starts,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return plan, ckpt


def _plan(args: argparse.Namespace) -> int:
    plan, ckpt = _plans(args)
    report = plan_report(plan, ckpt)
    if args.json:
        print(json.dumps(report, allow_nan=False))
    else:
        print(render_plan(report, policy_table(plan)))
    return 0


def _open(path: str, *, readonly: bool = False, inherited_fd: int | None = None) -> StateFile:
    try:
        return StateFile.open(path, readonly=readonly, inherited_fd=inherited_fd)
    except StateFileError as exc:
        raise RunError(str(exc)) from None
    except OSError as exc:
        raise RunError(f"cannot open state file {path}: {exc.strerror or exc}") from None


def _create(path: str, config: ModelConfig, *, force: bool, sparse: bool, **header) -> StateFile:
    try:
        return StateFile.create(path, config, overwrite=force, sparse=sparse, **header)
    except FileExistsError:
        raise RunError(
            f"state file {path} exists: pass --resume to continue the run it holds, or --force"
            " to replace it"
        ) from None
    except StateFileError as exc:  # in use, or not a state file: --force refuses it
        raise RunError(str(exc)) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise RunError(f"cannot create state file {path}: {exc.strerror or exc}") from None


def _state(args: argparse.Namespace) -> int:
    if args.state_command == "create":
        config = _config(args)
        try:
            plan_pipeline(config)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        _create(args.path, config, force=args.force, sparse=args.sparse).close()
        size = StateHeader(config, "all", 0, SchedulerState()).to_dict()["total_size"]
        how = "sparse" if args.sparse else "reserved"
        print(f"created {args.path}: {model_summary(config)}, {size:,} bytes ({how})")
        return 0
    with _open(args.path, readonly=True) as state:
        info = state.header.to_dict()
        info["interrupted_change_bytes"] = state.rolled_back
    if args.json:
        print(json.dumps(info, allow_nan=False))
        return 0
    s, d = info["scheduler"], info["dims"]
    lines = [
        f"{args.path}: state file version {info['version']} (sentinel {info['sentinel']}),"
        f" generation {info['generation']}",
        f"  model {info['model']}: " + " ".join(f"{k}={v}" for k, v in d.items()),
        "  compile: " + " ".join(f"{k}={v}" for k, v in info["compile"].items()),
        f"  checkpoint: {info['checkpoint']['policy']}"
        f" (interval {info['checkpoint']['interval'] or 'default'})",
        f"  scheduler: phase={s['phase']} group={s['group']} step={s['step']}/{s['total_steps']}"
        f" accum_step={s['accum_step']} lr={s['learning_rate']:g} last_loss={s['last_loss']:g}",
        f"  restarts={info['restarts']} actions: "
        + " ".join(f"{k}={v}" for k, v in info["actions"].items()),
        "  offsets: "
        + " ".join(f"{k}={v}" for k, v in info["offsets"].items())
        + f" total_size={info['total_size']}",
    ]
    if info["interrupted_change_bytes"]:
        lines.append(
            f"  an interrupted change ({info['interrupted_change_bytes']} bytes) will be undone"
            " by the next --resume"
        )
    print("\n".join(lines))
    return 0


_OPTIONS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")


def interpreter_options(orig_argv: Sequence[str]) -> list[str]:
    """The interpreter's own options in ``orig_argv`` (``sys.orig_argv``): everything between
    the executable and the first of ``-m``, ``-c``, ``-`` or a script (``-X dev``, ``-W error``,
    ``-O``, ``-Wdefault``, ``-OO`` ...)."""
    options: list[str] = []
    args = list(orig_argv[1:])
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-m", "-c", "-", "--") or not arg.startswith("-"):
            break
        if arg in _OPTIONS_WITH_VALUE:
            options += args[i : i + 2]
            i += 2
            continue
        if arg.startswith("--"):
            options.append(arg)
            i += 1
            continue
        cluster = arg[1:]
        for at, flag in enumerate(cluster):
            if flag in "cm":  # -cCODE, -mMODULE: the program starts here
                return options + ([f"-{cluster[:at]}"] if at else [])
            if flag in "WX":
                if at + 1 == len(cluster):  # the value is the next argument
                    options += [arg, *args[i + 1 : i + 2]]
                    i += 1
                else:
                    options.append(arg)
                break
        else:
            options.append(arg)
        i += 1
    return options


def restart_argv(argv: Sequence[str]) -> list[str]:
    """The command an ``EXEC_RESTART`` runs: this interpreter with its own options (from
    ``sys.orig_argv``: ``-X dev``, ``-W error``, ``-O`` survive), ``-m runtime.pipeline``, the
    full ``argv`` it was given and ``--resume`` (once)."""
    args = list(argv)
    if "--resume" not in args:
        args.append("--resume")
    options = interpreter_options(getattr(sys, "orig_argv", [sys.executable]))
    return [sys.executable, *options, "-m", "runtime.pipeline", *args]


def _check_resume(header: StateHeader, config: ModelConfig, ckpt: CheckpointPlan, steps: int):
    """Raise :class:`RunError` unless the file was written by a run like this one."""
    mine = dataclasses.replace(config, preset="")
    theirs = header.config
    if mine != theirs:
        raise RunError(
            f"the state file was written for {model_summary(theirs)} with {theirs.compile},"
            f" but this run is {model_summary(mine)} with {mine.compile}: resume with the"
            " arguments of the run that wrote it"
        )
    if (header.checkpoint_policy, header.checkpoint_interval) != (ckpt.policy, ckpt.interval or 0):
        raise RunError(
            f"the state file was written with checkpoint policy {header.checkpoint_policy!r}"
            f" (interval {header.checkpoint_interval}), this run uses {ckpt.policy!r}"
            f" (interval {ckpt.interval or 0})"
        )
    if header.scheduler.total_steps != steps:
        raise RunError(
            f"the state file was written for --steps {header.scheduler.total_steps}, this run"
            f" has --steps {steps}"
        )


def _dry_run_ranges(config: ModelConfig) -> list[tuple[int, int]]:
    """The byte ranges ``(offset, length)`` of a state file for ``config`` that a dry run
    writes, whole 4096-byte pages: the header page, the journal, and the page of each layer's
    first weight float and of its first gradient float (what :func:`_simulate` writes)."""
    layout = Layout.for_dims(config.dims)
    ranges = [(0, HEADER_BYTES), (layout.journal, layout.total_size - layout.journal)]
    for start, per_layer in (
        (layout.layer_weights, layer_weight_bytes(config.dims)),
        (layout.layer_grads, layer_gradient_bytes(config.dims)),
    ):
        for layer in range(config.dims.n_layers):
            offset = start + layer * per_layer
            ranges.append((offset - offset % 4096, 4096))
    return ranges


def _float32(value: float) -> bytes:
    return np.float32(value).tobytes()


def _simulate(
    state: StateFile, plan: PipelinePlan, action: Action, scheduler: Scheduler
) -> list[tuple[int, bytes]]:
    """The writes the action makes, as ``(offset, bytes)`` for :meth:`StateFile.commit`:
    backward adds one pass to each of its layers' first gradient; the weight update checks that
    all ``accum_steps`` passes are there (across restarts and crashes) and clears them."""
    # Statement-long views only: a view kept alive would stop the file from closing.
    group = plan.groups[scheduler.state.group]
    writes = []
    if action is Action.RUN_BACKWARD_GROUP:
        for layer in range(group.start, group.end):
            passes = state.layer_grads(layer)[0] + np.float32(1)
            writes.append((state.offset("layer_grads", layer), _float32(passes)))
    elif action is Action.WEIGHT_UPDATE:
        expected = plan.config.compile.accum_steps
        lr = np.float32(scheduler.state.learning_rate)
        for layer in range(plan.config.dims.n_layers):
            passes = state.layer_grads(layer)[0]
            if passes != expected:
                raise RunError(
                    f"layer {layer} accumulated {float(passes):g} backward passes, expected"
                    f" {expected}: the state file lost gradients or applied a pass twice"
                )
            weight = state.layer_weights(layer)[0] - lr * passes
            writes.append((state.offset("layer_weights", layer), _float32(weight)))
            writes.append((state.offset("layer_grads", layer), _float32(0.0)))
    return writes


def _remove(state: StateFile) -> str | None:
    """Remove the state file the run created, under its lock, if its path still names it;
    a failure is one warning line. Returns the path if the file is still there, else None."""
    try:
        if state.remove():
            return None
    except OSError as exc:
        _warn(f"cannot remove state file {state.path}: {exc.strerror or exc}; it is kept")
        return state.path
    _warn(
        f"not removing {state.path}: it no longer names the state file this run created"
        " (it was removed or replaced since)"
    )
    return None


def _train(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if not args.dry_run:
        raise UsageError("train: live ANE training is not implemented; pass --dry-run")
    plan, ckpt = _plans(args)
    config = plan.config
    if args.resume:
        inherited = os.environ.pop(LOCK_FD_ENV, "")  # from the process image before exec()
        state = _open(args.state, inherited_fd=int(inherited) if inherited.isdigit() else None)
        header = state.header
        try:
            _check_resume(header, config, ckpt, args.steps)
            scheduler = Scheduler(config, args.steps, state=header.scheduler)
        except (RunError, ValueError) as exc:
            state.close()
            raise RunError(f"cannot resume from {args.state}: {exc}") from None
        if state.rolled_back:
            print(
                f"[pipeline] undid an interrupted change ({state.rolled_back} bytes restored"
                " from the journal)",
                file=sys.stderr,
                flush=True,
            )
        print(f"[pipeline] resumed: {scheduler.describe()}", file=sys.stderr, flush=True)
    else:
        scheduler = Scheduler(config, args.steps, learning_rate=args.lr)
        # a dry run writes a few floats per layer: only their pages are reserved, the rest of
        # the file is sparse (LLaMA-7B's file is 103 GiB)
        reserve = [] if args.sparse else _dry_run_ranges(config)
        if reserve:
            total = StateHeader(config, "all", 0, SchedulerState()).to_dict()["total_size"]
            print(
                f"[pipeline] dry run: the state file is sparse but for the"
                f" {sum(n for _, n in reserve):,} bytes it writes, reserved"
                f" (of {total:,}; --sparse reserves none)",
                file=sys.stderr,
                flush=True,
            )
        state = _create(
            args.state,
            config,
            force=args.force,
            sparse=True,
            reserve=reserve,
            checkpoint_policy=ckpt.policy,
            checkpoint_interval=ckpt.interval or 0,
            scheduler=scheduler.state,
            delete_when_done=not args.keep_state,
        )
        header = state.header
        groups = " ".join(f"[{g.start}..{g.end})" for g in plan.groups)
        print(
            f"[pipeline] {model_summary(config)}: groups {groups}, checkpoint {ckpt.policy}"
            f" ({ckpt.n_checkpointed}/{config.dims.n_layers} saved), {args.steps} step(s)",
            file=sys.stderr,
            flush=True,
        )
    with state:
        while True:
            action = scheduler.next_action()
            print(f"[pipeline] {action.name:<18} {scheduler.describe()}", file=sys.stderr)
            if action is Action.STEP_DONE:
                break
            counts = list(header.action_counts)
            counts[action] += 1
            if action is Action.EXEC_RESTART:
                state.commit(
                    dataclasses.replace(
                        header,
                        scheduler=scheduler.state,
                        restarts=header.restarts + 1,
                        action_counts=tuple(counts),
                    )
                )
                # the lock stays held: the new process image adopts the descriptor
                os.environ[LOCK_FD_ENV] = str(state.handover())
                warnings_handover()  # the new image does not repeat this run's warnings
                sys.stdout.flush()
                sys.stderr.flush()
                command = restart_argv(argv)
                os.execv(command[0], command)
            writes = _simulate(state, plan, action, scheduler)
            scheduler.complete(action)
            if scheduler.next_action() is Action.STEP_DONE:  # the last update ends the run:
                counts[Action.STEP_DONE] = 1  # its commit counts the end too, as the JSON does
            state.commit(
                dataclasses.replace(header, scheduler=scheduler.state, action_counts=tuple(counts)),
                writes,
            )
            header = state.header
        kept = args.state
        if header.delete_when_done and not args.keep_state:
            kept = _remove(state)
    counts = header.action_counts  # what the file holds (a kept file shows the same)
    summary = {
        "model": config.name,
        "preset": config.preset,
        "restarts": header.restarts,
        "steps_done": scheduler.state.step,
        "actions": {a.name: n for a, n in zip(Action, counts, strict=True)},
        "groups": [[g.start, g.end, g.total_kernels] for g in plan.groups],
        "checkpoint": {"policy": ckpt.policy, "n_checkpointed": ckpt.n_checkpointed},
        "state_file": kept,
        "pid": os.getpid(),
    }
    print(json.dumps(summary, allow_nan=False), flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    ``train`` may never return: it ``exec()``\\ s itself at each restart.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "plan":
            return _plan(args)
        if args.command == "state":
            return _state(args)
        return _train(args, argv)
    except UsageError as exc:
        parser.error(str(exc))
    except RunError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    raise AssertionError("unreachable")  # pragma: no cover
