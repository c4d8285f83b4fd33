"""Read a memory snapshot: a timeline picture and the top allocation sites, from the shell.

::

    python -m allocator.memory plot SNAPSHOT -o timeline.png   # needs the plot extra
    python -m allocator.memory summary SNAPSHOT

``SNAPSHOT`` is a pickle written by :meth:`Allocator.dump_snapshot
<allocator.Allocator.dump_snapshot>`, or by PyTorch's ``torch.cuda.memory._dump_snapshot()``
(the same format). ``plot`` draws the live bytes, stacked by allocation site (the largest sites
by peak get their own band, labelled by their allocating frame), the cached bytes on top, and
marks arena exits, releases, cap evictions, OOMs and the snapshots PyTorch took. ``summary``
prints the levels and the top allocation sites by peak live bytes, as text.

Both read the file one trace event at a time (:mod:`allocator._pickle_stream`): each event is
checked, counted and dropped, so neither holds the trace's events. What they hold is the rest
of the snapshot (the segments, and our ``devmem`` annotations: one small dict per arena exit,
release or cap eviction, so a release-heavy trace's annotations take about what its file
does), the sites, and for ``plot`` the levels after each event of the device drawn (a few
numbers an event). ``docs/memory-history.md`` has the measurements (``bench/memory_reader.py``).

A site is named as memory_viz shows a stack: among the frames its filter shows
(:func:`~allocator._timeline.memory_viz_shows`), less the allocator's own, the first Python
frame, else (a C++ stack, as PyTorch's ``stacks="all"`` records on its autograd thread) the
operator and autograd node (``at::_ops::mm < MmBackward0``). Levels are in the bytes the events
carry (PyTorch's requested sizes). Live bytes fall at a free's ``free_requested`` (the
allocator's ``live_bytes``); memory_viz lets them fall at its ``free_completed``, and
``summary`` prints memory_viz's peak too when a block that awaited another stream's work
(``record_stream``) makes it higher.

A snapshot is a pickle, read here with a restricted reader that builds only builtin types
(dicts, lists, tuples, strings, numbers, booleans, None) and looks up no global, so a
malicious file cannot run code (PyTorch's own reader, ``torch.cuda._memory_viz``, would run it:
open only files you trust there). A file that is not a snapshot (cut short, corrupt, or made to
hurt a reader: nested deep, sharing one value a billion billion times over, sharing a segment
or a trace) is one ``error:`` line naming what is wrong, its values shown bounded
(:mod:`reprlib`), exit status 1, in milliseconds for a small file.

The picture needs matplotlib (``pip install 'devmem-harness[plot]'``); without it ``plot``
says so and exits with status 1. Nothing else here needs it.
"""

from __future__ import annotations

import argparse
import itertools
import os
import pickle
import stat
import sys
from pathlib import Path

from . import _pickle_stream
from ._timeline import (
    BEFORE_TRACE,
    Timeline,
    TraceScan,
    check_one,
    check_snapshot,
    device_of,
    format_bytes,
    overview,
    overview_of,
    scan_device,
    shown_value,
    timeline,
    timeline_of,
)

__all__ = ["MAX_POINTS", "PLOT_EXTRA_HINT", "load", "main", "plot", "summary", "thinned"]

PLOT_EXTRA_HINT = "pip install 'devmem-harness[plot]' (or pip install 'matplotlib>=3.7')"

_SITE_COLORS = ("#4e79a7", "#f28e2c", "#59a14f", "#e15759", "#76b7b2", "#edc949", "#af7aa1")
_OTHER_COLOR, _BEFORE_COLOR, _CACHED_COLOR = "#9c9c9c", "#c7c7c7", "#d6e6f5"
_MAX_LABELLED_EXITS = 12


class _SnapshotUnpickler(pickle.Unpickler):
    """An unpickler that builds only what a snapshot holds: dicts, lists, tuples, str, bytes,
    int, float, bool and None (sets too, which need no global). Every global (a class, a
    function: what a malicious pickle calls to run code) and every persistent id is refused."""

    def find_class(self, module: str, name: str):
        module, name = module[:60], name[:60]  # a name from the file: shown bounded
        raise pickle.UnpicklingError(
            f"it names the global {module}.{name}; a snapshot holds only dicts, lists, tuples,"
            " strings, numbers, booleans and None, so nothing is ever imported or called"
        )

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("it holds a persistent id; a snapshot has none")


