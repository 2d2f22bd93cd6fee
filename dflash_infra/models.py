"""Model shapes read from a Hugging Face config.json: heads, layers, cache bytes and weight sizes.

Only the facts the planner needs are extracted, so that a new model family is one small change here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DTYPE_BYTES: dict[str, int] = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "fp8": 1,
    "float8_e4m3fn": 1,
}

DFLASH_ARCHITECTURES = ("DFlashDraftModel", "DFlash2DraftModel")


class ModelConfigError(ValueError):
    """A config.json lacks a field the planner needs, or holds a value of the wrong kind."""


def dtype_bytes(name: str | None, default: int = 2) -> int:
    """Bytes per element of a torch dtype name such as 'bfloat16'; the default for unknown names."""
    if not name:
        return default
    return DTYPE_BYTES.get(str(name).removeprefix("torch."), default)


@dataclass(frozen=True)
class LinearAttention:
    """Gated-DeltaNet (mamba-like) layer shape: state sizes per request."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    ssm_dtype: str

    def state_bytes_per_layer(self, tp: int, ssm_dtype: str | None = None, conv_bytes: int = 2) -> int:
        """Conv state plus recurrent SSM state of one layer for one request on one TP rank."""
        conv_dim = (2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim) // tp
        conv = conv_dim * (self.conv_kernel - 1) * conv_bytes
        ssm = (self.num_value_heads // tp) * self.key_head_dim * self.value_head_dim
        return conv + ssm * dtype_bytes(ssm_dtype or self.ssm_dtype, 4)


@dataclass(frozen=True)
class ModelSpec:
    """The shape of one model as the planner sees it."""

    name: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    dtype: str
    max_position_embeddings: int
    layer_types: tuple[str, ...]
    tie_word_embeddings: bool
    linear: LinearAttention | None = None
    multimodal: bool = False
    vision: Mapping[str, Any] = field(default_factory=dict)
    moe: Mapping[str, int] = field(default_factory=dict)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_hybrid(self) -> bool:
        return self.linear is not None and self.num_linear_layers > 0

    @property
    def is_dflash_drafter(self) -> bool:
        return self.architecture in DFLASH_ARCHITECTURES

    @property
    def num_linear_layers(self) -> int:
        return sum(1 for t in self.layer_types if t == "linear_attention")

    @property
    def num_kv_layers(self) -> int:
        """Layers that keep a KV cache (full or sliding-window attention)."""
        return sum(1 for t in self.layer_types if t != "linear_attention")

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads on one TP rank; replicated when tp exceeds the KV head count."""
        return max(1, self.num_kv_heads // tp)

    def kv_bytes_per_token(self, tp: int, kv_dtype_bytes: int | None = None) -> int:
        """K and V bytes one token occupies on one TP rank, over all attention layers."""
        elem = kv_dtype_bytes or dtype_bytes(self.dtype)
        return self.num_kv_layers * 2 * self.kv_heads_per_rank(tp) * self.head_dim * elem

    def mamba_state_bytes_per_request(self, tp: int, ssm_dtype: str | None = None) -> int:
        """Persistent linear-attention state of one request slot on one TP rank (0 for non-hybrid models)."""
        if not self.is_hybrid or self.linear is None:
            return 0
        return self.num_linear_layers * self.linear.state_bytes_per_layer(tp, ssm_dtype)

    def tp_problems(self, tp: int) -> list[str]:
        """Why this model cannot be split over `tp` ranks (empty when it can)."""
        problems = []
        if self.num_attention_heads % tp:
            problems.append(f"{self.name}: {self.num_attention_heads} attention heads are not divisible by tp {tp}")
        if tp <= self.num_kv_heads and self.num_kv_heads % tp:
            problems.append(f"{self.name}: {self.num_kv_heads} KV heads are not divisible by tp {tp}")
        if tp > self.num_kv_heads and tp % self.num_kv_heads:
            problems.append(
                f"{self.name}: tp {tp} exceeds its {self.num_kv_heads} KV heads and is not a multiple of them "
                "(KV heads can only be replicated evenly)"
            )
        if self.is_hybrid and self.linear is not None:
            for label, heads in (("linear-attention key", self.linear.num_key_heads),
                                 ("linear-attention value", self.linear.num_value_heads)):
                if heads % tp:
                    problems.append(f"{self.name}: {heads} {label} heads are not divisible by tp {tp}")
        return problems

    def estimated_parameters(self) -> int:
        """Parameter count from the shapes, for when no safetensors index gives the byte total."""
        h, layers = self.hidden_size, self.num_layers
        attn = h * self.num_attention_heads * self.head_dim * 2 + h * self.num_kv_heads * self.head_dim * 2
        linear = 0
        if self.linear is not None:
            lin = self.linear
            key_dim, value_dim = lin.num_key_heads * lin.key_head_dim, lin.num_value_heads * lin.value_head_dim
            linear = h * (2 * key_dim + 2 * value_dim) + value_dim * h + (2 * key_dim + value_dim) * lin.conv_kernel
        if self.moe:
            experts = self.moe["num_experts"] * 3 * h * self.moe["moe_intermediate_size"]
            shared = 3 * h * self.moe.get("shared_expert_intermediate_size", 0)
            mlp = experts + shared + h * self.moe["num_experts"]
        else:
            mlp = 3 * h * self.intermediate_size
        mixers = self.num_linear_layers * linear + self.num_kv_layers * attn
        per_layer_norms = 2 * h * layers
        if self.is_dflash_drafter:
            # The drafter borrows the target's embedding and LM head; it adds a projection of the
            # target's hidden states (one per tapped layer) into its own width.
            taps = len(self.raw.get("dflash_config", {}).get("target_layer_ids", []))
            return mixers + layers * mlp + per_layer_norms + taps * h * h + h
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return mixers + layers * mlp + per_layer_norms + embeddings + self.vision_parameters()

    def vision_parameters(self) -> int:
        """Rough ViT parameter count (12 * hidden^2 per block), 0 for text-only models."""
        if not self.vision:
            return 0
        hidden = int(self.vision.get("hidden_size", 0))
        depth = int(self.vision.get("depth", self.vision.get("num_hidden_layers", 0)))
        return 12 * hidden * hidden * depth

    def estimated_weight_bytes(self) -> int:
        return self.estimated_parameters() * dtype_bytes(self.dtype)


def _require(cfg: Mapping[str, Any], key: str, name: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ModelConfigError(f"{name} config.json: expected key '{key}', found none")
    return cfg[key]


def _layer_types(text: Mapping[str, Any], num_layers: int) -> tuple[str, ...]:
    """Per-layer mixer kinds; Qwen3-Next style configs give only full_attention_interval."""
    types = text.get("layer_types")
    if types:
        return tuple(str(t) for t in types)
    interval = text.get("full_attention_interval")
    if interval and "linear_num_key_heads" in text:
        return tuple("full_attention" if (i + 1) % int(interval) == 0 else "linear_attention"
                     for i in range(num_layers))
    return ("full_attention",) * num_layers


def model_spec(config: Mapping[str, Any], name: str = "model") -> ModelSpec:
    """Read a ModelSpec from a config.json dict; vision-language wrappers are read through text_config."""
    if not isinstance(config, Mapping):
        raise ModelConfigError(f"{name} config.json: expected a JSON object, found {type(config).__name__}")
    text: Mapping[str, Any] = config.get("text_config") or config
    archs = config.get("architectures") or ["unknown"]
    num_layers = int(_require(text, "num_hidden_layers", name))
    hidden = int(_require(text, "hidden_size", name))
    heads = int(_require(text, "num_attention_heads", name))
    layer_types = _layer_types(text, num_layers)
    if len(layer_types) != num_layers:
        raise ModelConfigError(
            f"{name} config.json: layer_types lists {len(layer_types)} layers, num_hidden_layers says {num_layers}"
        )
    linear = None
    if "linear_num_key_heads" in text:
        linear = LinearAttention(
            num_key_heads=int(text["linear_num_key_heads"]),
            num_value_heads=int(text["linear_num_value_heads"]),
            key_head_dim=int(text["linear_key_head_dim"]),
            value_head_dim=int(text["linear_value_head_dim"]),
            conv_kernel=int(text.get("linear_conv_kernel_dim", 4)),
            ssm_dtype=str(text.get("mamba_ssm_dtype", "float32")),
        )
    moe = {}
    if text.get("num_experts"):
        moe = {k: int(text.get(k) or 0) for k in ("num_experts", "moe_intermediate_size",
                                                  "shared_expert_intermediate_size")}
    dtype = text.get("dtype") or text.get("torch_dtype") or config.get("dtype") or config.get("torch_dtype")
    return ModelSpec(
        name=name,
        architecture=str(archs[0]),
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or hidden // heads),
        vocab_size=int(_require(text, "vocab_size", name)),
        intermediate_size=int(text.get("intermediate_size") or 4 * hidden),
        dtype=str(dtype or "bfloat16"),
        max_position_embeddings=int(text.get("max_position_embeddings") or 0),
        layer_types=layer_types,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        linear=linear,
        multimodal="vision_config" in config,
        vision=config.get("vision_config") or {},
        moe=moe,
        raw=config,
    )
