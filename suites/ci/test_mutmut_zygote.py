"""The forkserver zygote under mutmut (``suites/_mutmut_zygote.py``): its module has its real
name, so a mutant of ``harness._zygote`` applies there, and a stats run hears what it reached.

The whole mutation run (``ci/mutation.py --module harness._zygote``) takes long; these check its
two pieces in seconds, each in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from suites import _mutmut, _mutmut_zygote

ROOT = Path(__file__).resolve().parents[2]

ZYGOTE_RUN = """
import json, os, sys
from harness import _forkserver
import harness
from suites import _mutmut, _mutmut_zygote
from suites.ci.test_mutmut_zygote import zygote_modules

if os.fork() == 0:  # as mutmut runs each mutant: in a process forked from one that imported us
    _mutmut._own_zygotes()
    outcome = harness.run_child(zygote_modules, style="forkserver")
    print(json.dumps({"kind": outcome.kind, "returned": outcome.returned, "pid": os.getpid(),
                      "root": _forkserver.ROOT[0], "path": _forkserver.ZYGOTE_PATH}), flush=True)
    os._exit(0)
os.wait()
"""


def zygote_modules() -> dict[str, object]:
    """A death-test target: where the zygote that forked this child took its code from."""
    zygote = sys.modules.get("harness._zygote")
    main = sys.modules["__main__"]
    return {
        "harness._zygote": None if zygote is None else zygote.__file__,
        "main_is_the_launcher": getattr(main, "__file__", "").endswith("_mutmut_zygote.py"),
    }


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_under_mutmut_the_zygote_runs_its_module_by_name_and_is_this_process_s_own():
    ran = _python(ZYGOTE_RUN)

    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout.splitlines()[-1])
    assert seen["kind"] == "exited", seen
    assert seen["path"] == _mutmut_zygote.__file__
    # the zygote's functions belong to harness._zygote, not __main__: a mutant's name matches
    assert seen["returned"]["harness._zygote"] == str(ROOT / "harness" / "_zygote.py")
    assert seen["returned"]["main_is_the_launcher"] is True
    # the process that ran it is its zygote's root (not the one it was forked from)
    assert seen["root"] == seen["pid"]


def test_without_the_launcher_the_zygote_is_main_and_the_parent_s():
    ran = _python(ZYGOTE_RUN.replace("_mutmut._own_zygotes()", ""))

    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout.splitlines()[-1])
    assert seen["returned"]["harness._zygote"] is None  # what mutmut could never switch
    assert seen["returned"]["main_is_the_launcher"] is False
    assert seen["root"] != seen["pid"]  # and the zygote would be shared with the parent's


SPILL = """
import os, sys
from mutmut.mutation import trampoline
from suites import _mutmut_zygote

directory = sys.argv[1]
_mutmut_zygote.spill_hits_to(directory)
trampoline.record_trampoline_hit("m.x_parent")
trampoline.record_trampoline_hit("m.x_parent")
pid = os.fork()
if pid == 0:
    trampoline.record_trampoline_hit("m.x_child")
    trampoline.record_trampoline_hit("m.x_parent")  # new in this process: reported
    os._exit(0)
os.waitpid(pid, 0)
print(pid)
"""


def test_a_stats_run_hears_the_hits_of_the_zygote_and_of_each_child_it_forks(tmp_path):
    pytest.importorskip("mutmut")
    ran = subprocess.run(
        [sys.executable, "-c", SPILL, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert ran.returncode == 0, ran.stderr
    child = ran.stdout.split()[-1]
    files = {path.name: path.read_text().split() for path in tmp_path.iterdir()}
    assert files.pop(child) == ["m.x_child", "m.x_parent"]
    assert list(files.values()) == [["m.x_parent"]]  # the zygote's, each name once


def test_a_name_is_reported_again_once_the_test_process_took_the_file(tmp_path):
    hits = _mutmut_zygote.SpillingHits(str(tmp_path / "7"))
    hits.add("m.x_f")
    hits.add("m.x_f")
    assert (tmp_path / "7").read_text() == "m.x_f\n"

    (tmp_path / "7").unlink()  # a test's teardown read it
    hits.add("m.x_g")
    hits.add("m.x_f")  # reached again in the next test: the next test is told

    assert (tmp_path / "7").read_text() == "m.x_g\nm.x_f\n"


def test_a_hit_that_cannot_be_written_is_lost_quietly(tmp_path):
    hits = _mutmut_zygote.SpillingHits(str(tmp_path / "missing" / "7"))
    hits.add("m.x_f")  # no such directory: the target's behaviour is untouched

    assert "m.x_f" in hits


STATS_RUN_ENDS = """
import os, time
import harness
from harness import _forkserver
from suites import _mutmut

