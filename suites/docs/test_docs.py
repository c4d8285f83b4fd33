"""Every copyable block of README.md and docs/*.md runs as written (see ``_blocks``).

Each runnable block (commands, a console transcript, a Python snippet) is one test item. It runs
in a fresh copy of the repository (its tracked files, as a clone has them: what a reader left in
the working tree never reaches the copy; without git, every file that ``.gitignore``'s patterns
do not name; plus a ``.venv`` that sees the packages of the environment running the tests but
installs into its own directory) with the document's file blocks written into it, in an
environment like a new shell's: no ``DEVMEM_*`` or ``PYTEST_*`` variables, and the virtual
environment's ``bin`` off ``PATH``. So a command that only works in an activated environment
fails here, as it would for a reader.

A reader runs an example twice as often as once, so each block runs twice in a row in the same
copy, and must leave nothing behind in the repository that git would not ignore: an example
writes under a temporary directory it names (or ``reports/``, which git ignores), or removes
what it wrote. A block run in a scratch directory of its own (``in <name>``: a reader's own
project) runs once: it cannot leave anything in the repository, and it starts by installing
the project into a new virtual environment (15 s of CPU, which CI's time cannot spare twice).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from suites.docs._blocks import Block, blocks_in, output_matches, parse_transcript

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT_S = 300.0
"""Per command; a block that takes longer is a benchmark and should be marked ``skip``."""


def _all_blocks() -> list[Block]:
    return [block for doc in DOCS for block in blocks_in(doc)]


RUNNABLE = [block for block in _all_blocks() if block.kind != "file"]


def _repo_files(root: Path = ROOT) -> list[str]:
    """The files a clone has: git's tracked files (staged ones included); without git (an
    unpacked archive), every file that ``.gitignore`` does not name."""
    try:
        listing = subprocess.run(
            ["git", "ls-files", "-z", "--cached"], cwd=root, capture_output=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return _files_without_git(root)
    return [name for name in listing.stdout.decode().split("\0") if name]


def _gitignore_patterns(root: Path) -> list[str]:
    path = root / ".gitignore"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return [line.strip() for line in lines if line.strip() and line[0] not in "#!"]


def _ignored_by_patterns(name: str, patterns: list[str], is_dir: bool = False) -> bool:
    """Whether ``.gitignore``'s simple patterns (a name or glob per line, ``/`` at the end for
    directories only: all this repository's are) ignore the relative path ``name``."""
    parts = name.split("/")
    for i, part in enumerate(parts):
        part_is_dir = is_dir or i < len(parts) - 1
        for pattern in patterns:
            bare = pattern.rstrip("/").lstrip("/")
            if pattern.endswith("/") and not part_is_dir:
                continue
            if fnmatch.fnmatchcase(part, bare) or fnmatch.fnmatchcase(
                "/".join(parts[: i + 1]), bare
            ):
                return True
    return False


def _files_without_git(root: Path) -> list[str]:
    patterns = [*_gitignore_patterns(root), ".git/"]
    found = []
    for top, dirs, files in os.walk(root):
        rel = Path(top).relative_to(root).as_posix()
        prefix = "" if rel == "." else rel + "/"
        dirs[:] = [d for d in dirs if not _ignored_by_patterns(prefix + d, patterns, True)]
        found += [prefix + f for f in files if not _ignored_by_patterns(prefix + f, patterns)]
    return sorted(found)


def _tree(repo: Path) -> set[str]:
    """Every file and symbolic link under ``repo``, relative, ``.venv`` left out."""
    found = set()
    for top, dirs, files in os.walk(repo):
        rel = Path(top).relative_to(repo).as_posix()
        prefix = "" if rel == "." else rel + "/"
        if prefix == "":
            dirs[:] = [d for d in dirs if d != ".venv"]
        found.update(prefix + name for name in files)
        found.update(prefix + d for d in dirs if (Path(top) / d).is_symlink())
    return found


