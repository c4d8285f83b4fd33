"""Words for people: how a child ended, failure messages, the plugin's summary line.

Pure functions of plain values, tested on their own; the outcome and the plugin only print
what these return.
"""

from __future__ import annotations

import re
import signal
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping

from harness._env import describe_env

DEATH_PREFIX = "[  DEATH   ] "
"""Prefix of every line of the child's stderr in a failure message (as in GoogleTest)."""

NOTE_PREFIX = "[  NOTE    ] "
"""Prefix of each of the harness's own notes about the child in a failure message."""

STDERR_HEAD_LINES = 20
STDERR_TAIL_LINES = 50
"""A failure message shows the child's whole stderr, or its first 20 and last 50 lines."""

_MAX_LINE = 500

ENV_SHOWN = 1000
"""Characters of the env overrides' line a failure message shows at most."""

REPRO_SHOWN = 4000
"""Characters of the repro command a failure message shows at most (its request is in a
file past ``harness._repro.INLINE_REQUEST_BYTES``; a huge env value can still make it long)."""


_FRAME = re.compile(r'  File ".*", line (?:\d+|\?\?\?) in .+')
"""A frame line of a stack faulthandler writes (a Python traceback has ``, in`` instead)."""

_TRUNCATED = "  ..."
"""faulthandler's line for the frames past the 100 it writes of a thread."""

ENTRY_FILE = "/harness/_child.py"
ENTRY_FUNCTION = "run_child"
"""Where a child's target is called from: ``harness._child.run_child``. Its frame and every
frame below it (the zygote's, the exec runner's, or, in the fork style, the test process's:
pytest's and pluggy's) are cut from the stacks a failure shows."""


def _is_entry(line: str) -> bool:
    return (
        _FRAME.fullmatch(line) is not None
        and line.endswith(f" in {ENTRY_FUNCTION}")
        and f'{ENTRY_FILE}", line ' in line
    )


def cut_entry_frames(stderr: str) -> str:
    """``stderr`` with the frames below each target's entry cut from faulthandler's stacks.

    A fork-style child is a copy of the test process, so the stack faulthandler writes when
    it crashes, or at its deadline, goes on below the target into the harness and pytest
    (about 35 frames of pytest and pluggy). As pytest hides its own frames, a failure shows
    the frames down to the target's caller: the entry frame (``harness/_child.py ... in
    run_child``) and the consecutive frame lines below it (faulthandler's ``  ...`` too)
    become one line that says how many were cut. When the entry is the top frame (the child
    died in the harness's own code), its line is kept and only those below it are cut.
    :attr:`harness.Outcome.stderr` keeps the whole stack.

    Args:
      stderr: the child's stderr (any text; only faulthandler's frame lines are cut).

    Returns:
      The text, unchanged where no entry frame is found.
    """
    raw = stderr.splitlines(keepends=True)
    lines = stderr.splitlines()  # the same lines, without their line breaks (any of them)
    out: list[str] = []
    index = 0
    while index < len(lines):
        if not _is_entry(lines[index]):
            out.append(raw[index])
            index += 1
            continue
        if not out or _FRAME.fullmatch(lines[index - 1]) is None:
            out.append(raw[index])  # the top frame: the child died in the harness's entry
            index += 1
        end = index
        while end < len(lines) and (_FRAME.fullmatch(lines[end]) or lines[end] == _TRUNCATED):
            end += 1
        cut = lines[index:end]
        if cut:
            frames = sum(1 for line in cut if line != _TRUNCATED)
            more = " and more" if _TRUNCATED in cut else ""
            noun = "frame" if frames == 1 and not more else "frames"
            newline = raw[end - 1][len(lines[end - 1]) :]
            out.append(
                f"  [... devmem-harness cut {frames}{more} {noun} here: the target's caller in "
                f"the harness and those below it (Outcome.stderr has them) ...]{newline}"
            )
        index = end
    return "".join(out)


def signal_name(signum: int | None) -> str:
    """``SIGABRT`` for 6; ``signal 40 (SIGRTMIN+6)`` for a real-time signal without a name;
    ``signal 99`` for another number."""
    if signum is None:
        return "no signal"
    try:
        return signal.Signals(signum).name
    except ValueError:
        low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
        if low is not None and high is not None and low < signum < high:
            return f"signal {signum} (SIGRTMIN+{signum - low})"
        return f"signal {signum}"


