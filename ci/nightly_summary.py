"""One-page summary of a nightly run (``ci/check.sh --nightly``), from its JUnit XML.

Usage: ``python ci/nightly_summary.py reports/nightly.xml [--memory reports/memory]
[--out reports/nightly-summary.md]``

One row per suite (test module) and backend: passed, failed (failures and errors), skipped,
duration, and the peak live bytes of the allocators the suite built in-process (the
``peak_live_bytes`` property the project's ``make_alloc`` fixture records; ``-`` for suites
that only run children). The backend comes from the ``backend`` property the ``backend``
fixture records (``-`` for tests not parametrized by backend). Failures are listed below the
table with their first message line. Needs the XML written with ``-o junit_family=xunit1``
(the family that keeps ``record_property`` values). With ``--memory DIR`` (what
``ci/memory_pictures.py`` wrote) a last section shows each memory timeline picture and links
its summary and its snapshot.
"""

from __future__ import annotations

import argparse
import os
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path


@dataclass
class Row:
    """Counts for one (suite, backend)."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    peak_bytes: int | None = None
    skip_reasons: set[str] = field(default_factory=set)


def suite_of(classname: str) -> str:
    """``suites.allocator.test_model.TestSim`` -> ``allocator/test_model``."""
    parts = classname.split(".")
    for i, part in enumerate(parts):
        if part.startswith("test_"):
            parts = parts[: i + 1]
            break
    if parts and parts[0] == "suites":
        parts = parts[1:]
    return "/".join(parts)


def summarize(xml_path: Path) -> tuple[dict[tuple[str, str], Row], list[str], dict[str, str]]:
    """Rows keyed by (suite, backend), the failures, and the run's totals.

    Raises:
        FileNotFoundError: ``xml_path`` does not exist.
        xml.etree.ElementTree.ParseError: it is not XML.
        ValueError: it holds no ``testsuite`` element.
    """
    root = ET.parse(xml_path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if not suites:
        raise ValueError(f"{xml_path}: no <testsuite> element; is it pytest's JUnit XML?")
    rows: dict[tuple[str, str], Row] = defaultdict(Row)
    failures = []
    for suite in suites:
        for case in suite.iter("testcase"):
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            key = (suite_of(case.get("classname", "")), props.get("backend", "-"))
            row = rows[key]
            row.seconds += float(case.get("time", 0) or 0)
            if props.get("peak_live_bytes"):
                peak = int(props["peak_live_bytes"])
                row.peak_bytes = peak if row.peak_bytes is None else max(row.peak_bytes, peak)
            problem = case.find("failure")
            if problem is None:
                problem = case.find("error")
            if problem is not None:
                row.failed += 1
                message = (problem.get("message") or problem.text or "").strip().splitlines()
                name = f"{case.get('classname')}::{case.get('name')}"
                failures.append(f"{name}: {message[0] if message else '(no message)'}")
            elif case.find("skipped") is not None:
                row.skipped += 1
                row.skip_reasons.add(case.find("skipped").get("message", ""))
            else:
                row.passed += 1
    totals = {
        "tests": str(sum(int(s.get("tests", 0)) for s in suites)),
        "seconds": f"{sum(float(s.get('time', 0)) for s in suites):.1f}",
        "timestamp": suites[0].get("timestamp", ""),
    }
    return dict(rows), failures, totals


def _mib(nbytes: int | None) -> str:
    if nbytes is None:
        return "-"
    if nbytes < 1 << 20:
        return f"{nbytes / 1024:.1f} KiB"
    return f"{nbytes / (1 << 20):.2f} MiB"


def render(rows: dict[tuple[str, str], Row], failures: list[str], totals: dict[str, str]) -> str:
    """The summary as Markdown."""
    passed = sum(r.passed for r in rows.values())
    failed = sum(r.failed for r in rows.values())
    skipped = sum(r.skipped for r in rows.values())
    when = totals["timestamp"] or datetime.now(timezone.utc).isoformat(timespec="seconds")
    verdict = "FAILED" if failed else "passed"
    lines = [
        f"# devmem-harness nightly: {verdict}",
        "",
        f"{when}: {totals['tests']} tests, {passed} passed, {failed} failed, {skipped} skipped"
        f" in {totals['seconds']} s.",
        "",
        "| suite | backend | passed | failed | skipped | duration | peak live |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (suite, backend), row in sorted(rows.items()):
        lines.append(
            f"| {suite} | {backend} | {row.passed} | {row.failed} | {row.skipped} |"
            f" {row.seconds:.1f} s | {_mib(row.peak_bytes)} |"
        )
    reasons = sorted({reason for row in rows.values() for reason in row.skip_reasons if reason})
    if reasons:
        lines += ["", "Skip reasons:", *(f"- {reason}" for reason in reasons)]
    if failures:
        lines += ["", "Failures:", *(f"- {failure}" for failure in failures)]
    return "\n".join(lines) + "\n"


def memory_section(directory: Path, relative_to: Path) -> str:
    """Markdown showing every ``<name>.png`` of ``directory`` (paths relative to the folder of
    the summary, ``relative_to``), each with links to its ``<name>.txt`` summary and
    ``<name>.pickle`` snapshot when they exist; empty when there is no picture."""
    lines = []
    for picture in sorted(directory.glob("*.png")):
        name = picture.stem

        def link(path: Path) -> str:
            return os.path.relpath(path, relative_to)

        lines += ["", f"### {name}", "", f"![{name} memory timeline]({link(picture)})", ""]
        extras = [
            f"[{label}]({link(path)})"
            for label, path in (
                ("top allocation sites", picture.with_suffix(".txt")),
                (
                    "snapshot (open it in https://pytorch.org/memory_viz)",
                    picture.with_suffix(".pickle"),
                ),
            )
            if path.exists()
        ]
        if extras:
            lines.append(" · ".join(extras))
    if not lines:
        return ""
    return "\n".join(["", "## Memory timelines", *lines]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("xml", type=Path, help="the JUnit XML of the nightly run")
    parser.add_argument("--out", type=Path, help="also write the summary to this file")
    parser.add_argument(
        "--memory", type=Path, help="a folder of memory timelines (ci/memory_pictures.py) to show"
    )
    args = parser.parse_args(argv)
    try:
        text = render(*summarize(args.xml))
    except (OSError, ET.ParseError, ValueError) as exc:
        parser.exit(1, f"nightly_summary: cannot read {args.xml}: {exc}\n")
    if args.memory is not None:
        where = (args.out or Path("nightly-summary.md")).resolve().parent
        text += memory_section(args.memory.resolve(), where)
    print(text, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
