"""Running a workload on the ring, and the command line (``python -m runtime.ring``).

:func:`run` plans a named workload (:mod:`runtime.ring._workloads`), simulates it
(:mod:`runtime.ring._sim`) on an allocator and returns the result; :func:`main` is the CLI that
:mod:`runtime.ring.__main__` runs.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from collections.abc import Callable

from ._program import plan
from ._sim import (
    MAX_CORES,
    MAX_LAG,
    RECLAIM_MODES,
    REPLAY_MODES,
    RingConfig,
    RunResult,
    simulate,
)
from ._trace import check_trace
from ._workloads import WORKLOADS, task_count

__all__ = ["cli_parser", "format_summary", "main", "run"]


def run(
    workload: str | Callable[..., None],
    config: RingConfig | None = None,
    alloc=None,
    **params,
) -> RunResult:
    """Plan ``workload`` for ``config`` and simulate it.

    Args:
        workload: a name in :data:`WORKLOADS` or a function ``f(orchestrator, **params)``.
        config: the run's knobs (default ``RingConfig()``).
        alloc: the :class:`~allocator.Allocator` the ring comes from (default: the process's
            default allocator, configured from ``DEVMEM_*``).
        params: the workload's sizes (e.g. ``batch=64, q_tiles=2``).

    Returns:
        The :class:`RunResult`.

    Raises:
        ValueError: an unknown workload name, or a bad size.
        TypeError: a bad argument type.

    With ``alloc_election=False`` the run may abort the process as the seed's runtime did.
    """
    if isinstance(workload, str):
        if workload not in WORKLOADS:
            raise ValueError(f"workload={workload!r}: expected one of {', '.join(WORKLOADS)}")
        name, function = workload, WORKLOADS[workload]
    elif callable(workload):
        name, function = getattr(workload, "__name__", "workload"), workload
    else:
        raise TypeError(f"workload must be a name or a function, got {type(workload).__name__}")
    config = RingConfig() if config is None else config
    if not isinstance(config, RingConfig):
        raise TypeError(f"config must be a RingConfig, got {type(config).__name__}")
    if alloc is None:
        import allocator

        alloc = allocator.get_allocator()
    return simulate(plan(function, config.limits(), name, **params), alloc, config)


# -- the command line -----------------------------------------------------------------------

_PARAMS = {  # workload parameter (and CLI option) -> the workloads that take it, and its bound
    "batch": (("paged_attention",), 1 << 16),
    "q_tiles": (("paged_attention",), 1024),
    "kv_blocks": (("paged_attention",), 1024),
    "scopes": (("long_span",), 1 << 16),
    "span": (("long_span",), 1 << 20),
    "k": (("tiles",), 1 << 20),
}
MAX_RING_BYTES = 1 << 32
"""The largest heap ring the command line takes (4 GiB: one allocator storage)."""
CLI_ALIGN = 64
"""The command line's output alignment (``RingConfig.align``'s default)."""
MAX_TASKS = 1_000_000
"""The most tasks the command line runs (the plan holds every task: about a minute of
planning and simulation at this size, and memory in proportion); larger sizes are refused
before planning, with the count they would make."""
_TASKS_FORMULA = {
    "paged_attention": "batch x q_tiles x (2 + 3 x kv_blocks)",
    "long_span": "scopes x (span + 2)",
    "tiles": "k + 2",
}


def _bounded(lo: int, hi: int, *, multiple: int = 1) -> Callable[[str], int]:
    """An argparse type: an integer in ``[lo, hi]`` (a multiple of ``multiple``); argparse's
    message names the option."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be between {lo:,} and {hi:,}, got {value:,}")
        if value % multiple:
            raise argparse.ArgumentTypeError(f"must be a multiple of {multiple}, got {value:,}")
        return value

    return parse


def _lag(text: str) -> tuple[int, float]:
    core, sep, factor = text.partition(":")
    try:
        if not sep:
            raise ValueError
        pair = int(core), float(factor)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected CORE:FACTOR (e.g. 3:16, core 3's kernels 16x slower), got {text!r}"
        ) from None
    if pair[0] < 0 or not 1 <= pair[1] <= MAX_LAG:
        raise argparse.ArgumentTypeError(
            f"expected a core >= 0 and a factor between 1 and {MAX_LAG:g}, got {text!r}"
        )
    return pair


