"""Files that several documents ask the reader to write agree: a reader who copies the README's
example and then a doc's (into the same package) gets modules that import each other."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from suites.docs._blocks import blocks_in

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_RELATIVE = re.compile(r"^from \. import (?P<names>[\w, ]+)$", re.M)


def _files(doc: Path) -> dict[str, str]:
    """The files ``doc`` asks the reader to write in the repository, by path."""
    return {
        block.path: block.text
        for block in blocks_in(doc)
        if block.kind == "file" and block.skip is None and block.place is None
    }


def _package(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def unresolved(files: dict[str, str], available: set[str]) -> list[str]:
    """``from . import X`` lines of ``files`` whose ``X.py`` is not in ``available``."""
    missing = []
    for path, text in files.items():
        for match in _RELATIVE.finditer(text):
            for name in (part.strip() for part in match["names"].split(",")):
                if f"{_package(path)}/{name}.py".lstrip("/") not in available:
                    missing.append(f"{path}: from . import {name}")
    return missing


def test_each_documents_example_files_fit_the_others():
    # a reader may take any file of a package from either document: each document's files must
    # import only modules that every other document writing into that package writes too
    for first, second in itertools.permutations(DOCS, 2):
        theirs = _files(second)
        packages = {_package(path) for path in theirs}
        ours = {path: text for path, text in _files(first).items() if _package(path) in packages}
        if ours:
            assert unresolved(ours, set(theirs)) == [], (first.name, second.name)


def test_a_renamed_module_is_caught():
    files = {
        "suites/example/_targets.py": "def f(): ...\n",
        "suites/example/test_x.py": "from . import _death_targets\n",
    }
    assert unresolved(files, set(files)) == [
        "suites/example/test_x.py: from . import _death_targets"
    ]