def _loaded(path: str | os.PathLike, data: object) -> dict:
    """``data`` unpickled from ``path``, as a checked snapshot (see :func:`load`)."""
    if isinstance(data, list):
        data = {"segments": data, "device_traces": []}
    if not isinstance(data, dict) or "segments" not in data:  # a wrong type: check_snapshot
        got = (
            f"keys {sorted(_key_text(key) for key in itertools.islice(data, 8))}"
            + (" ..." if len(data) > 8 else "")
            if isinstance(data, dict)
            else type(data).__name__
        )
        raise ValueError(
            f"{path}: not a memory snapshot: expected a dict with 'segments' and 'device_traces'"
            f" (the format of torch.cuda.memory._snapshot()), got {got}"
        )
    try:
        return check_snapshot(data)
    except ValueError as exc:
        raise ValueError(f"{path}: not a memory snapshot: {exc}") from None


def _key_text(key: object) -> str:
    """A key of a file's top-level dict, as an error message shows it (bounded)."""
    return (key if type(key) is str else shown_value(key))[:60]


def load(path: str | os.PathLike) -> dict:
    """The snapshot pickled at ``path``, read with a restricted unpickler (no global is ever
    looked up, so loading runs no code from the file) and checked by
    :func:`~allocator._timeline.check_snapshot`.

    A bare list is taken as a list of segments (as PyTorch's own reader does).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a pickle of builtin types, or not a snapshot; the message names
            the path and the first field that is wrong.
    """
    with open(path, "rb") as f:
        try:
            data = _SnapshotUnpickler(_NoMoreThanTheFile(f)).load()
        except Exception as exc:  # a pickle can fail in many ways; all mean "not a snapshot"
            reason = str(exc) or type(exc).__name__  # a MemoryError says nothing
            raise ValueError(f"{path}: not a pickled memory snapshot ({reason})") from None
    return _loaded(path, data)


class _NoMoreThanTheFile:
    """The file ``f`` as the unpickler reads it, never asked for more than it holds: a length
    field that claims GiBs in a file of KiBs is "pickle data was truncated", not GiBs set
    aside before the read (``BufferedReader.read(n)`` allocates ``n`` bytes first) or a
    ``MemoryError``."""

    def __init__(self, f) -> None:
        self._f = f
        info = os.fstat(f.fileno())
        # a pipe or a device says no size: read as asked
        self._left = info.st_size - f.tell() if stat.S_ISREG(info.st_mode) else sys.maxsize

    def _bounded(self, n: int | None) -> int:
        return self._left if n is None or n < 0 or n > self._left else n

    def read(self, n: int | None = -1) -> bytes:
        data = self._f.read(self._bounded(n))
        self._left -= len(data)
        return data

    def readline(self, limit: int | None = -1) -> bytes:
        line = self._f.readline(self._bounded(limit))
        self._left -= len(line)
        return line

    def peek(self, n: int = 0) -> bytes:
        return self._f.peek(n)[: self._left]


_NOT_STREAMED = object()