def seconds(value: float) -> str:
    """A duration for people: ``3.1 ms`` under a second, ``1.02 s`` above."""
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def describe_ending(
    kind: str,
    exit_code: int | None,
    signum: int | None,
    timeout_s: float | None,
    error: str | None,
    raised: object = None,
) -> str:
    """How a child ended, in words: ``killed by SIGABRT``, ``exited with status 3``,
    ``exited with status 1 after its target raised ValueError: bad size``, ``timed out after
    2 s, then killed by SIGTERM``, ``harness error (not a crash): ...``.

    The ending comes first: a target that raised and whose child was then killed on its way
    out (its ``sys.stdout.flush()`` aborted) ended ``killed by SIGABRT after its target
    raised ValueError: bad size``; one that raised and then hung past its deadline ended
    ``timed out after 2 s (its target had raised ValueError: bad size), then killed by
    SIGTERM``.

    Args:
      raised: the exception the target raised (its str is shown), or None.
    """
    if kind == "exited":
        after = f" after its target raised {raised}" if raised is not None else ""
        return f"exited with status {exit_code}{after}"
    if kind == "signaled":
        after = f" after its target raised {raised}" if raised is not None else ""
        return f"killed by {signal_name(signum)}{after}"
    if kind == "timed_out":
        how = f"killed by {signal_name(signum)}" if signum else f"exited with status {exit_code}"
        after = f" after {timeout_s:g} s" if timeout_s is not None else ""
        had = f" (its target had raised {raised})" if raised is not None else ""
        return f"timed out{after}{had}, then {how}"
    return f"harness error (not a crash): {error}"


def stderr_lines(
    stderr: str, head: int = STDERR_HEAD_LINES, tail: int = STDERR_TAIL_LINES
) -> list[str]:
    """A header and the child's stderr, each line prefixed with :data:`DEATH_PREFIX`.

    Longer than ``head + tail`` lines, only its first ``head`` and last ``tail`` lines are
    shown (the message a dying child writes usually comes before faulthandler's stack dump).
    """
    lines = stderr.splitlines()
    if not lines:
        return ["stderr: (empty)"]
    if len(lines) <= head + tail:
        header, shown = f"stderr ({len(lines)} line{'s' if len(lines) > 1 else ''}):", lines
    else:
        cut = len(lines) - head - tail
        header = f"stderr (first {head} and last {tail} of {len(lines)} lines):"
        shown = [*lines[:head], f"[... {cut} lines ...]", *lines[-tail:]]
    body = [
        DEATH_PREFIX + (line if len(line) <= _MAX_LINE else line[:_MAX_LINE] + " [...]")
        for line in shown
    ]
    return [header, *body]


def _cut(text: str, limit: int, where: str = "Outcome.env has them all") -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]} [... {len(text) - limit} more characters: {where}]"


def failure_message(
    *,
    problem: str,
    expected: str,
    actual: str,
    target: str,
    style: str,
    pid: int | None,
    duration_s: float,
    config_id: str | None,
    env: Mapping[str, str | None],
    stderr: str,
    repro: str,
    detail: Iterable[str] = (),
    notes: Iterable[str] = (),
    host: str | None = None,
) -> str:
    """The message of a :class:`~harness.DeathTestFailure`.

    Args:
      problem: the one-line verdict (``the child did not die: it exited with status 0``).
      expected, actual: the expected and the actual ending, in words.
      detail: extra lines (a raised exception, a returned value).
      notes: the harness's own lines about the child (shown after its stderr, each prefixed
        ``[  NOTE    ] ``).
      host: the name of the host the child ran on (an xdist worker may be on another), or
        None.
      The rest: as in :class:`~harness.Outcome`.
    """
    lines = [
        f"death test failed: {problem}",
        f"  target:   {target}  (style {style}, pid {pid}, {seconds(duration_s)}"
        f"{f', host {host}' if host else ''})",
        f"  config:   {config_id if config_id is not None else '(none)'}",
        f"  env:      {_cut(describe_env(env), ENV_SHOWN)}",
        f"  expected: {expected}",
        f"  actual:   {actual}",
    ]
    lines += [f"  {line}" for line in detail]
    lines += stderr_lines(stderr)
    lines += [NOTE_PREFIX + note for note in notes]
    lines += ["repro:", f"  {_cut(repro, REPRO_SHOWN, 'Outcome.repro has the whole command')}"]
    return "\n".join(lines)


def format_summary(children: Iterable[tuple[str, float, str]]) -> str | None:
    """The plugin's summary line, or None when no child ran.

    Args:
      children: one ``(style, duration_s, nodeid)`` per child run.

    Returns:
      ``death tests: 12 children (fork 4, forkserver 6, exec 2); median 3.1 ms, slowest
      1.02 s (suites/x.py::test_hang[exec])``.
    """
    children = list(children)
    if not children:
        return None
    counts = Counter(style for style, _, _ in children)
    by_style = ", ".join(
        f"{style} {counts[style]}" for style in ("fork", "forkserver", "exec") if counts[style]
    )
    median = statistics.median(duration for _, duration, _ in children)
    _, slowest, where = max(children, key=lambda child: child[1])
    noun = "child" if len(children) == 1 else "children"
    return (
        f"death tests: {len(children)} {noun} ({by_style}); median {seconds(median)}, "
        f"slowest {seconds(slowest)} ({where})"
    )
