"""Read a snapshot pickle without holding its trace: each trace event is handed to a callback as
soon as it is built, and then dropped.

A 1e6-event snapshot is ~120 MiB on disk but ~650 MiB as Python objects (one dict per event);
``summary`` needs only one pass over the events, so holding them all is waste. ``pickle``'s own
unpicklers build the whole object, so this is a small pickle machine of its own, for what a
snapshot holds: the binary opcodes of protocols 2 to 5 that build dicts, lists, tuples, sets,
strings, bytes, numbers, booleans and None. It never looks up a global, so, like
:class:`allocator.memory._SnapshotUnpickler`, it runs no code from the file.

Two passes over the file, each reading it in chunks:

1. the memo indices that are ever fetched (``BINGET``, ``LONG_BINGET``): a pickle memoizes
   every dict and list it writes, but fetches only those it shares (a frame dict, a string);
2. the objects, keeping in the memo only what pass 1 saw fetched, and handing each element of a
   list at ``device_traces[d]`` of the top-level dict to ``on_event(d, event)`` in place of
   appending it (the list stays empty in the result).

Anything else (protocol 0 or 1, a global, a persistent id, an out-of-band buffer, a truncated
or malformed stream, a ``device_traces`` that is not the top-level dict's list of lists) makes
:func:`stream` raise :class:`NotStreamable`, before any event is handed over when pass 1 can
tell, else after; the caller then drops what it counted and reads the file the ordinary way,
which gives the error message a user should see. A file that ends before its pickle does (cut
short, or a length field that claims more than is left) is :class:`NotStreamable` with
``truncated`` set: no reader can read it, so the caller says so rather than read it again.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import BinaryIO

__all__ = ["NotStreamable", "stream"]

_CHUNK = 1 << 20  # bytes read at a time
_SLACK = 16  # the longest fixed part of an opcode (FRAME, BINFLOAT: 1 + 8 bytes)
_PIECE = 1 << 26  # the most bytes asked of one read (a string may be longer: read in pieces)

_U16 = struct.Struct("<H").unpack_from
_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_U64 = struct.Struct("<Q").unpack_from
_F64 = struct.Struct(">d").unpack_from

# opcode -> the bytes of its fixed argument (_FIXED), or of its data's length prefix (_DATA)
_FIXED = {
    0x28: 0,  # MARK
    0x2E: 0,  # STOP
    0x30: 0,  # POP
    0x31: 0,  # POP_MARK
    0x32: 0,  # DUP
    0x4A: 4,  # BININT
    0x4B: 1,  # BININT1
    0x4D: 2,  # BININT2
    0x4E: 0,  # NONE
    0x61: 0,  # APPEND
    0x64: 0,  # DICT
    0x7D: 0,  # EMPTY_DICT
    0x65: 0,  # APPENDS
    0x68: 1,  # BINGET
    0x6A: 4,  # LONG_BINGET
    0x6C: 0,  # LIST
    0x5D: 0,  # EMPTY_LIST
    0x71: 1,  # BINPUT
    0x72: 4,  # LONG_BINPUT
    0x73: 0,  # SETITEM
    0x74: 0,  # TUPLE
    0x29: 0,  # EMPTY_TUPLE
    0x75: 0,  # SETITEMS
    0x47: 8,  # BINFLOAT
    0x80: 1,  # PROTO
    0x85: 0,  # TUPLE1
    0x86: 0,  # TUPLE2
    0x87: 0,  # TUPLE3
    0x88: 0,  # NEWTRUE
    0x89: 0,  # NEWFALSE
    0x8F: 0,  # EMPTY_SET
    0x90: 0,  # ADDITEMS
    0x91: 0,  # FROZENSET
    0x94: 0,  # MEMOIZE
    0x95: 8,  # FRAME (its length only: the frame's opcodes follow)
}
_DATA = {
    0x54: 4,  # BINSTRING
    0x55: 1,  # SHORT_BINSTRING
    0x58: 4,  # BINUNICODE
    0x8A: 1,  # LONG1
    0x8B: 4,  # LONG4
    0x42: 4,  # BINBYTES
    0x43: 1,  # SHORT_BINBYTES
    0x8C: 1,  # SHORT_BINUNICODE
    0x8D: 8,  # BINUNICODE8
    0x8E: 8,  # BINBYTES8
    0x96: 8,  # BYTEARRAY8
}
# everything else (text opcodes of protocol 0, globals, REDUCE, BUILD, persistent ids,
# extension codes, out-of-band buffers) is not streamed


class NotStreamable(Exception):
    """The file is not a pickle this reader handles (see the module docstring).

    Attributes:
        handed: whether elements may have been handed to ``on_event`` before this was found.
        truncated: the file ends before the pickle does (cut short, or a length field claims
            more bytes than are left): no reader can read it.
    """

    def __init__(self, reason: str, handed: bool = False) -> None:
        super().__init__(reason)
        self.handed = handed
        self.truncated = reason == TRUNCATED


TRUNCATED = "pickle data was truncated"
"""The reason of a :class:`NotStreamable` for a file that ends before its pickle does (the words
of pickle's own error)."""


class _FromCallback(Exception):
    """Carries what ``on_event`` raised past the handler of malformed pickles."""


class _Reader:
    """A file read in chunks: ``buf[pos:]`` holds the next bytes, at least ``_SLACK`` of them
    (or all that is left) after :meth:`fill`; ``buf[0]`` is byte ``start`` of the pickle."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.buf = f.read(_CHUNK)
        self.start = 0

    def fill(self, pos: int, need: int = _SLACK) -> tuple[bytes, int]:
        """Keep ``buf[pos:]`` and read on until ``need`` bytes are there (or the file ends).
        Read in pieces of at most :data:`_PIECE`: a length field claiming more than the file
        holds costs what the file holds, never what it claims."""
        parts = [self.buf[pos:]]
        have = len(parts[0])
        while True:
            more = self.f.read(min(max(_CHUNK, need - have), _PIECE))
            if not more:
                break
            parts.append(more)
            have += len(more)
            if have >= need:
                break
        self.buf = b"".join(parts)
        self.start += pos
        return self.buf, 0


def _data(reader: _Reader, buf: bytes, pos: int, width: int) -> tuple[bytes, bytes, int]:
    """The data of an opcode whose ``width``-byte length starts at ``pos``; returns
    ``(data, buf, pos after it)``."""
    if width == 1:
        n = buf[pos]
    elif width == 4:
        n = _U32(buf, pos)[0]
    else:
        n = _U64(buf, pos)[0]
    pos += width
    end = pos + n
    if end + _SLACK > len(buf):
        buf, pos = reader.fill(pos, n + _SLACK)
        end = pos + n
        if end > len(buf):
            raise NotStreamable(TRUNCATED)
    return buf[pos:end], buf, end


def _steps(protocol: int) -> list[int]:
    """Per opcode: the bytes it takes (opcode and fixed argument), 0 for one with a length
    prefixed argument (:data:`_DATA`), -1 for one this reader refuses. Memo indices are
    implicit (MEMOIZE) from protocol 4 on and explicit (PUT) before: mixing them would make
    ``len(memo)`` differ from a count, so each protocol gets only its own kind."""
    steps = [-1] * 256
    for op, size in _FIXED.items():
        steps[op] = 1 + size
    for op in _DATA:
        steps[op] = 0
    if protocol >= 4:
        steps[0x71] = steps[0x72] = -1  # BINPUT, LONG_BINPUT
    else:
        steps[0x94] = -1  # MEMOIZE
    return steps


def _fetched(f: BinaryIO) -> set[int]:
    """Pass 1: the memo indices the pickle fetches.

    Raises:
        NotStreamable: an opcode this reader does not handle (see :func:`_steps`), or a
            truncated pickle.
    """
    reader = _Reader(f)
    buf = reader.buf
    if len(buf) < 2 or buf[0] != 0x80 or buf[1] < 2:
        raise NotStreamable("not a pickle of protocol 2 or later")
    try:
        return _fetched_from(reader)
    except (IndexError, struct.error):  # a fixed argument cut by the end of the file
        raise NotStreamable(TRUNCATED) from None


def _fetched_from(reader: _Reader) -> set[int]:
    """:func:`_fetched`'s loop; the fixed arguments near the end of the file are read without a
    check (an ``IndexError`` or ``struct.error`` past it)."""
    buf, pos = reader.buf, 0
    fetched: set[int] = set()
    add = fetched.add
    steps = _steps(buf[1])
    limit = len(buf) - _SLACK
    while True:
        if pos > limit:
            buf, pos = reader.fill(pos)
            limit = len(buf) - _SLACK
            if pos >= len(buf):
                raise NotStreamable(TRUNCATED)
        op = buf[pos]
        if op == 0x6A:  # LONG_BINGET, in runs (a list of shared frames)
            add(_U32(buf, pos + 1)[0])
            pos += 5
            while pos <= limit and buf[pos] == 0x6A:
                add(_U32(buf, pos + 1)[0])
                pos += 5
        elif op == 0x68:  # BINGET
            add(buf[pos + 1])
            pos += 2
        elif op == 0x2E:  # STOP
            return fetched
        else:
            step = steps[op]
            if step > 0:
                pos += step
            elif step == 0:
                _, buf, pos = _data(reader, buf, pos + 1, _DATA[op])
                limit = len(buf) - _SLACK
            else:
                raise NotStreamable(f"opcode {bytes([op])!r} at byte {reader.start + pos}")


OnEvent = Callable[[int, object], None]


def _build(f: BinaryIO, keep: set[int], on_event: OnEvent) -> object:
    """Pass 2: the pickled object, its trace events handed to ``on_event`` (see the module
    docstring). Raises :class:`NotStreamable` on a malformed pickle."""
    reader = _Reader(f)
    buf, pos = reader.buf, 0
    limit = len(buf) - _SLACK
    stack: list = []
    metastack: list[list] = []
    memo: dict[int, object] = {}
    count = 0  # the next implicit memo index
    root = traces = None  # the top-level dict, and its device_traces list
    streamed: dict[int, tuple[list, int]] = {}  # id(list) -> (the list, its device)
    try:
        while True:
            if pos > limit:
                buf, pos = reader.fill(pos)
                limit = len(buf) - _SLACK
            op = buf[pos]
            pos += 1
            if op == 0x6A:  # LONG_BINGET
                stack.append(memo[_U32(buf, pos)[0]])
                pos += 4
            elif op == 0x68:  # BINGET
                stack.append(memo[buf[pos]])
                pos += 1
            elif op == 0x94:  # MEMOIZE
                if count in keep:
                    memo[count] = stack[-1]
                count += 1
            elif op == 0x28:  # MARK
                metastack.append(stack)
                stack = []
                while pos <= limit and buf[pos] == 0x6A:  # LONG_BINGETs: a list of frames
                    stack.append(memo[_U32(buf, pos + 1)[0]])
                    pos += 5
            elif op == 0x4A:  # BININT
                stack.append(_I32(buf, pos)[0])
                pos += 4
            elif op == 0x7D:  # EMPTY_DICT
                value = {}
                if root is None and not stack and not metastack:  # the top-level object
                    root = value
                stack.append(value)
            elif op == 0x75:  # SETITEMS
                items = stack
                stack = metastack.pop()
                stack[-1].update(zip(items[::2], items[1::2], strict=True))
            elif op == 0x4B:  # BININT1
                stack.append(buf[pos])
                pos += 1
            elif op == 0x5D:  # EMPTY_LIST
                value = []
                # where it goes: the value of root["device_traces"], or an element of that
                if traces is None:
                    if root is not None and _is_traces_value(stack, metastack, root):
                        traces = value
                elif metastack and metastack[-1] and metastack[-1][-1] is traces:
                    streamed[id(value)] = (value, len(traces) + len(stack))  # in a MARK
                elif stack and stack[-1] is traces:
                    streamed[id(value)] = (value, len(traces))  # for APPEND
                stack.append(value)
            elif op == 0x8A:  # LONG1
                data, buf, pos = _data(reader, buf, pos, 1)
                limit = len(buf) - _SLACK
                stack.append(int.from_bytes(data, "little", signed=True))
            elif op == 0x65:  # APPENDS
                items = stack
                stack = metastack.pop()
                target = stack[-1]
                entry = streamed.get(id(target))
                if entry is not None and entry[0] is target:
                    device = entry[1]
                    value = None  # the last list built: the events' only holders are theirs
                    try:
                        for item in items:
                            on_event(device, item)
                    except Exception as exc:
                        raise _FromCallback(exc) from None
                else:
                    target.extend(items)
            elif op == 0x4D:  # BININT2
                stack.append(_U16(buf, pos)[0])
                pos += 2
            elif op == 0x8C:  # SHORT_BINUNICODE
                data, buf, pos = _data(reader, buf, pos, 1)
                limit = len(buf) - _SLACK
                stack.append(str(data, "utf-8", "surrogatepass"))
            elif op == 0x95:  # FRAME
                pos += 8
            else:
                buf, pos = _rare(op, reader, buf, pos, stack, memo, keep)
                limit = len(buf) - _SLACK
                if op == 0x2E:  # STOP
                    result = stack.pop()
                    if stack or metastack:
                        raise NotStreamable("objects left on the stack at STOP")
                    _check_placed(result, root, traces, streamed)
                    return result
                if op == 0x61:  # APPEND: the value was appended; stream it instead
                    target = stack[-1]
                    entry = streamed.get(id(target))
                    if entry is not None and entry[0] is target:
                        value = None  # as for APPENDS
                        try:
                            on_event(entry[1], target.pop())
                        except Exception as exc:
                            raise _FromCallback(exc) from None
                elif op == 0x31:  # POP_MARK
                    stack = metastack.pop()
                elif op in (0x64, 0x6C, 0x74, 0x90, 0x91):  # they close a MARK
                    value = stack.pop()
                    stack = metastack.pop()
                    if op == 0x90:  # ADDITEMS
                        stack[-1].update(value)
                    else:
                        stack.append(value)
    except _FromCallback as wrapped:
        raise wrapped.args[0] from None
    except NotStreamable as exc:
        raise NotStreamable(str(exc), handed=True) from None
    except (IndexError, KeyError, TypeError, ValueError, AttributeError, struct.error) as exc:
        raise NotStreamable(
            f"malformed at byte {reader.start + pos} ({type(exc).__name__})", True
        ) from None


def _check_placed(result: object, root: dict | None, traces: list | None, streamed: dict) -> None:
    """Each list whose elements were handed over is where they were taken to be from:
    ``result["device_traces"][device]``. (While a pickle is read, a key ``device_traces`` of a
    dict nested in the top-level one can look like the top-level one's.)"""
    placed = result is root and isinstance(root, dict) and root.get("device_traces") is traces
    for trace, device in streamed.values():
        if not placed or device >= len(traces) or traces[device] is not trace:
            raise NotStreamable("the streamed lists are not the top-level device_traces")


def _is_traces_value(stack: list, metastack: list[list], root: dict) -> bool:
    """Whether the object about to be pushed is ``root["device_traces"]``: the key was just
    pushed, in ``root``'s own MARK (for SETITEMS) or right above it (for SETITEM)."""
    if not stack or type(stack[-1]) is not str or stack[-1] != "device_traces":
        return False
    if len(metastack) == 1:
        return len(metastack[0]) == 1 and metastack[0][0] is root and len(stack) % 2 == 1
    return not metastack and len(stack) == 2 and stack[0] is root


def _rare(op, reader, buf, pos, stack, memo, keep):
    """The opcodes a snapshot seldom holds; returns ``(buf, pos)``. For an opcode that
    closes a MARK it leaves the built object on top of the current stack (its items) for the
    caller to move down (see :func:`_build`)."""
    if op == 0x2E:  # STOP
        pass
    elif op == 0x61:  # APPEND
        value = stack.pop()
        stack[-1].append(value)
    elif op == 0x73:  # SETITEM
        value = stack.pop()
        key = stack.pop()
        stack[-1][key] = value
    elif op == 0x4E:  # NONE
        stack.append(None)
    elif op == 0x88:  # NEWTRUE
        stack.append(True)
    elif op == 0x89:  # NEWFALSE
        stack.append(False)
    elif op == 0x29:  # EMPTY_TUPLE
        stack.append(())
    elif op == 0x85:  # TUPLE1
        stack[-1] = (stack[-1],)
    elif op == 0x86:  # TUPLE2
        stack[-2:] = [(stack[-2], stack[-1])]
    elif op == 0x87:  # TUPLE3
        stack[-3:] = [(stack[-3], stack[-2], stack[-1])]
    elif op == 0x8F:  # EMPTY_SET
        stack.append(set())
    elif op == 0x30:  # POP
        if stack:
            stack.pop()
        else:
            raise NotStreamable("POP of a MARK")
    elif op == 0x31:  # POP_MARK: the caller pops the metastack
        pass
    elif op == 0x32:  # DUP
        stack.append(stack[-1])
    elif op == 0x64:  # DICT
        items = stack[:]
        stack[:] = [dict(zip(items[::2], items[1::2], strict=True))]
    elif op == 0x6C:  # LIST
        stack[:] = [stack[:]]
    elif op == 0x74:  # TUPLE
        stack[:] = [tuple(stack)]
    elif op == 0x90:  # ADDITEMS
        stack[:] = [stack[:]]
    elif op == 0x91:  # FROZENSET
        stack[:] = [frozenset(stack)]
    elif op == 0x47:  # BINFLOAT
        stack.append(_F64(buf, pos)[0])
        pos += 8
    elif op == 0x80:  # PROTO
        pos += 1
    elif op == 0x71:  # BINPUT
        if buf[pos] in keep:
            memo[buf[pos]] = stack[-1]
        pos += 1
    elif op == 0x72:  # LONG_BINPUT
        index = _U32(buf, pos)[0]
        if index in keep:
            memo[index] = stack[-1]
        pos += 4
    elif op in _DATA:
        data, buf, pos = _data(reader, buf, pos, _DATA[op])
        if op == 0x8A or op == 0x8B:  # LONG1, LONG4
            stack.append(int.from_bytes(data, "little", signed=True))
        elif op in (0x58, 0x8C, 0x8D):  # BINUNICODE, SHORT_BINUNICODE, BINUNICODE8
            stack.append(str(data, "utf-8", "surrogatepass"))
        elif op == 0x96:  # BYTEARRAY8
            stack.append(bytearray(data))
        elif op in (0x54, 0x55):  # BINSTRING, SHORT_BINSTRING: str, as pickle's ASCII default
            stack.append(data.decode("ascii"))
        else:  # BINBYTES, SHORT_BINBYTES, BINBYTES8
            stack.append(data)
    else:  # MEMOIZE, MARK and the rest are handled by _build; pass 1 refused the others
        raise NotStreamable(f"opcode {bytes([op])!r}")
    return buf, pos


def stream(f: BinaryIO, on_event: OnEvent) -> object:
    """The object pickled in ``f`` (a file opened ``"rb"``, seekable), with every element of
    each list at ``device_traces[d]`` of its top-level dict handed to ``on_event(d, element)``,
    in order, instead of kept (those lists come back empty).

    Raises:
        NotStreamable: ``f`` is not a pickle this reader handles. If its ``handed`` is false,
            no element was handed over and ``f`` is back where it was; if true, elements were
            handed over (the caller drops what it made of them and reads the file again).
        OSError: reading ``f`` failed.
        Exception: whatever ``on_event`` raised, as it was raised.
    """
    start = f.tell()
    try:
        keep = _fetched(f)
    finally:
        f.seek(start)
    return _build(f, keep, on_event)
