"""Reading a big memory snapshot: ``python -m allocator.memory summary|plot`` against PyTorch's
own reader, ``python -m torch.cuda._memory_viz trace``, on the same file.

Not a test: run it by hand (``.venv/bin/python bench/memory_reader.py``; PyTorch installed for
the reference, ``pip install torch==2.13.0``). It prints a table, writes JSON
(``bench/results/memory_reader.json``) and ends with one ``verdict:`` line (``bench/_common.py``).

The snapshot: ``--entries`` trace events (1,000,000 by default, ``--quick`` 100,000) written by
:func:`make_snapshot` in the format ``Allocator.dump_snapshot`` writes (protocol 4): cached
round trips (``alloc``, ``free_requested``, ``free_completed``) of 16 KiB to 4 MiB buffers
from 64 allocation sites, each stack 12 frames deep, with a ``segment_alloc`` per new address,
and one ``release`` annotation per round trip. Each command runs in a child process, ``--repeat``
times, alternating; the figures are the medians of wall time, of CPU time (user and system) and
of the child's peak resident memory (``VmHWM``) less that of a child that only imports the
reader.

Targets (issue 22): ``summary`` at most 0.5x the time of ``_memory_viz trace`` (its output
thrown away) on the same file, and at most 2x the file's size in memory above the baseline.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import _common  # bench/_common.py, beside this script

TARGET_VS_TORCH = 0.5
TARGET_MEMORY_VS_FILE = 2.0
SITES = 64
DEPTH = 12


def make_snapshot(entries: int, path: Path, seed: int = 1) -> int:
    """Write a snapshot of ``entries`` trace events to ``path``; returns its size in bytes."""
    rng = random.Random(seed)

    def frame(i: int, j: int) -> dict:
        return {
            "filename": f"/src/project/pkg/module_{(i + j) % 97}.py",
            "line": 10 + j,
            "name": f"f{j}",
        }

    stacks = [[frame(i, j) for j in range(DEPTH)] for i in range(SITES)]
    trace, notes, segments, seen = [], [], {}, set()
    live: dict[int, tuple[int, list]] = {}
    t = 1_000_000
    while len(trace) < entries:
        t += 1
        site = rng.randrange(SITES)
        size = 16384 << rng.randrange(9)
        address = 0x7F00_0000_0000 + rng.randrange(4096) * (8 << 20)
        if address in live:  # free it: a round trip's second half
            size, frames = live.pop(address)
            trace.append(_event("free_requested", address, size, t, list(frames)))
            notes.append({"action": "release", "trace_index": len(trace), "time_us": t})
            trace.append(_event("free_completed", address, size, t, list(frames)))
            continue
        if address not in seen:
            seen.add(address)
            segments[address] = size
            trace.append(_event("segment_alloc", address, size, t, list(stacks[site])))
        size = segments[address]
        live[address] = (size, stacks[site])
        trace.append(_event("alloc", address, size, t, list(stacks[site])))
    del trace[entries:]
    live = {}
    for event in trace:  # the state the trace ends in, as segments
        if event["action"] == "alloc":
            live[event["addr"]] = event
        elif event["action"] == "free_requested":
            live.pop(event["addr"], None)
    held = {e["addr"]: e["size"] for e in trace if e["action"] == "segment_alloc"}
    snapshot = {
        "segments": [
            {
                "device": 0,
                "address": address,
                "total_size": size,
                "allocated_size": size if address in live else 0,
                "active_size": size if address in live else 0,
                "requested_size": size if address in live else 0,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": [
                    {
                        "address": address,
                        "size": size,
                        "requested_size": size,
                        "state": "active_allocated" if address in live else "inactive",
                        "frames": [],
                    }
                ],
            }
            for address, size in sorted(held.items())
        ],
        "device_traces": [trace],
        "devmem": {"format": 1, "backend": "sim", "clock": "sim", "annotations": notes},
    }
    with open(path, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    return path.stat().st_size


def _event(action: str, address: int, size: int, t: int, frames: list) -> dict:
    return {
        "action": action,
        "addr": address,
        "size": size,
        "stream": 0,
        "time_us": t,
        "frames": frames,
    }


_CHILD = """
import sys, time, runpy
start, cpu = time.perf_counter(), time.process_time()
sys.argv = {argv!r}
try:
    runpy.run_module({module!r}, run_name="__main__")
except SystemExit as exc:
    if exc.code not in (0, None):
        raise
