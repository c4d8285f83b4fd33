"""A run ends with what a user can act on: one line per missing capability (cuda, interop,
multihost) with how to get it, and the other skips counted in one line; ``-rs`` on the command
line lists every skip again, as pytest does (``suites/_skips.py``, the root conftest)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from allocator.device import backend_unavailable_reason
from suites._skips import asks_for_skip_report, summary_lines

ROOT = Path(__file__).resolve().parents[2]

CUDA = "cuda backend unavailable: CuPy is not installed (pip install 'devmem-harness[cuda]')"
INTEROP = (
    "interop test (PyTorch as client or oracle): run with --interop; ci/check.sh --interop"
    " installs torch==2.13.0 (CPU) and runs them"
)


def test_one_line_per_capability_and_one_for_the_rest():
    reasons = [CUDA] * 3 + [INTEROP] * 2 + ["Skipped: illustrative (README.md:21): ..."] * 4
    assert summary_lines(reasons) == [
        "SKIPPED [3] cuda: CuPy is not installed (pip install 'devmem-harness[cuda]'); without a"
        " GPU, ci/check.sh --fake-cuda runs them on a fake one",
        "SKIPPED [2] interop: run with --interop (PyTorch installed); ci/check.sh --interop"
        " installs torch==2.13.0 (CPU) and runs them",
        "SKIPPED [4] for other reasons: -rs lists every skip with its reason",
    ]
    assert summary_lines([]) == []


@pytest.mark.parametrize(
    ("args", "asks"),
    [
        ([], False),
        (["-n", "auto", "-q", "-x", "-p", "no:cacheprovider", "-k", "rs or -rs"], False),
        (["-rs"], True),
        (["-ra"], True),
        (["-r", "fE"], True),
        (["-vrA"], True),
        (["-sra"], True),  # -s -r a: pytest's flags without a value combine before -r
        (["-xsvrs"], True),
        (["-dfr", "s"], True),
        (["-krs"], False),  # -k rs: a keyword, not a report
        (["-nr"], False),  # -n r: a worker count
        (["--report-chars=s"], True),
        (["--runxfail"], False),
    ],
)
def test_what_asks_for_pytest_s_own_skip_lines(args, asks):
    assert asks_for_skip_report(args) is asks


SELECTION = [
    "suites/allocator/test_memory_interop.py",  # interop
    "suites/harness/test_multihost.py",  # multihost
    "suites/allocator/test_stats.py::test_device_memory_fields",  # cuda, where no GPU is visible
    "suites/docs/test_docs.py::test_block_runs_as_written[README.md:21]",  # illustrative
]


def _pytest(*extra: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DEVMEM_"))}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *SELECTION, *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.splitlines()


def test_a_run_ends_with_what_to_do_about_its_skips():
    if backend_unavailable_reason("cuda") is None:  # pragma: no cover
        pytest.skip("the cuda backend is available here: its items run")
    lines = _pytest("--backend", "cpu,sim,cuda")
    ours = [line for line in lines if line.startswith("SKIPPED")]
    names = [line.split("] ", 1)[1].split(":", 1)[0] for line in ours]
    assert names == ["cuda", "interop", "multihost", "for other reasons"], lines
    assert "skipped: what it takes to run them" in lines[-6]
    assert ours == lines[-5:-1]  # the last lines, before pytest's count


def test_rs_lists_every_skip_with_its_reason_again():
    lines = _pytest("--backend", "cpu,sim,cuda", "-rs")
    skipped = [line for line in lines if line.startswith("SKIPPED")]
    assert any("conftest.py: interop test" in line for line in skipped), lines
    assert any("illustrative (README.md:21)" in line for line in skipped), lines
    assert not any("what it takes" in line for line in lines), lines
