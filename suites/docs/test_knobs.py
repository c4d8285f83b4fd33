"""The README's knob table names every ``DEVMEM_*`` variable the code reads, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("allocator", "harness", "runtime", "devmem_gpus.py", "conftest.py")
SET_BY_THE_HARNESS = {"DEVMEM_DEATH_CHILD"}  # not a knob: the harness sets it in its children


def knobs_in_code() -> set[str]:
    names = set()
    for source in SOURCES:
        path = ROOT / source
        for file in [path] if path.is_file() else sorted(path.rglob("*.py")):
            names |= set(re.findall(r"\bDEVMEM_[A-Z_]+[A-Z]\b", file.read_text()))
    return names - SET_BY_THE_HARNESS


def knobs_in_table(readme: str) -> list[str]:
    section = readme.split("\n## Knobs\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"(?m)^\| `(DEVMEM_[A-Z_]+)` \|", section)


def test_the_table_lists_every_knob_once():
    table = knobs_in_table((ROOT / "README.md").read_text())
    assert len(table) == len(set(table)), table
    assert set(table) == knobs_in_code()


def test_a_knob_missing_from_the_table_is_caught():
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `DEVMEM_HISTORY` |"))
    assert set(knobs_in_table(readme.replace(row + "\n", ""))) != knobs_in_code()
