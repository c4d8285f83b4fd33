"""The benchmarks' shared command line and verdict (bench/_common.py): a missed target fails
only under ``--check``, and every run ends with one ``verdict:`` line."""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def common():
    spec = importlib.util.spec_from_file_location("_bench_common", ROOT / "bench" / "_common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def finish(common, tmp_path, argv: list[str], verdicts: dict, capsys) -> tuple[int, str, dict]:
    parser = common.parser("demo", "A demo benchmark.\n\nMore.", repeat=3, quick="less")
    args = common.parse(parser, [*argv, "--out", str(tmp_path / "demo.json")])
    status = common.finish(args, {"repeat": args.repeat}, "the table", verdicts)
    written = json.loads((tmp_path / "demo.json").read_text())
    return status, capsys.readouterr(), written


def test_a_met_target_exits_0_with_one_verdict_line(common, tmp_path, capsys):
    status, out, written = finish(common, tmp_path, ["--check"], {"(a) <= 2x": True}, capsys)
    assert status == 0
    assert out.out.splitlines()[0] == "the table"
    assert out.out.splitlines()[-1] == "verdict: (a) <= 2x met"
    assert written == {"repeat": 3, "verdicts": {"(a) <= 2x": True}}


def test_a_missed_target_fails_only_under_check(common, tmp_path, capsys):
    verdicts = {"(a) <= 2x": True, "(b) <= 1.05x": False}
    status, out, _ = finish(common, tmp_path, [], verdicts, capsys)
    assert status == 0
    assert out.out.splitlines()[-1] == "verdict: (a) <= 2x met; (b) <= 1.05x MISSED"
    status, out, _ = finish(common, tmp_path, ["--check"], verdicts, capsys)
    assert status == 1
    assert out.err.endswith("--check: missed (b) <= 1.05x\n")


def test_a_repeat_below_one_is_a_usage_error(common, capsys):
    parser = common.parser("demo", "A demo benchmark.", repeat=3, quick="less")
    with pytest.raises(SystemExit) as info:
        common.parse(parser, ["--repeat", "0"])
    assert info.value.code == 2
    assert "--repeat must be >= 1, got 0" in capsys.readouterr().err


def test_per_call_us_times_each_run(common):
    calls = []
    runs = common.per_call_us(lambda: calls.append(1), 100, 3)
    assert len(runs) == 3 and all(us > 0 for us in runs) and len(calls) == 300


def test_per_call_us_reads_the_clock_it_is_given(common):
    # bench/alloc.py passes time.process_time: a run's figure is what that clock says
    ticks = iter(range(0, 100, 2))  # each read 2 s after the last: every run lasts 2 s
    runs = common.per_call_us(lambda: None, 4, 3, clock=lambda: next(ticks))
    assert runs == [2 / 4 * 1e6] * 3


def test_min_ratio_compares_the_fastest_runs(common):
    # a burst of load slows most runs of either side; the fastest of each is what the code costs
    assert common.min_ratio([9.0, 2.0, 7.0], [4.0, 1.0, 3.0, 8.0]) == 2.0
    assert common.min_ratio([3.0], [4.0]) == 0.75


def test_min_ratio_without_runs_names_what_it_needs(common):
    for runs, reference in (([], [1.0]), ([1.0], [])):
        with pytest.raises(ValueError, match="at least one run and one reference run"):
            common.min_ratio(runs, reference)


def test_paired_ratio_takes_each_run_over_the_one_beside_it(common):
    # the load doubles halfway: each pair still says 2x, a ratio of medians would not
    runs, reference = [2, 2, 4, 4, 4], [1, 1, 2, 2, 2]
    assert common.paired_ratio(runs, reference) == 2
    assert common.paired_ratio([3, 1], [1, 1]) == 2  # the median of 3x and 1x


def test_paired_ratio_rejects_unpaired_runs(common):
    with pytest.raises(ValueError):
        common.paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(statistics.StatisticsError):
        common.paired_ratio([], [])


def test_every_benchmark_has_the_shared_options():
    for script in sorted((ROOT / "bench").glob("[!_]*.py")):
        result = subprocess.run(
            [sys.executable, str(script), "-h"], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, (script.name, result.stderr)
        for option in ("--repeat", "--quick", "--check", "--out"):
            assert option in result.stdout, (script.name, option)


@pytest.mark.parametrize("script", sorted(path.name for path in (ROOT / "bench").glob("[!_]*.py")))
def test_every_benchmark_runs_as_the_readme_says(script, tmp_path):
    # the smallest run of the README's command: a table, the JSON and one verdict line
    out = tmp_path / "results.json"
    # checkpoint.py also draws a picture: into tmp_path, not over bench/results/
    extra = ["--plot", str(tmp_path / "plot.png")] if script == "checkpoint.py" else []
    argv = ["--quick", "--repeat", "1", "--out", str(out), *extra]
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1].startswith("verdict: "), result.stdout[-2000:]
    results = json.loads(out.read_text())
    if results.get("skipped"):  # a benchmark of a backend that cannot run here says why
        assert results["verdicts"] == {}
        assert result.stdout.splitlines()[-1] == (
            f"verdict: no target measured here ({results['skipped']})"
        )
        return
    assert results["verdicts"] and all(
        isinstance(met, bool) for met in results["verdicts"].values()
    )


def test_interleaved_rounds_rotate_the_order_and_time_each_function_once_a_round(common):
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    runs = common.interleaved_us(fns, 2, 4)
    assert "".join(calls) == "aabbcc" + "bbccaa" + "ccaabb" + "aabbcc"
    assert {name: len(times) for name, times in runs.items()} == {"a": 4, "b": 4, "c": 4}
    assert all(t >= 0 for times in runs.values() for t in times)


def test_a_burst_of_load_moves_the_median_but_not_the_fastest_round(common, monkeypatch):
    # the lookups' verdicts (bench/ring.py (b), (c)) compare the fastest of interleaved rounds:
    # a burst that slows the first 5 of 8 rounds of one function shifts its median 3x, not its
    # minimum
    seen = {"small": 0, "big": 0}

    def fake_per_call_us(fn, number, repeat):
        name = fn()
        seen[name] += 1
        return [30.0 if name == "big" and seen[name] <= 5 else 10.0]

    monkeypatch.setattr(common, "per_call_us", fake_per_call_us)
    runs = common.interleaved_us({"small": lambda: "small", "big": lambda: "big"}, 1, 8)
    assert statistics.median(runs["big"]) / statistics.median(runs["small"]) == 3.0
    assert min(runs["big"]) / min(runs["small"]) == 1.0


def test_the_machine_records_its_load_at_the_start(common, monkeypatch):
    monkeypatch.setattr(common.os, "getloadavg", lambda: (6.534, 5.0, 4.0))
    assert common.machine()["load_average"] == 6.53  # the 1-minute figure, as the docs print it


def test_a_failed_write_leaves_the_old_results_and_no_temporary_file(common, tmp_path, monkeypatch):
    out = tmp_path / "alloc.json"
    out.write_text('{"old": true}\n')

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(common.os, "replace", refuse)
    with pytest.raises(OSError, match="No space left"):
        common.write_atomically(out, '{"new": true}\n')
    assert out.read_text() == '{"old": true}\n'
    assert [path.name for path in tmp_path.iterdir()] == ["alloc.json"]


def test_a_writer_killed_mid_write_leaves_the_old_results(tmp_path):
    # a child that writes a large results file and is SIGKILLed while doing so, at a point
    # chosen by a write hook: the file the user keeps is the old one, whole
    out = tmp_path / "alloc.json"
    out.write_text('{"old": true}\n')
    code = (
        "import os, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'bench')!r})\n"
        "import _common\n"
        "real = os.fdopen\n"
        "class Dying:\n"
        "    def __init__(self, f): self.f = f\n"
        "    def __enter__(self): return self\n"
        "    def __exit__(self, *a): return False\n"
        "    def write(self, text):\n"
        "        self.f.write(text[: len(text) // 2]); self.f.flush()\n"
        "        os.kill(os.getpid(), 9)\n"
        "_common.os.fdopen = lambda fd, *a, **k: Dying(real(fd, *a, **k))\n"
        f"_common.write_atomically(__import__('pathlib').Path({str(out)!r}), 'x' * 10**6)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == -9, done.stderr
    assert out.read_text() == '{"old": true}\n'
