"""Model presets and their memory and FLOP estimates (the ANE pipeline seed's ``model_config.h``).

Everything here is arithmetic on frozen values: a :class:`ModelDims` (the transformer's shape), a
:class:`CompileConfig` (the ANE's per-process compile budget) and a :class:`ModelConfig` (both,
with a name). Byte counts are float32 (4 bytes per element); FLOPs count one multiply-add as two.
Source: ``../shared/seeds/ane-pipeline-and-checkpointing.txt`` and issue 12's "Facts to build from".
"""

from __future__ import annotations

import dataclasses
import numbers

from .._checks import FLOAT32_BYTES, check_int
from ..checkpoint import DEFAULT_HEADROOM

__all__ = [
    "FLOAT32_BYTES",
    "PRESETS",
    "CompileConfig",
    "ModelConfig",
    "ModelDims",
    "ane_flops_per_step",
    "flops_per_step",
    "global_bytes",
    "layer_activation_bytes",
    "layer_adam_bytes",
    "layer_gradient_bytes",
    "layer_weight_bytes",
    "total_model_bytes",
]


@dataclasses.dataclass(frozen=True)
class ModelDims:
    """A transformer's shape (the seed's ``ModelDims``). All fields are element counts.

    Attributes:
        dim: model width D (embedding and residual stream).
        hidden_dim: FFN width H.
        n_heads: attention heads; >= 1 (the seed divided by it unchecked, then guarded 0 by
            returning ``head_dim = 0``; we reject it instead).
        n_kv_heads: key/value heads (== ``n_heads`` for multi-head attention).
        n_layers: transformer layers N.
        vocab_size: vocabulary V.
        seq_len: sequence length S.

    Derived (properties): ``head_dim = dim // n_heads``, ``kv_dim = head_dim * n_kv_heads``,
    ``score_ch = n_heads * seq_len`` (attention-score channels of SDPA backward).

    Raises:
        TypeError: a field is not an int.
        ValueError: a field is < 1; the message names it.
    """

    dim: int
    hidden_dim: int
    n_heads: int
    n_kv_heads: int
    n_layers: int
    vocab_size: int
    seq_len: int

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            check_int(field.name, getattr(self, field.name), 1)

    @property
    def head_dim(self) -> int:
        """``dim // n_heads`` (elements per head)."""
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        """``head_dim * n_kv_heads``."""
        return self.head_dim * self.n_kv_heads

    @property
    def score_ch(self) -> int:
        """``n_heads * seq_len``."""
        return self.n_heads * self.seq_len


