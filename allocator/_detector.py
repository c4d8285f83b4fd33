"""The use-after-free detector: the one choke point every op's operands pass through.

Every op validates its operands here before it compares sizes: ``require_same_size2`` for binary
ops (roles ``lhs``, ``rhs``), ``require_same_size3`` for ternary ops (``arg0``, ``arg1``,
``arg2``) and ``require_live`` for unary ops and readback (``arg``). With the detector on, a freed
operand is reported as

    use-after-arena-free: buffer_add lhs was reclaimed by arena_exit at depth 0
    use-after-release: buffer_add lhs was released by release()

and then, in ``abort`` mode, the line is written to stderr and the process aborts (SIGABRT, which
cannot be caught in-process); in ``raise`` mode :class:`UseAfterFreeError` is raised with the same
text. With the detector off, a freed operand has size 0: a mismatch raises
``SizeMismatchError("buffer_add: size mismatch (16 vs 0)")`` and two freed operands slip through
silently (0 == 0), as in the original. Off, the detector costs one branch on a cached flag.
Source: TorchLean's ``TORCHLEAN_ARENA_DEBUG`` detector
(``../shared/seeds/torchlean-cuda-arena-and-cache-cap.txt``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._buffer import Buffer
from ._errors import SizeMismatchError, UseAfterFreeError
from .device.base import fatal

if TYPE_CHECKING:
    from ._arena import ArenaRegistry

__all__ = ["Detector", "use_after_free_message"]


def use_after_free_message(op: str, role: str, buf: Buffer) -> str:
    """The detector's line for a freed operand ``buf`` of ``op`` in ``role``."""
    cause = buf._st.cause
    kind = "use-after-arena-free" if cause.kind == "arena_exit" else "use-after-release"
    return f"{kind}: {op} {role} was {cause.describe()}"


class Detector:
    """Operand validation for one allocator, in the mode of its configuration.

    Args:
        home: the arena registry of the allocator whose buffers the ops may use (the registry,
            not the allocator, so that the allocator holds no reference cycle).
        mode: ``"off"``, ``"abort"`` or ``"raise"``.
    """

    __slots__ = ("home", "mode", "on")

    def __init__(self, home: ArenaRegistry, mode: str) -> None:
        self.home = home
        self.mode = mode
        self.on = mode != "off"

    def fire(self, op: str, role: str, buf: Buffer) -> None:
        """Report a freed operand: raise :class:`UseAfterFreeError` or abort the process."""
        message = use_after_free_message(op, role, buf)
        if self.mode == "raise":
            raise UseAfterFreeError(message)
        fatal(message)

    def _operand(self, op: str, role: str, buf: object) -> None:
        if type(buf) is not Buffer and not isinstance(buf, Buffer):
            raise TypeError(f"{op}: {role} must be a Buffer, got {type(buf).__name__}")
        if buf._st._home is not self.home:
            raise ValueError(f"{op}: {role} belongs to another allocator")

    def require_live(self, op: str, a: Buffer) -> int:
        """Validate the operand of a unary op or readback (role ``arg``); return its size."""
        self._operand(op, "arg", a)
        if self.on and a._st.cause is not None:
            self.fire(op, "arg", a)
        return a.size

    def require_same_size2(self, op: str, a: Buffer, b: Buffer) -> int:
        """Validate a binary op's operands (roles ``lhs``, ``rhs``); return their common size.

        Raises:
            TypeError: an operand is not a Buffer.
            ValueError: an operand belongs to another allocator.
            UseAfterFreeError: (``raise`` mode) an operand was freed.
            SizeMismatchError: the sizes differ.
        """
        self._operand(op, "lhs", a)
        self._operand(op, "rhs", b)
        if self.on:
            if a._st.cause is not None:
                self.fire(op, "lhs", a)
            if b._st.cause is not None:
                self.fire(op, "rhs", b)
        n = a.size
        if b.size != n:
            raise SizeMismatchError(f"{op}: size mismatch ({n} vs {b.size})")
        return n

    def require_same_size3(self, op: str, a: Buffer, b: Buffer, c: Buffer) -> int:
        """Validate a ternary op's operands (roles ``arg0``, ``arg1``, ``arg2``); return their
        common size. Raises as :meth:`require_same_size2`."""
        self._operand(op, "arg0", a)
        self._operand(op, "arg1", b)
        self._operand(op, "arg2", c)
        if self.on:
            for role, buf in (("arg0", a), ("arg1", b), ("arg2", c)):
                if buf._st.cause is not None:
                    self.fire(op, role, buf)
        n = a.size
        if b.size != n or c.size != n:
            raise SizeMismatchError(f"{op}: size mismatch ({n} vs {b.size} vs {c.size})")
        return n
