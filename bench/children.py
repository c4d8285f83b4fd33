"""Benchmark: what one death-test child costs in each style, against a raw fork in the same run.

Measures the median wall time of ``harness.run_child`` (launch, run, reap, read back) for the
fork, forkserver and exec styles, with a trivial target (``os:getpid``) and with a target that
imports NumPy (``pkgutil:resolve_name("numpy:__version__")``). Like a test process of this
project, the benchmark process has NumPy imported, and the forkserver zygote preloads it. The
children are timed in blocks of :data:`BLOCK`, each block right after as many references: a
raw ``os.fork()`` whose child calls ``os._exit(0)``, reaped with ``os.waitpid`` (the floor any
fork-based harness pays), so the verdicts are ratios taken in the same run, under the same
load; and as many raw forks whose child runs the target, after the block. Children back to
back, with nothing between them, are timed too (forkserver); and fork-style children that
only report (:func:`report_only_child`: what the harness's parent side costs, whatever the
child does). Beside them, pytest-forked's
cost per test: N trivial tests run under ``--forked`` and without, in the same run,
(forked - plain) / N; and the pair the harness competes with: N items that each run one
death-test child (``death.run("os:getpid")``, the ``death`` fixture's defaults) against the N
trivial items under ``--forked``, wall time of the whole pytest run, in the same run.

Beside each time, the minor page faults it costs (``getrusage``'s ``ru_minflt``, medians):
in this process (every page it writes after a fork faults once, the fork having made it
copy-on-write) and in the child (for fork and exec, whose children this process reaps; a
forkserver child is its zygote's). They are why a child costs more than a raw fork: the
harness's Python code around the fork touches a few hundred pages where the raw fork's loop
touches a few dozen, and each touch is a fault (a page copy in the child).

And the floor of the forkserver design, in the same run: a bare fork server
(:data:`FLOOR_SERVER`, a fresh interpreter preloading what the zygote preloads, one fork per
request, no harness) timed against the raw fork like the children; with the CPU time per
trivial child of the zygote and of its child against the bare server's and its child's
(``/proc/PID/stat``, clock ticks), which is what the harness's own work costs there.

Targets (verdicts on ratios, so a busy or slow machine gives the same verdict), each child
against a raw fork whose child runs the same target (for the trivial target, a bare raw fork:
``os.getpid`` is nothing; the NumPy target is not, see docs/results.md), so that the ratio is
what the harness adds, not what the target costs:

- a fork-style child costs at most 1.5x a raw fork (trivial and NumPy targets);
- a forkserver child costs at most 1.0x a raw fork of this process (a forkserver child is
  forked ahead of its request, see ``harness/_zygote.py``);
- N death-test items take at most 0.8x the wall time of N trivial ``--forked`` items;
- exec costs at least 5x forkserver for the NumPy target (why the forkserver exists).

Usage::

    .venv/bin/python bench/children.py [--repeat 100] [--quick] [--forked-tests 200]
        [--forked-repeat 7] [--out PATH] [--check]

Prints a table and the verdicts and writes JSON (default ``bench/results/children.json``).
Exits 1 on a missed target only under ``--check``. Not a test.
"""

from __future__ import annotations

import importlib
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import _common  # bench/_common.py, beside this script

TRIVIAL = ("os:getpid", ())
NUMPY = ("pkgutil:resolve_name", ("numpy:__version__",))
STYLES = ("fork", "forkserver", "exec")
LIMITS = {
    "fork_over_raw": 1.5,
    "forkserver_over_raw": 1.0,
    "death_items_over_forked": 0.8,
    "exec_over_forkserver_numpy": 5.0,
}
"""Upper bounds for the first three ratios, a lower bound for the last."""


def raw_fork(function: Callable[..., object] | None = None, args: tuple = ()) -> float:
    """Wall seconds of one raw ``os.fork()`` + ``os._exit(0)`` in the child + ``os.waitpid``;
    with ``function``, the child calls ``function(*args)`` first (the reference that includes
    the target's own work)."""
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            if function is not None:
                function(*args)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return time.perf_counter() - start