def _attach_dashed_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--lag -1:2`` as ``--lag=-1:2``: argparse takes a value that starts with ``-`` (and is
    not a plain negative number) for an option and says only "expected one argument"; attached,
    the option's own check names what was wrong with it. An option left without its value at
    the end is one error line that says what the value looks like (exit status 2)."""
    run = parser.get_default("run_parser")
    takes_value = {
        flag: action
        for action in run._actions
        if action.nargs is None and action.option_strings
        for flag in action.option_strings
    }
    known = {flag for action in run._actions for flag in action.option_strings}
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        if token in takes_value and "run" in argv[:i]:
            if i + 1 == len(argv):
                action = takes_value[token]
                what = action.metavar or action.dest.upper()
                example = " (e.g. 3:16, core 3's kernels 16x slower)" if token == "--lag" else ""
                run.error(f"argument {token}: expected {what}{example}, got nothing")
            if argv[i + 1].startswith("-") and argv[i + 1] not in known:
                out.append(f"{token}={argv[i + 1]}")
                i += 2
                continue
        out.append(token)
        i += 1
    return out


def cli_parser() -> argparse.ArgumentParser:
    """A new argument parser of the command line (``python -m runtime.ring``; the suites read
    its options' help and defaults)."""
    parser = argparse.ArgumentParser(
        prog="python -m runtime.ring",
        description="Simulate the heap-ring task runtime of the PTO seed on the allocator.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser(
        "run",
        help="run a workload to the end and print a summary",
        description="Run a workload to the end and print a summary: tasks, completed, fatal"
        " (or null), the largest live window in bytes, simulated time. A fatal exits with"
        " status 1; the pre-fix path (--no-alloc-election) aborts as the seed's runtime did.",
    )
    size = _PARAMS
    cmd.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="paged_attention",
        help="the orchestration to replay (default paged_attention)",
    )
    cmd.add_argument(
        "--batch",
        type=_bounded(1, size["batch"][1]),
        help="paged_attention: sequences (required)",
    )
    cmd.add_argument(
        "--q-tiles",
        type=_bounded(1, size["q_tiles"][1]),
        help="paged_attention: query tiles per sequence (default 2)",
    )
    cmd.add_argument(
        "--kv-blocks",
        type=_bounded(1, size["kv_blocks"][1]),
        help="paged_attention: KV blocks (default 2)",
    )
    cmd.add_argument(
        "--scopes", type=_bounded(1, size["scopes"][1]), help="long_span: scopes (default 8)"
    )
    cmd.add_argument(
        "--span",
        type=_bounded(1, size["span"][1]),
        help="long_span: updates per scope (default 100)",
    )
    cmd.add_argument(
        "--k",
        type=_bounded(1, size["k"][1]),
        help="tiles: producers of disjoint tiles (default 100)",
    )
    cmd.add_argument(
        "--cores",
        type=_bounded(1, MAX_CORES),
        default=4,
        help=f"simulated cores, 1 to {MAX_CORES} (default 4)",
    )
    cmd.add_argument(
        "--seed",
        type=_bounded(0, (1 << 63) - 1),
        default=0,
        help="interleaving seed (default 0)",
    )
    cmd.add_argument(
        "--replay",
        choices=REPLAY_MODES,
        default="busy-wait",
        help="busy-wait: kernels spin for their recorded times; kernel: they run as allocator"
        " ops on views of the ring, their cost modelled from their elements (default busy-wait)",
    )
    cmd.add_argument(
        "--lag",
        type=_lag,
        action="append",
        default=[],
        metavar="CORE:FACTOR",
        help=f"make CORE's kernels FACTOR (1 to {MAX_LAG:g}) times slower; repeatable, once"
        " per core",
    )
    cmd.add_argument(
        "--reclaim",
        choices=RECLAIM_MODES,
        default="exact",
        help="exact: a slice dies when its task and readers are done and its scope closed;"
        " window: the seed's rule, everything behind vend[F - H] (default exact)",
    )
    cmd.add_argument(
        "--h",
        type=_bounded(0, 1 << 32),
        default=64,
        help="window mode's span H, in tasks (default 64)",
    )
    cmd.add_argument(
        "--ring-bytes",
        type=_bounded(CLI_ALIGN, MAX_RING_BYTES, multiple=CLI_ALIGN),
        default=1 << 20,
        help=f"the heap ring's size, a multiple of {CLI_ALIGN} up to 4 GiB (default 1048576)",
    )
    cmd.add_argument(
        "--max-fanin",
        type=_bounded(1, 1 << 20),
        help="fan-in cap, exceeding it is fatal (default: no cap)",
    )
    cmd.add_argument(
        "--no-alloc-election",
        action="store_true",
        help="the seed's pre-fix alloc_tensors path (aborts where the seed's runtime did)",
    )
    cmd.add_argument(
        "--backend",
        choices=("cpu", "sim", "cuda"),
        help="the allocator's backend, as DEVMEM_BACKEND would set it (default: DEVMEM_BACKEND,"
        " else cpu); the other DEVMEM_* variables (DEVMEM_SIM_CAPACITY_BYTES, ...) apply either"
        " way",
    )
    cmd.add_argument(
        "--check-trace",
        action="store_true",
        help="also check the trace: inputs complete, no live heap byte reused, writers ordered",
    )
    cmd.add_argument(
        "--json",
        action="store_true",
        help="print the summary as one JSON object (with the workload's sizes under 'sizes')",
    )
    parser.set_defaults(run_parser=cmd)
    return parser


