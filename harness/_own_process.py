"""``@pytest.mark.own_process``: a whole test (setup, call, teardown) in a fork child.

What a test does to its process stays in that child: above all CUDA, which makes a process
unsafe to fork (``harness.mark_fork_unsafe``). A pytest process, or xdist worker, that ran a
test creating a CUDA context would refuse every later ``style="fork"`` death test; run in a
process of its own, the test leaves the worker as it found it, and the fork-style tests after
it still fork (docs/gpus.md: why the suites' ``cuda`` items are marked).

The child is a fork-style harness child (``harness.run_child(style="fork")``, so its process
group, its death with the worker and its reaping are the harness's), forked by the test
process before the test's setup. It runs pytest's own protocol for the item, reporting nothing
itself; its reports come back through pytest's report serialization (the hooks xdist uses) and
are logged by the test process, so terminal, JUnit XML and xdist see one test as usual.

Fixtures: everything the test sets up in the child is the child's. Its function-scoped
fixtures are torn down there; a broader fixture (module, session) the child set up first is
not torn down there, and is set up again by the next test that needs it in the test process;
one that the test process set up before is used by the child as a copy and torn down by the
test process, once. A child that dies (a signal, ``os._exit``) or hangs past the marker's
``timeout`` is one failed report with how it ended and what it wrote.
"""

from __future__ import annotations

import json
import sys

import pytest
from _pytest.runner import runtestprotocol

from harness._errors import HarnessError
from harness._run import run_unobserved

MARKER = (
    "own_process(timeout=None): run the whole test (setup, call and teardown) in a fork child "
    "of the test process, so that what it does to its process (CUDA initialized, ...) does not "
    "reach the tests after it; timeout: seconds, or None for no deadline"
)

SHOWN_BYTES = 20_000
"""How much of a dead child's stdout and of its stderr (each, the tail) its report shows."""


class _Successor:
    """What the child's teardown is told comes next: the item's own collectors, so that only
    the item's function-scoped fixtures are torn down in the child (``SetupState`` reads only
    ``listchain()`` of the next item)."""

    def __init__(self, item: pytest.Item) -> None:
        self._chain = item.listchain()[:-1]
        self.nodeid = item.nodeid

    def listchain(self) -> list:
        return list(self._chain)


def _tuples(data: dict) -> dict:
    """Undo what JSON did to a serialized report's tuples (``location``, a skip's
    ``longrepr``, ``sections``, ``user_properties``)."""
    for key in ("location", "longrepr"):
        if isinstance(data.get(key), list):
            data[key] = tuple(data[key])
    for key in ("sections", "user_properties"):
        if isinstance(data.get(key), list):
            data[key] = [tuple(pair) if isinstance(pair, list) else pair for pair in data[key]]
    return data


def _child_protocol(item: pytest.Item) -> list:
    """In the child: pytest's protocol for ``item`` (setup, call, teardown of its own
    fixtures), its reports as JSON plain data."""
    reports = runtestprotocol(item, log=False, nextitem=_Successor(item))  # type: ignore[arg-type]
    hook = item.config.hook
    data = [hook.pytest_report_to_serializable(config=item.config, report=r) for r in reports]
    return json.loads(json.dumps(data, default=repr))


def _tail(text: str) -> str:
    return (
        text
        if len(text) <= SHOWN_BYTES
        else f"[... {len(text) - SHOWN_BYTES} cut]{text[-SHOWN_BYTES:]}"
    )


def _failed_report(
    item: pytest.Item, lines: list[str], duration_s: float, when: str = "call"
) -> pytest.TestReport:
    """One failed report for a child that did not report (``setup``: for one that could not
    start, which pytest counts as an error)."""
    return pytest.TestReport(
        nodeid=item.nodeid,
        location=item.location,
        keywords=dict.fromkeys(item.keywords, 1),
        outcome="failed",
        longrepr="\n".join(lines),
        when=when,
        sections=[],
        duration=duration_s,
        user_properties=list(item.user_properties),
    )


