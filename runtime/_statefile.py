"""The state file that survives ``exec()`` restarts (the seed's ``MmapState``).

Layout: a header padded to :data:`HEADER_BYTES` (4096), then the tensors region-major: every
layer's weights, then every layer's Adam state, every layer's gradients, every layer's
activations, then the global region (final RMSNorm and embeddings with their Adam states and
gradients). Float32 throughout; the file is memory-mapped, so a process that ``exec()``s
itself finds its tensors where it left them. Created sparse (``truncate``): a LLaMA-7B file is
about 100 GiB long but holds only what was written.

The header (little-endian) carries the sentinel ``0x414E4550`` ("ANEP"), version 1, the model's
shape and compile config, the checkpoint policy, the scheduler state, restart and action
counters, each region's byte offset and the total size, and a CRC-32 of all of that. Opening
checks, in order: the file is smaller than the header; bad sentinel or version (both values
said); ``total_size`` larger than the file (truncated: expected and actual sizes said); then the
checksum and every field. Each failure is a :class:`StateFileError` naming the file.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
import zlib

import numpy as np

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
    "SENTINEL",
    "VERSION",
    "StateFile",
    "StateFileError",
    "StateHeader",
    "state_file_bytes",
]

SENTINEL = 0x414E4550
"""The first four bytes of a state file, ``"ANEP"`` read as a little-endian integer's hex."""
VERSION = 1
HEADER_BYTES = 4096
"""The header region's size: the header struct padded to one page."""

_NAME_BYTES = 32
_STRUCT = struct.Struct(
    "<II"  # sentinel, version
    f"{_NAME_BYTES}s"  # model name, UTF-8, NUL padded
    "7i"  # dims: n_layers dim hidden_dim n_heads n_kv_heads vocab_size seq_len
    "4id"  # compile: budget kernels_per_layer static_per_layer accum_steps headroom_pct
    "16s i"  # checkpoint policy name, interval (0: the policy's default)
    "5i2d"  # scheduler: phase group step accum_step total_steps learning_rate last_loss
    "i6I"  # restarts, one counter per Action
    "6Q"  # offsets: weights adam grads acts global, total_size
)
_CRC = struct.Struct("<I")
assert _STRUCT.size + _CRC.size <= HEADER_BYTES


_REGIONS = {
    "layer_weights": ("layer_weights", layer_weight_bytes),
    "layer_adam": ("layer_adam", layer_adam_bytes),
    "layer_grads": ("layer_grads", layer_gradient_bytes),
    "layer_acts": ("layer_acts", layer_activation_bytes),
}
"""Per-layer region accessor -> (its offset in :class:`Layout`, bytes per layer)."""


class StateFileError(ValueError):
    """A state file that cannot be used: too small, not ours, truncated or corrupt."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """Byte offsets of a state file's regions for one model (all from the file's start)."""

    layer_weights: int
    layer_adam: int
    layer_grads: int
    layer_acts: int
    global_: int
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
        return cls(weights, adam, grads, acts, global_, global_ + global_bytes(dims))


def state_file_bytes(config: ModelConfig) -> int:
    """The size of ``config``'s state file: the header plus ``total_model_bytes``."""
    return Layout.for_dims(config.dims).total_size