def time_child(style: str, target: str, args: tuple) -> float:
    """Wall seconds of one ``harness.run_child(target, *args, style=style)``.

    Raises:
      RuntimeError: the child did not end cleanly (the figures would mean nothing).
    """
    import harness

    start = time.perf_counter()
    outcome = harness.run_child(target, *args, style=style, timeout=120.0)
    elapsed = time.perf_counter() - start
    if outcome.kind != "exited" or outcome.exit_code != 0:
        raise RuntimeError(f"{style} child of {target} did not end cleanly: {outcome!r}")
    return elapsed


def _faults() -> tuple[int, int]:
    """Minor page faults so far: ``(this process, its reaped children)``."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    return own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt


def server_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of process ``pid`` so far, and of its reaped children
    (``/proc/PID/stat``): a fork server's own work and its children's."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def _cpu_per_child_ms(before: tuple, after: tuple, children: int) -> dict[str, float]:
    """Milliseconds of CPU per child, the server's own and its children's, from two
    :func:`server_cpu_s` readings around ``children`` children."""
    return {
        "server": (after[0] - before[0]) / children * 1000,
        "child": (after[1] - before[1]) / children * 1000,
    }


def _counted(step) -> tuple[float, int, int]:
    """``step()``'s seconds, with the minor faults it cost this process and its children."""
    own, children = _faults()
    seconds = step()
    after_own, after_children = _faults()
    return seconds, after_own - own, after_children - children


BLOCK = 5
"""Children timed in a row, between :data:`BLOCK` raw forks before them and as many raw forks
whose child runs the target after them. After any fork, every page the benchmark process
writes faults once (copy-on-write), so the first child of a block pays for the raw forks'
faults on its side of the launch: a forkserver child's test process, which never forks, does
not pay them in a test run; the median of a block's five leaves that first child out."""

GAP_S = 0.002
"""Seconds between two children of a block, untimed: a test's own work between two of its
children, which the forkserver's zygote uses to fork a spare child ahead of the next request
(see :func:`time_back_to_back` for children with nothing between them)."""


def time_children(
    style: str, target: str, args: tuple, repeat: int
) -> tuple[list, list, list[float], dict[str, float] | None]:
    """Wall seconds and minor page faults of ``repeat`` children, in blocks of :data:`BLOCK`
    after as many raw forks (the reference; child ``i`` is paired with raw fork ``i``), after
    one warm-up child (which may start a zygote).

    Returns:
      ``(children, raw_forks, with_target, cpu)``: two lists of ``repeat`` ``(seconds, faults
      in this process, faults in the child)`` triples; the seconds of as many raw forks whose
      child runs the target (:func:`raw_fork` given it, each right after its child); for the
      forkserver, the CPU milliseconds per child of its zygote (``server``) and of the child
      (``child``), else ``None``.

    Raises:
      RuntimeError: a child did not end cleanly (the figures would mean nothing).
    """
    import harness

    def one() -> float:
        return time_child(style, target, args)

    module, _, name = target.partition(":")  # not pkgutil.resolve_name: its first call
    function = getattr(importlib.import_module(module), name)  # would warm the NumPy target
    one()
    zygote = harness._forkserver.current() if style == "forkserver" else None
    before = None if zygote is None else server_cpu_s(zygote.pid)
    children, raws, with_target = [], [], []
    for start in range(0, repeat, BLOCK):
        size = min(BLOCK, repeat - start)
        raws += [_counted(raw_fork) for _ in range(size)]
        for _ in range(size):
            time.sleep(GAP_S)
            children.append(_counted(one))
        with_target += [raw_fork(function, args) for _ in range(size)]
    cpu = None if zygote is None else _cpu_per_child_ms(before, server_cpu_s(zygote.pid), repeat)
    return children, raws, with_target, cpu