def _left_in_capture(item: pytest.Item) -> tuple[str, str]:
    """What a child that died in a test phase left in pytest's capture files, which it shared
    with this process (its fd 1 and 2 were those files then: a segfault's stack is there)."""
    capman = item.config.pluginmanager.getplugin("capturemanager")
    if capman is None or not capman.is_globally_capturing():
        return "", ""
    out, err = capman.read_global_capture()
    return out, err


def _pass_on_output(item: pytest.Item, outcome, report: pytest.TestReport) -> None:
    """What the child wrote outside pytest's capture (between phases, or all of it under
    ``-s``): to this process's stdout and stderr under ``-s``, else a section of its last
    report."""
    for name, text, stream in (
        ("stdout", outcome.stdout, sys.stdout),
        ("stderr", outcome.stderr, sys.stderr),
    ):
        if not text:
            continue
        if item.config.getoption("capture", "fd") == "no":
            stream.write(text)
            stream.flush()
        else:
            report.sections.append((f"Captured {name} (own process)", text))


def _crash_lines(item: pytest.Item, outcome) -> list[str]:
    """How a child that did not report ended, and the tails of what it wrote."""
    lines = [
        f"the test's own process (@pytest.mark.own_process: pid {outcome.pid}, a fork of the "
        f"test process) {outcome.ending} before it reported, after {outcome.duration_s:.2f} s"
    ]
    if outcome.error:
        lines.append(f"harness: {outcome.error}")
    lines += [f"note: {note}" for note in outcome.notes]
    captured = _left_in_capture(item)
    for name, text in (
        ("stdout", captured[0] + outcome.stdout),
        ("stderr", captured[1] + outcome.stderr),
    ):
        if text.strip():
            lines += [f"---- its {name} ----", _tail(text).rstrip("\n")]
    return lines


def _marker_timeout(item: pytest.Item) -> tuple[float | None, str | None]:
    """``(timeout, None)`` from the item's ``own_process`` marker, or ``(None, problem)``."""
    marker = item.get_closest_marker("own_process")
    unknown = set(marker.kwargs) - {"timeout"}
    if marker.args or unknown:
        return None, (
            "@pytest.mark.own_process takes the keyword argument timeout= only, got "
            f"{marker.args!r} {sorted(unknown)}"
        )
    return marker.kwargs.get("timeout"), None


def run_in_own_process(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Run ``item``'s whole protocol in a fork child and log its reports here.

    Args:
      item: the test; its ``own_process`` marker's ``timeout`` (seconds, or None) bounds the
        child.
      nextitem: the test that runs next in this process, or None: what this process tears
        down of its own fixtures afterwards, as pytest's teardown would.

    A marker with other arguments than ``timeout=``, a bad timeout, or a test process that
    cannot fork (``harness.fork_unsafe_reason``) fail the test, saying so; nothing is raised.
    """
    ihook = item.ihook
    timeout, problem = _marker_timeout(item)
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    try:
        if problem is not None:
            raise HarnessError(problem)
        outcome = run_unobserved(lambda: _child_protocol(item), style="fork", timeout=timeout)
    except Exception as exc:  # HarnessError: fork refused (this process is fork-unsafe), ...
        line = f"the test's own process (@pytest.mark.own_process) could not be started: {exc}"
        reports = [_failed_report(item, [line], 0.0, when="setup")]
    else:
        if outcome.kind == "exited" and outcome.exit_code == 0 and outcome.returned:
            config = item.config
            reports = [
                config.hook.pytest_report_from_serializable(config=config, data=_tuples(data))
                for data in outcome.returned
            ]
            _pass_on_output(item, outcome, reports[-1])
        else:
            reports = [_failed_report(item, _crash_lines(item, outcome), outcome.duration_s)]
    # this process never set the item up; it tears down what the next item does not need
    teardown = pytest.CallInfo.from_call(
        lambda: item.session._setupstate.teardown_exact(nextitem), when="teardown"
    )
    if teardown.excinfo is not None:
        reports.append(ihook.pytest_runtest_makereport(item=item, call=teardown))
    for report in reports:
        ihook.pytest_runtest_logreport(report=report)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
