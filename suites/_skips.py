"""The end of a run's report: what was skipped, as what a user can do about it.

A first ``pytest -n auto`` on a machine without a GPU skips whole groups of items (the ``cuda``
backend, the ``interop`` and ``multihost`` tests) and a handful of single ones (docs blocks
marked illustrative, a check that only ``ci/check.sh`` turns on). pytest's ``-ra`` (this
project's ``addopts``) lists one line per reason; this module folds them into one line per
missing capability, with how to get it, and one line that counts the rest. The root conftest
prints these lines instead of pytest's own ``SKIPPED`` lines unless the command line itself
asks for a report of skips (``-rs``, ``-ra``, ``-rA``: then pytest lists every one).

Pure functions; the conftest only writes what :func:`summary_lines` returns.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

__all__ = ["CAPABILITIES", "asks_for_skip_report", "summary_lines"]

# (capability, the start of the reasons its items skip with, how to get it)
CAPABILITIES = (
    (
        "cuda",
        "cuda backend unavailable: ",
        "{detail}; without a GPU, ci/check.sh --fake-cuda runs them on a fake one",
    ),
    (
        "interop",
        "interop test (PyTorch as client or oracle)",
        "run with --interop (PyTorch installed); ci/check.sh --interop installs torch==2.13.0"
        " (CPU) and runs them",
    ),
    (
        "multihost",
        "multihost test (xdist workers over ssh",
        "run with --multihost; ci/check.sh --multihost starts a throwaway sshd on 127.0.0.1"
        " (installing openssh-server) and runs them",
    ),
)

_FLAGS_BEFORE_R = re.compile(r"-[dfhlqsvxV]*r")
"""``-r`` after any of pytest's (and xdist's) one-letter flags that take no value, which argparse
lets a user combine before it: ``-sra`` is ``-s -r a``. A flag that takes a value (``-k``,
``-n``, ``-p``) takes the rest of the word, so ``-krs`` is no report."""


def asks_for_skip_report(args: Sequence[str]) -> bool:
    """Whether command-line ``args`` (the user's, not ``addopts``) choose pytest's report
    characters: ``-r CHARS``, ``-rs``, ``-vrA``, ``--report-chars=...``."""
    return any(
        arg.startswith("--report-chars") or _FLAGS_BEFORE_R.match(arg) is not None
        for arg in args
        if arg.startswith("-")
    )


def summary_lines(reasons: Iterable[str]) -> list[str]:
    """One line per missing capability and one for the rest, from the skipped items' reasons.

    Args:
        reasons: one per skipped item (pytest's ``Skipped: `` prefix allowed).

    Returns:
        ``SKIPPED [40] cuda: CuPy is not installed (...); without a GPU, ...`` lines in
        :data:`CAPABILITIES` order, for each capability with a skip, then
        ``SKIPPED [8] for other reasons: -rs lists every skip with its reason``; nothing when
        nothing was skipped.
    """
    counts: Counter[str] = Counter()
    details: dict[str, Counter[str]] = {}
    for reason in reasons:
        reason = reason.removeprefix("Skipped: ")
        for name, start, _ in CAPABILITIES:
            if reason.startswith(start):
                counts[name] += 1
                details.setdefault(name, Counter())[reason[len(start) :]] += 1
                break
        else:
            counts[""] += 1
    lines = []
    for name, _, how in CAPABILITIES:
        if counts[name]:
            detail = details[name].most_common(1)[0][0]
            lines.append(f"SKIPPED [{counts[name]}] {name}: {how.format(detail=detail)}")
    if counts[""]:
        lines.append(
            f"SKIPPED [{counts['']}] for other reasons: -rs lists every skip with its reason"
        )
    return lines