def _sizes(workload: str, params: dict) -> dict:
    """The workload's sizes as run: the options given, then the function's defaults."""
    signature = inspect.signature(WORKLOADS[workload])
    sizes = {
        name: p.default
        for name, p in signature.parameters.items()
        if p.kind is p.KEYWORD_ONLY and p.default is not p.empty
    }
    return {**sizes, **params}


def format_summary(summary: dict, params: dict) -> str:
    """The CLI's text summary of :meth:`RunResult.summary` (a pure function)."""
    sizes = ", ".join(f"{k} {v}" for k, v in params.items())
    lag = ", ".join(f"core {c} x{f:g}" for c, f in summary["lag"]) or "none"
    reclaim = summary["reclaim"]
    if reclaim == "window":
        reclaim += f" (H={summary['h']})"
    rows = [
        ("workload", f"{summary['workload']} ({sizes})" if sizes else summary["workload"]),
        ("cores", f"{summary['cores']} (seed {summary['seed']}, lag: {lag})"),
        ("replay", summary["replay"]),
        ("reclaim", reclaim),
        (
            "heap ring",
            f"{summary['ring_bytes']} bytes, alloc election"
            f" {'on' if summary['alloc_election'] else 'off (pre-fix)'}",
        ),
        ("tasks", summary["tasks"]),
        ("completed", summary["completed"]),
        ("fatal", summary["fatal"] if summary["fatal"] is not None else "null"),
        ("max live window", f"{summary['max_live_window_bytes']} bytes"),
        ("simulated time", f"{summary['sim_time_us']:.3f} us"),
        ("tasks per core", " ".join(str(c) for c in summary["claims_per_core"])),
        ("back-pressure", f"{summary['backpressure_waits']} waits"),
    ]
    if "trace_violations" in summary:
        rows.append(("trace check", f"{len(summary['trace_violations'])} violations"))
    return "\n".join(f"{name:<16}{value}" for name, value in rows)


def main(argv: list[str] | None = None) -> int:
    """The command line (``python -m runtime.ring``). Returns the exit status: 0 when the run
    completed (and its trace checked clean, with ``--check-trace``), 1 on a fatal or a trace
    violation, 2 on bad arguments."""
    parser = cli_parser()
    args = parser.parse_args(_attach_dashed_values(parser, sys.argv[1:] if argv is None else argv))
    parser = args.run_parser  # errors name the subcommand: "python -m runtime.ring run: error"
    params = {}
    for name, (takers, _) in _PARAMS.items():
        value = getattr(args, name)
        if value is None:
            continue
        if args.workload not in takers:
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag} applies to {', '.join(takers)}, not to {args.workload}")
        params[name] = value
    if args.workload == "paged_attention" and "batch" not in params:
        parser.error("--workload paged_attention needs --batch")
    tasks = task_count(args.workload, **params)
    if tasks > MAX_TASKS:
        parser.error(
            f"{args.workload} with {_TASKS_FORMULA[args.workload]} would run {tasks:,} tasks,"
            f" more than the command line's limit of {MAX_TASKS:,}"
        )
    lag_cores = [core for core, _ in args.lag]
    for core in lag_cores:
        if core >= args.cores:
            parser.error(f"argument --lag: core {core} does not exist (--cores {args.cores})")
        if lag_cores.count(core) > 1:
            parser.error(f"argument --lag: core {core} is given more than once")
    config = RingConfig(
        cores=args.cores,
        seed=args.seed,
        replay=args.replay,
        lag=tuple(args.lag),
        reclaim=args.reclaim,
        h=args.h,
        ring_bytes=args.ring_bytes,
        align=CLI_ALIGN,
        max_fanin=args.max_fanin,
        alloc_election=not args.no_alloc_election,
    )
    alloc = None
    if args.backend is not None:
        from allocator import Allocator, AllocatorConfig, BackendUnavailable

        try:  # the option stands for DEVMEM_BACKEND: the other DEVMEM_* knobs apply as well
            environ = {**os.environ, "DEVMEM_BACKEND": args.backend}
            alloc = Allocator(AllocatorConfig.from_env(environ))
        except BackendUnavailable as exc:  # status 1, as DEVMEM_BACKEND's (not a usage error)
            parser.exit(1, f"{parser.prog}: error: --backend {args.backend}: {exc}\n")
    result = run(args.workload, config, alloc, **params)
    summary = result.summary()
    summary["sizes"] = _sizes(args.workload, params)
    violations = check_trace(result) if args.check_trace else None
    if violations is not None:
        summary["trace_violations"] = violations
    if args.json:
        print(json.dumps(summary))
    else:
        print(format_summary(summary, params))
    if result.fatal is not None:
        print(f"fatal: {result.fatal}", file=sys.stderr)
        return 1
    if violations:
        for line in violations:
            print(f"trace: {line}", file=sys.stderr)
        return 1
    return 0
