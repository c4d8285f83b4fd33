"""The benchmark tables in the docs, generated from the benchmarks' JSON rather than typed.

A table in a Markdown file sits between two comments that name its JSON::

    <!-- bench-table: docs/results/children.json -->
    ...the table, as the benchmark itself prints it from that JSON...
    <!-- /bench-table -->

The JSON is a benchmark's own output (``--out docs/results/<name>.json``), checked in; its
``bench/<name>.py`` renders the table (``format_table`` or ``render``), so the docs show what the
benchmark printed, to the digit. ``suites/docs/test_doc_tables.py`` fails when a table and its
JSON disagree.

Usage: ``.venv/bin/python ci/doc_tables.py [--check] [FILE.md ...]`` (default: README.md and
docs/*.md). Without ``--check`` it rewrites the stale tables in place (each file written whole,
through a temporary file and ``os.replace``); with it, it lists them and exits 1 when any is
stale. Exit status 2: a marker names a JSON that is missing or not a benchmark's.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"

_TABLE = re.compile(
    r"(?P<open><!-- bench-table: (?P<json>[^ ]+) -->\n)(?P<body>.*?)"
    r"(?P<close><!-- /bench-table -->)",
    re.S,
)


class TableError(ValueError):
    """A marker names a JSON file that cannot be read or rendered."""


def _common():
    """``bench/_common.py``, which benchmarks and this script share (its crash-safe writer)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import _common

    return _common


def _benchmark(name: str):
    """The module ``bench/<name>.py`` (its directory on ``sys.path`` for ``_common``)."""
    path = BENCH / f"{name}.py"
    if not path.is_file():
        raise TableError(f"no benchmark bench/{name}.py renders {name}.json")
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def render(json_path: Path) -> str:
    """The table that ``bench/<stem>.py`` prints for the results in ``json_path``, fenced as
    text when it is not Markdown, ending with a newline.

    Raises:
        TableError: the file is missing or not JSON, no benchmark renders it, or its benchmark
            cannot (a JSON written by an older version of it: the message says to rerun it).
    """
    try:
        results = json.loads(json_path.read_text())
    except (OSError, ValueError) as exc:
        raise TableError(f"{json_path}: cannot read the benchmark's JSON ({exc})") from None
    module = _benchmark(json_path.stem)
    renderer = getattr(module, "format_table", None) or module.render
    # render(rows) takes the part of the results it is named after (bench/checkpoint.py)
    first = next(iter(inspect.signature(renderer).parameters))
    try:
        text = renderer(results.get(first, results))
    except (KeyError, TypeError, ValueError) as exc:  # a JSON of an older bench/<name>.py
        raise TableError(
            f"{json_path}: bench/{json_path.stem}.py cannot render it ({type(exc).__name__}:"
            f" {exc}); rerun it: .venv/bin/python bench/{json_path.stem}.py --out {json_path}"
        ) from None
    table = "\n".join(line.rstrip() for line in text.strip("\n").splitlines())
    if not table.startswith("|"):  # a plain-text table: fenced, so that it keeps its columns
        table = f"```text\n{table}\n```"
    parts = [table]
    verdicts = results.get("verdicts") or {}
    if verdicts:
        words = "; ".join(
            f"{label} {'met' if met else 'MISSED'}" for label, met in verdicts.items()
        )
        parts.append(f"verdict: {words}")
    machine = results.get("machine")
    if machine:  # bench/_common.py's machine(): where the figures come from
        load = machine.get("load_average")  # absent from JSON written before it was recorded
        parts.append(
            f"Measured with Python {machine['python']}, NumPy {machine['numpy']},"
            f" {machine['cpus']} CPUs ({machine['processor']}, {machine['platform']})"
            + (f", load average {load} at the start." if load is not None else ".")
        )
    return "\n\n".join(parts) + "\n"


def refresh(text: str, base: Path | None = None) -> tuple[str, list[str]]:
    """``text`` with each table regenerated from its JSON (paths relative to ``base``, by
    default the project's root), and the JSON paths of the tables that changed.

    Raises:
        TableError: a marker's JSON cannot be read or rendered.
    """
    base = ROOT if base is None else base
    stale: list[str] = []

    def replace(match: re.Match) -> str:
        body = render(base / match["json"])
        if body != match["body"]:
            stale.append(match["json"])
        return match["open"] + body + match["close"]

    return _TABLE.sub(replace, text), stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="only list stale tables; exit 1 if any"
    )
    parser.add_argument(
        "files", nargs="*", type=Path, help="Markdown files (default: README.md and docs/*.md)"
    )
    args = parser.parse_args(argv)
    files = args.files or [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    stale_files = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
            new, stale = refresh(text)
        except OSError as exc:
            parser.error(f"{path}: {exc}")
        except TableError as exc:
            parser.error(f"{path}: {exc}")
        if not stale:
            continue
        stale_files.append(path)
        for json_path in stale:
            print(f"{path}: the table of {json_path} is stale")
        if not args.check:
            _common().write_atomically(path, new)
    if args.check and stale_files:
        print("run .venv/bin/python ci/doc_tables.py to regenerate them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