_mutmut._UNDER_TEST = "stats"  # as in mutmut's first run, which is in mutmut's own process
_mutmut._own_zygotes()
outcome = harness.run_child("suites.ci.test_mutmut_zygote:zygote_modules", style="forkserver")
zygote = _forkserver.current().pid
lost_pid = os.fork()  # a child the run left unreaped (no Popen to reap it when dropped)
if lost_pid == 0:
    os._exit(0)
while open(f"/proc/{lost_pid}/stat").read().split(") ")[1][0] != "Z":
    time.sleep(0.01)
_mutmut.pytest_unconfigure(None)
try:  # mutmut's os.wait() for its first worker would get a pid here, or block on a zygote
    left = "ended" if os.waitpid(-1, os.WNOHANG)[0] else "running"
except ChildProcessError:
    left = None
print(outcome.kind, zygote != lost_pid, left)
"""


def test_the_stats_run_ends_with_its_zygotes_gone_and_every_ended_child_reaped():
    # mutmut waits for its workers with os.wait(): a zygote of the stats run that ended later
    # was taken for a worker, and the run stopped with KeyError (the harness._zygote run did)
    ran = _python(STATS_RUN_ENDS)

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["exited", "True", "None"], ran.stdout + ran.stderr


TEARDOWN = """
import json
from suites import _mutmut

class State:
    _stats = set()

state = State()
hits = _mutmut._ChildHits(lambda: state)
seen = []
for stats in (
    {_mutmut.FORKSERVER_RUN, "harness._child.x_main"},
    {_mutmut.ZYGOTE_RUN, "harness._child.x_main"},  # only the zygote mutated
    {"harness._child.x_main"},
):
    state._stats = set(stats)
    hits.pytest_runtest_teardown(None, None)
    seen.append(sorted(state._stats))
hits.pytest_unconfigure(None)
print(json.dumps(seen))
"""


def test_a_test_that_ran_a_forkserver_child_is_mapped_to_the_zygote_s_start_up():
    # a zygote starts once, in one test; every test whose child it forked depends on how
    ran = _python(TEARDOWN)

    assert ran.returncode == 0, ran.stderr
    forkserver, zygote, other = json.loads(ran.stdout)
    assert forkserver == sorted(
        {_mutmut.FORKSERVER_RUN, "harness._child.x_main", *_mutmut.ZYGOTE_START}
    )
    assert zygote == sorted({_mutmut.ZYGOTE_RUN, "harness._child.x_main", *_mutmut.ZYGOTE_START})
    assert other == ["harness._child.x_main"]  # no forkserver child: nothing added


def test_the_zygote_start_up_names_are_functions_that_exist():
    # mutmut's names ("<module>.x_<function>", "<module>.xǁ<Class>ǁ<method>"): a renamed
    # function would leave a name that maps nothing, silently
    import importlib

    for name in (_mutmut.FORKSERVER_RUN, _mutmut.ZYGOTE_RUN, *_mutmut.ZYGOTE_START):
        module, _, mangled = name.rpartition(".")
        path = mangled[2:].split("ǁ") if mangled.startswith("xǁ") else [mangled[2:]]
        found = importlib.import_module(module)
        for part in filter(None, path):
            found = getattr(found, part)
        assert callable(found), name


class _Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


@pytest.mark.parametrize("mutated", [True, False], ids=["child-mutated", "child-not-mutated"])
def test_frame_counting_tests_are_deselected_where_the_child_side_is_mutated(monkeypatch, mutated):
    # mutmut's trampolines add frames between a target and harness._child.run_child
    from harness import _child

    monkeypatch.setattr(_mutmut, "_UNDER_TEST", "stats")
    if mutated:
        monkeypatch.setattr(_child, "x_run_child__mutmut_orig", _child.run_child, raising=False)
    deselected: list = []
    config = type("Config", (), {})()
    config.hook = type(
        "Hook", (), {"pytest_deselected": lambda self, items: deselected.extend(items)}
    )()
    frames = _Item("suites/harness/test_report_frames.py::test_x[fork]")
    other = _Item("suites/harness/test_child.py::test_y")
    items = [frames, other]

    _mutmut.pytest_collection_modifyitems(config, items)

    assert items == ([other] if mutated else [frames, other])
    assert deselected == ([frames] if mutated else [])
