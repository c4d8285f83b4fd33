"""What every child gets: its own group, no core dumps, /dev/null stdin, env, captured output."""

from __future__ import annotations

import os
import signal
import sys
import threading

import pytest

import harness
from harness import _forkserver
from harness._capture import HEAD_BYTES, TAIL_BYTES
from harness._child import DUMP_SIGNAL
from suites.harness import _procs, _targets


def test_child_setup(run, style):
    outcome = run(_targets.hygiene).assert_clean()
    seen = outcome.returned

    assert seen["pgid"] == seen["pid"] == outcome.pid  # its own process group
    assert seen["pgid"] != os.getpgid(0)
    assert _targets.set_up_of(seen) == _targets.SET_UP  # no core files; signals; faulthandler
    assert DUMP_SIGNAL == signal.SIGUSR2  # the signal hygiene() checks is caught
    assert seen["stdin"] == "/dev/null"
    assert seen["deathsig"] == signal.SIGKILL  # dies with its parent
    assert seen["flag"] == "1"
    assert seen["cwd"] == os.getcwd()
    if style != "fork":  # a clean interpreter: neither pytest nor the harness package
        assert seen["pytest_imported"] is False
        assert seen["harness_imported"] is False


def test_the_child_module_has_one_name_in_every_style(run):
    # fork runs the imported harness._child; the zygote and the exec runner load the same file
    # by path, under the same name (mutmut's trampolines go by it too)
    assert set(run(_targets.entry_modules).assert_clean().returned) == {"harness._child"}


def test_in_death_child_flag(run):
    assert harness.in_death_child() is False
    assert run(harness.in_death_child).assert_clean().returned is True
    assert run(_targets.env_values, "DEVMEM_DEATH_CHILD").returned == ["1"]


def test_env_set_and_unset_seen_at_import_time(run, monkeypatch):
    assert "suites.harness._env_probe" not in sys.modules  # so even fork imports it fresh
    monkeypatch.setenv("PROBE_UNSET", "from the parent")
    config = harness.Config("probe", {"PROBE_CONFIG": "from config", "PROBE_SET": "overridden"})

    outcome = run(
        "suites.harness._env_probe:probe",
        env={"PROBE_SET": "from env", "PROBE_UNSET": None},
        config=config,
    ).assert_clean()

    expected = {"PROBE_SET": "from env", "PROBE_UNSET": None, "PROBE_CONFIG": "from config"}
    assert outcome.returned == {"at_import": expected, "now": expected}
    assert outcome.env == {
        "PROBE_CONFIG": "from config",
        "PROBE_SET": "from env",
        "PROBE_UNSET": None,
    }
    assert outcome.config_id == "probe"
    assert "suites.harness._env_probe" not in sys.modules


def test_parent_environment_is_inherited(run, monkeypatch):
    monkeypatch.setenv("PROBE_PARENT", "parent value")
    outcome = run(_targets.env_values, "PROBE_PARENT").assert_clean()
    assert outcome.returned == ["parent value"]


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_twenty_megabytes_of_output_do_not_block_and_the_tail_is_kept(run, stream):
    outcome = run(_targets.write_lots, stream, 20, "THE LAST LINE", timeout=20.0).assert_clean()

    text = getattr(outcome, stream)
    assert text.endswith("THE LAST LINE\n")
    assert text.startswith("line 000000 of filler text")
    cut = 20 * 2**20 + len("THE LAST LINE\n") - HEAD_BYTES - TAIL_BYTES
    assert f"devmem-harness cut {cut} bytes" not in text  # a note, not part of the stream
    assert any(note.startswith(f"devmem-harness cut {cut} bytes") for note in outcome.notes)
    assert len(text) == HEAD_BYTES + TAIL_BYTES


# Issue 9, case 8: however much a child writes, the parent keeps a few MiB, and nothing on disk.
FLOOD_MIB = 128


def test_a_flood_of_output_is_kept_in_a_few_mib_of_memory_and_none_on_disk(run, tmp_path):
    pid_file = tmp_path / "pid"
    peak = {"disk": 0, "memory": 0}
    before = _procs.resident_bytes()
    done = threading.Event()

    def sample() -> None:  # what the child's stdout holds on disk; what this process holds
        while not done.wait(0.002):
            peak["memory"] = max(peak["memory"], _procs.resident_bytes() - before)
            try:
                stdout = os.stat(f"/proc/{int(pid_file.read_text())}/fd/1")
            except (OSError, ValueError):
                continue
            peak["disk"] = max(peak["disk"], stdout.st_blocks * 512)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        outcome = run(_targets.flood, str(pid_file), FLOOD_MIB, timeout=120).assert_clean()
    finally:
        done.set()
        sampler.join()

    cut = FLOOD_MIB * 2**20 + len("THE LAST LINE\n") - HEAD_BYTES - TAIL_BYTES
    assert f"devmem-harness cut {cut} bytes (126.9 MiB) of stdout" in outcome.notes[0]
    assert outcome.stdout.endswith("THE LAST LINE\n")
    assert peak["disk"] <= 4 * 2**20, peak
    assert peak["memory"] <= 32 * 2**20, peak


def test_grandchild_left_behind_is_killed_with_the_group(run):
    outcome = run(_targets.leave_grandchild).assert_clean()
    grandchild = outcome.returned

    assert isinstance(grandchild, int)
    assert _procs.wait_until_dead(grandchild), f"grandchild {grandchild} still running"


def test_no_zombies_left(run, style):
    outcomes = [
        run(_targets.give_back),
        run(_targets.abort_with, "x"),
        run(_targets.exit_with, 2),
        run(_targets.leave_grandchild),
    ]

    assert [o.kind for o in outcomes] == ["exited", "signaled", "exited", "exited"]
    parents = {os.getpid()}
    if style == "forkserver":
        zygote = _forkserver.current().pid
        assert zygote is not None
        parents.add(zygote)
    assert _procs.zombies_of(parents) == []


def _fork_and_wait(body) -> int:
    """Run ``body()`` in a forked child; its return value is the child's exit status (an
    exception is 70)."""
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            code = body()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_process_forked_from_a_forkserver_user_keeps_its_own_descriptors_in_its_children():
    # The forkserver's connection descriptors are closed in every child forked from the process
    # that opened them. A process forked from that one (pytest --forked's child) has them
    # closed already, and reuses their numbers for its own files: its own children, fork-style
    # death tests among them, must keep those files (a hook closing the numbers again took the
    # capture files away: EBADF, a harness error instead of the target's outcome).
    harness.run_child(_targets.hygiene, style="forkserver").assert_clean()
    closes = list(_forkserver._child_closes)
    assert closes, "the forkserver connection registers descriptors to close in children"

    def forked_like_pytest_forked() -> int:
        held: list[int] = []
        while not set(closes) <= set(held) and len(held) < 256:  # lowest numbers first
            held.append(os.open(os.devnull, os.O_RDONLY))
        if not set(closes) <= set(held):
            return 3  # the numbers were not reused: the check below would prove nothing

        def grandchild() -> int:
            for fd in held:
                os.fstat(fd)  # OSError (EBADF): closed by the at-fork hook
            return 0

        if _fork_and_wait(grandchild) != 0:
            return 4
        outcome = harness.run_child(_targets.abort_with, "still mine", style="fork")
        outcome.assert_aborted("still mine")  # AssertionError: the child exits 70
        return 0

    assert _fork_and_wait(forked_like_pytest_forked) == 0
