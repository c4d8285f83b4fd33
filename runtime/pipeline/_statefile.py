"""The state file that survives ``exec()`` restarts and crashes (the seed's ``MmapState``).

Layout (version 2): a :data:`HEADER_BYTES` (4096) header page, then the tensors region-major:
every layer's weights, then every layer's Adam state, every layer's gradients, every layer's
activations, then the global region (final RMSNorm and embeddings with their Adam states and
gradients), then an undo journal (:func:`journal_bytes`). Float32 throughout; the file is
memory-mapped, so a process that ``exec()``\\ s itself finds its tensors where it left them.

The header page holds a fixed prefix (the sentinel ``0x414E4550`` "ANEP" and the version, written
once) and two header *slots* (bytes 512 and 2048). Each slot carries a generation number, the
model's shape and compile config, the checkpoint policy, the scheduler state, restart and
action counters, each region's byte offset, the total size, and a CRC-32 of all of that.

**Crash safety.** Every change is a *commit* (:meth:`StateFile.commit`) that moves the file from
generation ``g`` to ``g + 1``:

1. the original bytes of every range the change writes go to the journal, stamped with ``g``
   and a CRC-32, and are flushed (``msync``);
2. the new bytes are written in place and flushed;
3. the new header goes to the slot the current one is *not* in, stamped ``g + 1``, and is flushed:
   this write is the commit point.

Between steps 1 and 2 a copy of the journal's head and CRC, the *seal*, goes to bytes 3584 of
the header page and is flushed: a journal that does not match a seal of its generation was
damaged after its change began, not torn before it.

Opening picks the valid slot with the highest generation; if the journal is valid and stamped
with that generation, a change was under way when the writer died, and opening read-write copies
the original bytes back (idempotent, so a crash during recovery is harmless). A kill at any
point thus leaves either the state before the change or the state after it, never a mix; a
torn slot falls back to the other one, whose journal undoes what it must. What no journal can
undo is refused: a journal or seal stamped after the chosen slot's generation (a newer slot
existed and is damaged: the tensors are past it), and a sealed change whose journal is damaged.

**One writer.** A read-write :class:`StateFile` holds an exclusive ``flock`` on the file, taken
without waiting (:class:`StateFileBusy` names the holder's pid), from creation or opening to
:meth:`StateFile.close`; :meth:`StateFile.handover` keeps it across an ``exec()`` restart (the
descriptor is inherited, its number passed in :data:`LOCK_FD_ENV`). ``create(overwrite=True)``
replaces only a state file, under its lock. :meth:`StateFile.remove` removes the name only
while it still names the file. Creation goes through
a temporary file in the same directory, ``fsync`` and ``os.replace`` (or ``os.link``, which
refuses an existing file), with the space reserved first (``posix_fallocate``) unless the caller
asks for a sparse file. The writer holds an exclusive ``flock`` on its temporary file, so the next
creation of the same state file tells a killed writer's leftover (its lock is free) from a live
writer's, and removes the leftover, saying so on stderr. Writes made through the accessors
outside :meth:`StateFile.commit` are not journaled.

Opening checks, in order: the file is smaller than the header; the sentinel (not a pipeline
state file) and the version (field and value said); both slots (checksum, every field, the
layout), naming the field at fault; the file is shorter than the header's ``total_size``
(truncated: expected and actual sizes said); the journal. Each failure is a
:class:`StateFileError` naming the file.

Test knob: ``DEVMEM_PIPELINE_KILL_AT=GEN:POINT`` SIGKILLs the process at ``POINT`` of the commit
that makes generation ``GEN`` (``create``, then one of :data:`KILL_POINTS`), read once per
process; the suites use it to kill the writer everywhere and compare resumed runs.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import math
import mmap
import os
import signal
import struct
import sys
import tempfile
import zlib
from collections.abc import Sequence
from stat import S_ISBLK, S_ISCHR, S_ISDIR, S_ISFIFO, S_ISLNK, S_ISREG, S_ISSOCK

import numpy as np

from .._warnings import warn_once
from ._model import (
    FLOAT32_BYTES,
    CompileConfig,
    ModelConfig,
    ModelDims,
    global_bytes,
    layer_activation_bytes,
    layer_adam_bytes,
    layer_gradient_bytes,
    layer_weight_bytes,
)
from ._plan import plan_pipeline
from ._scheduler import Action, Phase, SchedulerState

__all__ = [
    "HEADER_BYTES",
    "INT32_MAX",
    "KILL_POINTS",
    "LOCK_FD_ENV",
    "SENTINEL",
    "SLOT_OFFSETS",
    "VERSION",
    "StateFile",
    "StateFileBusy",
    "StateFileError",
    "StateHeader",
    "check_header_fields",
    "journal_bytes",
    "state_file_bytes",
]

SENTINEL = 0x414E4550
"""The first four bytes of a state file, ``"ANEP"`` read as a little-endian integer's hex."""
VERSION = 2
"""The file format this build reads and writes (1: one header, no journal; not readable)."""
HEADER_BYTES = 4096
"""The header page's size: the prefix and both header slots."""
SLOT_OFFSETS = (512, 2048)
"""Byte offsets of the two header slots (in different 512-byte sectors)."""
INT32_MAX = 2**31 - 1
"""The largest value of the header's integer fields (signed 32-bit)."""
KILL_POINTS = ("journal", "journaled", "write", "written", "header", "committed")
"""Where ``DEVMEM_PIPELINE_KILL_AT`` can kill a commit: half the journal written, the journal
flushed, the first new bytes written, all of them flushed, half the header slot written, the
header flushed. ``create`` kills a creation before its ``os.replace``."""

_PREFIX = struct.Struct("<II")  # sentinel, version
_NAME_BYTES = 32
_POLICY_BYTES = 16
_SLOT = struct.Struct(
    "<QI"  # generation, flags
    f"{_NAME_BYTES}s"  # model name, UTF-8, NUL padded
    "7i"  # dims: n_layers dim hidden_dim n_heads n_kv_heads vocab_size seq_len
    "4id"  # compile: budget kernels_per_layer static_per_layer accum_steps headroom_pct
    f"{_POLICY_BYTES}s i"  # checkpoint policy name, interval (0: the policy's default)
    "5i2d"  # scheduler: phase group step accum_step total_steps learning_rate last_loss
    "i6I"  # restarts, one counter per Action
    "7Q"  # offsets: weights adam grads acts global journal, total_size
)
_CRC = struct.Struct("<I")
assert _SLOT.size + _CRC.size <= SLOT_OFFSETS[1] - SLOT_OFFSETS[0]
assert SLOT_OFFSETS[1] + _SLOT.size + _CRC.size <= HEADER_BYTES
_FLAG_DELETE_WHEN_DONE = 1

