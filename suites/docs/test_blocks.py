"""The Markdown reader of the docs test: what counts as a block, directives, transcripts."""

from __future__ import annotations

import pytest

from suites.docs._blocks import DocError, blocks_in, output_matches, parse_transcript

DOC = """\
# Title

```sh
echo one
```

<!-- docs-test: skip: takes an hour -->
```console
$ sleep 3600
```

```python
# pkg/mod.py: a file
X = 1
```

```python
print("snippet")
```

```
not copyable: no language
```

```toml
[tool]
```

<!-- docs-test: in own; with /path/to/repo=<repo> -->
~~~bash
pip install /path/to/repo
~~~
"""


def test_blocks_kinds_paths_and_directives(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(DOC)
    blocks = blocks_in(doc)
    assert [(b.kind, b.line) for b in blocks] == [
        ("sh", 3),
        ("console", 8),
        ("file", 12),
        ("snippet", 17),
        ("sh", 30),
    ]
    assert blocks[0].text == "echo one\n" and blocks[0].skip is None
    assert blocks[1].skip == "takes an hour"
    assert blocks[2].path == "pkg/mod.py"
    assert blocks[3].path is None
    assert blocks[4].place == "own"
    assert blocks[4].replace == (("/path/to/repo", "<repo>"),)
    assert blocks[4].where == "doc.md:30"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("```sh\necho\n", "doc.md:1: the fence ``` is never closed"),
        ("<!-- docs-test: skipp: x -->\n```sh\necho\n```\n", "unknown docs-test directive"),
        ("<!-- docs-test: with x=/tmp -->\n```sh\necho\n```\n", "needs PLACEHOLDER=<repo>"),
        ("<!-- docs-test: skip: x -->\n```\nout\n```\n", "a docs-test directive before a ''"),
    ],
)
def test_malformed_docs_are_errors(tmp_path, text, message):
    doc = tmp_path / "doc.md"
    doc.write_text(text)
    with pytest.raises(DocError, match=message.replace("(", r"\(").replace("*", r"\*")):
        blocks_in(doc)


def test_transcript_steps_and_a_block_without_a_command(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("```console\n$ echo a\na\n$ echo $?\n0\n```\n```console\nout\n```\n")
    good, bad = blocks_in(doc)
    steps = parse_transcript(good)
    assert [(s.command, s.expected) for s in steps] == [("echo a", ("a",)), ("echo $?", ("0",))]
    with pytest.raises(DocError, match="must start with a '\\$ ' command line"):
        parse_transcript(bad)


@pytest.mark.parametrize(
    ("expected", "actual", "matches"),
    [
        (("a", "b"), ["a", "b  ", ""], True),
        (("a", "b"), ["a", "c"], False),
        (("a",), ["a", "b"], False),
        (("a", "b"), ["a"], False),
        (("a", "...", "z"), ["a", "z"], True),
        (("a", "...", "z"), ["a", "1", "2", "z"], True),
        (("a", "...", "z"), ["a", "1", "2"], False),
        (("...",), [], True),
        ((), ["surprise"], False),
        (("0x...: 16 bytes",), ["0x55e4: 16 bytes"], True),
        (("0x...: 16 bytes",), ["0x55e4: 32 bytes"], False),
        (("    .../a.py:8 in f",), ["    /tmp/x/a.py:8 in f"], True),
        (("    .../a.py:8 in f",), ["    /tmp/x/a.py:9 in f"], False),
        (("a.b ...",), ["aXb c"], False),  # only "..." is a wildcard; "." is itself
        (("x...",), ["x"], True),
    ],
)
def test_output_matching(expected, actual, matches):
    assert output_matches(expected, actual) is matches


def test_a_skip_reason_may_hold_semicolons(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- docs-test: in own; skip: slow; needs a GPU -->\n```sh\necho\n```\n")
    (block,) = blocks_in(doc)
    assert (block.place, block.skip) == ("own", "slow; needs a GPU")