def report_only_child(
    request: dict, *, status_fd: int, seal: object, status_identity: tuple[int, int] | None, **_
):
    """A fork child that does only what its parent needs to read a clean outcome: its pid into
    its seal, a ``started`` and a ``returned`` record, ``os._exit(0)``. No group, no death
    signal, no signal or descriptor set-up, no target: with it in place of
    ``harness._child.run_child``, a fork-style ``run_child`` costs what the harness's parent
    side costs (request, capture, launch, wait, reap, outcome) over a raw fork. Never
    returns."""
    from harness import _child

    status = _child._Status(status_fd, seal, echo=False, identity=status_identity)
    status.started()
    status.emit("returned", value=None)
    os._exit(0)


def _summary(counted: list, raws: list) -> dict[str, float | None]:
    """The figures of one cell, from :func:`time_children`'s two lists of ``(seconds, faults
    in this process, faults in the child)``: ``ms`` (median), ``over_raw`` (paired ratio over
    the raw forks), ``faults_parent`` and ``faults_child`` (medians)."""
    times = [seconds for seconds, _, _ in counted]
    return {
        "ms": statistics.median(times) * 1000,
        "over_raw": _common.paired_ratio(times, [seconds for seconds, _, _ in raws]),
        "faults_parent": statistics.median(own for _, own, _ in counted),
        "faults_child": statistics.median(child for _, _, child in counted),
    }


def time_back_to_back(style: str, repeat: int) -> tuple[list[float], list[float]]:
    """Wall seconds of ``repeat`` trivial children run back to back, with nothing between them
    (several children in one test), and of as many raw forks run the same way, after them.

    Returns:
      ``(children, raw_forks)``: seconds each.
    """
    time_child(style, *TRIVIAL)
    children = [time_child(style, *TRIVIAL) for _ in range(repeat)]
    return children, [raw_fork() for _ in range(repeat)]


FLOOR_SERVER = """
import os, select, socket, sys
import numpy, pkgutil  # what the harness's zygote preloads in this benchmark
sock = socket.socket(fileno=int(sys.argv[1]))
while True:
    message, fds, _, _ = socket.recv_fds(sock, 64, 1)
    if not message:
        break
    pid = os.fork()
    if pid == 0:
        os.write(fds[0], b"0")
        os._exit(0)
    os.close(fds[0])
    pidfd = os.pidfd_open(pid)
    sock.send(b"forked")
    select.select([pidfd], [], [])
    os.close(pidfd)
    sock.send(str(os.waitpid(pid, 0)[1]).encode())
"""
"""The floor of any fork server: a fresh interpreter that preloads what the harness's zygote
preloads here, then serves one request at a time over a ``SOCK_SEQPACKET`` socket with a
descriptor attached (the child's status pipe), forks a child that writes one byte and
``os._exit``s, waits on its pidfd and sends its wait status; no harness at all."""


def time_floor_server(repeat: int) -> tuple[list[float], list[float], dict[str, float]]:
    """Wall seconds of ``repeat`` requests to :data:`FLOOR_SERVER` (a child each, its byte read
    back), each right after a raw fork, after ten warm-up requests.

    Returns:
      ``(requests, raw_forks, cpu)``: seconds each, and the CPU milliseconds per request of
      the server (``server``) and of its child (``child``).
    """
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server = subprocess.Popen(
        [sys.executable, "-c", FLOOR_SERVER, str(theirs.fileno())], pass_fds=[theirs.fileno()]
    )
    theirs.close()
    ours.settimeout(60)  # a server that died fails the benchmark instead of hanging it

    def one() -> float:
        start = time.perf_counter()
        read_end, write_end = os.pipe()
        socket.send_fds(ours, [b"run"], [write_end])
        os.close(write_end)
        forked, status = ours.recv(64), ours.recv(64)
        byte = os.read(read_end, 1)
        os.close(read_end)
        elapsed = time.perf_counter() - start
        if forked != b"forked" or status != b"0" or byte != b"0":
            raise RuntimeError(f"the floor server failed: {forked!r} {status!r} {byte!r}")
        return elapsed

    try:
        for _ in range(10):
            one()
        before = server_cpu_s(server.pid)
        requests, raws = [], []
        for _ in range(repeat):
            raws.append(raw_fork())
            requests.append(one())
        cpu = _cpu_per_child_ms(before, server_cpu_s(server.pid), repeat)
    finally:
        ours.close()  # the server reads end of file and leaves
        server.wait(timeout=60)
    return requests, raws, cpu


