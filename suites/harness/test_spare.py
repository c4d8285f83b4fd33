"""The forkserver's spare: a child its zygote forks ahead of the next request (issue 18, item
13). A request whose setting (environment, ``sys.path``, working directory) is the one the
spare was forked with, or differs from it only in environment variables, runs in the spare;
it then sees exactly what a child forked for it would: its variables, its set-up, only its
own descriptors. Any other request gets a child forked for it, and the spare is sent away. A
spare that died is replaced; none outlives its zygote.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import harness
from harness import _child, _forkserver
from harness._fd import anonymous_fd
from harness._zygote import Zygote, _Child, _environ_change, _Spare
from suites.harness import _procs, _targets

run = harness.DeathRunner(style="forkserver", timeout=30.0).run


def spare_of(zygote: int, within_s: float = 5.0) -> int:
    """The pid of the spare of ``zygote``: its one live child once none of ours runs, the same
    one 50 ms later (a spare sent away lives on for a moment, before its successor is forked)."""
    deadline = time.monotonic() + within_s
    seen = None
    while True:
        live = _procs.children_of(zygote)
        if len(live) == 1 and live[0] == seen:
            return seen
        seen = live[0] if len(live) == 1 else None
        if time.monotonic() >= deadline:
            raise AssertionError(f"zygote {zygote} has no one spare: its live children {live}")
        time.sleep(0.05 if seen is not None else 0.005)


def zygote() -> int:
    run("os:getpid").assert_clean()  # one is running, and its state is this request's
    return _forkserver.current().pid


def test_a_request_like_the_one_before_runs_in_the_spare_forked_ahead():
    spare = spare_of(zygote())

    outcome = run(_targets.hygiene).assert_clean()

    assert outcome.pid == spare  # forked before the request: the spare
    seen = outcome.returned
    assert seen["pgid"] == seen["pid"] == spare
    assert _targets.set_up_of(seen) == _targets.SET_UP
    assert seen["stdin"] == "/dev/null"
    assert seen["deathsig"] == signal.SIGKILL
    assert seen["flag"] == "1"
    assert seen["cwd"] == os.getcwd()
    assert (seen["pytest_imported"], seen["harness_imported"]) == (False, False)


def test_a_spare_sees_the_variables_its_request_changed(monkeypatch):
    monkeypatch.setenv("DEVMEM_T_GONE", "before")
    monkeypatch.delenv("DEVMEM_T_NEW", raising=False)
    spare = spare_of(zygote())
    monkeypatch.setenv("DEVMEM_T_NEW", "new")
    monkeypatch.delenv("DEVMEM_T_GONE")

    outcome = run(_targets.env_values, "DEVMEM_T_NEW", "DEVMEM_T_GONE", "PYTEST_CURRENT_TEST")

    assert outcome.pid == spare
    assert outcome.returned == ["new", None, os.environ["PYTEST_CURRENT_TEST"]]
    # and so does the next spare, forked once the zygote has set them too
    spare = spare_of(_forkserver.current().pid)
    outcome = run(_targets.env_values, "DEVMEM_T_NEW", "DEVMEM_T_GONE")
    assert (outcome.pid, outcome.returned) == (spare, ["new", None])


def test_a_spare_imports_a_module_written_after_it_was_forked(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    spare = spare_of(zygote())  # its setting: this sys.path, the directory empty
    (tmp_path / "devmem_t_late.py").write_text("def value():\n    return 'written late'\n")

    outcome = run("devmem_t_late:value").assert_clean()

    assert (outcome.pid, outcome.returned) == (spare, "written late")


def test_a_request_in_another_directory_gets_a_child_forked_for_it(tmp_path, monkeypatch):
    spare = spare_of(zygote())
    monkeypatch.chdir(tmp_path)

    outcome = run(_targets.hygiene).assert_clean()

    assert outcome.pid != spare
    assert outcome.returned["cwd"] == str(tmp_path)
    assert _procs.wait_until_dead(spare)  # sent away
    assert spare not in _procs.zombies_of({_forkserver.current().pid})  # and reaped


def test_a_request_with_its_own_env_variables_runs_in_a_spare_with_them():
    spare = spare_of(zygote())

    outcome = run(_targets.env_values, "DEVMEM_T_OWN", env={"DEVMEM_T_OWN": "mine"})

    assert (outcome.pid, outcome.returned) == (spare, ["mine"])
    assert run(_targets.env_values, "DEVMEM_T_OWN").returned == [None]  # never the next's


def test_a_client_that_connected_after_the_spare_gets_a_child_forked_for_it(tmp_path):
    spare = spare_of(zygote())
    result = tmp_path / "result.json"
    pid = os.fork()  # a new process: it connects to the same zygote (the root's) as a new client
    if pid == 0:
        try:
            outcome = run(_targets.give_back, "late")
            result.write_text(json.dumps([outcome.kind, outcome.pid, outcome.returned["args"]]))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)

    kind, child, args = json.loads(result.read_text())
    assert (kind, args) == ("exited", ["late"])
    assert child != spare  # the spare has not mapped that client's guard table
    assert _procs.wait_until_dead(spare)  # sent away for one that has


def test_a_spare_that_died_is_replaced():
    server = zygote()
    spare = spare_of(server)
    os.kill(spare, signal.SIGKILL)

    outcome = run(_targets.give_back, 7).assert_clean()  # at once: the zygote may not know yet

    assert outcome.pid != spare
    assert outcome.returned["args"] == [7]
    assert _procs.wait_until_dead(spare)
    assert spare_of(server) not in (spare, outcome.pid)  # a new one
    assert spare not in _procs.zombies_of({server})


def test_a_spare_holds_only_the_descriptors_of_a_child_forked_for_its_request(monkeypatch):
    spare = spare_of(zygote())
    in_spare = run(_targets.open_descriptors).assert_clean()
    monkeypatch.chdir("/")  # another setting: a child forked for the request
    forked = run(_targets.open_descriptors).assert_clean()

    assert in_spare.pid == spare
    assert forked.pid != spare
    for outcome in (in_spare, forked):
        opened = sorted(outcome.returned.values())  # 0, 1, 2, the status channel
        assert opened == [
            "/dev/null",
            "/memfd:devmem-death (deleted)",
            *sorted(target for target in opened if target.startswith("pipe:")),
        ], outcome.returned


ENVIRONS = st.dictionaries(st.sampled_from("ABCD"), st.sampled_from(["", "1", "2", "é"]))
SETTINGS = st.fixed_dictionaries(
    {"environ": ENVIRONS, "cwd": st.sampled_from(["/", "/tmp"]), "sys_path": st.just(["/x"])}
)


@given(before=SETTINGS, after=SETTINGS)
def test_a_setting_fits_a_spare_when_only_its_variables_differ(before, after):
    # The oracle: the variables' change, applied to the spare's environment, gives the
    # request's; anything else that differs means no fit (a child forked for the request).
    encoded = json.dumps(before).encode()
    spare = _Spare(0, -1, None, encoded, json.loads(encoded), frozenset())
    request = b'{"target": "m:f"}\n' + json.dumps(after).encode()

    change = _environ_change(spare, request)

    if before["cwd"] != after["cwd"]:
        assert change is None
        return
    assert change is not None
    variables, decoded, setting = change
    environ = dict(before["environ"])
    for name, value in variables.items():
        if value is None:
            environ.pop(name)
        else:
            environ[name] = value
    assert environ == after["environ"]
    assert set(variables) == set(before["environ"]) ^ set(after["environ"]) | {
        name
        for name in before["environ"].keys() & after["environ"].keys()
        if before["environ"][name] != after["environ"][name]
    }  # only the names that changed
    assert (decoded, setting) == (after, json.dumps(after).encode())


def test_a_spare_that_cannot_say_it_took_a_request_runs_none_of_it(tmp_path):
    # The zygote forks a child for a request its spare did not say it took: were the spare to
    # run it too, the target would run twice. Here the zygote's end is closed before the spare
    # answers (its "taken" fails): the spare must leave without running anything.
    spare = Zygote.__new__(Zygote)  # only what _serve_as_spare reads
    spare.child, spare.clients = _child, {}
    request = json.dumps({"target": "suites.harness._targets:give_back", "args": []})
    request_fd, status_fd = anonymous_fd(), anonymous_fd()
    os.write(request_fd, request.encode() + b"\n{}")
    read_end, write_end = os.pipe()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    message = json.dumps({"client": 0, "serial": 0, "seal_offset": 0}).encode()
    socket.send_fds(ours, [message], [request_fd, write_end, write_end, status_fd])
    ours.close()  # before the fork: the spare's "taken" meets a closed end
    pid = os.fork()
    if pid == 0:
        try:
            spare._serve_as_spare(theirs.fileno())
        finally:
            os._exit(3)
    theirs.close()
    os.close(write_end)
    try:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0  # it left, as one sent away
        assert _child.read_all(status_fd) == b""  # not even a "started" record
    finally:
        for fd in (request_fd, status_fd, read_end):
            os.close(fd)


SERVE_AND_LEAVE = """
import sys, time
import harness
from harness import _forkserver
outcome = harness.run_child("os:getpid", style="forkserver", timeout=30.0)
assert outcome.kind == "exited", outcome
zygote = _forkserver.current().pid
for _ in range(500):
    children = open(f"/proc/{zygote}/task/{zygote}/children").read().split()
    if children:
        break
    time.sleep(0.01)
