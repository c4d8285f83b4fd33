"""Mutation testing with mutmut, one module at a time, with a score per module.

Usage: ``.venv/bin/python ci/mutation.py [--module NAME ...] [--max-children N]
[--min-score PCT] [--gate PREFIX] [--no-run | --resume] [--mutmut PATH]
[--out reports/mutation.md]``

mutmut is the one installed beside the interpreter that runs this script (``.venv/bin/mutmut``
for ``.venv/bin/python``), so the virtual environment need not be activated; else the one on
``PATH``; ``--mutmut`` names another.

Which files are mutated, and with which tests, is mutmut's own configuration
(``[tool.mutmut]`` in ``pyproject.toml``): ``allocator/`` but ``device/cuda.py``, and
``harness/_outcome.py``. For each module, one after the other, it runs
``mutmut run "<module>.x*" --max-children N`` (every mutant of the module, each against the
tests that reach its function, from the map mutmut collects at the first module) with
``PYTHONPYCACHEPREFIX`` set to ``mutants/.pycache`` (see :func:`run_mutmut`), then reads
mutmut's results from ``mutants/<path>.meta`` and prints a table: mutants, killed (a test
failed or timed out), equivalent (listed with a reason), survivors nobody explained, mutants no
test reaches, the score ``killed / (mutants - equivalent)`` and the wall time. A whole run over
``allocator/`` takes the better part of an hour on 2 cores.

mutmut runs every mutant a pattern names again, also those it killed before. ``--resume``
names only the mutants with no result yet, and the survivors and mutants no test reached
that are not listed as equivalent (a test added since may kill or reach them) instead, so an
interrupted run goes on where it stopped; then, once more, those of functions changed since
the last run, whose verdicts mutmut dropped when it made the mutants again. The killed keep
their verdict, which a test weakened since is not checked against: the nightly runs without
it.

Equivalent mutants (a change no test can see, because the program behaves the same) are listed
in ``ci/equivalent-mutants/<module>.txt``, one a line: ``<mutant name>  # <reason>``; blank
lines and ``#`` comment lines are allowed. The report prints every one with its reason; a
listed name that is not a mutant of that module (any more) is an error, so the lists stay true.

Exit status: 0, or 1 when a module whose name starts with a ``--gate`` prefix (default
``allocator``) has an unexplained survivor or a mutant no test reaches, or when those modules
together score below ``--min-score`` (default 97), or when an equivalent list is wrong; 2 on
bad usage. Modules outside the gates are reported only.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT_DIR = ROOT / "ci" / "equivalent-mutants"
MUTANTS_DIR = ROOT / "mutants"
PYCACHE_DIR = MUTANTS_DIR / ".pycache"
"""The bytecode cache of mutmut's runs (``PYTHONPYCACHEPREFIX``), apart from the tree's."""

# mutmut's exit codes (mutmut.stats.status_by_exit_code, mutmut 3.8), grouped as this report
# counts them. A mutant that timed out made a test hang: killed, as mutmut's own score says; one
# whose test process died of a signal (-6: the mutant made the allocator abort in-process, as
# its fatal errors do; -9, -11) was caught too, as was one whose test process left with the
# harness's EXIT_HARNESS_ERROR (121: a mutant of a fork made the test process run the child's
# side, as a zygote tested in-process does with `if pid != 0`).
KILLED_CODES = {1, 3, 24, -24, 36, 121, 152, 255, -6, -9, -11}
SURVIVED_CODES = {0}
NO_TESTS_CODES = {5, 33}
SKIPPED_CODES = {34, 37}

ISOLATIONS = (
    ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child"),
    ("unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "--kill-child"),
)
"""How mutmut is run in a PID namespace of its own, the first of these that works here (root's,
else an unprivileged user's). Some mutants of the zygote's guard-table reader
(``harness._zygote._pids_in``) read a pid at the wrong offset and SIGKILL that process group:
1 (init's) among others, which took every process of the machine's session with it. In the
namespace a pid names only mutmut's own processes."""

_INIT = (
    "import os, subprocess, sys\n"
    "try:\n"
    "    with open('/proc/sys/kernel/ns_last_pid', 'w') as last:\n"
    "        last.write('999999')\n"
    "except OSError:\n"
    "    pass\n"
    "child = subprocess.Popen(sys.argv[1:])\n"
    "while True:\n"
    "    pid, status = os.wait()\n"
    "    if pid == child.pid:\n"
    "        sys.exit(os.waitstatus_to_exitcode(status))\n"
)
"""The namespace's pid 1: runs mutmut and reaps every process orphaned there (mutmut itself
waits with ``os.wait()`` and would take an orphaned zygote for one of its workers). It first
moves the namespace's pids to 1,000,000 and up: the made-up pids those mutants read are parts
of real ones (``234`` of ``1234``), so with seven-digit pids none names a live process (with
small ones they named mutmut's own, and the run died)."""

NOTHING_MATCHES = "Filtered for specific mutants, but nothing matches"
"""mutmut's complaint when a module has no mutant (no function, or only constants)."""

_LINE = re.compile(r"^(?P<name>\S+)\s+#\s*(?P<reason>\S.*)$")


class MutationError(Exception):
    """The configuration, an equivalent list or mutmut's results cannot be used."""


@dataclasses.dataclass(frozen=True)
class Equivalent:
    """One listed equivalent mutant."""

    name: str
    reason: str


@dataclasses.dataclass
class ModuleResult:
    """mutmut's verdicts on one module's mutants, and the equivalent list applied to them.

    Attributes:
        module: the dotted module name (``allocator._cache``).
        total: its mutants.
        killed: killed by a test (a failure or a timeout).
        equivalent: the listed equivalent mutants that survived.
        survivors: survivors not listed as equivalent.
        no_tests: mutants no test reaches (mutmut's "no tests").
        other: mutants not checked or skipped, by status.
        seconds: wall time of this module's run (``None`` when not run now).
        stale: listed names that survive no more (killed now) or are not mutants of it.
    """

    module: str
    total: int = 0
    killed: int = 0
    equivalent: list[Equivalent] = dataclasses.field(default_factory=list)
    survivors: list[str] = dataclasses.field(default_factory=list)
    no_tests: list[str] = dataclasses.field(default_factory=list)
    other: dict[str, int] = dataclasses.field(default_factory=dict)
    seconds: float | None = None
    stale: list[str] = dataclasses.field(default_factory=list)

    @property
    def score(self) -> float | None:
        """Killed over the mutants that can be killed (all but the equivalent ones), in %."""
        denominator = self.total - len(self.equivalent)
        return None if denominator <= 0 else 100.0 * self.killed / denominator


def module_name(path: Path) -> str:
    """``allocator/device/__init__.py`` -> ``allocator.device``; ``allocator/_cache.py`` ->
    ``allocator._cache`` (``path`` relative to the project root)."""
    parts = list(path.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def mutated_files(root: Path = ROOT) -> list[Path]:
    """The files mutmut mutates, from ``[tool.mutmut]``: the ``.py`` files under its
    ``source_paths`` that match ``only_mutate`` (when given) and no ``do_not_mutate`` pattern,
    relative to ``root``.

    Raises:
        MutationError: ``pyproject.toml`` has no ``[tool.mutmut]`` with ``source_paths``, or
            no TOML reader is installed (Python 3.10 without ``tomli``).
    """
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the test extra installs tomli, its original
        try:
            import tomli as tomllib
        except ModuleNotFoundError as exc:
            raise MutationError(
                "reading pyproject.toml needs tomllib (Python 3.11+) or, on Python "
                f"{sys.version_info[0]}.{sys.version_info[1]}, tomli: pip install -e .[test]"
            ) from exc

    try:
        config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"]
        sources = config["source_paths"]
    except (OSError, KeyError) as exc:
        raise MutationError(f"{root / 'pyproject.toml'}: no [tool.mutmut] source_paths") from exc
    only = config.get("only_mutate", [])
    never = config.get("do_not_mutate", [])
    files = set()
    for source in sources:
        for path in (root / source).rglob("*.py"):
            relative = path.relative_to(root).as_posix()
            if only and not any(fnmatch.fnmatch(relative, pattern) for pattern in only):
                continue
            if any(fnmatch.fnmatch(relative, pattern) for pattern in never):
                continue
            files.add(Path(relative))
    return sorted(files)


def parse_equivalents(text: str, source: str) -> list[Equivalent]:
    """The entries of an equivalent list: ``<mutant name>  # <reason>`` lines, skipping blank
    and ``#`` lines.

    Raises:
        MutationError: a line has no name or no reason, or a name appears twice (the message
            gives ``source`` and the line number).
    """
    entries: dict[str, Equivalent] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _LINE.match(stripped)
        if match is None:
            raise MutationError(
                f"{source}:{number}: expected '<mutant name>  # <reason>', got {stripped!r}"
            )
        name = match["name"]
        if name in entries:
            raise MutationError(f"{source}:{number}: {name} is listed twice")
        entries[name] = Equivalent(name, match["reason"].strip())
    return list(entries.values())


def load_equivalents(module: str, directory: Path | None = None) -> list[Equivalent]:
    """The equivalent list of ``module`` (``<directory>/<module>.txt``, by default in
    ``ci/equivalent-mutants/``), or ``[]``."""
    path = (directory or EQUIVALENT_DIR) / f"{module}.txt"
    if not path.exists():
        return []
    return parse_equivalents(path.read_text(), str(path))


def tally(
    module: str, exit_codes: dict[str, int | None], equivalents: Iterable[Equivalent]
) -> ModuleResult:
    """Count mutmut's verdicts (``exit_codes``: mutant name -> exit code, ``None`` when not
    checked) for ``module`` and apply its equivalent list."""
    listed = {entry.name: entry for entry in equivalents}
    result = ModuleResult(module, total=len(exit_codes))
    for name, code in sorted(exit_codes.items()):
        if code in KILLED_CODES:
            result.killed += 1
            if name in listed:
                result.stale.append(f"{name} (killed now)")
        elif code in SURVIVED_CODES:
            if name in listed:
                result.equivalent.append(listed[name])
            else:
                result.survivors.append(name)
        elif code in NO_TESTS_CODES:
            result.no_tests.append(name)
        else:
            status = {None: "not checked", **dict.fromkeys(SKIPPED_CODES, "skipped")}.get(
                code, f"exit code {code}"
            )
            result.other[status] = result.other.get(status, 0) + 1
    result.stale += [
        f"{name} (not a mutant of {module})" for name in listed if name not in exit_codes
    ]
    return result


def read_exit_codes(path: Path, mutants_dir: Path | None = None) -> dict[str, int | None]:
    """mutmut's verdicts for the source file ``path``, from ``<mutants_dir>/<path>.meta``
    (by default ``mutants/``).

    Raises:
        MutationError: the file is missing or not mutmut's JSON.
    """
    meta = (mutants_dir or MUTANTS_DIR) / f"{path.as_posix()}.meta"
    try:
        return dict(json.loads(meta.read_text())["exit_code_by_key"])
    except (OSError, ValueError, KeyError) as exc:
        raise MutationError(f"{meta}: no mutmut results ({exc}); run without --no-run") from exc


def pending(exit_codes: dict[str, int | None], equivalents: Iterable[Equivalent] = ()) -> list[str]:
    """The mutants of ``exit_codes`` (mutant name -> mutmut's exit code) that ``--resume``
    runs, sorted: those with no result yet; the survivors and mutants no test reached not
    listed in ``equivalents`` (a test added since may kill or reach them); and those listed
    that were killed (a test added since kills them, and the listing goes; or a test failed
    for another reason, a load's timeout, and the mutant survives again)."""
    listed = {entry.name for entry in equivalents}
    again = SURVIVED_CODES | NO_TESTS_CODES
    return sorted(
        name
        for name, code in exit_codes.items()
        if code is None or (code in again) != (name in listed)
    )


def find_mutmut(given: str | None = None) -> str:
    """The mutmut command to run: ``given`` (a path, or a name looked up on ``PATH``), else
    the ``mutmut`` installed beside this interpreter (``.venv/bin/mutmut`` when this runs as
    ``.venv/bin/python``: no activated environment needed), else the one on ``PATH``.

    Raises:
        MutationError: ``given`` is not an executable file or a command on ``PATH``; or, with
            no ``given``, there is no mutmut beside the interpreter nor on ``PATH``.
    """
    if given is not None:
        found = shutil.which(given)
        if found is None:
            raise MutationError(f"--mutmut {given}: not an executable file or a command on PATH")
        return found
    # not resolved: .venv/bin/python is a link to the base interpreter, whose bin has no mutmut
    beside = shutil.which("mutmut", path=os.path.dirname(sys.executable))
    found = beside or shutil.which("mutmut")
    if found is None:
        raise MutationError(
            f"mutmut is neither beside {sys.executable} nor on PATH: install the test extra"
            " (pip install -e '.[test]') or name it with --mutmut"
        )
    return found


def isolation() -> list[str]:
    """The command prefix that runs mutmut in a PID namespace of its own with a reaper for pid 1
    (:data:`ISOLATIONS`, :data:`_INIT`), or ``[]`` where no namespace can be made here (not
    Linux, no ``unshare``, neither root nor user namespaces)."""
    for prefix in ISOLATIONS:
        if shutil.which(prefix[0]) is None:
            continue
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return [*prefix, sys.executable, "-c", _INIT]
    return []


def run_mutmut(
    module: str, max_children: int, mutmut: str, names: list[str] | None = None
) -> float:
    """Run mutmut on ``module``'s mutants, or on those of ``names`` only (mutmut's full mutant
    names); return the wall time in seconds.

    mutmut copies the tree into ``mutants/``, ``__pycache__`` folders included, with the files'
    times: Python (and pytest's assertion rewriter) would then load the copied bytecode, whose
    code objects name the original files, and a test comparing a frame's file with its own
    ``__file__`` would fail in mutmut's runs only. ``PYTHONPYCACHEPREFIX`` (:data:`PYCACHE_DIR`)
    gives mutmut's runs a bytecode cache of their own; ``PYTHONDONTWRITEBYTECODE`` is dropped,
    so that cache is written: with it set, every exec-style child and forkserver zygote of the
    harness's suites compiled the mutated ``harness/_child.py`` (1.3 MB with its trampolines)
    again, 1-2 s each, and the deadline tests timed out unmutated. mutmut runs in a PID
    namespace of its own where one can be made (:func:`isolation`), and says so.

    Raises:
        MutationError: mutmut could not be started, or failed (its output is in the message).
    """
    start = time.monotonic()
    patterns = [f"{module}.x*"] if names is None else names
    command = [mutmut, "run", *patterns, "--max-children", str(max_children)]
    shown = command if names is None else [*command[:2], f"<{len(names)} mutants>", *command[-2:]]
    print(f"+ {' '.join(shown)}", flush=True)
    sandbox = isolation()
    if sandbox:
        print(f"  (in a PID namespace of its own: {' '.join(sandbox[:-3])})", flush=True)
    else:
        print(
            "  (no PID namespace can be made here: a mutant that signals a made-up process"
            " group reaches this machine's processes)",
            flush=True,
        )
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(PYCACHE_DIR)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        done = subprocess.run(
            [*sandbox, *command],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    except OSError as exc:
        raise MutationError(f"cannot run {mutmut}: {exc}") from exc
    seconds = time.monotonic() - start
    output = done.stdout.decode(errors="replace")
    if done.returncode != 0 and NOTHING_MATCHES not in output:  # a module without functions
        raise MutationError(
            f"mutmut run failed on {module} (status {done.returncode}):\n{output[-4000:]}"
        )
    return seconds


def _pct(score: float | None) -> str:
    return "-" if score is None else f"{score:.1f}%"


def combined(results: Iterable[ModuleResult]) -> ModuleResult:
    """The sum of several modules' results."""
    total = ModuleResult("(together)")
    for result in results:
        total.total += result.total
        total.killed += result.killed
        total.equivalent += result.equivalent
        total.survivors += result.survivors
        total.no_tests += result.no_tests
    return total


def render(results: list[ModuleResult], gates: list[str]) -> str:
    """The report as Markdown: the table, the gated modules together, the equivalent mutants
    with their reasons, and every survivor or unreached mutant nobody explained."""
    lines = [
        "| module | mutants | killed | equivalent | survived | no tests | score | wall time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        seconds = "-" if r.seconds is None else f"{r.seconds:.0f} s"
        lines.append(
            f"| {r.module} | {r.total} | {r.killed} | {len(r.equivalent)} | {len(r.survivors)} |"
            f" {len(r.no_tests)} | {_pct(r.score)} | {seconds} |"
        )
    for gate in gates:
        gated = combined(r for r in results if r.module.startswith(gate))
        lines.append(
            f"\n{gate} together: {gated.killed} killed of {gated.total} mutants,"
            f" {len(gated.equivalent)} equivalent: score {_pct(gated.score)}"
        )
    equivalents = [(r.module, e) for r in results for e in r.equivalent]
    if equivalents:
        lines += ["", "Equivalent mutants (ci/equivalent-mutants/):"]
        lines += [f"- {e.name}: {e.reason}" for _, e in equivalents]
    problems = [(r.module, name, "survived") for r in results for name in r.survivors]
    problems += [(r.module, name, "no test reaches it") for r in results for name in r.no_tests]
    if problems:
        lines += ["", "Unexplained (kill it with a test, or list it with the reason):"]
        lines += [f"- {name}: {why} (mutmut show {name})" for _, name, why in problems]
    others = [f"{r.module}: {status} {n}" for r in results for status, n in r.other.items()]
    if others:
        lines += ["", "Not checked:", *(f"- {line}" for line in others)]
    stale = [f"{r.module}: {entry}" for r in results for entry in r.stale]
    if stale:
        lines += ["", "Stale equivalent entries:", *(f"- {line}" for line in stale)]
    return "\n".join(lines) + "\n"


def verdict(results: list[ModuleResult], gates: list[str], min_score: float) -> list[str]:
    """Why the run fails (empty when it passes)."""
    reasons = [f"{r.module}: stale equivalent entry {entry}" for r in results for entry in r.stale]
    for gate in gates:
        gated = [r for r in results if r.module.startswith(gate)]
        for r in gated:
            if r.survivors or r.no_tests:
                reasons.append(
                    f"{r.module}: {len(r.survivors)} unexplained survivors,"
                    f" {len(r.no_tests)} mutants no test reaches"
                )
        score = combined(gated).score
        if gated and (score is None or score < min_score):
            reasons.append(f"{gate}: score {_pct(score)} < {min_score:g}%")
    return reasons


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--module",
        action="append",
        dest="modules",
        metavar="NAME",
        help="only this module (dotted, e.g. allocator._cache); repeatable. Default: every"
        " module mutmut mutates",
    )
    parser.add_argument(
        "--max-children",
        type=int,
        default=2,
        help="mutants tested at once (default 2: the machine is shared)",
    )
    parser.add_argument("--min-score", type=float, default=97.0, help="gated score (default 97)")
    parser.add_argument(
        "--gate",
        action="append",
        dest="gates",
        metavar="PREFIX",
        help="modules starting with PREFIX must have no unexplained survivor and together"
        " reach --min-score; repeatable (default: allocator)",
    )
    parser.add_argument(
        "--no-run", action="store_true", help="report mutmut's last results without running it"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="run only the mutants with no result yet and the survivors (mutmut runs every"
        " mutant of a module again, also those it killed); every one where none has a result",
    )
    parser.add_argument(
        "--mutmut",
        metavar="PATH",
        help="the mutmut command (default: the mutmut beside this Python, else the one on PATH)",
    )
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    args = parser.parse_args(argv)
    if args.max_children < 1:
        parser.error(f"--max-children must be >= 1, got {args.max_children}")
    if args.resume and args.no_run:
        parser.error("--resume runs mutmut, --no-run does not: give one of them")
    if not 0 <= args.min_score <= 100:
        parser.error(f"--min-score must be between 0 and 100, got {args.min_score:g}")
    gates = args.gates or ["allocator"]
    try:
        files = {module_name(path): path for path in mutated_files()}
        unknown = sorted(set(args.modules or ()) - set(files))
        if unknown:
            parser.error(f"--module {', '.join(unknown)}: expected one of {', '.join(files)}")
        known = {path.stem for path in EQUIVALENT_DIR.glob("*.txt")} - set(files)
        if known:
            raise MutationError(
                f"{EQUIVALENT_DIR}: lists for modules that are not mutated: {sorted(known)}"
            )
        results = []
        if not args.no_run:
            try:
                mutmut = find_mutmut(args.mutmut)
            except MutationError as exc:
                if args.mutmut is not None:
                    parser.error(str(exc))
                raise
            # A fresh map of which tests reach which function: mutmut 3.8 updates it only for
            # tests it has not seen, and loses the others' when the tests changed.
            (MUTANTS_DIR / "mutmut-stats.json").unlink(missing_ok=True)
        for module in args.modules or list(files):
            names = None
            meta = MUTANTS_DIR / f"{files[module].as_posix()}.meta"
            if args.resume and meta.exists():
                codes = read_exit_codes(files[module])
                # mutmut makes the mutants again (dropping the verdicts of changed functions)
                # only when it runs: with none left, it runs one, the second pass the rest
                names = pending(codes, load_equivalents(module)) or sorted(codes)[:1]
            seconds = None if args.no_run else run_mutmut(module, args.max_children, mutmut, names)
            if names is not None:  # mutmut dropped the verdicts of functions changed since
                reset = [n for n, c in read_exit_codes(files[module]).items() if c is None]
                if reset:
                    seconds += run_mutmut(module, args.max_children, mutmut, sorted(reset))
            result = tally(module, read_exit_codes(files[module]), load_equivalents(module))
            result.seconds = seconds
            results.append(result)
            print(f"{module}: {_pct(result.score)}", flush=True)
    except MutationError as exc:
        print(f"mutation: {exc}", file=sys.stderr)
        return 1
    report = render(results, gates)
    print(report, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
    failures = verdict(results, gates, args.min_score)
    for failure in failures:
        print(f"mutation: FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