def _read_streamed(
    path: str | os.PathLike, device: int | None, series: bool
) -> tuple[dict, int, TraceScan, int]:
    """``(snapshot, device read, its trace's scan, events of device 0)`` of the snapshot pickled
    at ``path``, its trace events checked and scanned as they are read, then dropped
    (:mod:`allocator._pickle_stream`; the snapshot comes back with empty traces). The device
    read is ``device``, or the first with events (as :func:`~allocator._timeline.device_of`).
    With ``series`` the scan keeps the levels after every event (for a picture), and only that
    device's trace is scanned. A pickle that reader does not handle is read whole with
    :func:`load`. Raises as :func:`load`, and ``ValueError`` for ``device`` as
    :func:`~allocator._timeline.device_of`."""
    scans: dict[int, TraceScan] = {}
    counts: dict[int, int] = {}
    seen: dict[tuple | int, object] = {}
    chosen = device  # series: the one device scanned (not given: the first with an event)
    late = False  # series, no device: an earlier device's events came after the chosen one's
    short = series  # site names: with directories in a summary, without in a picture

    def count(index: int, event: object) -> None:
        nonlocal chosen, late
        done = counts.get(index, 0)
        check_one(event, done, f"device_traces[{index}]", seen)
        counts[index] = done + 1
        if series:
            if chosen is None:
                chosen = index
            elif index != chosen:
                late = late or (device is None and index < chosen)  # that one is the first
                return
        scan = scans.get(index)
        if scan is None:
            scan = scans[index] = TraceScan(short, series)
        scan.add(event)

    with open(path, "rb") as f:
        try:
            data = _pickle_stream.stream(f, count)
        except _pickle_stream.NotStreamable as exc:
            if exc.truncated:  # no unpickler reads it (nor sets aside what a length claims)
                raise ValueError(f"{path}: not a pickled memory snapshot ({exc})") from None
            data = _NOT_STREAMED  # load() reads it whole, or says what is wrong with it
        except ValueError as exc:  # an event is not what a snapshot holds
            raise ValueError(f"{path}: not a memory snapshot: {exc}") from None
    if data is not _NOT_STREAMED:
        snapshot = _loaded(path, data)
        for index, trace in enumerate(snapshot.get("device_traces") or []):
            for event in trace:  # a trace the pickle built in one step (not streamed): checked
                count(index, event)
    if data is _NOT_STREAMED or late:
        snapshot = load(path)  # checked whole
        read = device_of(snapshot, device)
        traces = snapshot.get("device_traces") or [[]]
        scan = scan_device(snapshot, read, short=short, series=series)
        return snapshot, read, scan, len(traces[0])
    if device is None:  # the first with events, as device_of
        read = next((i for i in sorted(counts) if counts[i]), 0)
    else:
        read = device_of(snapshot, device)
    return snapshot, read, scans.get(read) or TraceScan(short, series), counts.get(0, 0)


def summary(snapshot: dict | str | os.PathLike, *, top: int = 10, device: int | None = None) -> str:
    """The snapshot's levels and its ``top`` allocation sites by peak live bytes, as text.

    Args:
        snapshot: a snapshot dict (ours, or ``torch.cuda.memory._snapshot()``'s), or the path
            of a pickled one: read as :func:`load` reads it, but one trace event at a time, each
            dropped once counted, so the trace's events are never held (the segments and our
            annotations are: see the module docstring); what ``python -m allocator.memory
            summary`` does.
        top: how many sites to list, >= 1 (the others are counted).
        device: the device to read (default: the first with events).

    Returns:
        Lines ending with a newline: event count (and whether the ring dropped some), peak,
        live, cached and reserved bytes, memory_viz's peak when it is higher (a block that
        awaited another stream: see the module docstring), marker counts, then the sites'
        table.

    Raises:
        ValueError: ``top`` < 1, ``device`` has no trace, or (a path) the file is not a
            snapshot, as :func:`load`.
        OSError: (a path) the file cannot be read.
    """
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")
    if isinstance(snapshot, dict):
        line = overview(snapshot, device)
        device0 = len((snapshot.get("device_traces") or [[]])[0])
    else:
        snapshot, read, scan, device0 = _read_streamed(snapshot, device, series=False)
        line = overview_of(snapshot, read, scan)
    peak, at = line.peak
    notes = {kind: sum(m.kind == kind for m in line.markers) for kind in _MARKER_STYLE}
    devmem = snapshot.get("devmem") or {}
    # the ring holds device 0's events and the annotations
    # (less the events a snapshot added for what changed after recording stopped)
    kept = device0 + len(devmem.get("annotations", ()))
    kept -= devmem.get("reconciled", 0)
    full = devmem.get("max_entries") and kept >= devmem["max_entries"]
    lines = [
        f"backend {line.backend}: {line.events} events"
        + (" (the ring is full: older events were dropped)" if full else ""),
        f"peak live {format_bytes(peak)} after event {at}; at the end: live"
        f" {format_bytes(line.live)}, cached {format_bytes(line.cached)}, reserved"
        f" {format_bytes(line.reserved)}",
        f"arena exits {notes['arena_exit']}, releases {notes['release']}, cap evictions"
        f" {notes['cap_evict']}, OOMs {notes['oom']}",
    ]
    if line.viz_peak[0] > peak:
        viz, viz_at = line.viz_peak
        lines.insert(
            2,
            f"memory_viz's peak: {format_bytes(viz)} after event {viz_at} (it counts a freed"
            " block as live until its free_completed: blocks that awaited another stream's"
            " work)",
        )
    lines += [
        "",
        "top allocation sites by peak live bytes:",
        f"{'peak live':>12} {'allocs':>8} {'largest':>12} {'live at end':>12}  site",
    ]
    found = line.sites
    for site in found[:top]:
        lines.append(
            f"{format_bytes(site.peak_bytes):>12} {site.allocs:>8}"
            f" {format_bytes(site.largest_bytes):>12} {format_bytes(site.live_end_bytes):>12}"
            f"  {site.name}"
        )
    if not found:
        lines.append(f"{'':>12} (no allocation in the trace)")
    elif len(found) > top:
        lines.append(f"... and {len(found) - top} more sites (--top to see more)")
    return "\n".join(lines) + "\n"