def _not_ignored(repo: Path, names: set[str]) -> list[str]:
    """The paths of ``names`` (relative to ``repo``) that the repository's ``.gitignore``
    does not ignore: what a block left behind for the next ``git status`` to show."""
    patterns = _gitignore_patterns(repo)
    return sorted(name for name in names if not _ignored_by_patterns(name, patterns))


def _shell_env() -> dict[str, str]:
    """The environment of a new shell: the user's variables without this run's."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("DEVMEM_", "PYTEST_", "COV_"))
        and name not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    }
    venv_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(
        part for part in env.get("PATH", "").split(os.pathsep) if part and part != venv_bin
    )
    return env


@pytest.fixture
def workspace(tmp_path: Path):
    """``make(block) -> cwd``: a copy of the repository with the block's document's files
    written in it, and the scratch directories its ``in`` directives name."""

    def make(block: Block) -> Path:
        repo = tmp_path / "repo"
        for name in _repo_files():
            source = ROOT / name
            if source.is_file():
                target = repo / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
        _overlay_venv(repo / ".venv")
        for other in blocks_in(block.doc):
            if other.kind == "file" and other.skip is None:
                base = repo if other.place is None else tmp_path / other.place
                target = base / other.path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(_text(other, repo), encoding="utf-8")
        cwd = repo if block.place is None else tmp_path / block.place
        cwd.mkdir(parents=True, exist_ok=True)
        return cwd

    return make


def _overlay_venv(target: Path) -> None:
    """A virtual environment at ``target`` that sees this run's packages but owns its own
    site-packages: what a block installs lands there, never in the environment running the
    tests. Its ``bin`` has this environment's console scripts (pytest, ruff, ...)."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(target)
    purelib = Path(sysconfig.get_paths(vars={"base": str(target)})["purelib"])
    here = sysconfig.get_paths()["purelib"]
    (purelib / "_docs_test_overlay.pth").write_text(f"import site; site.addsitedir({here!r})\n")
    python = target / "bin" / "python"
    for script in (Path(sys.prefix) / "bin").iterdir():
        if (target / "bin" / script.name).exists() or not script.is_file():
            continue
        head = script.read_bytes()[:256]
        if head.startswith(b"#!") and b"python" in head.split(b"\n", 1)[0]:
            body = script.read_text(encoding="utf-8").split("\n", 1)[1]
            (target / "bin" / script.name).write_text(f"#!{python}\n{body}", encoding="utf-8")
            (target / "bin" / script.name).chmod(0o755)


def _text(block: Block, repo: Path) -> str:
    text = block.text
    for placeholder, _ in block.replace:
        text = text.replace(placeholder, str(repo))
    return text


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        command,
        cwd=cwd,
        env=_shell_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=TIMEOUT_S,
    )