rss = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
sys.stderr.write(f"{{time.perf_counter() - start}} {{rss}} {{time.process_time() - cpu}}\\n")
"""


def run_child(module: str, argv: list[str]) -> tuple[float, int, float]:
    """Run ``python -m module argv...`` in a child (stdout thrown away); returns its wall time
    in seconds from just before the module runs, its peak resident memory in bytes (``VmHWM``:
    ``ru_maxrss`` would report the parent's if that was higher, as Linux keeps it across fork
    and exec), and the CPU seconds the module took (user and system, all its threads).

    Raises:
        RuntimeError: the child failed (the message ends with its stderr)."""
    code = _CHILD.format(module=module, argv=[module, *argv])
    done = subprocess.run(
        [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"{module} {argv} failed: {done.stderr[-2000:]}")
    seconds, kib, cpu = done.stderr.strip().splitlines()[-1].split()
    return float(seconds), int(kib) * 1024, float(cpu)


def baseline_rss(module: str) -> int:
    """Peak resident memory of a child that imports ``module`` only (bytes)."""
    code = (
        f"import {module}\n"
        "print(next(int(line.split()[1]) for line in open('/proc/self/status')"
        " if line.startswith('VmHWM')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(done.stdout) * 1024


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit status (see ``bench/_common.py``)."""
    parser = _common.parser("memory_reader", __doc__, repeat=3, quick="100,000 entries")
    parser.add_argument("--entries", type=int, default=None, help="trace events (default 1e6)")
    args = _common.parse(parser, argv)
    entries = args.entries or (100_000 if args.quick else 1_000_000)
    env_root = str(_common.ROOT)
    os.environ["PYTHONPATH"] = env_root + os.pathsep + os.environ.get("PYTHONPATH", "")
    have_torch = importlib.util.find_spec("torch") is not None  # not imported here: see run_child
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.pickle"
        file_bytes = make_snapshot(entries, path)
        png = str(Path(tmp) / "big.png")
        commands = {
            "summary": ("allocator.memory", ["summary", str(path)]),
            "plot": ("allocator.memory", ["plot", str(path), "-o", png]),
        }
        if have_torch:
            commands["torch_trace"] = ("torch.cuda._memory_viz", ["trace", str(path)])
        runs: dict[str, list[tuple[float, int, float]]] = {name: [] for name in commands}
        for _ in range(args.repeat):
            for name, (module, child_argv) in commands.items():
                runs[name].append(run_child(module, child_argv))
        base = {"allocator.memory": baseline_rss("allocator.memory")}
        if have_torch:
            base["torch.cuda._memory_viz"] = baseline_rss("torch.cuda._memory_viz")
    results: dict = {
        "machine": _common.machine(),
        "command": " ".join(["bench/memory_reader.py", *(sys.argv[1:] if argv is None else argv)]),
        "repeat": args.repeat,
        "entries": entries,
        "file_bytes": file_bytes,
    }
    for name, (module, _) in commands.items():
        seconds = statistics.median(run[0] for run in runs[name])
        rss = statistics.median(run[1] for run in runs[name]) - base[module]
        results[name] = {
            "seconds": seconds,
            "cpu_seconds": statistics.median(run[2] for run in runs[name]),
            "memory_bytes": rss,
            "memory_over_file": rss / file_bytes,
        }
    verdicts = {
        f"summary memory <= {TARGET_MEMORY_VS_FILE:g}x the file": results["summary"][
            "memory_over_file"
        ]
        <= TARGET_MEMORY_VS_FILE
    }
    if have_torch:
        ratio = results["summary"]["seconds"] / results["torch_trace"]["seconds"]
        results["summary_over_torch_trace"] = ratio
        verdicts[f"summary <= {TARGET_VS_TORCH:g}x torch trace"] = ratio <= TARGET_VS_TORCH
    return _common.finish(args, results, render(results), verdicts)


def render(results: dict) -> str:
    """The results as a plain-text table."""
    mib = results["file_bytes"] / (1 << 20)
    head = f"benchmark ({results['entries']:,} events, {mib:.1f} MiB file)"
    lines = [
        f"{head:<47} {'median':>10} {'CPU':>10} {'memory':>10} {'target':>10}",
        "-" * 91,
    ]
    for name in ("summary", "plot", "torch_trace"):
        if name in results:
            r = results[name]
            cpu = f"{r['cpu_seconds']:>8.2f} s" if "cpu_seconds" in r else f"{'':>10}"
            lines.append(
                f"{name:<47} {r['seconds']:>8.2f} s {cpu}"
                f" {r['memory_bytes'] / (1 << 20):>6.0f} MiB"
                f" {'<= 2x file' if name == 'summary' else '':>10}"
            )
    if "summary_over_torch_trace" in results:
        lines.append(
            f"{'summary / torch trace, same file, same run':<47}"
            f" {results['summary_over_torch_trace']:>9.2f}x {'':>10} {'':>10} {'<= 0.5x':>10}"
        )
    lines.append(
        f"{'summary memory / file size':<47} {results['summary']['memory_over_file']:>9.2f}x"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