# kind -> (color, legend label)
_MARKER_STYLE = {
    "arena_exit": ("#555555", "arena exit"),
    "release": ("#7b3294", "release"),
    "cap_evict": ("#e66101", "cap eviction"),
    "oom": ("#d7191c", "OOM"),
    "snapshot": ("#1a9641", "snapshot taken"),
}


def _unit(nbytes: int) -> tuple[float, str]:
    for scale, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if nbytes >= 2 * scale:
            return scale, name
    return 1, "bytes"


def _figure():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(f"allocator.memory plot needs matplotlib: {PLOT_EXTRA_HINT}") from None
    return Figure


def plot(
    snapshot: dict | str | os.PathLike,
    output: str | os.PathLike,
    *,
    top: int = 6,
    device: int | None = None,
    use_time: bool = False,
    title: str | None = None,
) -> Path:
    """Draw the snapshot's timeline into ``output`` (PNG, SVG or PDF, by its suffix).

    Args:
        snapshot: a snapshot dict (:func:`load`), or the path of a pickled one: read one trace
            event at a time, as :func:`summary` reads it, keeping only the levels after each
            event of the device drawn, not the events (what ``python -m allocator.memory plot``
            does).
        output: the picture's path.
        top: allocation sites with a band of their own (the rest is one ``other sites`` band).
        device: the device to draw (default: the first with events).
        use_time: x is the events' time (``time_us``); by default, and when the clock never
            moved (``sim`` with no kernel), x counts the allocations and frees (each free
            one step, as in memory_viz; the axis label says which).
        title: the title; default says the backend, the events and the peak.

    Returns:
        ``output`` as a Path.

    Raises:
        ImportError: matplotlib is not installed (the message says how to install it).
        ValueError: ``top`` < 0, ``device`` has no trace, or (a path) the file is not a
            snapshot, as :func:`load`.
        OSError: the picture cannot be written, or (a path) the snapshot cannot be read.
    """
    figure_class = _figure()
    if top < 0:
        raise ValueError(f"top must be >= 0, got {top}")
    if isinstance(snapshot, dict):
        line = timeline(snapshot, device, top=top)
    else:
        snapshot, read, scan, _ = _read_streamed(snapshot, device, series=True)
        line = timeline_of(snapshot, read, scan, top)
    x, xlabel = _x_axis(line, use_time, snapshot)
    keep = thinned(line.live, line.reserved)
    if len(keep) < len(line.live):
        xlabel += (
            f"; {line.events:,} events drawn as {len(keep):,} points (each stretch's first,"
            " lowest and highest levels)"
        )
    scale, unit = _unit(max(line.reserved + line.live + [1]))
    fig = figure_class(figsize=(11, 5.2), dpi=100, layout="constrained")
    ax = fig.subplots()
    bands, labels, colors = [], [], []
    named = 0
    for name, series in line.by_site.items():
        peak = max(series)
        if name == BEFORE_TRACE:
            colors.append(_BEFORE_COLOR)
        else:
            colors.append(_SITE_COLORS[named % len(_SITE_COLORS)])
            named += 1
        bands.append([series[i] / scale for i in keep])
        label = name if len(name) <= 58 else name[:55] + "..."
        # a legend drops labels that start with "_" (file names like _stress.py): peak first
        labels.append(f"peak {format_bytes(peak)}: {label}")
    sites = list(line.by_site.values())
    other = [line.live[i] - sum(series[i] for series in sites) for i in keep]
    if any(other):
        bands.append([v / scale for v in other])
        labels.append("other sites")
        colors.append(_OTHER_COLOR)
    bands.append([max(line.reserved[i] - line.live[i], 0) / scale for i in keep])
    labels.append("cached (reuse cache, blocks awaiting their event)")
    colors.append(_CACHED_COLOR)
    drawn_x = [x[i] for i in keep]
    ax.stackplot(drawn_x, *bands, labels=labels, colors=colors, step="post", linewidth=0)
    ax.step(
        drawn_x,
        [line.live[i] / scale for i in keep],
        where="post",
        color="#222222",
        lw=0.8,
        label="live bytes",
    )
    _draw_markers(ax, line, x, scale)
    peak, at = line.peak
    if peak:
        ax.annotate(
            f"peak live {format_bytes(peak)}",
            xy=(x[at], peak / scale),
            xytext=(14, -24),
            textcoords="offset points",
            fontsize=8,
            arrowprops={"arrowstyle": "->", "lw": 0.8},
        )
    ax.set_xlim(x[0], x[-1] if x[-1] > x[0] else x[0] + 1)  # a clock that never moved (sim)
    ax.set_ylim(0, max(max(line.reserved), max(line.live), 1) / scale * 1.12)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(unit)
    ax.grid(axis="y", lw=0.4, alpha=0.5)
    ax.set_title(
        title
        or f"devmem memory timeline ({line.backend}): {line.events} events,"
        f" peak live {format_bytes(peak)}",
        fontsize=11,
    )
    fig.legend(loc="outside right upper", fontsize=8, frameon=False)
    path = Path(output)
    fig.savefig(path)
    return path