print(zygote, *children, flush=True)
if sys.argv[1] == "kill":
    import os, signal
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_no_spare_outlives_its_zygote():
    for how in ("exit", "kill"):
        result = subprocess.run(
            [sys.executable, "-c", SERVE_AND_LEAVE, how],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        pids = [int(word) for word in result.stdout.split()]
        assert len(pids) == 2, (how, result.stdout, result.stderr)  # the zygote, its spare
        for pid in pids:
            assert _procs.wait_until_dead(pid), f"{pid} outlived the test process ({how})"


NAMES = ("DEVMEM_T_A", "DEVMEM_T_B")
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.sampled_from(NAMES), st.sampled_from(["a", "b", "", "ü"])),
        st.tuples(st.just("unset"), st.sampled_from(NAMES)),
        st.tuples(st.just("chdir"), st.sampled_from([0, 1])),
        st.tuples(st.just("override"), st.sampled_from(NAMES), st.sampled_from(["x", None])),
        st.tuples(st.just("idle")),  # time for the zygote to fork a spare and rehearse it
        st.tuples(st.just("kill")),  # the spare, if there is one, killed
    ),
    max_size=10,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(steps=STEPS)
def test_every_child_sees_its_own_request_whatever_came_before(steps, tmp_path_factory):
    # Random sequences of requests, each after a change of the test process's environment or
    # working directory, a per-call override, a pause or a killed spare: whether it runs in a
    # spare or in a child forked for it, each child sees exactly its own request (the oracle:
    # this process's environment and directory when it asked, with the call's overrides).
    directories = [str(tmp_path_factory.mktemp("spare")) for _ in range(2)]
    saved_env = {name: os.environ.get(name) for name in NAMES}
    saved_cwd = os.getcwd()
    try:
        server = zygote()
        for step in steps:
            override: dict[str, str | None] = {}
            if step[0] == "set":
                os.environ[step[1]] = step[2]
            elif step[0] == "unset":
                os.environ.pop(step[1], None)
            elif step[0] == "chdir":
                os.chdir(directories[step[1]])
            elif step[0] == "override":
                override = {step[1]: step[2]}
            elif step[0] == "idle":
                time.sleep(0.02)
            else:
                for pid in _procs.children_of(server):
                    with contextlib.suppress(ProcessLookupError):  # a spare sent away, gone
                        os.kill(pid, signal.SIGKILL)
            expected = {name: os.environ.get(name) for name in NAMES} | override

            outcome = run(_targets.env_values, *NAMES, "DEVMEM_DEATH_CHILD", env=override)
            place = run(_targets.hygiene, env=override).assert_clean().returned

            assert outcome.kind == "exited", (step, outcome)
            assert outcome.returned == [*expected.values(), "1"], step
            assert place["cwd"] == os.getcwd(), step
            assert _targets.set_up_of(place) == _targets.SET_UP, step
    finally:
        os.chdir(saved_cwd)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.mark.parametrize(
    "spare_setting, setting",
    [
        ({"environ": {}}, {"environ": {}, "cwd": "/"}),  # a key the spare's setting lacks
        ({"environ": {}, "cwd": "/"}, {"environ": {}}),  # one the request's lacks
        ({"environ": None}, {"environ": {}}),  # either environ not a dict
        ({"environ": {}}, {"environ": ["A"]}),
        ({"environ": {}}, ["not", "a", "dict"]),
    ],
    ids=["key-added", "key-left-out", "spare-environ-null", "environ-a-list", "not-a-dict"],
)
def test_a_setting_that_differs_in_more_than_its_variables_does_not_fit(spare_setting, setting):
    encoded = json.dumps(spare_setting).encode()
    spare = _Spare(0, -1, None, encoded, spare_setting, frozenset())

    assert _environ_change(spare, b'{"target": "m:f"}\n' + json.dumps(setting).encode()) is None


def test_a_child_s_page_offset_is_kept_only_when_it_is_an_int():
    assert _Child(-1, None, 4096, ()).offset == 4096
    assert _Child(-1, None, "4096", ()).offset is None  # the client's orders, unchecked
    assert _Child(-1, None, None, ()).offset is None
