"""The CI tooling: ``ci/check.sh`` option handling, the nightly summary, ``ci/import_all.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "ci" / "check.sh"


def _check_sh(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        ["bash", str(CHECK), *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_unknown_option_prints_usage_and_exits_2():
    result = _check_sh("--bogus")
    assert result.returncode == 2
    assert "ci/check.sh: unknown option '--bogus'" in result.stderr
    assert "usage: ci/check.sh [--ci-all] [--cuda] [--nightly]" in result.stderr


def test_help_exits_0():
    result = _check_sh("--help")
    assert result.returncode == 0 and result.stdout.startswith("usage: ci/check.sh")


def test_cuda_without_a_gpu_fails_at_once_with_a_clear_message(tmp_path):
    path = f"{tmp_path}{os.pathsep}/usr/bin{os.pathsep}/bin"  # no nvidia-smi anywhere on it
    result = _check_sh("--cuda", "--no-build", "--no-lint", "--no-test", path=path)
    assert result.returncode == 1
    assert "ci/check.sh --cuda: no GPU is visible: nvidia-smi is not on PATH" in result.stderr
    assert "check passed." not in result.stdout


def test_cuda_with_a_driver_but_no_gpu_fails_too(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    smi.chmod(0o755)
    path = f"{tmp_path}{os.pathsep}/usr/bin{os.pathsep}/bin"
    result = _check_sh("--cuda", "--no-build", "--no-lint", "--no-test", path=path)
    assert result.returncode == 1
    assert "nvidia-smi -L says: No devices were found" in result.stderr


NIGHTLY_TESTS = """
import pytest


@pytest.fixture(params=["cpu", "sim"])
def backend(request):
    request.node.user_properties.append(("backend", request.param))
    return request.param


def test_stress(backend, record_property):
    record_property("peak_live_bytes", 3 << 20 if backend == "sim" else 1 << 20)


def test_fails_on_sim(backend):
    assert backend != "sim", "sim broke"


def test_skipped():
    pytest.skip("no GPU here")
"""


def test_nightly_summary_from_junit_xml(pytester):
    pytester.makepyfile(test_nightly=NIGHTLY_TESTS)
    xml = pytester.path / "nightly.xml"
    pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", f"--junitxml={xml}", "-o", "junit_family=xunit1"
    )
    out = pytester.path / "reports" / "summary.md"
    result = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "nightly_summary.py"), str(xml), "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    text = out.read_text()
    assert text == result.stdout
    assert text.startswith("# devmem-harness nightly: FAILED\n")
    assert "5 tests, 3 passed, 1 failed, 1 skipped" in text
    rows = [line for line in text.splitlines() if line.startswith("| test_nightly")]
    assert [row.split(" | ")[1:5] for row in rows] == [  # backend, passed, failed, skipped
        ["-", "0", "0", "1"],
        ["cpu", "2", "0", "0"],
        ["sim", "1", "1", "0"],
    ]
    assert rows[1].endswith("| 1.00 MiB |") and rows[2].endswith("| 3.00 MiB |")
    assert "- no GPU here" in text
    assert "test_nightly::test_fails_on_sim[sim]: AssertionError: sim broke" in text


def test_nightly_summary_refuses_a_missing_file(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "nightly_summary.py"), str(tmp_path / "none.xml")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "nightly_summary: cannot read" in result.stderr


def test_import_all_reports_failures(tmp_path):
    pkg = tmp_path / "brokenpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "fine.py").write_text("X = 1\n")
    (pkg / "bad.py").write_text("raise RuntimeError('no driver')\n")
    result = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "import_all.py"), "brokenpkg"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 1
    assert "imported brokenpkg.fine" in result.stdout
    assert "import failed: brokenpkg.bad" in result.stderr


@pytest.mark.parametrize("package", ["allocator", "harness"])
def test_every_project_module_imports(package):
    result = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "import_all.py"), package],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr


def test_help_says_what_a_bare_run_does():
    result = _check_sh("-h")
    assert "With no option: build (create .venv if absent" in result.stdout
    assert 'It ends with "check passed."' in result.stdout


def test_a_passing_check_ends_by_printing_the_second_command():
    # The README's second command, as written, must be what the first one prints last.
    result = _check_sh("--no-build", "--no-lint", "--no-test")
    assert result.returncode == 0, result.stderr
    last = result.stdout.rstrip("\n").splitlines()[-2:]
    assert last == ["check passed.", "Run the suites again, in any shell: .venv/bin/pytest -n auto"]
    readme = (ROOT / "README.md").read_text()
    assert "\n.venv/bin/pytest -n auto  # then, in any shell" in readme