def time_pytest_forked(tests: int, repeat: int) -> dict:
    """pytest-forked's cost per test: ``tests`` trivial tests with and without ``--forked``;
    and ``tests`` items that each run one death-test child, against the ``--forked`` run:
    with the ``death`` fixture's default style (``auto``: fork here), and with
    ``--death-style forkserver``."""
    with tempfile.TemporaryDirectory(prefix="bench-forked-") as directory:
        trivial = "".join(f"def test_{i}():\n    pass\n\n\n" for i in range(tests))
        Path(directory, "trivial", "test_trivial.py").parent.mkdir()
        Path(directory, "trivial", "test_trivial.py").write_text(trivial)
        death = "".join(
            f"def test_{i}(death):\n    death.run('os:getpid').assert_clean()\n\n\n"
            for i in range(tests)
        )
        Path(directory, "death", "test_death.py").parent.mkdir()
        Path(directory, "death", "test_death.py").write_text(death)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]

        def run(where: str, extra: list[str]) -> tuple[float, int]:
            start = time.perf_counter()
            result = subprocess.run(
                [*command, *extra, str(Path(directory, where))],
                cwd=directory,
                capture_output=True,
                text=True,
                check=False,
            )
            return time.perf_counter() - start, result.returncode

        per_test, plain_runs, forked_runs, death_runs, pairs, codes = [], [], [], [], [], set()
        server_runs, server_pairs = [], []
        for _ in range(repeat):
            plain, plain_code = run("trivial", [])
            forked, forked_code = run("trivial", ["--forked"])
            items, death_code = run("death", [])
            server_items, server_code = run("death", ["--death-style", "forkserver"])
            codes |= {plain_code, forked_code, death_code, server_code}
            plain_runs.append(plain)
            forked_runs.append(forked)
            death_runs.append(items)
            server_runs.append(server_items)
            per_test.append((forked - plain) / tests)
            pairs.append(items / forked)
            server_pairs.append(server_items / forked)
    return {
        "tests": tests,
        "runs": repeat,
        "plain_s": statistics.median(plain_runs),
        "forked_s": statistics.median(forked_runs),
        "death_items_s": statistics.median(death_runs),
        "death_items_over_forked": statistics.median(pairs),
        "forkserver_items_s": statistics.median(server_runs),
        "forkserver_items_over_forked": statistics.median(server_pairs),
        "per_test_ms": statistics.median(per_test) * 1000,
        "all_passed": codes == {0},
    }