MAX_POINTS = 20_000
"""The most points :func:`plot` draws per series: a longer timeline is thinned (:func:`thinned`)."""


def thinned(live: list[int], reserved: list[int], points: int = MAX_POINTS) -> list[int]:
    """The indices of the points of a timeline to draw: all of them if there are at most
    ``points``; else, for each stretch of consecutive points (``(points - 1) // 4`` stretches of
    equal length), its first point and those of its lowest and highest live level and of its
    highest reserved level, in order, and the last point. So the picture keeps every stretch's
    extremes: the peak, the lowest level and the end are drawn exactly (a 1,000,000-event trace
    is more points than a picture has pixels; matplotlib would hold every one).

    Args:
        live, reserved: the levels in bytes at each point (as long as each other).
        points: the most indices returned, >= 8.

    Raises:
        ValueError: ``points`` < 8, or the lists differ in length.
    """
    if points < 8:
        raise ValueError(f"points must be >= 8, got {points}")
    if len(live) != len(reserved):
        raise ValueError(f"live has {len(live)} points but reserved has {len(reserved)}")
    count = len(live)
    if count <= points:
        return list(range(count))
    stretches = (points - 1) // 4
    keep: list[int] = []
    for k in range(stretches):
        start, end = k * count // stretches, (k + 1) * count // stretches
        part = range(start, end)
        low = min(part, key=live.__getitem__)
        high = max(part, key=live.__getitem__)
        held = max(part, key=reserved.__getitem__)
        keep += sorted({start, low, high, held})
    if keep[-1] != count - 1:
        keep.append(count - 1)
    return keep


EVENT_AXIS = "allocations and frees (a free is one step, as in memory_viz)"
STILL_CLOCK_AXIS = EVENT_AXIS + "; --time: the clock never moved"


def _x_axis(line: Timeline, use_time: bool, snapshot: dict) -> tuple[list[float], str]:
    """x of each point, and the axis label. The event axis counts the events that change a
    level (an allocation, a free's request, a segment's malloc or free), so a free is one step
    (its ``free_completed`` takes none) and bookkeeping events take no width. A time axis on a
    clock that never moved falls back to it, saying so."""
    if use_time and line.time_us[-1] != line.time_us[0]:
        start = line.time_us[0]
        clock = (snapshot.get("devmem") or {}).get("clock", "host")
        if clock == "sim":
            return [t - start for t in line.time_us], "time (us of the simulated clock)"
        return [(t - start) / 1e6 for t in line.time_us], "time (s since the first event)"
    x, step = [0], 0
    live, reserved = line.live, line.reserved
    for i in range(1, len(live)):
        if live[i] != live[i - 1] or reserved[i] != reserved[i - 1]:
            step += 1
        x.append(step)
    return x, STILL_CLOCK_AXIS if use_time and len(live) > 1 else EVENT_AXIS


