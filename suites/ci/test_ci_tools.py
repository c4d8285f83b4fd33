"""The CI tooling: ``ci/check.sh`` option handling, the nightly summary, ``ci/import_all.py``,
``ci/mutation.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from suites.ci import path_without_a_driver

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
    assert "usage: ci/check.sh [--ci-all] [--cuda] [--fake-cuda] [--nightly]" in result.stderr


def test_help_exits_0():
    result = _check_sh("--help")
    assert result.returncode == 0 and result.stdout.startswith("usage: ci/check.sh")


def test_cuda_without_a_gpu_fails_at_once_with_a_clear_message(tmp_path):
    path = path_without_a_driver(tmp_path)  # no nvidia-smi anywhere on it, even on a GPU box
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


def test_the_nightly_memory_timelines_are_written_and_linked(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra: pip install 'devmem-harness[plot]'")
    memory = tmp_path / "reports" / "memory"
    done = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "memory_pictures.py"), "--out", str(memory)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    names = sorted(path.name for path in memory.iterdir())
    assert names == [
        f"{run}.{suffix}"
        for run in ("arena-stress", "cache-cap")
        for suffix in ("pickle", "png", "txt")
    ]
    assert "cap evictions 28" in (memory / "cache-cap.txt").read_text()
    assert "arena exits 7" in (memory / "arena-stress.txt").read_text()
    sys.path.insert(0, str(ROOT / "ci"))
    import nightly_summary

    section = nightly_summary.memory_section(memory, tmp_path / "reports")
    assert section.startswith("\n## Memory timelines\n")
    assert "![arena-stress memory timeline](memory/arena-stress.png)" in section
    assert "[top allocation sites](memory/cache-cap.txt)" in section
    assert "(memory/cache-cap.pickle)" in section
    assert nightly_summary.memory_section(tmp_path, tmp_path) == ""


def test_memory_pictures_refuses_a_scale_below_one(tmp_path):
    out = tmp_path / "memory"
    done = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "memory_pictures.py"), "--scale", "0", "--out", out],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "--scale must be >= 1, got 0" in done.stderr
    assert not out.exists()  # refused before anything was written


def test_interop_is_an_option_of_check_sh_and_ci_runs_it():
    assert "--interop   also run the tests marked interop" in _check_sh("-h").stdout
    run = (ROOT / ".ci" / "run").read_text().splitlines()
    assert run[-2:] == [
        "ci/check.sh --ci-all --interop --multihost --fake-cuda",
        "exec ci/pythons.sh",
    ]
    readme = (ROOT / "README.md").read_text()
    assert "ci/check.sh --ci-all      # set up .venv" in readme  # still the first command


def test_fake_cuda_and_cuda_exclude_each_other():
    result = _check_sh("--cuda", "--fake-cuda", "--no-build")
    assert result.returncode == 2
    assert result.stderr == (
        "ci/check.sh: --cuda and --fake-cuda exclude each other (a real GPU, or the fake one)\n"
    )


def test_pythons_sh_takes_no_argument_and_says_what_it_does():
    script = ROOT / "ci" / "pythons.sh"
    done = subprocess.run(["bash", str(script), "-h"], capture_output=True, text=True)
    assert done.returncode == 0 and "3.10 to 3.13" in done.stdout.splitlines()[0]
    done = subprocess.run(["bash", str(script), "--bogus"], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr == "ci/pythons.sh: unknown argument '--bogus' (it takes none; -h for help)\n"


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


def test_import_all_leaves_a_packages_main_out(tmp_path):
    pkg = tmp_path / "clipkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text("raise SystemExit('the command line ran')\n")
    result = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "import_all.py"), "clipkg"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert "clipkg.__main__" not in result.stdout + result.stderr


@pytest.mark.parametrize("package", ["allocator", "harness", "runtime"])
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


# -- ci/mutation.py ------------------------------------------------------------------------------

sys.path.insert(0, str(ROOT / "ci"))
import mutation  # noqa: E402


def test_mutated_files_follow_the_mutmut_configuration():
    files = [path.as_posix() for path in mutation.mutated_files()]
    assert "allocator/_cache.py" in files and "allocator/device/sim.py" in files
    assert "harness/_outcome.py" in files
    assert "allocator/device/cuda.py" not in files and "harness/_run.py" not in files
    assert mutation.module_name(Path("allocator/device/__init__.py")) == "allocator.device"
    assert mutation.module_name(Path("harness/_outcome.py")) == "harness._outcome"


def test_equivalent_lists_parse_names_and_reasons():
    text = "# header\n\nm.x_f__mutmut_1  # same value either way\nm.x_g__mutmut_2 #why\n"
    assert mutation.parse_equivalents(text, "m.txt") == [
        mutation.Equivalent("m.x_f__mutmut_1", "same value either way"),
        mutation.Equivalent("m.x_g__mutmut_2", "why"),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("m.x_f__mutmut_1\n", r"^m\.txt:1: expected '<mutant name>  # <reason>'"),
        ("\nm.x_f__mutmut_1  #   \n", r"^m\.txt:2: expected"),
        ("a  # r\na  # again\n", r"^m\.txt:2: a is listed twice$"),
    ],
)
def test_bad_equivalent_lines_are_refused_with_their_line(text, message):
    with pytest.raises(mutation.MutationError, match=message):
        mutation.parse_equivalents(text, "m.txt")


def _result() -> mutation.ModuleResult:
    codes = {
        "m.x_a__mutmut_1": 1,
        "m.x_a__mutmut_2": 0,
        "m.x_a__mutmut_3": 0,
        "m.x_a__mutmut_4": 36,
        "m.x_a__mutmut_5": 33,
        "m.x_a__mutmut_6": None,
    }
    listed = [mutation.Equivalent("m.x_a__mutmut_2", "no test can tell")]
    return mutation.tally("m", codes, listed)


def test_tally_counts_verdicts_and_applies_the_list():
    result = _result()
    assert (result.total, result.killed) == (6, 2)  # a failure and a timeout
    assert [e.name for e in result.equivalent] == ["m.x_a__mutmut_2"]
    assert result.survivors == ["m.x_a__mutmut_3"]
    assert result.no_tests == ["m.x_a__mutmut_5"]
    assert result.other == {"not checked": 1} and result.stale == []
    assert result.score == pytest.approx(100 * 2 / 5)


def test_a_test_process_that_left_as_a_death_test_child_killed_its_mutant():
    # a mutant of a fork (`if pid != 0`) made the in-process zygote's test run the child's
    # side, which leaves with the harness's EXIT_HARNESS_ERROR
    from harness._child import EXIT_HARNESS_ERROR

    result = mutation.tally("m", {"m.x_a__mutmut_1": EXIT_HARNESS_ERROR}, [])
    assert (result.killed, result.other) == (1, {})


def test_stale_equivalent_entries_are_reported():
    listed = [
        mutation.Equivalent("m.x_a__mutmut_1", "r"),
        mutation.Equivalent("m.x_b__mutmut_9", "r"),
    ]
    result = mutation.tally("m", {"m.x_a__mutmut_1": 1}, listed)
    assert result.stale == ["m.x_a__mutmut_1 (killed now)", "m.x_b__mutmut_9 (not a mutant of m)"]
    assert mutation.verdict([result], ["m"], 0) == [
        "m: stale equivalent entry m.x_a__mutmut_1 (killed now)",
        "m: stale equivalent entry m.x_b__mutmut_9 (not a mutant of m)",
    ]


def test_the_report_and_the_verdict():
    result = _result()
    result.seconds = 12.3
    clean = mutation.tally("allocator.x", {"allocator.x.x_f__mutmut_1": 1}, [])
    report = mutation.render([result, clean], ["m"])
    assert "| m | 6 | 2 | 1 | 1 | 1 | 40.0% | 12 s |" in report
    assert "| allocator.x | 1 | 1 | 0 | 0 | 0 | 100.0% | - |" in report
    assert "- m.x_a__mutmut_2: no test can tell" in report
    assert "- m.x_a__mutmut_3: survived (mutmut show m.x_a__mutmut_3)" in report
    assert "- m.x_a__mutmut_5: no test reaches it" in report
    assert "m together: 2 killed of 6 mutants, 1 equivalent: score 40.0%" in report
    assert mutation.verdict([result, clean], ["allocator"], 97) == []
    assert mutation.verdict([result, clean], ["m"], 30) == [
        "m: 1 unexplained survivors, 1 mutants no test reaches"
    ]
    assert mutation.verdict([clean], ["allocator"], 100) == []


def test_no_run_reports_the_last_results_and_fails_without_them(tmp_path, monkeypatch):
    monkeypatch.setattr(mutation, "MUTANTS_DIR", tmp_path)
    assert mutation.main(["--no-run", "--module", "allocator._locks"]) == 1
    meta = tmp_path / "allocator" / "_locks.py.meta"
    meta.parent.mkdir()
    meta.write_text(json.dumps({"exit_code_by_key": {"allocator._locks.x_new_lock__mutmut_1": 1}}))
    out = tmp_path / "report.md"
    assert mutation.main(["--no-run", "--module", "allocator._locks", "--out", str(out)]) == 0
    assert "| allocator._locks | 1 | 1 | 0 | 0 | 0 | 100.0% | - |" in out.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--module", "allocator.nothing"], "--module allocator.nothing: expected one of"),
        (["--max-children", "0"], "--max-children must be >= 1, got 0"),
        (["--min-score", "101"], "--min-score must be between 0 and 100, got 101"),
    ],
)
def test_bad_mutation_arguments_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        mutation.main(["--no-run", *args])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_the_checked_in_equivalent_lists_parse():
    for path in sorted(mutation.EQUIVALENT_DIR.glob("*.txt")):
        module = path.stem
        assert module in {mutation.module_name(p) for p in mutation.mutated_files()}, path
        for entry in mutation.load_equivalents(module):
            assert entry.name.startswith(f"{module}.x"), entry


def test_the_mutmut_plugin_spills_each_new_hit_once(tmp_path):
    from suites import _mutmut, _mutmut_zygote

    hits = _mutmut_zygote.SpillingHits(str(tmp_path / "hits"))
    for name in ("m.x_f", "m.x_g", "m.x_f"):
        hits.add(name)
    assert hits == {"m.x_f", "m.x_g"}
    assert (tmp_path / "hits").read_text() == "m.x_f\nm.x_g\n"
    stack = _mutmut._ThreadLocalCallStack()
    token = stack.set(("m.x_f", 1))
    assert stack.get() == ("m.x_f", 1)
    stack.reset(token)
    assert stack.get() == (None, 0)


def test_run_mutmut_accepts_a_module_without_mutants_and_reports_failures(tmp_path):
    fake = tmp_path / "mutmut"
    fake.write_text(
        '#!/bin/sh\ncase "$2" in\n'
        f"  empty.x*) echo '{mutation.NOTHING_MATCHES}'; exit 1;;\n"
        "  broken.x*) echo 'Traceback: boom'; exit 1;;\n"
        "esac\nexit 0\n"
    )
    fake.chmod(0o755)
    assert mutation.run_mutmut("fine", 1, str(fake)) >= 0
    assert mutation.run_mutmut("empty", 1, str(fake)) >= 0
    with pytest.raises(mutation.MutationError, match=r"mutmut run failed on broken \(status 1\)"):
        mutation.run_mutmut("broken", 1, str(fake))