@dataclasses.dataclass(frozen=True)
class CompileConfig:
    """The ANE compile budget of one process (the seed's ``CompileConfig``).

    The ANE compiles at most ``compile_budget`` kernels per process; a group of layers that does
    not fit what is left needs an ``exec()`` restart first.

    Attributes:
        compile_budget: kernels one process may compile (119 on the seed's hardware); >= 1.
        kernels_per_layer: weight-bearing kernels per layer (5); >= 0.
        static_per_layer: weight-free kernels per layer (1: ``sdpaBwd2``); >= 0.
        accum_steps: forward+backward passes accumulated per weight update; >= 1.
        headroom_pct: the fraction of the budget kept in reserve. Used only when
            ``0 < headroom_pct < 1`` in float32; anything else (0, negative, 1 or more, NaN)
            means the default 0.10, as in the seed.

    Raises:
        TypeError: an integer field is not an int, or ``headroom_pct`` is not a real number.
        ValueError: an integer field is below its minimum; the message names it.
    """

    compile_budget: int = 119
    kernels_per_layer: int = 5
    static_per_layer: int = 1
    accum_steps: int = 10
    headroom_pct: float = DEFAULT_HEADROOM

    def __post_init__(self) -> None:
        check_int("compile_budget", self.compile_budget, 1)
        check_int("kernels_per_layer", self.kernels_per_layer, 0)
        check_int("static_per_layer", self.static_per_layer, 0)
        check_int("accum_steps", self.accum_steps, 1)
        if isinstance(self.headroom_pct, bool) or not isinstance(self.headroom_pct, numbers.Real):
            raise TypeError(
                f"headroom_pct must be a real number, got {type(self.headroom_pct).__name__}"
                f" {self.headroom_pct!r}"
            )

    @property
    def kernels_per_layer_total(self) -> int:
        """``kernels_per_layer + static_per_layer``: what one layer costs to compile."""
        return self.kernels_per_layer + self.static_per_layer


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A named model: its shape and its compile budget (the seed's ``ModelConfig``).

    Attributes:
        name: the human-readable name (``"LLaMA-7B"``).
        dims: the shape.
        compile: the compile budget.
        preset: the preset key it came from (``"llama7b"``), or ``""`` for a custom model.
    """

    name: str
    dims: ModelDims
    compile: CompileConfig
    preset: str = ""

    def with_overrides(
        self,
        *,
        n_layers: int | None = None,
        compile_budget: int | None = None,
        headroom_pct: float | None = None,
    ) -> ModelConfig:
        """A copy with some fields replaced (``None`` keeps a field). Raises as the fields do."""
        dims = self.dims
        if n_layers is not None:
            dims = dataclasses.replace(dims, n_layers=n_layers)
        compile_ = self.compile
        if compile_budget is not None:
            compile_ = dataclasses.replace(compile_, compile_budget=compile_budget)
        if headroom_pct is not None:
            compile_ = dataclasses.replace(compile_, headroom_pct=headroom_pct)
        return dataclasses.replace(self, dims=dims, compile=compile_)


def _preset(key: str, name: str, *shape: int, accum_steps: int) -> ModelConfig:
    dim, hidden, heads, kv_heads, layers, vocab, seq = shape
    return ModelConfig(
        name=name,
        dims=ModelDims(dim, hidden, heads, kv_heads, layers, vocab, seq),
        compile=CompileConfig(accum_steps=accum_steps),
        preset=key,
    )


PRESETS: dict[str, ModelConfig] = {
    "stories42m": _preset(
        "stories42m", "Stories42M", 512, 1376, 8, 8, 8, 32000, 256, accum_steps=10
    ),
    "stories110m": _preset(
        "stories110m", "Stories110M", 768, 2048, 12, 12, 12, 32000, 256, accum_steps=10
    ),
    "llama1b": _preset("llama1b", "LLaMA-1.1B", 2048, 5504, 16, 16, 22, 32000, 512, accum_steps=4),
    "llama7b": _preset("llama7b", "LLaMA-7B", 4096, 11008, 32, 32, 32, 32000, 512, accum_steps=2),
}
"""The seed's four presets by CLI key; ``stories110m`` is the default model."""

DEFAULT_PRESET = "stories110m"


# -- memory (bytes) ------------------------------------------------------------------------------


def layer_weight_bytes(dims: ModelDims) -> int:
    """One layer's weights: ``4*D^2 + 3*H*D + 2*D`` floats (Wq, Wk, Wv, Wo; W1, W2, W3; two
    RMSNorm vectors), in bytes. ``n_kv_heads`` is not used (multi-head attention)."""
    d, h = dims.dim, dims.hidden_dim
    return (4 * d * d + 3 * h * d + 2 * d) * FLOAT32_BYTES


def layer_adam_bytes(dims: ModelDims) -> int:
    """One layer's Adam state (m and v): twice its weights, in bytes."""
    return 2 * layer_weight_bytes(dims)


def layer_gradient_bytes(dims: ModelDims) -> int:
    """One layer's gradient accumulators: the same layout as its weights, in bytes."""
    return layer_weight_bytes(dims)


def layer_activation_bytes(dims: ModelDims) -> int:
    """One layer's activations kept for backward: ``10*D*S + 3*H*S`` floats, in bytes
    (layer input, norms, Q, K, V, attention and projection outputs: ``9*D*S``; ``h1``, ``h3``,
    SiLU: ``3*H*S``; FFN output: ``D*S``)."""
    d, h, s = dims.dim, dims.hidden_dim, dims.seq_len
    return (10 * d * s + 3 * h * s) * FLOAT32_BYTES


def global_bytes(dims: ModelDims) -> int:
    """The global tensors: the final RMSNorm and the embeddings, with their Adam states and
    gradients: ``16*D*(V+1)`` bytes."""
    return 16 * dims.dim * (dims.vocab_size + 1)


def total_model_bytes(config: ModelConfig) -> int:
    """All training state: ``n_layers * (W + 2W + W + A) + global`` bytes (weights, Adam,
    gradients and activations of every layer, plus :func:`global_bytes`)."""
    d = config.dims
    per_layer = (
        layer_weight_bytes(d)
        + layer_adam_bytes(d)
        + layer_gradient_bytes(d)
        + layer_activation_bytes(d)
    )
    return d.n_layers * per_layer + global_bytes(d)


# -- compute (FLOPs per training step) ------------------------------------------------------------


def _forward_flops(dims: ModelDims) -> int:
    d, h, s = dims.dim, dims.hidden_dim, dims.seq_len
    return dims.n_layers * (8 * d * d * s + 6 * d * h * s)


def _sdpa_flops(dims: ModelDims) -> int:
    s = dims.seq_len
    return dims.n_layers * 2 * dims.n_heads * 5 * s * s * dims.head_dim


def flops_per_step(config: ModelConfig) -> int:
    """FLOPs of one forward+backward pass: ``3*fwd + sdpa + cls``, where
    ``fwd = N*(8*D^2*S + 6*D*H*S)`` (forward, backward-dx and backward-dW cost the same),
    ``sdpa = N*2*n_heads*5*S^2*head_dim`` and ``cls = 6*V*D*S`` (the classifier)."""
    d = config.dims
    cls = 6 * d.vocab_size * d.dim * d.seq_len
    return 3 * _forward_flops(d) + _sdpa_flops(d) + cls


def ane_flops_per_step(config: ModelConfig) -> int:
    """The part of :func:`flops_per_step` that runs on the ANE: ``2*fwd + sdpa`` (the weight
    gradients and the classifier run on the CPU)."""
    d = config.dims
    return 2 * _forward_flops(d) + _sdpa_flops(d)


def human_bytes(nbytes: int) -> str:
    """``nbytes`` in binary units with one decimal: ``"151.6 MiB"``, ``"3.2 GiB"``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
