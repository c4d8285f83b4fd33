"""Every copyable block of README.md and docs/*.md runs as written (see ``_blocks``).

Each runnable block (commands, a console transcript, a Python snippet) is one test item. It runs
in a fresh copy of the repository (tracked and untracked-but-not-ignored files, as a clone would
have them, plus a ``.venv`` that sees the packages of the environment running the tests but
installs into its own directory) with the
document's file blocks written into it, in an environment like a new shell's: no ``DEVMEM_*`` or
``PYTEST_*`` variables, and the virtual environment's ``bin`` off ``PATH``. So a command that
only works in an activated environment fails here, as it would for a reader.
"""

from __future__ import annotations

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


def _repo_files() -> list[str]:
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    return [name for name in listing.stdout.decode().split("\0") if name]


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
    if block.skip is not None:
        pytest.skip(f"illustrative ({block.where}): {block.skip}")
    cwd = workspace(block)
    repo = cwd if block.place is None else cwd.parent / "repo"
    text = _text(block, repo)
    if block.kind == "snippet":
        script = cwd / "_docs_snippet.py"
        script.write_text(text, encoding="utf-8")
        result = _run([str(repo / ".venv" / "bin" / "python"), script.name], cwd)
        assert result.returncode == 0, f"{block.where}: the snippet failed:\n{result.stdout}"
    elif block.kind == "sh":
        result = _run(["bash", "-e", "-o", "pipefail", "-c", text], cwd)
        assert result.returncode == 0, (
            f"{block.where}: the commands exited with status {_status(result.returncode)}:\n"
            f"{result.stdout}"
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
