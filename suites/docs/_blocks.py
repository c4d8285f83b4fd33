"""The code blocks of the project's Markdown files, as a user would copy them.

A fenced block is *copyable* when its info string names a language a user runs: ``python`` (a
file or a snippet), ``sh``/``bash``/``shell`` (commands) or ``console`` (a transcript: ``$ ``
lines are commands, the lines after each are its expected output). Blocks fenced with no
language, or ``text``/``toml``/anything else, show output, synopses or configuration and are not
run.

A ``python`` block whose first line is ``# <relative path>`` (optionally followed by ``:`` and a
note) is a *file*: the docs test writes it at that path before it runs the document's commands,
as a user who copies the files would. Any other ``python`` block is a *snippet*, run as a script.

An HTML comment on the line right before the fence steers the test, and shows nowhere on a
rendered page:

- ``<!-- docs-test: skip: <reason> -->``: illustrative; not run, the reason is reported.
- ``<!-- docs-test: in <name> -->``: run in a scratch directory of that name, outside the copy
  of the repository (an "own project"); blocks naming the same directory share it.
- ``<!-- docs-test: with <placeholder>=<repo> -->``: replace ``<placeholder>`` in the block by
  the path of the repository copy before running it (e.g. an install path).

Directives combine with ``;``: ``<!-- docs-test: in own-project; with /path/to/x=<repo> -->``;
``skip`` comes last, and its reason runs to the end of the comment.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

__all__ = [
    "Block",
    "DocError",
    "Step",
    "blocks_in",
    "line_matches",
    "output_matches",
    "parse_transcript",
]

COPYABLE = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh"}
COPYABLE["console"] = "console"
_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<body>.*?)\s*-->\s*$")
_FILE_LINE = re.compile(r"^#\s+(?P<path>[\w.-]+(?:/[\w.-]+)*\.(?:py|toml|cfg|ini|txt))(?::.*)?$")


class DocError(ValueError):
    """A Markdown file that the docs test cannot read: an unclosed fence, a bad directive."""


@dataclasses.dataclass(frozen=True)
class Block:
    """One copyable fenced block.

    Attributes:
        doc: the Markdown file it is in.
        line: the 1-based line of its opening fence.
        kind: ``"file"``, ``"snippet"``, ``"sh"`` or ``"console"``.
        text: its contents, without the fences, ending with a newline.
        path: for a file, its path relative to the directory it is written in; else None.
        skip: the reason given by a ``skip`` directive, or None.
        place: the scratch directory named by an ``in`` directive, or None (the repo copy).
        replace: ``(placeholder, "<repo>")`` pairs of ``with`` directives.
    """

    doc: Path
    line: int
    kind: str
    text: str
    path: str | None = None
    skip: str | None = None
    place: str | None = None
    replace: tuple[tuple[str, str], ...] = ()

    @property
    def where(self) -> str:
        """``README.md:51``: where a reader finds the block."""
        return f"{self.doc.name}:{self.line}"


def _directives(comment: str | None, where: str) -> dict:
    found: dict = {"skip": None, "place": None, "replace": []}
    if comment is None:
        return found
    rest = comment
    while rest.strip():
        part, _, rest = rest.partition(";")
        part = part.strip()
        reason = (part[5:] + (";" + rest if rest else "")).strip()
        if part.startswith("skip:") and reason:
            found["skip"] = reason  # the reason runs to the end of the comment
            break
        if part.startswith("in ") and re.fullmatch(r"[\w.-]+", part[3:].strip()):
            found["place"] = part[3:].strip()
        elif part.startswith("with ") and "=" in part:
            placeholder, _, value = part[5:].strip().partition("=")
            if value != "<repo>" or not placeholder:
                raise DocError(f"{where}: 'with' needs PLACEHOLDER=<repo>, got {part!r}")
            found["replace"].append((placeholder, value))
        else:
            raise DocError(
                f"{where}: unknown docs-test directive {part!r}; expected 'skip: <reason>',"
                " 'in <name>' or 'with <placeholder>=<repo>'"
            )
    return found


def blocks_in(doc: Path) -> list[Block]:
    """Every copyable block of the Markdown file ``doc``, in order.

    Raises:
        DocError: a fence is not closed, or a directive is malformed or stands before a block
            that is not copyable.
    """
    lines = doc.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        start = i
        fence = opening["fence"]
        language = opening["info"].strip().split(" ")[0].lower()
        body = []
        i += 1
        while i < len(lines) and not (
            lines[i].strip().startswith(fence) and lines[i].strip().strip(fence[0]) == ""
        ):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise DocError(f"{doc.name}:{start + 1}: the fence {fence} is never closed")
        i += 1
        before = lines[start - 1] if start else ""
        match = _DIRECTIVE.match(before)
        where = f"{doc.name}:{start + 1}"
        kind = COPYABLE.get(language)
        if kind is None:
            if match is not None:
                raise DocError(f"{where}: a docs-test directive before a {language!r} block")
            continue
        directives = _directives(match["body"] if match else None, where)
        text = "\n".join(body) + "\n"
        path = None
        if kind == "python":
            file_line = _FILE_LINE.match(body[0]) if body else None
            kind, path = ("file", file_line["path"]) if file_line else ("snippet", None)
        blocks.append(
            Block(
                doc=doc,
                line=start + 1,
                kind=kind,
                text=text,
                path=path,
                skip=directives["skip"],
                place=directives["place"],
                replace=tuple(directives["replace"]),
            )
        )
    return blocks


@dataclasses.dataclass(frozen=True)
class Step:
    """One command of a ``console`` transcript and the output shown after it.

    Attributes:
        command: the text after ``$ ``.
        expected: the lines shown after it; a line ``...`` stands for any number of lines,
            and ``...`` within a line for any text.
    """

    command: str
    expected: tuple[str, ...]


def parse_transcript(block: Block) -> list[Step]:
    """The steps of a ``console`` block.

    Raises:
        DocError: the block does not start with a ``$ `` line.
    """
    steps: list[Step] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            steps.append(Step(line[2:].strip(), ()))
        elif not steps:
            raise DocError(f"{block.where}: a console block must start with a '$ ' command line")
        else:
            last = steps[-1]
            steps[-1] = Step(last.command, (*last.expected, line.rstrip()))
    return steps


def line_matches(expected: str, actual: str) -> bool:
    """Whether one ``actual`` line matches an ``expected`` one, in which ``...`` stands for any
    text (doctest's ELLIPSIS: an address, a path), trailing spaces cut from both."""
    expected, actual = expected.rstrip(), actual.rstrip()
    if "..." not in expected:
        return actual == expected
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, actual, re.DOTALL) is not None


def output_matches(expected: tuple[str, ...], actual: list[str]) -> bool:
    """Whether ``actual`` lines match ``expected``, where a line ``...`` matches any run of
    lines (none included) and every other line must match as :func:`line_matches` says."""
    actual = [line.rstrip() for line in actual]
    while actual and not actual[-1]:
        actual.pop()
    expected = list(expected)
    while expected and not expected[-1]:
        expected.pop()

    def match(e: int, a: int) -> bool:
        if e == len(expected):
            return a == len(actual)
        if expected[e] == "...":
            return any(match(e + 1, k) for k in range(a, len(actual) + 1))
        return a < len(actual) and line_matches(expected[e], actual[a]) and match(e + 1, a + 1)

    return match(0, 0)
