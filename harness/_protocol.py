"""Decoding a child's status records (the encoder is the standalone ``_child.py``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Raised:
    """The exception a target raised in the child.

    Attributes:
      type: the exception type's name, qualified by its module unless builtin
        (``"ValueError"``, ``"allocator.UseAfterFreeError"``).
      message: ``str()`` of the exception.
      traceback: the formatted traceback, as the child printed it to its stderr.
    """

    type: str
    message: str
    traceback: str

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

    An ``exit`` record (the target raised ``SystemExit``) adds nothing: the wait status has
    the code.
    """

    started: bool = False
    returned: Any = None
    raised: Raised | None = None
    harness_error: str | None = None


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
        if event == "started":
            fields["started"] = True
        elif event == "returned":
            fields["returned"] = record.get("value")
        elif event == "raised":
            fields["raised"] = Raised(
                str(record.get("type", "?")),
                str(record.get("message", "")),
                str(record.get("traceback", "")),
            )
        elif event == "harness_error":
            fields["harness_error"] = str(record.get("message", "unknown harness error"))
        elif event != "exit":
            return Status(harness_error=f"unknown status event {event!r} from the child")
    return Status(**fields)
