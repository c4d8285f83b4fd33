"""How a death-test child ended, with GoogleTest-style assertions."""

from __future__ import annotations

import re
import signal as signal_module
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness._errors import DeathTestFailure, HarnessError
from harness._protocol import Raised
from harness._report import describe_ending, failure_message, seconds, signal_name


@dataclass(frozen=True, repr=False)
class Outcome:
    """How one death-test child ended, and what it left behind.

    Returned by :func:`harness.run_child` and ``death.run``; check it with the ``assert_*``
    methods, which return the outcome so they chain, or read the fields.

    Attributes:
      kind: ``"exited"`` (it called exit, or returned, or raised), ``"signaled"`` (a signal
        killed it), ``"timed_out"`` (the harness killed it at the deadline) or
        ``"harness_error"`` (the harness failed; never a verdict on the code under test).
      exit_code: the exit status, or None if a signal ended it.
      signal: the :class:`signal.Signals` that killed it (SIGABRT, not 6), or None (a plain
        int for a signal without a name, such as a real-time one).
      stdout, stderr: what the child wrote to its file descriptors 1 and 2; of a long stream
        the first 64 KiB and the last 1 MiB are kept, with a line saying what was cut.
      returned: the target's return value (JSON plain data), None if it did not return.
      raised: the exception the target raised (type, message, traceback), or None.
      duration_s: seconds from the launch of the child to its reaping (a forkserver zygote's
        own start-up is not counted).
      style: ``"fork"``, ``"forkserver"`` or ``"exec"``: how the child was started.
      pid: the child's pid (None if it never started).
      repro: a shell command that reruns the child (exec style) and shows how it ends.
      target: the target as ``"module:qualname"``.
      config_id: the id of the :class:`~harness.Config` it ran under, or None.
      env: the env overrides it ran with (config's, then the call's; None = unset).
      timeout_s: its deadline, in seconds.
      error: what went wrong, for a ``"harness_error"``; else None.
    """

    kind: str
    exit_code: int | None
    signal: signal_module.Signals | None
    stdout: str
    stderr: str
    returned: Any
    raised: Raised | None
    duration_s: float
    style: str
    pid: int | None
    repro: str
    target: str
    config_id: str | None = None
    env: Mapping[str, str | None] = field(default_factory=dict)
    timeout_s: float = 60.0
    error: str | None = None

    @property
    def ending(self) -> str:
        """How it ended, in words: ``killed by SIGABRT``, ``exited with status 3``, ..."""
        return describe_ending(self.kind, self.exit_code, self.signal, self.timeout_s, self.error)

    def __repr__(self) -> str:
        config = f", config {self.config_id!r}" if self.config_id is not None else ""
        return (
            f"<Outcome {self.target}: {self.ending} "
            f"(style {self.style}{config}, {seconds(self.duration_s)})>"
        )

    def assert_aborted(self, match: str | re.Pattern[str] | None = None) -> Outcome:
        """Assert the child was killed by SIGABRT (``abort()``, a failed C assert, ...).

        Args:
          match: a regex that must be found (``re.search``) in the child's stderr.

        Returns:
          This outcome.

        Raises:
          DeathTestFailure: it ended otherwise, or its stderr does not match.
          HarnessError: ``match`` is not a valid regex.
        """
        __tracebackhide__ = True
        ok = self.kind == "signaled" and self.signal == signal_module.SIGABRT
        return self._check("killed by SIGABRT", ok, match, death=True)

    def assert_died(
        self,
        match: str | re.Pattern[str] | None = None,
        signal: signal_module.Signals | int | str | None = None,
    ) -> Outcome:
        """Assert the child died: killed by a signal, or exited with a non-zero status.

        A timeout is not a death (the harness killed it), nor is a harness error.

        Args:
          match: a regex that must be found (``re.search``) in the child's stderr.
          signal: if given, the signal that must have killed it (``signal.SIGSEGV``, 11 or
            ``"SIGSEGV"``); an exit status then does not count.

        Returns:
          This outcome.

        Raises:
          DeathTestFailure: it did not die (as required), or its stderr does not match.
          HarnessError: ``signal`` names no signal, or ``match`` is not a valid regex.
        """
        __tracebackhide__ = True
        if signal is None:
            ok = self.kind == "signaled" or (self.kind == "exited" and self.exit_code != 0)
            expected = "killed by a signal, or exited with a non-zero status"
        else:
            wanted = _as_signal(signal)
            ok = self.kind == "signaled" and self.signal == wanted
            expected = f"killed by {signal_name(wanted)}"
        return self._check(expected, ok, match, death=True)

    def assert_exited(self, code: int = 0, match: str | re.Pattern[str] | None = None) -> Outcome:
        """Assert the child exited with status ``code`` (not killed, not timed out).

        Args:
          code: the expected exit status, 0 to 255 (a target that raises exits with 1).
          match: a regex that must be found (``re.search``) in the child's stderr.

        Returns:
          This outcome.

        Raises:
          DeathTestFailure: it ended otherwise, or its stderr does not match.
          HarnessError: ``code`` is not an int from 0 to 255, or ``match`` is not a regex.
        """
        __tracebackhide__ = True
        if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
            raise HarnessError(f"assert_exited(code=...) takes an int from 0 to 255, not {code!r}")
        ok = self.kind == "exited" and self.exit_code == code
        return self._check(f"exited with status {code}", ok, match, death=code != 0)

    def assert_clean(self) -> Outcome:
        """Assert the child exited with status 0 and its target raised nothing.

        Returns:
          This outcome.

        Raises:
          DeathTestFailure: it ended otherwise.
        """
        __tracebackhide__ = True
        ok = self.kind == "exited" and self.exit_code == 0 and self.raised is None
        return self._check("exited with status 0, nothing raised", ok, None, death=False)

    def _check(
        self,
        expected: str,
        ok: bool,
        match: str | re.Pattern[str] | None,
        *,
        death: bool,
    ) -> Outcome:
        __tracebackhide__ = True
        pattern = _compile(match)
        if pattern is not None:
            expected += f", with stderr matching {pattern.pattern!r}"
        if self.kind == "harness_error":
            problem = f"the harness failed, so how the child ends is unknown: {self.error}"
        elif not ok:
            lived = self.kind == "timed_out" or (self.kind == "exited" and self.exit_code == 0)
            verb = "was " if self.kind == "signaled" else ""
            if death and lived:
                problem = f"the child did not die: it {self.ending}"
            else:
                problem = f"the child {verb}{self.ending}"
        elif pattern is not None and not pattern.search(self.stderr):
            problem = (
                f"the child ended as expected, but its stderr does not match {pattern.pattern!r}"
            )
        else:
            return self
        raise DeathTestFailure(
            failure_message(
                problem=problem,
                expected=expected,
                actual=self.ending,
                target=self.target,
                style=self.style,
                pid=self.pid,
                duration_s=self.duration_s,
                config_id=self.config_id,
                env=self.env,
                stderr=self.stderr,
                repro=self.repro,
                detail=self._detail(),
            )
        )

    def _detail(self) -> list[str]:
        lines = []
        if self.raised is not None:
            lines.append(f"raised:   {self.raised}")
        if self.returned is not None:
            text = repr(self.returned)
            lines.append(f"returned: {text if len(text) <= 200 else text[:200] + ' [...]'}")
        return lines


def _compile(match: str | re.Pattern[str] | None) -> re.Pattern[str] | None:
    if match is None or isinstance(match, re.Pattern):
        return match
    if not isinstance(match, str):
        raise HarnessError(f"match must be a regex str or compiled pattern, not {match!r}")
    try:
        return re.compile(match)
    except re.error as exc:
        raise HarnessError(f"match={match!r} is not a valid regex: {exc}") from exc


def _as_signal(value: object) -> signal_module.Signals:
    try:
        if isinstance(value, str):
            name = value.upper()
            return signal_module.Signals[name if name.startswith("SIG") else "SIG" + name]
        if isinstance(value, int) and not isinstance(value, bool):
            return signal_module.Signals(value)
    except (KeyError, ValueError):
        pass
    raise HarnessError(f"signal={value!r} is not a signal (use e.g. signal.SIGSEGV)")
