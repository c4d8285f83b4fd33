"""The paths made lean for speed (issue 18, item 13) keep their guarantees.

- fork style: the parent's first wait, right after the fork, does next to nothing; an
  interrupt there (KeyboardInterrupt) still kills the child and reaps it, in every style;
- forkserver: the zygote sets up a request's environment, ``sys.path`` and working directory
  itself before the fork; none of it carries over to the next child; it also sets up, once,
  the signal dispositions and mask, core-file limit and faulthandler its children would set
  up (after its preload, whose changes to them never reach a child), and where it cannot
  apply a request, the child sets itself up as it would have;
- the ``started`` record is written without ``emit``'s general steps, the same bytes;
- status records are written without the json module's encoder for plain values: what the
  parent decodes is what ``json.dumps`` would have written.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import signal
import sys

import pytest

import harness
from harness import _child
from harness._child import DUMP_SIGNAL, _Status, encode_record
from suites.harness import _procs, _targets


def test_an_interrupted_wait_kills_and_reaps_the_child(style, tmp_path):
    pid_file = str(tmp_path / "pids.json")

    def interrupt_once_started(signum, frame):
        if os.path.exists(pid_file):
            signal.setitimer(signal.ITIMER_REAL, 0)
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt_once_started)
    signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
    try:
        with pytest.raises(KeyboardInterrupt):
            harness.run_child(
                _targets.spawn_sleepers_and_hang, pid_file, 0, style=style, timeout=30.0
            )
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    with open(pid_file) as pids:
        child = json.load(pids)["child"]
    assert _procs.wait_until_dead(child), f"child {child} survived the interrupt"
    assert child not in _procs.zombies_of({os.getpid()})  # reaped, not left a zombie


def test_forkserver_children_do_not_inherit_an_earlier_request(monkeypatch, tmp_path):
    monkeypatch.setenv("DEVMEM_T_KEPT", "kept")
    monkeypatch.delenv("DEVMEM_T_SET", raising=False)
    names = ("DEVMEM_T_SET", "DEVMEM_T_KEPT")
    home = os.getcwd()
    extra = str(tmp_path / "extra-path-entry")

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(extra)
    first = harness.run_child(
        _targets.env_values,
        *names,
        env={"DEVMEM_T_SET": "1", "DEVMEM_T_KEPT": None},
        style="forkserver",
    )
    first_cwd = harness.run_child("os:getcwd", style="forkserver")
    first_path = harness.run_child("sys:path.copy", style="forkserver")
    monkeypatch.chdir(home)
    sys.path.remove(extra)
    second = harness.run_child(_targets.env_values, *names, style="forkserver")
    second_cwd = harness.run_child("os:getcwd", style="forkserver")
    second_path = harness.run_child("sys:path.copy", style="forkserver")

    assert first.returned == ["1", None]
    assert second.returned == [None, "kept"]
    assert first_cwd.returned == str(tmp_path)
    assert second_cwd.returned == home
    assert extra in first_path.returned
    assert extra not in second_path.returned


def test_a_child_is_set_up_as_documented_whatever_the_zygote_s_preload_did(preloading):
    preloading("suites.harness._meddling_import")

    first = harness.run_child(_targets.hygiene, style="forkserver").assert_clean()
    second = harness.run_child(_targets.hygiene, style="forkserver").assert_clean()

    assert _targets.set_up_of(first.returned) == _targets.SET_UP
    assert _targets.set_up_of(second.returned) == _targets.SET_UP
    hung = harness.run_child(_targets.hang_forever, style="forkserver", timeout=0.5)
    hung.assert_timed_out()
    assert "in hang_forever" in hung.stderr  # the stacks it dumped at the deadline


def test_where_the_zygote_cannot_apply_a_request_the_child_sets_itself_up(preloading):
    preloading("suites.harness._failing_finder_import")

    outcome = harness.run_child("os:getpid", style="forkserver")

    assert outcome.kind == "harness_error"
    assert outcome.error.startswith("could not set up the child: RuntimeError: ")
    assert "this finder cannot refresh its caches" in outcome.error


def test_the_started_record_is_what_emit_writes():
    written = []
    for send in (lambda status: status.emit("started", pid=status.pid), _Status.started):
        read_fd, write_fd = os.pipe()
        try:
            send(_Status(write_fd, None, echo=False))
            os.close(write_fd)
            written.append(os.read(read_fd, 1 << 16))
        finally:
            os.close(read_fd)
    assert written[0] == written[1] == b'{"event": "started", "pid": %d}\n' % os.getpid()


def test_the_started_record_of_a_repro_run_prints_nothing(capfd):
    status = _Status(None, None, echo=True)
    status.started()
    status.emit("started", pid=status.pid)  # the general path agrees
    assert capfd.readouterr() == ("", "")
    status.emit("exit", code=3)  # where other records are printed
    assert capfd.readouterr().err == 'devmem-death: exit {"code": 3}\n'


def test_a_child_dumps_its_stacks_where_its_parent_registered_the_dump_signal(tmp_path):
    # faulthandler.register skips installing its handler where this process registered the
    # signal already: the child's reset of the signal must not leave it at its default action
    # (a nested death test's test process is a child that registered it)
    log = open(tmp_path / "dumps", "w")  # noqa: SIM115 - closed below
    faulthandler.register(DUMP_SIGNAL, file=log, all_threads=True, chain=False)
    try:
        hung = harness.run_child(_targets.hang_forever, style="fork", timeout=0.5)
    finally:
        faulthandler.unregister(DUMP_SIGNAL)
        log.close()
    hung.assert_timed_out()
    assert "in hang_forever" in hung.stderr  # the stacks it dumped at the deadline


def _meddle_then_set_up_ahead() -> dict:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    faulthandler.disable()
    ok = _child.set_up_ahead()
    return {"ok": ok, **_targets.set_up_of(_targets.hygiene())}


def _set_up_ahead_with_a_failing_faulthandler() -> bool:
    def fail() -> None:
        raise RuntimeError("no faulthandler here")

    _child._arm_faulthandler = fail
    return _child.set_up_ahead()


def test_set_up_ahead_puts_a_process_in_its_children_s_state_or_says_it_could_not():
    # what the zygote runs after its preload (checked here in fork children, which are free
    # to change their own state)
    done = harness.run_child(_meddle_then_set_up_ahead, style="fork").assert_clean()
    assert done.returned == {"ok": True, **_targets.SET_UP}
    failed = harness.run_child(_set_up_ahead_with_a_failing_faulthandler, style="fork")
    assert failed.assert_clean().returned is False


@pytest.mark.parametrize(
    "fields",
    [
        {"event": "started", "pid": 4242},
        {"event": "returned", "value": None},
        {"event": "returned", "value": True},
        {"event": "returned", "value": -(2**80)},
        {"event": "returned", "value": 'é\u2028"\\\n\ud800 \x00'},
        {"event": "returned", "value": ["a", 1, None, False]},
        {"event": "returned", "value": 1.5},
        {"event": "returned", "value": float("nan")},
        {"event": "returned", "value": [1, [2]]},
        {"event": "returned", "value": {"k": [1, {"z": None}]}},
        {"event": "raised", "type": "E", "bases": ["Exception", "BaseException"], "message": ""},
        {"event": "returned", "delivered": False, "error": "OSError: [Errno 9] x"},
    ],
)
def test_records_are_what_json_dumps_writes(fields):
    assert encode_record(fields) == json.dumps(fields, default=repr)


def test_an_int_too_long_to_convert_raises_as_json_dumps_does():
    huge = 10**5000 if hasattr(sys, "set_int_max_str_digits") else None
    if huge is None:
        pytest.skip("this Python converts ints of any length")
    with pytest.raises(ValueError):
        json.dumps({"value": huge})
    with pytest.raises(ValueError):
        encode_record({"value": huge})


@pytest.mark.parametrize("enabled", [True, False])
def test_the_target_runs_with_the_collector_as_the_test_process_has_it(run, style, enabled):
    # the child turns the collector off for the harness's own steps, never for the target
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        outcome = run(_targets.collector_state)
    finally:
        (gc.enable if was else gc.disable)()
    # a fresh interpreter (exec) and the zygote's children have it on, whatever this process does
    expected = enabled or style != "fork"
    assert outcome.returned == {"enabled": expected, "collected": True}