def _draw_markers(ax, line: Timeline, x: list[float], scale: float) -> None:
    by_kind: dict[str, list] = {kind: [] for kind in _MARKER_STYLE}
    for marker in line.markers:
        by_kind[marker.kind].append(marker)
    top = max(max(line.reserved), max(line.live), 1) / scale
    exits = by_kind["arena_exit"]
    color, name = _MARKER_STYLE["arena_exit"]
    for i, marker in enumerate(exits):
        ax.axvline(
            x[marker.index],
            color=color,
            ls=":",
            lw=0.8,
            label=f"{name} ({len(exits)})" if i == 0 else None,
        )
        if len(exits) <= _MAX_LABELLED_EXITS:
            ax.text(
                x[marker.index],
                top * 1.1,
                f"{marker.label} ",
                rotation=90,
                fontsize=6.5,
                va="top",
                ha="right",
                color=color,
            )
    for kind, shape in (("release", "v"), ("cap_evict", "v")):
        found = by_kind[kind]
        if found:
            color, name = _MARKER_STYLE[kind]
            # a release on the live bytes it left, a cap eviction above the plot
            ys = [line.live[m.index] / scale if kind == "release" else top * 1.06 for m in found]
            ax.plot(
                [x[m.index] for m in found],
                ys,
                ls="none",
                marker=shape,
                ms=7,
                color=color,
                label=f"{name} ({len(found)})",
                clip_on=False,
            )
    found = by_kind["snapshot"]
    for i, marker in enumerate(found):
        color, name = _MARKER_STYLE["snapshot"]
        ax.axvline(
            x[marker.index],
            color=color,
            ls="--",
            lw=0.8,
            label=f"{name} ({len(found)})" if i == 0 else None,
        )
    for i, marker in enumerate(by_kind["oom"]):
        color, name = _MARKER_STYLE["oom"]
        ax.axvline(
            x[marker.index],
            color=color,
            lw=1.4,
            label=f"{name} ({len(by_kind['oom'])})" if i == 0 else None,
        )
        ax.text(
            x[marker.index], top * 0.95, f"{marker.label} ", fontsize=7, color=color, ha="right"
        )


def main(argv: list[str] | None = None) -> int:
    """The command line; see the module docstring. Returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m allocator.memory",
        description="Read a memory snapshot (Allocator.dump_snapshot, or PyTorch's"
        " torch.cuda.memory._dump_snapshot): a timeline picture, or the top allocation sites.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{plot,summary}")
    draw = commands.add_parser(
        "plot",
        help="draw live and cached bytes over time (matplotlib)",
        description="Draw the live bytes over time, stacked by allocation site (the largest"
        " sites by peak in bands of their own), the cached bytes on top, and marks: arena"
        " exits, releases, cap evictions, OOMs, and the snapshots PyTorch took.",
    )
    draw.add_argument("snapshot", help="the pickled snapshot")
    draw.add_argument(
        "-o",
        "--output",
        default="timeline.png",
        help="the picture: .png, .svg or .pdf (default timeline.png)",
    )
    draw.add_argument(
        "--top", type=_count, default=6, help="allocation sites drawn in their own band (default 6)"
    )
    draw.add_argument(
        "--time",
        action="store_true",
        help="x is the events' time_us (default: allocations and frees, each free one step;"
        " also when the clock never moved)",
    )
    draw.add_argument("--title", help="the picture's title")
    text = commands.add_parser("summary", help="print the top allocation sites by peak bytes")
    text.add_argument("snapshot", help="the pickled snapshot")
    text.add_argument("--top", type=_positive, default=10, help="sites to list (default 10)")
    for sub in (draw, text):
        sub.add_argument(
            "--device",
            type=_count,
            default=None,
            help="the device to read (default: the first with events)",
        )
    args = parser.parse_args(argv)
    try:
        if args.command == "summary":
            sys.stdout.write(summary(args.snapshot, top=args.top, device=args.device))
        else:
            path = plot(
                args.snapshot,
                args.output,
                top=args.top,
                device=args.device,
                use_time=args.time,
                title=args.title,
            )
            print(f"wrote {path}")
    except (OSError, ValueError, ImportError) as exc:
        print(f"python -m allocator.memory {args.command}: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _count(text: str, minimum: int = 0) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}")
    return value


def _positive(text: str) -> int:
    return _count(text, 1)


if __name__ == "__main__":
    from allocator._cli import run_command  # a bad DEVMEM_* value: one line, status 1

    sys.exit(run_command(main, "python -m allocator.memory"))
