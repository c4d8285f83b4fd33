"""Decoding a child's status records and seal (the encoder is the standalone ``_child.py``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from harness._child import FINAL_EVENTS, SEAL_FINAL_AT


@dataclass(frozen=True)
class Raised:
    """The exception a target raised in the child.

    Attributes:
      type: the exception type's name, qualified by its module unless builtin
        (``"ValueError"``, ``"allocator.UseAfterFreeError"``).
      message: ``str()`` of the exception.
      traceback: the formatted traceback, as the child printed it to its stderr.
      bases: the names of the type's base classes, nearest first, without ``object``
        (``("Exception", "BaseException")`` for a ``ValueError``).
    """

    type: str
    message: str
    traceback: str
    bases: tuple[str, ...] = ()

    def is_a(self, name: str) -> bool:
        """Whether the exception is an instance of the type named ``name`` (qualified as
        :attr:`type` is), judged by the names of its type and its bases."""
        return name == self.type or name in self.bases

    def __str__(self) -> str:
        return f"{self.type}: {self.message}" if self.message else self.type


@dataclass(frozen=True)
class Status:
    """What the status channel said, decoded.

    Attributes:
      started: the child got through its setup and was about to import the target.
      returned: the target's return value (None if it did not return).
      raised: the target's exception, or None.
      harness_error: a harness failure the child reported, or None (its traceback, if any,
        is in the child's stderr).
      final: the last final event read (``returned``, ``raised``, ``exit``,
        ``harness_error``), or None.
      notes: the harness's own lines the child sent (``note`` records: a part of the test
        process's state it could not take), for the outcome's notes.

    An ``exit`` record (the target raised ``SystemExit``) adds nothing else: the wait status
    has the code.
    """

    started: bool = False
    returned: Any = None
    raised: Raised | None = None
    harness_error: str | None = None
    final: str | None = None
    notes: tuple[str, ...] = ()


def decode_status(data: bytes) -> Status:
    """Decode the records a child wrote (one JSON object per line).

    A last line without its newline (the child died while writing it) is ignored. A record
    that is not valid, or names an unknown event, is reported as a harness error, like any
    other breach of the protocol.
    """
    fields: dict[str, Any] = {}
    for line in data.split(b"\n")[:-1]:
        try:
            record = json.loads(line)
            event = record["event"]
        except (ValueError, KeyError, TypeError):
            return Status(harness_error=f"unreadable status record from the child: {line[:200]!r}")
        if event in FINAL_EVENTS:
            fields["final"] = event
        if event == "started":
            fields["started"] = True
        elif event == "returned":
            fields["returned"] = record.get("value")
        elif event == "raised":
            bases = record.get("bases")
            fields["raised"] = Raised(
                str(record.get("type", "?")),
                str(record.get("message", "")),
                str(record.get("traceback", "")),
                tuple(map(str, bases)) if isinstance(bases, list) else (),
            )
        elif event == "harness_error":
            fields["harness_error"] = str(record.get("message", "unknown harness error"))
        elif event == "note":
            fields["notes"] = (*fields.get("notes", ()), str(record.get("message", "")))
        elif event != "exit":
            return Status(harness_error=f"unknown status event {event!r} from the child")
    return Status(**fields)


@dataclass(frozen=True)
class Seal:
    """What the child left in the seal of its status file.

    Attributes:
      pid: the child's pid, written before anything else it did (None: it never got that far).
      final: the final event it sent (``returned``, ``raised``, ``exit``, ``harness_error``),
        or None if it sent none (it died, or left through ``os._exit``).
      delivered: whether that final record reached the status file.
      error: why it did not (``OSError: [Errno 9] Bad file descriptor``), or None.
    """

    pid: int | None = None
    final: str | None = None
    delivered: bool = True
    error: str | None = None


def decode_seal(data: bytes) -> Seal:
    """Decode a seal (see ``harness._child``); a torn or foreign one reads as empty parts."""
    line = data[:SEAL_FINAL_AT].split(b"\n", 1)[0].strip(b"\0")
    pid = int(line) if line.isdigit() else None
    verdict = data[SEAL_FINAL_AT:].split(b"\0", 1)[0]
    try:
        record = json.loads(verdict) if verdict else {}
    except ValueError:
        record = {"event": "?", "delivered": False, "error": f"unreadable seal {verdict[:100]!r}"}
    if not isinstance(record, dict):
        record = {"event": "?", "delivered": False, "error": f"unreadable seal {verdict[:100]!r}"}
    final = record.get("event")
    return Seal(
        pid=pid,
        final=str(final) if final is not None else None,
        delivered=record.get("delivered") is not False,
        error=str(record["error"]) if record.get("error") is not None else None,
    )