def _status(returncode: int) -> int:
    """The status a shell shows in ``$?``: 128 + N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.where for block in RUNNABLE])
def test_block_runs_as_written(block: Block, workspace):
    """Each block runs twice in a row in the same copy, as a reader runs an example again (once
    in its own scratch directory, see the module docstring), and leaves nothing in the
    repository that git would not ignore."""
    if block.skip is not None:
        pytest.skip(f"illustrative ({block.where}): {block.skip}")
    cwd = workspace(block)
    repo = cwd if block.place is None else cwd.parent / "repo"
    before = _tree(repo)
    runs = ["the first run", "the second run in a row"][: 1 if block.place else 2]
    for run in runs:
        _run_block(block, cwd, repo, run)
        left = _not_ignored(repo, _tree(repo) - before)
        assert not left, (
            f"{block.where}: {run} left {', '.join(left)} in the repository, which git does"
            " not ignore: write under a temporary directory the example names, or remove it"
        )


def _run_block(block: Block, cwd: Path, repo: Path, run: str) -> None:
    text = _text(block, repo)
    if block.kind == "snippet":
        script = cwd / "_docs_snippet.py"
        script.write_text(text, encoding="utf-8")
        result = _run([str(repo / ".venv" / "bin" / "python"), script.name], cwd)
        script.unlink()
        assert result.returncode == 0, (
            f"{block.where}: the snippet failed ({run}):\n{result.stdout}"
        )
    elif block.kind == "sh":
        result = _run(["bash", "-e", "-o", "pipefail", "-c", text], cwd)
        assert result.returncode == 0, (
            f"{block.where}: the commands exited with status {_status(result.returncode)}"
            f" ({run}):\n{result.stdout}"
        )
    else:
        _check_transcript(block, text, cwd)


def _check_transcript(block: Block, text: str, cwd: Path) -> None:
    steps = parse_transcript(Block(block.doc, block.line, block.kind, text))
    status = 0
    for i, step in enumerate(steps):
        if step.command == "echo $?":
            actual = [str(status)]
        else:
            result = _run(["bash", "-c", step.command], cwd)
            status = _status(result.returncode)
            actual = result.stdout.splitlines()
            shows_status = i + 1 < len(steps) and steps[i + 1].command == "echo $?"
            assert status == 0 or shows_status, (
                f"{block.where}: `{step.command}` exited with status {status} (follow it with"
                f" `$ echo $?` if that is what the docs show):\n{result.stdout}"
            )
        assert output_matches(step.expected, actual), (
            f"{block.where}: `{step.command}` printed something else.\n--- the docs show:\n"
            + "\n".join(step.expected)
            + "\n--- it printed:\n"
            + "\n".join(actual)
        )


def test_every_file_block_is_exercised():
    """A file a document asks the reader to write must be used by a block that runs."""
    blocks = _all_blocks()
    for block in blocks:
        if block.kind != "file" or block.skip is not None:
            continue
        users = [
            other
            for other in blocks
            if other.doc == block.doc
            and other.kind != "file"
            and other.place == block.place
            and other.skip is None
        ]
        assert users, f"{block.where}: writes {block.path}, but no block of its document runs it"


def test_the_copy_has_the_tracked_files_only(tmp_path):
    """What a reader left in the working tree (``run.state``, ``arena.pickle``) never reaches
    the copy: a clone would not have it. Without git, ``.gitignore``'s patterns decide."""
    (tmp_path / ".gitignore").write_text("*.log\nout/\n")
    (tmp_path / "tracked.py").write_text("")
    (tmp_path / "left.state").write_text("")  # untracked, not ignored
    (tmp_path / "x.log").write_text("")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "y").write_text("")
    assert _repo_files(tmp_path) == sorted([".gitignore", "left.state", "tracked.py"])  # no git
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", ".gitignore", "tracked.py"], cwd=tmp_path, check=True)
    assert sorted(_repo_files(tmp_path)) == [".gitignore", "tracked.py"]


@pytest.mark.parametrize(
    "name",
    [
        ".venv/bin/python",
        ".venv-3.12/x",
        "a/__pycache__/m.pyc",
        "devmem_harness.egg-info/PKG-INFO",
        "reports/arena.pickle",
        "bench/results/ring.json",
        "bench/results.md",
        "allocator/_cstacks.cpython-311-x86_64-linux-gnu.so",
        ".coverage",
        ".coverage.host.1.2",
        "coverage.py",
        "run.state",
        "arena_history.py",
        "mutants/x.py",
        "docs/results/x.json",
    ],
)
def test_the_ignore_check_agrees_with_git(name):
    """The leftover check reads ``.gitignore`` itself (it runs without git too): it must say
    what ``git check-ignore`` says of every kind of path this repository ignores, and of some
    it does not."""
    git = subprocess.run(
        ["git", "check-ignore", "--no-index", "-q", name], cwd=ROOT, capture_output=True
    )
    if git.returncode not in (0, 1):
        pytest.skip(f"git check-ignore is not usable here: {git.stderr.decode().strip()}")
    assert _ignored_by_patterns(name, _gitignore_patterns(ROOT)) == (git.returncode == 0)
