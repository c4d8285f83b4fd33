"""How a death-test child ended, with GoogleTest-style assertions."""

from __future__ import annotations

import re
import signal as signal_module
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness._child import type_name
from harness._errors import DeathTestFailure, HarnessError
from harness._protocol import Raised
from harness._report import (
    STDERR_HEAD_LINES,
    STDERR_TAIL_LINES,
    cut_entry_frames,
    describe_ending,
    failure_message,
    seconds,
    signal_name,
)
from harness._repro import PendingRepro
from harness._target import exception_name, raised_name

Pattern = str | re.Pattern[str] | None
ExceptionSpec = type[BaseException] | str | tuple[type[BaseException] | str, ...] | None

RETURNED_SHOWN = 200
"""Characters of a returned value's repr shown in a failure message (longer: cut, `` [...]``)."""

TRACEBACK_LINES = 30
"""Last lines of a raised exception's traceback shown in a failure message (when the stderr
shown there does not already hold it whole)."""


@dataclass(frozen=True, repr=False)
class Outcome:
    """How one death-test child ended, and what it left behind.

    Returned by :func:`harness.run_child` and ``death.run``; check it with the ``assert_*``
    methods, which return the outcome so they chain, or read the fields. As in GoogleTest, a
    target that raised did not die (``assert_died``, ``assert_aborted``, ``assert_exit`` and
    ``assert_exited`` fail on it, saying so; ``assert_raised`` expects it), and a child that
    timed out never satisfies a death assertion, whatever signal ended it
    (``assert_timed_out`` expects it).

    The ending decides, and what the target did before it is its history: a target that raised
    (or returned) and whose child a signal then killed on its way out (its
    ``sys.stdout.flush()`` aborted, say) is ``"signaled"``, with :attr:`raised` (or
    :attr:`returned`) set; it died (``assert_aborted`` and ``assert_died`` pass), and
    ``assert_raised`` fails on it, since its child did not exit.

    Attributes:
      kind: ``"exited"`` (it called exit, or returned, or raised), ``"signaled"`` (a signal
        killed it), ``"timed_out"`` (it was still running at its deadline; the harness then
        stopped it) or ``"harness_error"`` (the harness failed; never a verdict on the code
        under test).
      exit_code: the exit status, or None if a signal ended it.
      signal: the :class:`signal.Signals` that killed it (SIGABRT, not 6), or None (a plain
        int for a signal without a name, such as a real-time one).
      stdout, stderr: what the child wrote to its file descriptors 1 and 2, and nothing else;
        of a long stream the first 64 KiB and the last 1 MiB are kept, joined (a note says
        what was cut). A failure shows faulthandler's stacks in the stderr only down to the
        target's caller (a fork-style child's go on into pytest); ``stderr`` has them whole.
      returned: the target's return value (JSON plain data), None if it did not return.
      raised: the exception the target raised (type, message, traceback), or None.
      duration_s: seconds from the launch of the child to its reaping (a forkserver zygote's
        own start-up and preloading are not counted: the deadline starts at its fork too).
      style: ``"fork"``, ``"forkserver"`` or ``"exec"``: how the child was started.
      pid: the child's pid (None if it never started).
      repro: a shell command that reruns the child (exec style) and shows how it ends. A
        request over 16 KiB goes to a file the command names, written when ``repro`` is
        first read (a failure reads it): a child no one asks about leaves no file. Outside
        pytest, the file of a child that no assertion failed on is removed when the process
        exits (copy it to keep it); a failure's stays.
      target: the target as ``"module:qualname"``.
      config_id: the id of the :class:`~harness.Config` it ran under, or None.
      env: the env overrides it ran with (config's, then the call's; None = unset).
      timeout_s: its deadline, in seconds, or None for none.
      error: what went wrong, for a ``"harness_error"``; else None.
      stderr_cut_bytes: bytes cut from the middle of ``stderr`` (0 when it is whole): a
        ``match`` runs on the kept head and tail only, and a failure says so.
      stderr_cut_at: where in ``stderr`` (a str index) those bytes were cut, or None: a
        ``match`` searches the head and the tail each on its own, never across the cut.
      notes: the harness's own lines about the child (what it cut from a stream, that the
        deadline passed and the stacks were asked for), kept out of ``stdout`` and
        ``stderr`` so that a ``match`` never finds them; shown in a failure.
      host: the name of the host the child ran on (``socket.gethostname()``; an xdist
        worker may run on another host than the controller), or None; shown in a failure.
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
    timeout_s: float | None = 60.0
    error: str | None = None
    stderr_cut_bytes: int = 0
    stderr_cut_at: int | None = None
    notes: tuple[str, ...] = ()
    host: str | None = None

    @property
    def _ended_by_raise(self) -> bool:
        """Whether the target raised and the child then exited (the raise's own ending)."""
        return self.kind == "exited" and self.raised is not None

    @property
    def ending(self) -> str:
        """How it ended, in words: ``killed by SIGABRT``, ``exited with status 3``, ..."""
        return describe_ending(
            self.kind, self.exit_code, self.signal, self.timeout_s, self.error, self.raised
        )

    def __repr__(self) -> str:
        config = f", config {self.config_id!r}" if self.config_id is not None else ""
        return (
            f"<Outcome {self.target}: {self.ending} "
            f"(style {self.style}{config}, {seconds(self.duration_s)})>"
        )

    def assert_aborted(self, match: Pattern = None) -> Outcome:
        """Assert the child was killed by SIGABRT (``abort()``, a failed C assert, ...).

        Args:
          match: a regex that must be found (``re.search``) in the child's stderr.

        Returns:
          This outcome.

        Raises:
          DeathTestFailure: it ended otherwise (its target raised, it timed out, ...), or its
            stderr does not match.
          HarnessError: ``match`` is not a valid str regex (a bytes one is refused).
        """
        __tracebackhide__ = True
        ok = self.kind == "signaled" and self.signal == signal_module.SIGABRT
        return self._check("killed by SIGABRT", ok, match, death=True)

    def assert_died(
        self,
        match: Pattern = None,
        signal: signal_module.Signals | int | str | None = None,
    ) -> Outcome:
        """Assert the child died: killed by a signal, or exited with a non-zero status.

        A raise is not a death (the target failed in Python: use :meth:`assert_raised`), nor
        is a timeout (the harness killed it), nor a harness error.

        Args:
          match: a regex that must be found (``re.search``) in the child's stderr.
          signal: if given, the signal that must have killed it (``signal.SIGSEGV``, 11 or
            ``"SIGSEGV"``; a real-time one by number, 40, or as ``"SIGRTMIN+6"``); an exit
            status then does not count.

        Returns:
          This outcome.

        Raises:
          DeathTestFailure: it did not die (as required), or its stderr does not match.
          HarnessError: ``signal`` names no signal, or ``match`` is not a valid str regex (a
            bytes one is refused).
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

    def assert_exit(self, predicate: Callable[[Outcome], object], match: Pattern = None) -> Outcome:
        """Assert the child ended (exited or was killed) in a way ``predicate`` accepts.

        GoogleTest's ``EXPECT_EXIT(statement, predicate, regex)``: ``predicate(outcome)`` sees
        this outcome and returns whether its ending is the expected one, e.g.
        ``lambda o: o.exit_code in (3, 4)``. As for the other death assertions, a child that
        exited because its target raised, a timeout and a harness error fail before the
        predicate is asked; any exit status, 0 included, and any signal (also one that killed
        the child after its target raised) are the predicate's to judge.

        Args:
          predicate: a callable taking the outcome and returning a truth value; its name
            (``__name__``) is shown in a failure.
          match: a regex that must be found (``re.search``) in the child's stderr.

        Returns:
          This outcome.

        Raises:
          DeathTestFailure: it did not end by itself, or the predicate returned false, or its
            stderr does not match.
          HarnessError: ``predicate`` is not callable, or ``match`` is not a valid str regex
            (a bytes one is refused).
          Exception: whatever ``predicate`` raises, unchanged.
        """
        __tracebackhide__ = True
        if not callable(predicate):
            raise HarnessError(f"assert_exit(predicate) needs a callable, not {predicate!r}")
        name = getattr(predicate, "__name__", None) or repr(predicate)
        ended = self.kind in ("exited", "signaled") and not self._ended_by_raise
        ok = ended and bool(predicate(self))
        return self._check(
            f"an ending for which {name}(outcome) is true",
            ok,
            match,
            death=True,
            why=f"{name}(outcome) is false: the child " if ended else None,
        )

    def assert_exited(self, code: int = 0, match: Pattern = None) -> Outcome:
        """Assert the child exited with status ``code`` (not killed, not timed out).

        A raise is not an exit: a target that raised (its child exits with status 1) fails
        this, as it fails :meth:`assert_died`; :meth:`assert_raised` is the assertion for it.
        ``sys.exit(n)`` (``SystemExit``) is an exit.

        Args:
          code: the expected exit status, 0 to 255.
          match: a regex that must be found (``re.search``) in the child's stderr.

        Returns:
          This outcome.

        Raises:
          DeathTestFailure: it ended otherwise (its target raised, it was killed, it timed
            out...), or its stderr does not match.
          HarnessError: ``code`` is not an int from 0 to 255, or ``match`` is not a valid str
            regex (a bytes one is refused).
        """
        __tracebackhide__ = True
        if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
            raise HarnessError(f"assert_exited(code=...) takes an int from 0 to 255, not {code!r}")
        ok = self.kind == "exited" and self.exit_code == code and self.raised is None
        if self.raised is not None and self.kind == "exited":
            return self._check(
                f"exited with status {code}",
                False,
                match,
                why="a raise is not an exit (assert_raised checks a raise): the child ",
            )
        return self._check(f"exited with status {code}", ok, match, death=code != 0)

    def assert_timed_out(self, match: Pattern = None) -> Outcome:
        """Assert the child was still running at its deadline (so the harness stopped it).

        For a test that expects a hang (a deadlock the code under test must not escape).
        Whatever ended the child after its deadline (SIGTERM, SIGKILL, a handler of its own)
        does not matter.

        Args:
          match: a regex that must be found (``re.search``) in the child's stderr (its stacks,
            dumped at the deadline, are there when it still handled the dump signal).

        Returns:
          This outcome.

        Raises:
          DeathTestFailure: it ended before its deadline (or had none), or the harness
            failed, or its stderr does not match.
          HarnessError: ``match`` is not a valid str regex (a bytes one is refused).
        """
        __tracebackhide__ = True
        return self._check("timed out", self.kind == "timed_out", match)

    def assert_clean(self) -> Outcome:
        """Assert the child exited with status 0 and its target raised nothing.

        Returns:
          This outcome.

        Raises:
          DeathTestFailure: it ended otherwise.
        """
        __tracebackhide__ = True
        ok = self.kind == "exited" and self.exit_code == 0 and self.raised is None
        return self._check("exited with status 0, nothing raised", ok, None)

    def assert_raised(self, exc_type: ExceptionSpec = None, match: Pattern = None) -> Outcome:
        """Assert the target raised an exception (of type ``exc_type``, if given).

        The child then exited with status 1, its traceback in its stderr and
        :attr:`raised`; a child killed by a signal after its target raised (on its way out),
        or still running at its deadline, fails this, as its ending is the signal's or the
        timeout's (``assert_aborted``, ``assert_died``, ``assert_timed_out`` judge it). Types
        are compared by their qualified names (``"ValueError"``,
        ``"pkg.mod.MyError"``) against the raised type and its bases, so a subclass counts,
        as with ``except``.

        Args:
          exc_type: an exception class, its qualified name, or a tuple of those (any one
            will do); None accepts any exception.
          match: a regex that must be found (``re.search``) in the child's stderr, where the
            traceback ends with ``Type: message``.

        Returns:
          This outcome.

        Raises:
          DeathTestFailure: the target did not raise, or raised another type, or the child did
            not exit after the raise (a signal killed it, it timed out), or the stderr does
            not match.
          HarnessError: ``exc_type`` is not an exception class, a str, a tuple of those or
            None, or ``match`` is not a valid str regex (a bytes one is refused).
        """
        __tracebackhide__ = True
        names = _exception_names(exc_type)
        raised = self.raised
        wanted = "an exception" if names is None else " or ".join(names)
        of_type = raised is not None and (names is None or any(raised.is_a(n) for n in names))
        ok = of_type and self._ended_by_raise
        if raised is None:
            why = "the target did not raise: the child "
        elif not of_type:
            named = raised_name(raised.type, self.style)
            why = f"the target raised {named}, not {wanted}: the child "
        else:
            why = "the target raised, but the child did not exit after it: the child "
        return self._check(f"its target raised {wanted}", ok, match, why=why)

    def _check(
        self,
        expected: str,
        ok: bool,
        match: Pattern,
        *,
        death: bool = False,
        why: str | None = None,
    ) -> Outcome:
        """Raise :class:`DeathTestFailure` unless the ending is ``ok`` and the stderr matches.

        Args:
          death: the assertion expects a death, so a child that lived (timed out, or exited
            with status 0) "did not die", and a raise is not a death.
          why: the problem's start when the ending is not ok (``"... the child "``; the
            ending follows), or None for the usual words.
        """
        __tracebackhide__ = True
        pattern = _compile(match)
        if pattern is not None:
            expected += f", with stderr matching {pattern.pattern!r}"
        verb = "was " if self.kind == "signaled" else ""
        if self.kind == "harness_error":
            problem = f"the harness failed, so how the child ends is unknown: {self.error}"
        elif death and self._ended_by_raise:
            problem = f"the child did not die: its target raised {self.raised}"
        elif not ok:
            lived = self.kind == "timed_out" or (self.kind == "exited" and self.exit_code == 0)
            if why is not None:
                problem = f"{why}{verb}{self.ending}"
            elif death and lived:
                problem = f"the child did not die: it {self.ending}"
            else:
                problem = f"the child {verb}{self.ending}"
        elif pattern is not None and not self._stderr_matches(pattern):
            problem = (
                f"the child ended as expected, but its stderr does not match {pattern.pattern!r}"
            )
            if self.stderr_cut_bytes:
                problem += (
                    f" (the match ran on a cut stream: {self.stderr_cut_bytes} bytes in the "
                    "middle of its stderr were not kept)"
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
                stderr=self._stderr_shown(),
                repro=self._repro_command(keep=True),
                detail=self._detail(),
                notes=self.notes,
                host=self.host,
            )
        )

    def _repro_command(self, *, keep: bool = False) -> str:
        """The repro command, its request file written now if it was pending.

        Args:
          keep: a failure shows it, so its file outlives this process.
        """
        value = self.__dict__["_repro"]
        return value.command(keep=keep) if isinstance(value, PendingRepro) else value

    def _stderr_matches(self, pattern: re.Pattern[str]) -> bool:
        """Whether ``pattern`` is found in the child's stderr: in the head and in the tail of a
        cut one, each on its own (a match across the cut would be of text never written)."""
        cut = self.stderr_cut_at
        if cut is None or not 0 <= cut <= len(self.stderr):
            return pattern.search(self.stderr) is not None
        # slices, not search(pos, endpos): "^" must match where the tail starts
        return bool(pattern.search(self.stderr[:cut]) or pattern.search(self.stderr[cut:]))

    def _stderr_shown(self) -> str:
        """The stderr as a failure shows it: a marker line where bytes were cut, and the
        frames below the target's entry cut from faulthandler's stacks
        (:func:`~harness._report.cut_entry_frames`; :attr:`stderr` keeps them)."""
        cut = self.stderr_cut_at
        if cut is None or not 0 <= cut <= len(self.stderr):
            return cut_entry_frames(self.stderr)
        head, tail = self.stderr[:cut], self.stderr[cut:]
        marker = f"[... devmem-harness cut {self.stderr_cut_bytes} bytes here (see notes) ...]"
        shown = f"{head}{'' if head.endswith(chr(10)) or not head else chr(10)}{marker}\n{tail}"
        return cut_entry_frames(shown)

    def _detail(self) -> list[str]:
        lines = []
        if self.raised is not None:
            lines.append(f"raised:   {self.raised}")
            shown = len(self.stderr.splitlines()) <= STDERR_HEAD_LINES + STDERR_TAIL_LINES
            if not (shown and self.raised.traceback in self.stderr):
                traceback = self.raised.traceback.splitlines()[-TRACEBACK_LINES:]
                lines += [f"  {line}" for line in traceback]
        if self.returned is not None:
            text = repr(self.returned)
            cut = text if len(text) <= RETURNED_SHOWN else text[:RETURNED_SHOWN] + " [...]"
            lines.append(f"returned: {cut}")
        return lines


def _get_repro(outcome: Outcome) -> str:
    return outcome._repro_command()


def _set_repro(outcome: Outcome, value: str | PendingRepro) -> None:
    # Only the dataclass's __init__ gets here (its frozen __setattr__ refuses anyone else).
    outcome.__dict__["_repro"] = value


# After the dataclass is made: a property of that name in the class body would be the field's
# default. The field stays (its __init__ argument, fields(), eq, replace); the value, a str or
# a PendingRepro, is kept in the instance's __dict__ under "_repro".
Outcome.repro = property(  # type: ignore[assignment]
    _get_repro, _set_repro, doc="The repro command (see the class's docstring)."
)


def _compile(match: Pattern) -> re.Pattern[str] | None:
    """``match`` as a compiled str pattern, or None.

    Raises:
      HarnessError: ``match`` is not a str or a compiled str pattern (a bytes pattern is
        refused: the stderr it would search is text, decoded as UTF-8 with undecodable bytes
        replaced, so the child's raw bytes are not there to match), or not a valid regex.
    """
    __tracebackhide__ = True
    if isinstance(match, (bytes, bytearray)) or (
        isinstance(match, re.Pattern) and isinstance(match.pattern, bytes)
    ):
        raise HarnessError(
            f"match={match!r} is a bytes pattern; the stderr it searches is text (decoded as "
            "UTF-8, undecodable bytes replaced): use a str pattern, e.g. "
            f"match={_as_text(match)!r}"
        )
    if match is None or isinstance(match, re.Pattern):
        return match
    if not isinstance(match, str):
        raise HarnessError(f"match must be a regex str or compiled pattern, not {match!r}")
    try:
        return re.compile(match)
    except re.error as exc:
        raise HarnessError(f"match={match!r} is not a valid regex: {exc}") from None


def _as_text(match: bytes | bytearray | re.Pattern[bytes]) -> str:
    """A bytes pattern's text, for the error that refuses it (undecodable bytes escaped)."""
    raw = match.pattern if isinstance(match, re.Pattern) else bytes(match)
    return raw.decode(errors="backslashreplace")  # UTF-8


def _as_signal(value: object) -> signal_module.Signals | int:
    """The signal ``value`` names: a :class:`signal.Signals`, or a plain int for a signal
    without a name (a real-time one: ``40``, ``"SIGRTMIN+6"``)."""
    __tracebackhide__ = True
    number: object = None
    if isinstance(value, str):
        name = value.strip().upper()
        name = name if name.startswith("SIG") else "SIG" + name
        for base in ("SIGRTMIN+", "SIGRTMAX-"):
            offset = name[len(base) :]
            if name.startswith(base) and offset.isdigit() and hasattr(signal_module, base[:-1]):
                start = int(getattr(signal_module, base[:-1]))
                number = start + int(offset) if base[-1] == "+" else start - int(offset)
        if number is None:
            try:
                return signal_module.Signals[name]
            except KeyError:
                pass
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    if isinstance(number, int) and number in signal_module.valid_signals():
        try:
            return signal_module.Signals(number)
        except ValueError:
            return number  # a real-time signal has no name
    raise HarnessError(
        f"signal={value!r} is not a signal (use e.g. signal.SIGSEGV, 11, 'SIGSEGV', or a "
        "real-time one such as 40 or 'SIGRTMIN+6')"
    )


def _exception_names(exc_type: ExceptionSpec) -> list[str] | None:
    """The qualified type names ``exc_type`` stands for; None for any exception."""
    __tracebackhide__ = True
    if exc_type is None:
        return None
    specs = exc_type if isinstance(exc_type, tuple) else (exc_type,)
    names = []
    for spec in specs:
        if isinstance(spec, str) and spec:
            names.append(exception_name(spec))
        elif isinstance(spec, type) and issubclass(spec, BaseException):
            names.append(type_name(spec))
        else:
            raise HarnessError(
                "assert_raised(exc_type=...) takes an exception class, its qualified name, a "
                f"tuple of those, or None, not {exc_type!r}"
            )
    if not names:
        raise HarnessError("assert_raised(exc_type=()) names no exception type")
    return names