_JOURNAL_MAGIC = 0x4C4E524A  # "JRNL"
_JOURNAL = struct.Struct("<IQII")  # magic, generation, records, payload bytes; then the CRC
_RECORD = struct.Struct("<QQ")  # offset, length; then the bytes, padded to 8
_SEAL_OFFSET = 3584
"""Where the journal's *seal* lives: a copy of the journal's head and CRC, written and flushed
after the journal and before the first tensor write, so a journal that does not match its seal
is known to be damaged, not torn (a sector of its own, after both slots)."""
_SEAL_MAGIC = 0x4C414553  # "SEAL"
_SEAL = struct.Struct(f"<I{_JOURNAL.size + 4}s")  # magic, the journal's head and CRC; then a CRC
assert SLOT_OFFSETS[1] + _SLOT.size + _CRC.size <= _SEAL_OFFSET
assert _SEAL_OFFSET + _SEAL.size + _CRC.size <= HEADER_BYTES
LOCK_FD_ENV = "PIPELINE_STATE_LOCK_FD"
"""The environment variable through which a run hands its state file's locked descriptor to
the process image its ``exec()`` restart starts (see :meth:`StateFile.handover`). Not a knob
(the run sets it for itself), so not one of the ``DEVMEM_*`` names a user sets."""

_REGIONS = {
    "layer_weights": ("layer_weights", layer_weight_bytes),
    "layer_adam": ("layer_adam", layer_adam_bytes),
    "layer_grads": ("layer_grads", layer_gradient_bytes),
    "layer_acts": ("layer_acts", layer_activation_bytes),
}
"""Per-layer region accessor -> (its offset in :class:`Layout`, bytes per layer)."""


class StateFileError(ValueError):
    """A state file that cannot be used: too small, not ours, truncated or corrupt."""


class StateFileBusy(StateFileError):
    """Another process holds the state file's lock: a run, or a ``state create --force``.

    Attributes:
        path: the state file's path.
        pid: the lock holder's process id, or ``None`` where the system does not say
            (``/proc/locks`` unreadable).
    """

    def __init__(self, path: str, pid: int | None) -> None:
        self.path, self.pid = path, pid
        holder = f"pid {pid}" if pid is not None else "another process"
        super().__init__(
            f"state file {path} is in use by {holder}, which holds its lock (a train run or a"
            " state create --force): wait for it to end"
        )