def measure(repeat: int, forked_tests: int, forked_repeat: int) -> dict:
    """Run every measurement; return the results as plain data."""
    import pkgutil  # the NumPy target's own module: its import is not what we measure

    import numpy  # noqa: F401  (a test process of this project has it: fork children inherit it)

    import harness
    from harness import _child

    assert pkgutil.resolve_name  # imported for the fork style's sake
    harness.set_forkserver_preload(["numpy", "pkgutil"])
    children: dict[str, dict[str, float | None]] = {}
    raws: list[tuple[float, int, int]] = []
    for style in STYLES:
        children[style] = {}
        runs = repeat if style != "exec" else max(repeat // 4, 5)  # exec is 10-30x slower
        for name, (target, args) in (("trivial", TRIVIAL), ("numpy", NUMPY)):
            counted, raw, with_target, cpu = time_children(style, target, args, runs)
            raws += raw
            row = children[style]
            summary = _summary(counted, raw)
            if style == "forkserver":  # its child is reaped by its zygote: not counted here
                summary["faults_child"] = None
            row.update((f"{name}_{key}", value) for key, value in summary.items())
            row[f"{name}_over_raw_target"] = _common.paired_ratio(
                [seconds for seconds, _, _ in counted], with_target
            )
            if cpu is not None:
                row[f"{name}_cpu_ms"] = cpu
    with mock.patch.object(_child, "run_child", report_only_child):
        parent_side, parent_side_raws, _, _ = time_children("fork", *TRIVIAL, repeat)
    back_to_back, back_to_back_raws = time_back_to_back("forkserver", repeat)
    floor, floor_raws, floor_cpu = time_floor_server(repeat)
    forked = time_pytest_forked(forked_tests, forked_repeat)
    ratios = {  # each target against a raw fork whose child runs it too: the harness's cost
        "fork_over_raw": max(
            children["fork"]["trivial_over_raw"], children["fork"]["numpy_over_raw_target"]
        ),
        "forkserver_over_raw": max(
            children["forkserver"]["trivial_over_raw"],
            children["forkserver"]["numpy_over_raw_target"],
        ),
        "death_items_over_forked": forked["death_items_over_forked"],
        "exec_over_forkserver_numpy": children["exec"]["numpy_ms"]
        / children["forkserver"]["numpy_ms"],
    }
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": _common.machine(),
        "repeat": repeat,
        "raw_fork_ms": statistics.median(seconds for seconds, _, _ in raws) * 1000,
        "raw_fork_faults_parent": statistics.median(own for _, own, _ in raws),
        "raw_fork_faults_child": statistics.median(child for _, _, child in raws),
        "children": children,
        "fork_parent_side": _summary(parent_side, parent_side_raws),
        "forkserver_back_to_back": {
            "ms": statistics.median(back_to_back) * 1000,
            "over_raw": statistics.median(back_to_back) / statistics.median(back_to_back_raws),
        },
        "floor_server": {
            "ms": statistics.median(floor) * 1000,
            "over_raw": _common.paired_ratio(floor, floor_raws),
            "cpu_ms": floor_cpu,
        },
        "pytest_forked": forked,
        "ratios": ratios,
        "limits": LIMITS,
        "checks": {
            "fork_over_raw": ratios["fork_over_raw"] <= LIMITS["fork_over_raw"],
            "forkserver_over_raw": ratios["forkserver_over_raw"] <= LIMITS["forkserver_over_raw"],
            "death_items_over_forked": forked["all_passed"]
            and ratios["death_items_over_forked"] <= LIMITS["death_items_over_forked"],
            "exec_over_forkserver_numpy": ratios["exec_over_forkserver_numpy"]
            >= LIMITS["exec_over_forkserver_numpy"],
        },
    }


