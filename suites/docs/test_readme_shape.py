"""The README is a landing page: short, linking every document under docs/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_at_most_250_lines_of_at_most_100_characters_outside_tables():
    lines = README.splitlines()
    assert len(lines) <= 250
    long = [line for line in lines if len(line) > 100 and not line.startswith("|")]
    assert long == []


def test_every_document_is_linked_from_the_readme():
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)(?:#[\w-]+)?\)", README))
    documents = {f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md")}
    assert documents - linked == set()


def test_the_harness_in_your_own_project_comes_early_with_its_limits():
    headings = re.findall(r"(?m)^## (.+)$", README)
    assert headings.index("Use the harness in your own project") <= 1
    section = README.split("\n## Use the harness in your own project\n", 1)[1].split("\n## ")[0]
    assert "pytest 9.2" in section and "--forked" in section


def test_every_time_figure_says_where_it_was_seen():
    """A duration (``25 minutes``, ``about 30``) is a measurement of one command on one machine,
    or an estimate: the sentence says which, with the machine and the commit it was seen on."""
    text = " ".join(line for line in README.splitlines() if not line.startswith("|"))
    for sentence in re.split(r"(?<=[.;])\s+(?=[A-Z(`])", text):
        if re.search(r"\b\d+ (?:s|seconds|minutes?|hours?)\b", sentence):
            assert re.search(r"main at [0-9a-f]{7}", sentence) or "estimate" in sentence, sentence