def journal_bytes(dims: ModelDims) -> int:
    """The journal's size for ``dims``: one page plus 64 bytes per layer, rounded up to a page.

    That holds the original bytes of two small ranges per layer (what the dry run's weight
    update writes); :meth:`StateFile.commit` refuses a change whose originals do not fit.
    """
    return -(-(4096 + 64 * dims.n_layers) // 4096) * 4096


@dataclasses.dataclass(frozen=True)
class Layout:
    """Byte offsets of a state file's regions for one model (all from the file's start)."""

    layer_weights: int
    layer_adam: int
    layer_grads: int
    layer_acts: int
    global_: int
    journal: int
    total_size: int

    @classmethod
    def for_dims(cls, dims: ModelDims) -> Layout:
        """The region-major layout after a :data:`HEADER_BYTES` header."""
        n = dims.n_layers
        weights = HEADER_BYTES
        adam = weights + n * layer_weight_bytes(dims)
        grads = adam + n * layer_adam_bytes(dims)
        acts = grads + n * layer_gradient_bytes(dims)
        global_ = acts + n * layer_activation_bytes(dims)
        journal = global_ + global_bytes(dims)
        return cls(weights, adam, grads, acts, global_, journal, journal + journal_bytes(dims))


def state_file_bytes(config: ModelConfig) -> int:
    """The size of ``config``'s state file: the header, ``total_model_bytes`` and the journal."""
    return Layout.for_dims(config.dims).total_size


def check_header_fields(
    config: ModelConfig,
    *,
    checkpoint_policy: str = "all",
    checkpoint_interval: int = 0,
    scheduler: SchedulerState | None = None,
) -> None:
    """Check that every value fits its header field, before anything touches the disk.

    Integer fields are signed 32-bit (``0 .. 2**31 - 1``), floats must be finite, the model's
    name at most 32 UTF-8 bytes and the policy's 16, the file size below 2**64 bytes.

    Raises:
        ValueError: a value that does not fit; the message names the field and its range.
    """
    d, c = config.dims, config.compile
    s = scheduler or SchedulerState()
    ints = {
        **{f"dims.{f.name}": getattr(d, f.name) for f in dataclasses.fields(d)},
        "compile_budget": c.compile_budget,
        "kernels_per_layer": c.kernels_per_layer,
        "static_per_layer": c.static_per_layer,
        "accum_steps": c.accum_steps,
        "checkpoint_interval": checkpoint_interval,
        "step": s.step,
        "total_steps": s.total_steps,
        "group": s.group,
        "accum_step": s.accum_step,
    }
    for name, value in ints.items():
        if not 0 <= value <= INT32_MAX:
            raise ValueError(f"{name}={value}: the state file holds 0 .. {INT32_MAX}")
    for name, value in (
        ("headroom_pct", c.headroom_pct),
        ("learning_rate", s.learning_rate),
        ("last_loss", s.last_loss),
    ):
        if not math.isfinite(value):
            raise ValueError(f"{name}={value}: the state file holds finite numbers only")
    for name, text, limit in (
        ("model name", config.name, _NAME_BYTES),
        ("checkpoint policy", checkpoint_policy, _POLICY_BYTES),
    ):
        if len(text.encode()) > limit:
            raise ValueError(f"{name} {text!r}: the state file holds at most {limit} UTF-8 bytes")
    size = Layout.for_dims(d).total_size
    if size >= 2**64:
        raise ValueError(f"state file size {size} bytes: the header holds less than 2**64")


@dataclasses.dataclass(frozen=True)
class StateHeader:
    """A state file's header (one slot), decoded.

    Attributes:
        config: the model (name, shape, compile config); ``config.preset`` is ``""``.
        checkpoint_policy: the checkpoint policy's name (``"sqrt"``).
        checkpoint_interval: its parameter, 0 for the policy's default.
        scheduler: the :class:`SchedulerState` to resume from.
        restarts: ``exec()`` restarts so far.
        action_counts: how often each :class:`Action` was committed, indexed by its value.
        layout: the regions' byte offsets and the total size.
        generation: commits so far (0 for a new file); :meth:`StateFile.commit` sets it.
        delete_when_done: the run that created the file deletes it when it ends.
    """

    config: ModelConfig
    checkpoint_policy: str
    checkpoint_interval: int
    scheduler: SchedulerState
    restarts: int = 0
    action_counts: tuple[int, ...] = (0,) * len(Action)
    layout: Layout | None = None
    generation: int = 0
    delete_when_done: bool = False

    def pack(self) -> bytes:
        """The slot's bytes (checksum included).

        Raises:
            ValueError: a value does not fit its field (see :func:`check_header_fields`).
        """
        c, d, s = self.config.compile, self.config.dims, self.scheduler
        check_header_fields(
            self.config,
            checkpoint_policy=self.checkpoint_policy,
            checkpoint_interval=self.checkpoint_interval,
            scheduler=s,
        )
        if not 0 <= self.restarts <= INT32_MAX:
            raise ValueError(f"restarts={self.restarts}: the state file holds 0 .. {INT32_MAX}")
        if len(self.action_counts) != len(Action):
            raise ValueError(f"action_counts: expected {len(Action)} counts, one per Action")
        for action, count in zip(Action, self.action_counts, strict=True):
            if not 0 <= count < 2**32:
                raise ValueError(
                    f"action_counts[{action.name}]={count}: the state file holds 0 .. {2**32 - 1}"
                )
        if not 0 <= self.generation < 2**64:
            raise ValueError(f"generation={self.generation}: the state file holds 0 .. 2**64-1")
        layout = self.layout or Layout.for_dims(d)
        fields = _SLOT.pack(
            self.generation,
            _FLAG_DELETE_WHEN_DONE if self.delete_when_done else 0,
            self.config.name.encode(),
            d.n_layers,
            d.dim,
            d.hidden_dim,
            d.n_heads,
            d.n_kv_heads,
            d.vocab_size,
            d.seq_len,
            c.compile_budget,
            c.kernels_per_layer,
            c.static_per_layer,
            c.accum_steps,
            c.headroom_pct,
            self.checkpoint_policy.encode(),
            self.checkpoint_interval,
            int(s.phase),
            s.group,
            s.step,
            s.accum_step,
            s.total_steps,
            s.learning_rate,
            s.last_loss,
            self.restarts,
            *self.action_counts,
            *dataclasses.astuple(layout),
        )
        return fields + _CRC.pack(zlib.crc32(fields))

    def to_dict(self) -> dict:
        """Plain data for ``state show --json`` (finite numbers only: valid JSON)."""
        d, c, s = self.config.dims, self.config.compile, self.scheduler
        layout = self.layout or Layout.for_dims(d)
        return {
            "sentinel": f"0x{SENTINEL:08X}",
            "version": VERSION,
            "generation": self.generation,
            "model": self.config.name,
            "dims": dataclasses.asdict(d),
            "compile": dataclasses.asdict(c),
            "checkpoint": {"policy": self.checkpoint_policy, "interval": self.checkpoint_interval},
            "scheduler": {
                "phase": s.phase.name,
                "group": s.group,
                "step": s.step,
                "accum_step": s.accum_step,
                "total_steps": s.total_steps,
                "learning_rate": s.learning_rate,
                "last_loss": s.last_loss,
            },
            "restarts": self.restarts,
            "actions": {a.name: n for a, n in zip(Action, self.action_counts, strict=True)},
            "delete_when_done": self.delete_when_done,
            "offsets": {
                "layer_weights": layout.layer_weights,
                "layer_adam": layout.layer_adam,
                "layer_grads": layout.layer_grads,
                "layer_acts": layout.layer_acts,
                "global": layout.global_,
                "journal": layout.journal,
            },
            "total_size": layout.total_size,
        }


_LAYOUT_FIELDS = tuple(f.name.rstrip("_") for f in dataclasses.fields(Layout))


def _decode_slot(raw: bytes) -> StateHeader:
    """Decode and validate one slot; ``ValueError`` naming the field at fault."""
    fields = raw[: _SLOT.size]
    (stored_crc,) = _CRC.unpack_from(raw, _SLOT.size)
    computed = zlib.crc32(fields)
    if stored_crc != computed:
        raise ValueError(
            f"checksum mismatch (stored 0x{stored_crc:08X}, computed 0x{computed:08X})"
        )
    generation, flags, name, *rest = _SLOT.unpack(fields)
    dims_v, rest = rest[:7], rest[7:]
    compile_v, rest = rest[:5], rest[5:]
    (policy, interval, phase, group, step, accum, total, lr, loss, restarts), rest = (
        rest[:10],
        rest[10:],
    )
    counts, offsets = rest[: len(Action)], rest[len(Action) :]
    try:
        text_name = name.rstrip(b"\0").decode()
        text_policy = policy.rstrip(b"\0").decode()
    except UnicodeDecodeError:
        raise ValueError("the model or policy name is not UTF-8") from None
    if flags & ~_FLAG_DELETE_WHEN_DONE:
        raise ValueError(f"flags=0x{flags:X}: unknown flags")
    n_layers, dim, hidden, heads, kv_heads, vocab, seq = dims_v
    dims = ModelDims(dim, hidden, heads, kv_heads, n_layers, vocab, seq)
    budget, kernels, static, accum_steps, headroom = compile_v
    compile_ = CompileConfig(budget, kernels, static, accum_steps, float(headroom))
    try:
        phase_ = Phase(phase)
    except ValueError:
        raise ValueError(f"phase={phase}: expected one of {[int(p) for p in Phase]}") from None
    scheduler = SchedulerState(phase_, group, step, accum, total, lr, loss)
    config = ModelConfig(text_name, dims, compile_)
    for field, value in (("interval", interval), ("restarts", restarts)):
        if value < 0:
            raise ValueError(f"{field}={value}: expected >= 0")
    if not 0 <= step <= total or not 0 <= accum < accum_steps:
        raise ValueError(f"step={step}/{total} accum_step={accum}/{accum_steps} out of range")
    check_header_fields(
        config, checkpoint_policy=text_policy, checkpoint_interval=interval, scheduler=scheduler
    )
    n_groups = plan_pipeline(config).n_groups
    if not 0 <= group < n_groups:
        raise ValueError(f"group={group}: expected 0 <= group < {n_groups}")
    layout = Layout.for_dims(dims)
    for field, stored, expected in zip(
        _LAYOUT_FIELDS, offsets, dataclasses.astuple(layout), strict=True
    ):
        if stored != expected:
            raise ValueError(
                f"field {field}={stored} does not match the layout of its model ({expected})"
            )
    return StateHeader(
        config=config,
        checkpoint_policy=text_policy,
        checkpoint_interval=interval,
        scheduler=scheduler,
        restarts=restarts,
        action_counts=tuple(counts),
        layout=layout,
        generation=generation,
        delete_when_done=bool(flags & _FLAG_DELETE_WHEN_DONE),
    )


def _read_header(path: str, raw: bytes) -> tuple[StateHeader, int]:
    """The newest valid slot of a header page whose prefix was checked, and its index."""
    decoded: list[tuple[StateHeader, int]] = []
    errors = []
    for index, offset in enumerate(SLOT_OFFSETS):
        try:
            decoded.append((_decode_slot(raw[offset : offset + _SLOT.size + _CRC.size]), index))
        except (ValueError, TypeError) as exc:
            errors.append(f"slot {index}: {exc}")
    if not decoded:
        raise StateFileError(f"state file {path}: corrupt header: {'; '.join(errors)}")
    return max(decoded, key=lambda pair: pair[0].generation)


def _kill_at() -> tuple[int, str] | None:
    raw = os.environ.get("DEVMEM_PIPELINE_KILL_AT", "")
    if not raw:
        return None
    generation, _, point = raw.partition(":")
    if not generation.isdigit() or point not in ("create", *KILL_POINTS):
        warn_once(  # once per run: not again after each exec() restart
            f"devmem: ignoring DEVMEM_PIPELINE_KILL_AT={raw!r}: expected GEN:POINT with POINT"
            f" one of create, {', '.join(KILL_POINTS)}; not killing"
        )
        return None
    return int(generation), point


_UNREAD = ("unread",)
_kill_spec: object = _UNREAD


def _kill_point(generation: int, point: str) -> None:
    """The test knob: SIGKILL this process here if ``DEVMEM_PIPELINE_KILL_AT`` names it (read
    at the first call in a process; a forked child reads its own)."""
    global _kill_spec
    if _kill_spec is _UNREAD:
        _kill_spec = _kill_at()
    if (generation, point) == _kill_spec:
        os.kill(os.getpid(), signal.SIGKILL)


def _forget_kill_spec() -> None:
    global _kill_spec
    _kill_spec = _UNREAD


os.register_at_fork(after_in_child=_forget_kill_spec)


def _page_span(offset: int, length: int) -> tuple[int, int]:
    start = offset - offset % mmap.PAGESIZE
    return start, offset + length - start


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_TEMP_SUFFIX = ".tmp"
_TEMP_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")
"""The characters of ``tempfile.mkstemp``'s random part (8 of them) in a temporary's name."""


def _is_temporary_of(entry: str, name: str) -> bool:
    """``entry`` is a name :meth:`StateFile.create` gives its temporary file for ``name``:
    ``.NAME.XXXXXXXX.tmp`` (not another state file's, such as ``.NAME.b.XXXXXXXX.tmp``)."""
    prefix = f".{name}."
    if not entry.startswith(prefix) or not entry.endswith(_TEMP_SUFFIX):
        return False
    middle = entry[len(prefix) : -len(_TEMP_SUFFIX)]
    return len(middle) == 8 and set(middle) <= _TEMP_LETTERS


def _remove_dead_temporaries(directory: str, name: str, own: os.stat_result | None = None) -> None:
    """Remove the temporary files that killed writers of state file ``name`` left in
    ``directory``: those whose ``flock`` can be taken (a live writer holds its own), and those
    that are a second name of ``own`` (the state file whose lock the caller holds: a writer
    killed between ``os.link`` and the unlink of its temporary left it), each said in one line
    on stderr. Never raises: a temporary that cannot be checked is left alone."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in sorted(entries):
        if not _is_temporary_of(entry, name):
            continue
        candidate = os.path.join(directory, entry)
        try:  # not through a symbolic link; a FIFO must not block the open
            fd = os.open(candidate, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        second_name = False
        try:
            stat = os.fstat(fd)
            if not S_ISREG(stat.st_mode):  # only ever a regular file of ours
                continue
            # our own lock covers a second name of our file: its flock would be refused
            second_name = own is not None and os.path.samestat(stat, own)
            if not second_name:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # the name still holds the inode locked here (not a newer writer's file)
            if not os.path.samestat(stat, os.stat(candidate, follow_symlinks=False)):
                continue
            os.unlink(candidate)
        except OSError:  # locked by a live writer, gone, or not ours to remove
            continue
        finally:
            os.close(fd)
        if second_name:
            what = (
                f"a second name of state file {name} left by a writer killed while placing it"
                " (its space stays with the state file)"
            )
        else:
            what = f"({stat.st_size:,} bytes), a temporary state file left by a killed writer"
        print(f"devmem: removed {candidate} {what}", file=sys.stderr, flush=True)


def _locked_temporary(directory: str, name: str) -> tuple[int, str]:
    """A new temporary file for state file ``name`` in ``directory``, under an exclusive
    ``flock`` that the returned descriptor holds until it is closed (or unlocked).

    A concurrent :func:`_remove_dead_temporaries` may take the lock in the instant between
    the file's creation and this lock and remove it: the lock is taken, then the name checked
    to still be this file; if it is not, another one is made."""
    while True:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=_TEMP_SUFFIX)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.path.samestat(os.fstat(fd), os.stat(tmp, follow_symlinks=False)):
                return fd, tmp
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)  # removed (and perhaps replaced) by a cleaner: try another name


def _lock_holder(fd: int) -> int | None:
    """The pid that holds an ``flock`` on ``fd``'s file, from ``/proc/locks`` (Linux); ``None``
    where it cannot be read or lists no holder."""
    st = os.fstat(fd)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:  # "1: FLOCK  ADVISORY  WRITE 4276 00:1b:3 0 EOF"; a waiter has "->"
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == key:
            return int(fields[4])
    return None


def _lock(fd: int, path: str) -> None:
    """Take the exclusive ``flock`` of a state file on ``fd``, without waiting (taking it again
    on the descriptor that holds it succeeds).

    Raises:
        StateFileBusy: another open file description holds it (the message names its pid).
        OSError: no lock can be taken at all (e.g. ``ENOLCK``).
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise StateFileBusy(path, _lock_holder(fd)) from None


def _describe(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, for a refusal."""
    for test, what in (
        (S_ISDIR, "a directory"),
        (S_ISFIFO, "a FIFO (named pipe)"),
        (S_ISCHR, "a character device"),
        (S_ISBLK, "a block device"),
        (S_ISSOCK, "a socket"),
        (S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return what
    return "not a regular file"


def _claim_existing(path: str) -> tuple[int, os.stat_result] | None:
    """For ``create(overwrite=True)``: the file at ``path`` opened and locked, with its status,
    if it is a state file (a regular file that starts with the ``ANEP`` sentinel), so that no
    run holds it while it is replaced; ``None`` if ``path`` does not exist.

    Raises:
        StateFileError: ``path`` is anything else (a directory, FIFO, device, socket, symbolic
            link, or a regular file without the sentinel): the message says what it is.
        StateFileBusy: a run (or another ``--force``) holds its lock.
    """
    while True:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        refusal = f"refusing to replace {path}: --force replaces only a pipeline state file, and"
        if not S_ISREG(st.st_mode):
            raise StateFileError(f"{refusal} it is {_describe(st.st_mode)}")
        try:  # the name may change between lstat and open: then look again
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            continue
        try:
            if os.path.samestat(os.fstat(fd), st):
                prefix = os.pread(fd, _PREFIX.size, 0)
                if len(prefix) < _PREFIX.size or _PREFIX.unpack(prefix)[0] != SENTINEL:
                    raise StateFileError(
                        f"{refusal} it is a regular file of {st.st_size:,} bytes without the"
                        " state file's sentinel ('ANEP')"
                    )
                _lock(fd, path)
                if os.path.samestat(st, os.lstat(path)):
                    return fd, st
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _adopt(fd: int, path: str) -> bool:
    """``fd`` (handed over an ``exec()``) is open read-write on the file ``path`` names."""
    try:
        access = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        return access == os.O_RDWR and os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


class StateFile:
    """An open, memory-mapped state file. Use :meth:`create` or :meth:`open`, then
    :meth:`close` (or a ``with`` block).

    Attributes:
        path: the file's path.
        header: the decoded :class:`StateHeader` (:meth:`commit` replaces it).
        readonly: opened with ``readonly=True`` (the accessors' arrays are read-only).
        rolled_back: bytes the opening restored from the journal (a change was interrupted);
            for a read-only open, the bytes a read-write open would restore.
    """

    def __init__(
        self,
        path: str,
        fd: int,
        mapping: mmap.mmap,
        header: StateHeader,
        slot: int,
        *,
        readonly: bool = False,
    ) -> None:
        self.path = path
        self._fd = fd
        self._map: mmap.mmap | None = mapping
        self._slot = slot
        self.header = header
        self.readonly = readonly
        self.rolled_back = 0

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        config: ModelConfig,
        *,
        checkpoint_policy: str = "all",
        checkpoint_interval: int = 0,
        scheduler: SchedulerState | None = None,
        overwrite: bool = False,
        sparse: bool = False,
        reserve: Sequence[tuple[int, int]] = (),
        delete_when_done: bool = False,
    ) -> StateFile:
        """Create ``path`` as a state file for ``config`` (generation 0), atomically, and hold
        its lock (an exclusive ``flock``) until :meth:`close`.

        The file is built as a temporary file in the same directory (space reserved with
        ``posix_fallocate`` unless ``sparse``), flushed, and moved into place: an existing
        ``path`` is never truncated, and a failure or a kill leaves it as it was. The lock is
        taken on the temporary file and so holds the state file from the moment it has its
        name. A failure removes the temporary ``.NAME.XXXXXXXX.tmp`` file; a kill leaves it
        behind, under an ``flock`` that dies with the writer, and the next creation or
        read-write open of ``path`` removes it (saying so on stderr, with its size); a
        temporary whose writer lives is left alone.

        Args:
            overwrite: replace an existing ``path`` (``os.replace``), only if it is a state
                file (a regular file with the sentinel) whose lock is free, and under that
                lock; else refuse it.
            sparse: do not reserve the space: creation is instant and takes no disk, but a
                write that finds the disk full kills the process with ``SIGBUS``.
            reserve: with ``sparse``, the byte ranges ``(offset, length)`` to reserve anyway
                (what the caller will write: a write there cannot find the disk full).
            delete_when_done: recorded in the header for the run that owns the file.

        Raises:
            ValueError: a value does not fit the header (see :func:`check_header_fields`).
            FileExistsError: ``path`` exists and not ``overwrite``.
            StateFileBusy: ``overwrite`` and another process holds the existing file's lock.
            StateFileError: ``overwrite`` and ``path`` is not a state file (the message says
                what it is).
            OSError: the file cannot be created, its space reserved (the message names the path
                and the bytes needed), locked or mapped.
        """
        path = os.fspath(path)
        scheduler = scheduler or SchedulerState()
        check_header_fields(
            config,
            checkpoint_policy=checkpoint_policy,
            checkpoint_interval=checkpoint_interval,
            scheduler=scheduler,
        )
        layout = Layout.for_dims(config.dims)
        header = StateHeader(
            config=config,
            checkpoint_policy=checkpoint_policy,
            checkpoint_interval=checkpoint_interval,
            scheduler=scheduler,
            layout=layout,
            delete_when_done=delete_when_done,
        )
        if not overwrite and os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, f"state file {path} exists", path)
        existing = _claim_existing(path) if overwrite else None
        try:
            return cls._create_locked(path, header, sparse, reserve, existing)
        finally:
            if existing is not None:  # replaced, or left as it was: no longer ours to guard
                os.close(existing[0])

    @classmethod
    def _create_locked(
        cls,
        path: str,
        header: StateHeader,
        sparse: bool,
        reserve: Sequence[tuple[int, int]],
        existing: tuple[int, os.stat_result] | None,
    ) -> StateFile:
        """:meth:`create`'s work once the file it replaces (``existing``) is locked."""
        layout = header.layout
        assert layout is not None
        overwrite = existing is not None
        directory = os.path.dirname(path) or "."
        name = os.path.basename(path)
        _remove_dead_temporaries(directory, name, existing[1] if existing else None)
        fd, tmp = _locked_temporary(directory, name)
        placed = False
        try:
            os.fchmod(fd, 0o644)
            todo = [(0, layout.total_size)] if not sparse else list(reserve)
            try:
                os.ftruncate(fd, layout.total_size)
                for offset, length in todo:  # no write into the mapping there can then fail
                    os.posix_fallocate(fd, offset, length)
            except OSError as exc:
                size = sum(length for _, length in todo) if todo else layout.total_size
                raise OSError(
                    exc.errno,
                    f"cannot {'reserve' if todo else 'size'} {size:,} bytes for"
                    f" state file {path}: {exc.strerror or exc}",
                    path,
                ) from None
            os.pwrite(fd, _PREFIX.pack(SENTINEL, VERSION), 0)
            os.pwrite(fd, header.pack(), SLOT_OFFSETS[0])
            os.fsync(fd)
            _kill_point(0, "create")
            if overwrite:
                os.replace(tmp, path)
            else:
                try:
                    os.link(tmp, path)  # fails if path exists, unlike rename
                except FileExistsError:
                    raise FileExistsError(errno.EEXIST, f"state file {path} exists", path) from None
                except OSError:  # no hard links here (e.g. FAT): checked above
                    os.replace(tmp, path)
                else:
                    os.unlink(tmp)
            placed = True  # the temporary's lock is now the state file's
            _fsync_dir(directory)
            mapping = mmap.mmap(fd, layout.total_size)
        except BaseException:
            if not placed:
                os.unlink(tmp)
            os.close(fd)
            raise
        return cls(path, fd, mapping, header, 0)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        readonly: bool = False,
        inherited_fd: int | None = None,
    ) -> StateFile:
        """Open an existing state file (after an ``exec()`` restart or a crash).

        A read-write open takes the file's lock (an exclusive ``flock``, held until
        :meth:`close`), undoes a change that a killed writer left half-done (see the module
        docstring), and removes what killed writers of the file left beside it (their
        temporaries, a second name of the file itself), saying so on stderr. ``readonly``
        opens with ``O_RDONLY``, takes no lock, reads the header and journal with ``pread``
        (never through the mapping) and changes nothing.

        Args:
            inherited_fd: a descriptor that :meth:`handover` passed over an ``exec()``: used
                (with the lock it holds) if it is open read-write on the file ``path`` names,
                else left alone.

        Raises:
            StateFileBusy: read-write, and another process holds the lock (its pid said).
            StateFileError: the file is smaller than the header, its sentinel or version is
                wrong, both header slots are corrupt, it is truncated, its journal is corrupt,
                or a change was interrupted that cannot be undone (a damaged newest header
                slot or journal); the message says which, with the values.
            OSError: it cannot be opened, locked or mapped (e.g. ``FileNotFoundError``).
        """
        path = os.fspath(path)
        fd = os.open(path, os.O_RDONLY) if readonly else cls._open_locked(path, inherited_fd)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_BYTES:
                raise StateFileError(
                    f"state file {path} is {size} bytes, smaller than its {HEADER_BYTES}-byte"
                    " header"
                )
            raw = os.pread(fd, HEADER_BYTES, 0)
            sentinel, version = _PREFIX.unpack_from(raw)
            if sentinel != SENTINEL:
                raise StateFileError(
                    f"state file {path} is not a pipeline state file: sentinel 0x{sentinel:08X}"
                    f" (expected 0x{SENTINEL:08X} 'ANEP')"
                )
            if version != VERSION:
                raise StateFileError(
                    f"state file {path}: field 'version' is {version}, this build reads version"
                    f" {VERSION} only" + (" (recreate the file)" if version < VERSION else "")
                )
            header, slot = _read_header(path, raw)
            total = header.layout.total_size  # type: ignore[union-attr]
            if total > size:
                raise StateFileError(
                    f"state file {path} is truncated: expected {total} bytes, got {size}"
                )
            access = mmap.ACCESS_READ if readonly else mmap.ACCESS_WRITE
            mapping = mmap.mmap(fd, total, access=access)
        except BaseException:
            os.close(fd)
            raise
        state = cls(path, fd, mapping, header, slot, readonly=readonly)
        try:
            state.rolled_back = state._recover()
        except BaseException:
            mapping.close()
            os.close(fd)
            raise
        if not readonly:
            _remove_dead_temporaries(
                os.path.dirname(path) or ".", os.path.basename(path), os.fstat(fd)
            )
        return state

    @staticmethod
    def _open_locked(path: str, inherited_fd: int | None) -> int:
        """A read-write descriptor of ``path`` that holds its lock: ``inherited_fd`` if it is
        one of this file, else a new one. Raises as :meth:`open`."""
        if inherited_fd is not None and _adopt(inherited_fd, path):
            fd = inherited_fd
            os.set_inheritable(fd, False)  # a later restart hands it over again
        else:
            fd = os.open(path, os.O_RDWR)
        while True:
            try:
                _lock(fd, path)
                # a --force that held the lock may have replaced the name meanwhile
                if os.path.samestat(os.fstat(fd), os.stat(path)):
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
            fd = os.open(path, os.O_RDWR)

    def __enter__(self) -> StateFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _mapping(self) -> mmap.mmap:
        if self._map is None:
            raise ValueError(f"state file {self.path} is closed")
        return self._map

    # -- the journal -------------------------------------------------------------------------

    def _read_journal(self) -> tuple[bytes, int | None, list[tuple[int, bytes]]]:
        """The journal's head (magic, generation, count, payload size and CRC, as read), and
        if it is whole (magic, bounds and CRC right) its generation and records; else
        ``(head, None, [])``. Read with ``pread``: never through the mapping, so a read-only
        open of a sparse file on a full disk cannot die of ``SIGBUS``.

        Raises:
            StateFileError: a whole journal whose records overrun it or leave the tensors.
        """
        layout = self.header.layout
        assert layout is not None
        start = layout.journal
        head = os.pread(self._fd, _JOURNAL.size + _CRC.size, start)
        if len(head) < _JOURNAL.size + _CRC.size:  # cut short since it was checked
            return head, None, []
        magic, generation, count, payload = _JOURNAL.unpack_from(head)
        body_start = start + len(head)
        if magic != _JOURNAL_MAGIC or body_start + payload > layout.total_size:
            return head, None, []
        body = os.pread(self._fd, payload, body_start)
        (stored,) = _CRC.unpack_from(head, _JOURNAL.size)
        if len(body) != payload or zlib.crc32(body, zlib.crc32(head[: _JOURNAL.size])) != stored:
            return head, None, []  # torn (the change had not started) or damaged: see the seal
        records, at = [], 0
        for _ in range(count):
            if at + _RECORD.size > payload:
                raise StateFileError(f"state file {self.path}: corrupt journal (record overrun)")
            offset, length = _RECORD.unpack_from(body, at)
            at += _RECORD.size
            if not layout.layer_weights <= offset <= offset + length <= layout.journal:
                raise StateFileError(
                    f"state file {self.path}: corrupt journal: record at {offset} ({length}"
                    " bytes) is outside the tensors"
                )
            records.append((offset, bytes(body[at : at + length])))
            at += -(-length // 8) * 8
        return head, generation, records

    def _read_seal(self) -> tuple[bytes, int | None]:
        """The seal's copy of a journal head, and that journal's generation if the seal is
        whole (else ``None``); read with ``pread``."""
        raw = os.pread(self._fd, _SEAL.size + _CRC.size, _SEAL_OFFSET)
        if len(raw) < _SEAL.size + _CRC.size:  # cut short since it was checked
            return raw, None
        magic, head = _SEAL.unpack_from(raw)
        (stored,) = _CRC.unpack_from(raw, _SEAL.size)
        if magic != _SEAL_MAGIC or zlib.crc32(raw[: _SEAL.size]) != stored:
            return head, None
        return head, _JOURNAL.unpack_from(head)[1]

    def _recover(self) -> int:
        """Undo the change a killed writer left half-done, if the journal holds one (read-write
        only); return the bytes restored (read-only: that it would restore).

        The journal undoes the change from the header's generation ``g``; it counts only if
        whole and stamped ``g``. A seal stamped ``g`` says that change's tensor writes may have
        begun: the journal must then match it. A journal or seal stamped after ``g`` says the
        header of a newer generation existed and is damaged: the tensors are past ``g``.

        Raises:
            StateFileError: either of those two cases, which no journal can undo.
        """
        generation = self.header.generation
        head, journaled, records = self._read_journal()
        seal, sealed = self._read_seal()
        newer = max((g for g in (journaled, sealed) if g is not None), default=-1)
        if newer > generation:
            raise StateFileError(
                f"state file {self.path} cannot be resumed: its newest readable header is"
                f" generation {generation}, but its journal is of the change from generation"
                f" {newer}: a newer header slot is damaged, and the tensors are past generation"
                f" {generation}"
            )
        if sealed == generation and (journaled != generation or seal != head):
            raise StateFileError(
                f"state file {self.path} cannot be resumed: the journal of the change from"
                f" generation {generation} is damaged (it does not match its seal), and the"
                " change had begun: its original bytes cannot be restored"
            )
        if journaled != generation:
            return 0
        restored = sum(len(data) for _, data in records)
        if self.readonly:
            return restored
        mapping = self._mapping()
        for offset, data in records:
            mapping[offset : offset + len(data)] = data
        self._flush_ranges([(offset, len(data)) for offset, data in records])
        if sealed == generation:  # undone: the next commit's journal starts afresh
            mapping[_SEAL_OFFSET : _SEAL_OFFSET + _SEAL.size + _CRC.size] = bytes(
                _SEAL.size + _CRC.size
            )
            mapping.flush(0, HEADER_BYTES)
        return restored

    def _flush_ranges(self, ranges: Sequence[tuple[int, int]]) -> None:
        mapping = self._mapping()
        for offset, length in ranges:
            if length:
                mapping.flush(*_page_span(offset, length))

    # -- commits -----------------------------------------------------------------------------

    def offset(self, what: str, layer: int, index: int = 0) -> int:
        """The byte offset of float32 element ``index`` of ``what(layer)`` (``what`` names a
        per-layer accessor, e.g. ``"layer_grads"``), for :meth:`commit`.

        Raises:
            KeyError: an unknown ``what``; IndexError, TypeError: as the accessors.
        """
        offset_field, layer_bytes = _REGIONS[what]
        self._check_layer(what, layer)
        per_layer = layer_bytes(self.header.config.dims)
        if not 0 <= index < per_layer // FLOAT32_BYTES:
            raise IndexError(f"{what}({layer})[{index}]: out of range")
        return getattr(self.header.layout, offset_field) + layer * per_layer + 4 * index

    def commit(self, header: StateHeader, writes: Sequence[tuple[int, bytes]] = ()) -> None:
        """Write ``writes`` (``(byte offset, new bytes)`` pairs inside the tensors) and
        ``header`` as one crash-safe change: generation ``g`` becomes ``g + 1``, and a kill at
        any point leaves one or the other (see the module docstring).

        ``header``'s generation and layout are set here.

        Raises:
            ValueError: the file is closed or read-only, ``header`` is another model's, a value
                does not fit the header, a write is outside the tensors, or the originals of the
                writes do not fit the journal. Nothing is written then.
        """
        if self.readonly:
            raise ValueError(f"state file {self.path} is open read-only")
        mapping = self._mapping()
        layout = self.header.layout
        assert layout is not None
        if Layout.for_dims(header.config.dims) != layout:
            raise ValueError(
                f"commit: the header's model needs layout {Layout.for_dims(header.config.dims)},"
                f" the file has {layout}"
            )
        generation = self.header.generation + 1
        header = dataclasses.replace(header, layout=layout, generation=generation)
        slot_bytes = header.pack()  # raises before anything is written
        body = bytearray()
        for offset, data in writes:
            if not layout.layer_weights <= offset <= offset + len(data) <= layout.journal:
                raise ValueError(
                    f"commit: a write at {offset} ({len(data)} bytes) is outside the tensors"
                    f" [{layout.layer_weights}, {layout.journal})"
                )
            body += _RECORD.pack(offset, len(data))
            body += mapping[offset : offset + len(data)]
            body += bytes(-len(data) % 8)
        capacity = layout.total_size - layout.journal - _JOURNAL.size - _CRC.size
        if len(body) > capacity:
            raise ValueError(
                f"commit: the originals of {len(writes)} writes take {len(body)} journal bytes,"
                f" the journal holds {capacity}"
            )
        if writes:
            journal = _JOURNAL.pack(_JOURNAL_MAGIC, generation - 1, len(writes), len(body))
            crc = zlib.crc32(bytes(body), zlib.crc32(journal))
            start = layout.journal
            blob = journal + _CRC.pack(crc) + bytes(body)
            half = len(blob) // 2
            mapping[start : start + half] = blob[:half]
            _kill_point(generation, "journal")
            mapping[start + half : start + len(blob)] = blob[half:]
            mapping.flush(*_page_span(start, len(blob)))
            _kill_point(generation, "journaled")
            seal = _SEAL.pack(_SEAL_MAGIC, blob[: _JOURNAL.size + _CRC.size])
            mapping[_SEAL_OFFSET : _SEAL_OFFSET + len(seal) + _CRC.size] = seal + _CRC.pack(
                zlib.crc32(seal)
            )
            mapping.flush(0, HEADER_BYTES)
            for i, (offset, data) in enumerate(writes):
                mapping[offset : offset + len(data)] = data
                if i == 0:
                    _kill_point(generation, "write")
            self._flush_ranges([(offset, len(data)) for offset, data in writes])
            _kill_point(generation, "written")
        slot = 1 - self._slot
        start = SLOT_OFFSETS[slot]
        half = len(slot_bytes) // 2
        mapping[start : start + half] = slot_bytes[:half]
        _kill_point(generation, "header")
        mapping[start + half : start + len(slot_bytes)] = slot_bytes[half:]
        mapping.flush(0, HEADER_BYTES)
        _kill_point(generation, "committed")
        self._slot = slot
        self.header = header

    def write_header(self, header: StateHeader) -> None:
        """Commit ``header`` alone (:meth:`commit` with no writes). Raises as :meth:`commit`."""
        self.commit(header)

    # -- accessors ---------------------------------------------------------------------------

    def _check_layer(self, what: str, layer: int) -> None:
        n_layers = self.header.config.dims.n_layers
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError(f"layer must be an int, got {type(layer).__name__} {layer!r}")
        if not 0 <= layer < n_layers:
            raise IndexError(f"{what}({layer}): expected a layer in 0 .. {n_layers - 1}")

    def _region(self, what: str, layer: int) -> np.ndarray:
        self._check_layer(what, layer)
        offset_field, layer_bytes = _REGIONS[what]
        per_layer = layer_bytes(self.header.config.dims)
        start = getattr(self.header.layout, offset_field) + layer * per_layer
        return np.frombuffer(self._mapping(), np.float32, per_layer // FLOAT32_BYTES, offset=start)

    def layer_weights(self, layer: int) -> np.ndarray:
        """Layer ``layer``'s weights as a float32 view of the file (writable unless the file
        was opened read-only; writes through it are not journaled).

        Raises:
            IndexError: ``layer`` is not in ``0 .. n_layers-1``.
            TypeError: ``layer`` is not an int.
            ValueError: the file is closed.
        """
        return self._region("layer_weights", layer)

    def layer_adam(self, layer: int) -> np.ndarray:
        """Layer ``layer``'s Adam state (m then v). Raises as :meth:`layer_weights`."""
        return self._region("layer_adam", layer)

    def layer_grads(self, layer: int) -> np.ndarray:
        """Layer ``layer``'s gradient accumulators. Raises as :meth:`layer_weights`."""
        return self._region("layer_grads", layer)

    def layer_acts(self, layer: int) -> np.ndarray:
        """Layer ``layer``'s activation checkpoint. Raises as :meth:`layer_weights`."""
        return self._region("layer_acts", layer)

    def global_region(self) -> np.ndarray:
        """The global tensors (final RMSNorm, embeddings, their Adam states and gradients).

        Raises:
            ValueError: the file is closed.
        """
        layout = self.header.layout
        assert layout is not None
        return np.frombuffer(
            self._mapping(),
            np.float32,
            (layout.journal - layout.global_) // FLOAT32_BYTES,
            offset=layout.global_,
        )

    def remove(self) -> bool:
        """Remove the file's name, if it still names this very file (the same inode, with the
        sentinel): a run removes only the file it created, never one put at its path since.
        Call it before :meth:`close`, under the lock (a read-write file holds it), so that no
        cooperating process can replace the file in between.

        Returns:
            True if the name was removed; False if it names another file or nothing (then
            nothing is removed).

        Raises:
            ValueError: the file is closed or read-only.
            OSError: the name could not be removed (e.g. ``PermissionError``).
        """
        self._mapping()
        if self.readonly:
            raise ValueError(f"state file {self.path} is open read-only")
        try:
            named = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        prefix = os.pread(self._fd, _PREFIX.size, 0)
        if not os.path.samestat(named, os.fstat(self._fd)) or prefix != _PREFIX.pack(
            SENTINEL, VERSION
        ):
            return False
        os.unlink(self.path)
        return True

    def handover(self) -> int:
        """Flush and unmap the file and return its descriptor, still open and holding the
        lock, made inheritable: for an ``exec()`` restart, whose new process image passes it
        to :meth:`open` as ``inherited_fd``. The lock is thus held across the restart, with
        no instant in which another process could take it. The object is closed after.

        Raises:
            ValueError: the file is closed or read-only, or an accessor's array is alive.
        """
        mapping = self._mapping()
        if self.readonly:
            raise ValueError(f"state file {self.path} is open read-only: it holds no lock")
        mapping.flush()
        try:
            mapping.close()
        except BufferError:
            raise ValueError(
                f"state file {self.path}: cannot hand over while arrays from layer_weights()"
                " and the other accessors are alive; drop them first"
            ) from None
        self._map = None
        os.set_inheritable(self._fd, True)
        return self._fd

    def close(self) -> None:
        """Flush and unmap the file and close it (it stays on disk), which releases its lock.
        Idempotent.

        Raises:
            ValueError: an array returned by an accessor is still alive (it points into the
                mapping); the file stays open and usable.
        """
        if self._map is None:
            return
        mapping = self._map
        if not self.readonly:
            mapping.flush()
        try:
            mapping.close()
        except BufferError:
            raise ValueError(
                f"state file {self.path}: cannot close while arrays from layer_weights() and"
                " the other accessors are alive; drop them first"
            ) from None
        self._map = None
        os.close(self._fd)
