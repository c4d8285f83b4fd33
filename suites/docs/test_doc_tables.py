"""The benchmark tables in the docs are the benchmarks' own output from the checked-in JSON
(``ci/doc_tables.py``): a typed figure, or a JSON changed without regenerating, fails here."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "ci"))
import doc_tables  # noqa: E402

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _tables() -> list[tuple[Path, str]]:
    return [
        (doc, match["json"])
        for doc in DOCS
        for match in doc_tables._TABLE.finditer(doc.read_text(encoding="utf-8"))
    ]


def test_the_results_page_shows_each_core_benchmark():
    shown = {name for _, name in _tables()}
    assert {"docs/results/alloc.json", "docs/results/children.json"} <= shown


@pytest.mark.parametrize("doc", DOCS, ids=[doc.name for doc in DOCS])
def test_every_table_is_its_json_rendered(doc):
    text = doc.read_text(encoding="utf-8")
    new, stale = doc_tables.refresh(text)
    assert stale == [], f"{doc.name}: run .venv/bin/python ci/doc_tables.py ({stale})"
    assert new == text


def test_a_typed_figure_is_stale():
    doc, name = next((doc, name) for doc, name in _tables() if name.endswith("children.json"))
    text = doc.read_text(encoding="utf-8")
    raw = json.loads((ROOT / name).read_text())["raw_fork_ms"]
    typed = text.replace(f"{raw:.2f} ms", f"{raw + 1:.2f} ms", 1)
    assert typed != text
    new, stale = doc_tables.refresh(typed)
    assert (new, stale) == (text, [name])


def test_the_script_regenerates_then_checks(tmp_path, capsys):
    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    shutil.copy2(ROOT / "docs" / "results" / "children.json", results / "children.json")
    doc = tmp_path / "page.md"
    doc.write_text(
        "# page\n\n<!-- bench-table: docs/results/children.json -->\n| old |\n"
        "<!-- /bench-table -->\n\nafter\n"
    )
    data = json.loads((results / "children.json").read_text())
    data["raw_fork_ms"] = 1.25
    (results / "children.json").write_text(json.dumps(data))
    base = doc_tables.ROOT
    try:
        doc_tables.ROOT = tmp_path
        assert doc_tables.main(["--check", str(doc)]) == 1
        assert (
            "page.md: the table of docs/results/children.json is stale" in capsys.readouterr().out
        )
        assert doc_tables.main([str(doc)]) == 0
        assert doc_tables.main(["--check", str(doc)]) == 0
    finally:
        doc_tables.ROOT = base
    text = doc.read_text()
    assert "| raw `os.fork()` + `waitpid` (reference) | 1.25 ms | |" in text
    assert text.startswith("# page\n\n<!-- bench-table:") and text.endswith("\n\nafter\n")
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(".page.md")]


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("docs/results/none.json", "docs/results/none.json: cannot read the benchmark's JSON"),
        ("README.md", "cannot read the benchmark's JSON"),
        ("pyproject.toml", "cannot read the benchmark's JSON"),
    ],
)
def test_a_marker_without_a_benchmarks_json_is_a_usage_error(tmp_path, capsys, marker, message):
    doc = tmp_path / "page.md"
    doc.write_text(f"<!-- bench-table: {marker} -->\n<!-- /bench-table -->\n")
    with pytest.raises(SystemExit) as info:
        doc_tables.main(["--check", str(doc)])
    assert info.value.code == 2 and message in capsys.readouterr().err
    assert doc.read_text() == f"<!-- bench-table: {marker} -->\n<!-- /bench-table -->\n"


def test_a_json_no_benchmark_renders_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(doc_tables.TableError, match=r"no benchmark bench/other\.py renders"):
        doc_tables.render(tmp_path / "other.json")


def test_the_documented_benchmark_defaults_are_the_benchmarks(capsys):
    line = next(
        line
        for line in (ROOT / "docs" / "death-tests.md").read_text().splitlines()
        if line.startswith(".venv/bin/python bench/children.py")
    )
    children = doc_tables._benchmark("children")
    with pytest.raises(SystemExit):
        children.main(["-h"])
    help_text = " ".join(capsys.readouterr().out.split())
    found = re.search(r"--repeat (\d+) --forked-tests (\d+) --forked-repeat (\d+)", line)
    repeat, tests, runs = found.groups()
    assert f"--repeat REPEAT runs per figure (default {repeat})" in help_text
    assert f"--forked-tests FORKED_TESTS trivial tests per pytest-forked run (default {tests})" in (
        help_text
    )
    forked_repeat = "--forked-repeat FORKED_REPEAT pytest runs with and without --forked, and"
    assert f"{forked_repeat} of the death-test items (default {runs}:" in help_text


def test_a_json_of_an_older_benchmark_says_to_rerun_it(tmp_path):
    old = tmp_path / "children.json"
    old.write_text(json.dumps({"raw_fork_ms": 2.0}))  # the fields a newer format_table reads
    with pytest.raises(doc_tables.TableError, match=r"cannot render it \(KeyError: .*rerun it: "):
        doc_tables.render(old)


def test_the_machine_line_says_how_loaded_the_machine_was(tmp_path):
    data = json.loads((ROOT / "docs" / "results" / "children.json").read_text())
    data["machine"]["load_average"] = 6.53
    loaded = tmp_path / "children.json"
    loaded.write_text(json.dumps(data))
    assert doc_tables.render(loaded).rstrip().endswith(", load average 6.53 at the start.")
    del data["machine"]["load_average"]  # a JSON from before the figure was recorded
    loaded.write_text(json.dumps(data))
    assert doc_tables.render(loaded).rstrip().endswith(f"{data['machine']['platform']}).")