def format_table(results: dict) -> str:
    """The results as a Markdown table, the pytest-forked line and one verdict line."""

    def faults(parent: float, child: float | None) -> str:
        return f"{parent:.0f} / " + ("-" if child is None else f"{child:.0f}")

    lines = [
        "| style | trivial target | NumPy-importing target | minor faults, this process / child"
        " (trivial) |",
        "|---|---:|---:|---:|",
        f"| raw `os.fork()` + `waitpid` (reference) | {results['raw_fork_ms']:.2f} ms | |"
        f" {faults(results['raw_fork_faults_parent'], results['raw_fork_faults_child'])} |",
    ]
    for style in STYLES:
        row = results["children"][style]
        lines.append(
            f"| {style} | {row['trivial_ms']:.2f} ms ({row['trivial_over_raw']:.1f}x) |"
            f" {row['numpy_ms']:.2f} ms ({row['numpy_over_raw']:.1f}x) |"
            f" {faults(row['trivial_faults_parent'], row['trivial_faults_child'])} |"
        )
    for style in STYLES:
        row = results["children"][style]
        lines.append(
            f"| {style}, over a raw fork whose child runs the target too |"
            f" {row['trivial_over_raw_target']:.1f}x | {row['numpy_over_raw_target']:.1f}x | |"
        )
    row = results["fork_parent_side"]
    lines.append(
        "| fork, the child only reporting (no set-up, no target): the harness's parent side |"
        f" {row['ms']:.2f} ms ({row['over_raw']:.1f}x) | |"
        f" {faults(row['faults_parent'], row['faults_child'])} |"
    )
    row = results["forkserver_back_to_back"]
    lines.append(
        "| forkserver, children back to back (nothing between them: no time to fork a spare) |"
        f" {row['ms']:.2f} ms ({row['over_raw']:.1f}x) | | |"
    )
    floor = results["floor_server"]
    lines.append(
        "| a bare fork server (no harness; its zygote preloads what the forkserver's does) |"
        f" {floor['ms']:.2f} ms ({floor['over_raw']:.1f}x) | | |"
    )
    server = results["children"]["forkserver"]["trivial_cpu_ms"]
    lines.append(
        "| CPU per trivial child, server / child: forkserver vs bare server |"
        f" {server['server']:.2f} / {server['child']:.2f} ms vs"
        f" {floor['cpu_ms']['server']:.2f} / {floor['cpu_ms']['child']:.2f} ms | | |"
    )
    forked = results["pytest_forked"]
    label = "pytest-forked, per test" + ("" if forked["all_passed"] else " (tests FAILED)")
    lines.append(f"| {label} | {forked['per_test_ms']:.2f} ms | | |")
    lines.append(
        f"| {forked['tests']} death-test items vs {forked['tests']} trivial `--forked` items |"
        f" {forked['death_items_s']:.2f} s vs {forked['forked_s']:.2f} s"
        f" ({forked['death_items_over_forked']:.2f}x) | | |"
    )
    lines.append(
        f"| the same {forked['tests']} items with `--death-style forkserver` |"
        f" {forked['forkserver_items_s']:.2f} s ({forked['forkserver_items_over_forked']:.2f}x)"
        " | | |"
    )
    lines += [
        "",
        f"Medians of {results['repeat']} children per cell (exec: a quarter), in blocks of"
        f" {BLOCK} after as many raw forks, {GAP_S * 1000:g} ms apart; (Nx) = the median of each"
        " child over its raw fork (back to back: over the median raw fork). Faults: medians"
        " of getrusage's ru_minflt per child (a forkserver child is its zygote's: -)."
        f" pytest-forked: {forked['tests']} trivial tests,"
        f" {forked['forked_s']:.2f} s with --forked vs {forked['plain_s']:.2f} s without (median"
        f" of {forked['runs']} runs).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table and the verdict; write the JSON. Returns the exit
    status (1 only under ``--check`` with a missed target)."""
    parser = _common.parser(
        "children", __doc__, repeat=100, quick="20 children per cell, 50 pytest-forked tests"
    )
    parser.add_argument(
        "--forked-tests",
        type=int,
        default=200,
        help="trivial tests per pytest-forked run (default 200)",
    )
    parser.add_argument(
        "--forked-repeat",
        type=int,
        default=7,
        help="pytest runs with and without --forked, and of the death-test items (default 7: "
        "their ratio sits near its 0.8x target, and a median of 3 flipped its verdict from run "
        "to run)",
    )
    options = _common.parse(parser, argv)
    for name in ("forked_tests", "forked_repeat"):
        if getattr(options, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if options.quick:
        options.repeat, options.forked_tests, options.forked_repeat = 20, 50, 1
    results = measure(options.repeat, options.forked_tests, options.forked_repeat)
    ratios, limits = results["ratios"], results["limits"]
    verdicts = {
        f"fork/raw {ratios['fork_over_raw']:.1f}x <= {limits['fork_over_raw']:g}x (the parent"
        f" side alone: {results['fork_parent_side']['over_raw']:.1f}x)": results["checks"][
            "fork_over_raw"
        ],
        f"forkserver/raw {ratios['forkserver_over_raw']:.1f}x"
        f" <= {limits['forkserver_over_raw']:g}x": results["checks"]["forkserver_over_raw"],
        f"{results['pytest_forked']['tests']} death-test items / as many --forked items"
        f" {ratios['death_items_over_forked']:.2f}x <= {limits['death_items_over_forked']:g}x": (
            results["checks"]["death_items_over_forked"]
        ),
        f"exec/forkserver (NumPy) {ratios['exec_over_forkserver_numpy']:.1f}x"
        f" >= {limits['exec_over_forkserver_numpy']:g}x": results["checks"][
            "exec_over_forkserver_numpy"
        ],
    }
    return _common.finish(options, results, format_table(results), verdicts)


if __name__ == "__main__":
    sys.exit(main())