@dataclasses.dataclass(frozen=True)
class StateHeader:
    """A state file's header, decoded.

    Attributes:
        config: the model (name, shape, compile config); ``config.preset`` is ``""``.
        checkpoint_policy: the checkpoint policy's name (``"sqrt"``).
        checkpoint_interval: its parameter, 0 for the policy's default.
        scheduler: the :class:`SchedulerState` to resume from.
        restarts: ``exec()`` restarts so far.
        action_counts: how often each :class:`Action` was taken, indexed by its value.
        layout: the regions' byte offsets and the total size.
    """

    config: ModelConfig
    checkpoint_policy: str
    checkpoint_interval: int
    scheduler: SchedulerState
    restarts: int = 0
    action_counts: tuple[int, ...] = (0,) * len(Action)
    layout: Layout | None = None

    def pack(self) -> bytes:
        """The header region's bytes (:data:`HEADER_BYTES` long, checksum included)."""
        c, d, s = self.config.compile, self.config.dims, self.scheduler
        layout = self.layout or Layout.for_dims(d)
        fields = _STRUCT.pack(
            SENTINEL,
            VERSION,
            self.config.name.encode()[:_NAME_BYTES],
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
        packed = fields + _CRC.pack(zlib.crc32(fields))
        return packed + bytes(HEADER_BYTES - len(packed))

    def to_dict(self) -> dict:
        """Plain data for ``state show --json``."""
        d, c, s = self.config.dims, self.config.compile, self.scheduler
        layout = self.layout or Layout.for_dims(d)
        return {
            "sentinel": f"0x{SENTINEL:08X}",
            "version": VERSION,
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
            "offsets": {
                "layer_weights": layout.layer_weights,
                "layer_adam": layout.layer_adam,
                "layer_grads": layout.layer_grads,
                "layer_acts": layout.layer_acts,
                "global": layout.global_,
            },
            "total_size": layout.total_size,
        }


def _decode(path: str, raw: bytes) -> StateHeader:
    """Decode and validate a header whose sentinel, version and size were checked."""
    fields = raw[: _STRUCT.size]
    (stored_crc,) = _CRC.unpack_from(raw, _STRUCT.size)
    computed = zlib.crc32(fields)
    if stored_crc != computed:
        raise StateFileError(
            f"state file {path}: header checksum mismatch (stored 0x{stored_crc:08X}, computed"
            f" 0x{computed:08X}): the header is corrupt"
        )
    values = list(_STRUCT.unpack(fields))
    (_, _, name, *rest) = values
    dims_v, rest = rest[:7], rest[7:]
    compile_v, rest = rest[:5], rest[5:]
    (policy, interval, phase, group, step, accum, total, lr, loss, restarts), rest = (
        rest[:10],
        rest[10:],
    )
    counts, offsets = rest[: len(Action)], rest[len(Action) :]
    try:
        text_name = name.rstrip(b"\0").decode(errors="replace")
        text_policy = policy.rstrip(b"\0").decode(errors="replace")
        n_layers, dim, hidden, heads, kv_heads, vocab, seq = dims_v
        dims = ModelDims(dim, hidden, heads, kv_heads, n_layers, vocab, seq)
        budget, kernels, static, accum_steps, headroom = compile_v
        compile_ = CompileConfig(budget, kernels, static, accum_steps, float(headroom))
        scheduler = SchedulerState(Phase(phase), group, step, accum, total, lr, loss)
        for field, value in (("interval", interval), ("restarts", restarts)):
            if value < 0:
                raise ValueError(f"{field}={value}: expected >= 0")
        if not 0 <= step <= total or not 0 <= accum < accum_steps:
            raise ValueError(f"step={step}/{total} accum_step={accum}/{accum_steps} out of range")
        n_groups = plan_pipeline(ModelConfig(text_name, dims, compile_)).n_groups
        if not 0 <= group < n_groups:
            raise ValueError(f"group={group}: expected 0 <= group < {n_groups}")
    except (ValueError, TypeError) as exc:
        raise StateFileError(f"state file {path}: corrupt header: {exc}") from None
    layout = Layout.for_dims(dims)
    if tuple(offsets) != dataclasses.astuple(layout):
        raise StateFileError(
            f"state file {path}: corrupt header: region offsets {tuple(offsets)} do not match"
            f" the layout of its model {dataclasses.astuple(layout)}"
        )
    return StateHeader(
        config=ModelConfig(text_name, dims, compile_),
        checkpoint_policy=text_policy,
        checkpoint_interval=interval,
        scheduler=scheduler,
        restarts=restarts,
        action_counts=tuple(counts),
        layout=layout,
    )


class StateFile:
    """An open, memory-mapped state file. Use :meth:`create` or :meth:`open`, then
    :meth:`close` (or a ``with`` block).

    Attributes:
        path: the file's path.
        header: the decoded :class:`StateHeader` (:meth:`write_header` replaces it).
    """

    def __init__(self, path: str, fd: int, mapping: mmap.mmap, header: StateHeader) -> None:
        self.path = path
        self._fd = fd
        self._map: mmap.mmap | None = mapping
        self.header = header

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        config: ModelConfig,
        *,
        checkpoint_policy: str = "all",
        checkpoint_interval: int = 0,
        scheduler: SchedulerState | None = None,
    ) -> StateFile:
        """Create (or truncate) ``path`` as a sparse state file for ``config``.

        Raises:
            OSError: the file cannot be created, sized or mapped.
        """
        path = os.fspath(path)
        header = StateHeader(
            config=config,
            checkpoint_policy=checkpoint_policy,
            checkpoint_interval=checkpoint_interval,
            scheduler=scheduler or SchedulerState(),
            layout=Layout.for_dims(config.dims),
        )
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, header.layout.total_size)  # type: ignore[union-attr]
            mapping = mmap.mmap(fd, header.layout.total_size)  # type: ignore[union-attr]
        except BaseException:
            os.close(fd)
            raise
        state = cls(path, fd, mapping, header)
        state.write_header(header)
        return state

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> StateFile:
        """Open an existing state file (after an ``exec()`` restart).

        Raises:
            StateFileError: the file is smaller than the header, its sentinel or version is
                wrong, it is truncated, or its header is corrupt; the message says which, with
                the values.
            OSError: it cannot be opened or mapped (e.g. ``FileNotFoundError``).
        """
        path = os.fspath(path)
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_BYTES:
                raise StateFileError(
                    f"state file {path} is {size} bytes, smaller than its {HEADER_BYTES}-byte"
                    " header"
                )
            raw = os.pread(fd, HEADER_BYTES, 0)
            sentinel, version = struct.unpack_from("<II", raw)
            if sentinel != SENTINEL or version != VERSION:
                raise StateFileError(
                    f"state file {path} is not a pipeline state file: sentinel 0x{sentinel:08X}"
                    f" (expected 0x{SENTINEL:08X} 'ANEP'), version {version} (expected {VERSION})"
                )
            (total,) = struct.unpack_from("<Q", raw, _STRUCT.size - 8)
            if total > size:
                raise StateFileError(
                    f"state file {path} is truncated: expected {total} bytes, got {size}"
                )
            header = _decode(path, raw)
            mapping = mmap.mmap(fd, header.layout.total_size)  # type: ignore[union-attr]
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, mapping, header)

    def __enter__(self) -> StateFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _mapping(self) -> mmap.mmap:
        if self._map is None:
            raise ValueError(f"state file {self.path} is closed")
        return self._map

    def write_header(self, header: StateHeader) -> None:
        """Replace the header (same model and layout) and flush it to the file.

        Raises:
            ValueError: the file is closed, or ``header`` describes another model's layout.
        """
        layout = Layout.for_dims(header.config.dims)
        if self.header.layout != layout:
            raise ValueError(
                f"write_header: the header's model needs layout {layout}, the file has"
                f" {self.header.layout}"
            )
        header = dataclasses.replace(header, layout=layout)
        mapping = self._mapping()
        mapping[:HEADER_BYTES] = header.pack()
        mapping.flush(0, HEADER_BYTES)
        self.header = header

    def _region(self, what: str, layer: int) -> np.ndarray:
        n_layers = self.header.config.dims.n_layers
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError(f"layer must be an int, got {type(layer).__name__} {layer!r}")
        if not 0 <= layer < n_layers:
            raise IndexError(f"{what}({layer}): expected a layer in 0 .. {n_layers - 1}")
        offset_field, layer_bytes = _REGIONS[what]
        per_layer = layer_bytes(self.header.config.dims)
        start = getattr(self.header.layout, offset_field) + layer * per_layer
        return np.frombuffer(self._mapping(), np.float32, per_layer // FLOAT32_BYTES, offset=start)

    def layer_weights(self, layer: int) -> np.ndarray:
        """Layer ``layer``'s weights as a writable float32 view of the file.

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
        return np.frombuffer(
            self._mapping(),
            np.float32,
            (layout.total_size - layout.global_) // FLOAT32_BYTES,
            offset=layout.global_,
        )

    def close(self) -> None:
        """Flush and unmap the file and close it (it stays on disk). Idempotent.

        Raises:
            ValueError: an array returned by an accessor is still alive (it points into the
                mapping); the file stays open and usable.
        """
        if self._map is None:
            return
        mapping = self._map
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
