"""Every relative link of README.md and docs/*.md reaches a file of the repository, and a link
to a heading (``page.md#heading``) reaches a heading of that page, as GitHub names it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces made ``-``."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return {anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def broken_links(doc: Path) -> list[str]:
    """The relative links of ``doc`` whose file or heading does not exist."""
    text = _FENCE.sub("", doc.read_text(encoding="utf-8"))
    broken = []
    for match in _LINK.finditer(text):
        target = match["target"]
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, heading = target.partition("#")
        page = doc if not path else (doc.parent / path).resolve()
        if not page.exists():
            broken.append(f"{target}: no such file")
        elif heading and page.suffix == ".md" and heading not in anchors(page):
            broken.append(f"{target}: no such heading")
    return broken


def test_every_relative_link_reaches_its_file_and_heading():
    assert {doc.name: broken_links(doc) for doc in DOCS if broken_links(doc)} == {}


def test_a_broken_link_is_caught(tmp_path):
    (tmp_path / "other.md").write_text("# Death-test children\n")
    doc = tmp_path / "page.md"
    doc.write_text(
        "# A page\n[ok](other.md#death-test-children) [self](#a-page) [web](https://x.org)\n"
        "[gone](missing.md) [bad](other.md#death-test-children-benchchildrenpy)\n"
        "```\n[in a fence](nowhere.md)\n```\n"
    )
    assert broken_links(doc) == [
        "missing.md: no such file",
        "other.md#death-test-children-benchchildrenpy: no such heading",
    ]
    assert anchor("Death-test children (`bench/children.py`)") == (
        "death-test-children-benchchildrenpy"
    )
