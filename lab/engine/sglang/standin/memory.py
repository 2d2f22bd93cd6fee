"""LAB STAND-IN: the numbers in the start-up memory log lines, from a simulated GPU.

This is the stand-in's own small approximation, not SGLang's allocator and not the planner's memory
model (dflash_infra is not installed in the container). It follows the shape of SGLang 0.5.23:
static pool = mem_fraction_static * GPU memory (the memory_hook.py heuristic when the flag is unset),
rest = free memory after weights - GPU * (1 - fraction); hybrid (gated-deltanet) models give the mamba
pool rest * r/(1+r) (r = --mamba-full-memory-ratio) with per-draft-token SSM scratch; the KV pool takes
the remainder at target + drafter bytes per token. Weights are estimated from config.json. "GB" in
the log lines is GiB, as in SGLang's get_available_gpu_memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 1 << 30
MIB = 1 << 20
CUDA_CONTEXT_MIB = 532  # what a CUDA context takes before any tensor (stand-in constant)
MAMBA_SLOTS_PER_REQUEST = 3  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO in 0.5.23
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8_e4m3": 1,
               "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}
TORCH_DTYPES = {"bfloat16": "torch.bfloat16", "float16": "torch.float16", "half": "torch.float16",
                "float32": "torch.float32", "fp8_e4m3": "torch.float8_e4m3fn", "fp8_e5m2": "torch.float8_e5m2"}


def not_enough_memory(mem_fraction_static: float | None) -> RuntimeError:
    """The RuntimeError SGLang's pool configurator raises when the KV pool would be empty."""
    msg = "Not enough memory. Please try to increase --mem-fraction-static."
    if mem_fraction_static is not None:
        msg += f" Current value: mem_fraction_static={mem_fraction_static}"
    return RuntimeError(msg)


@dataclass(frozen=True)
class Capacity:
    """chunked_prefill_size and decode CUDA-graph max batch for a GPU size (memory_hook.py buckets)."""

    chunked_prefill_size: int
    cuda_graph_max_bs: int


def capacity(gpu_mib: int, tp: int) -> Capacity:
    """The engine's defaults for a GPU of gpu_mib MiB at this TP size."""
    if gpu_mib < 20 * 1024:
        return Capacity(2048, 8)
    if gpu_mib < 35 * 1024:
        return Capacity(4096, 48 if tp < 4 else 160)
    if gpu_mib < 60 * 1024:
        return Capacity(4096, 32 if tp < 4 else 160)
    if gpu_mib < 160 * 1024:
        return Capacity(8192, 256 if tp < 4 else 512)
    return Capacity(16384, 512)


def prefill_graph_count(max_tokens: int) -> int:
    """How many prefill CUDA-graph token sizes the engine captures up to max_tokens."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_tokens + 1, 512)))
    return sum(1 for s in sizes if s <= max_tokens)


def default_mem_fraction(gpu_mib: int, tp: int, chunked: int, graph_bs: int) -> float:
    """The memory_hook.py heuristic when --mem-fraction-static is unset."""
    reserved = 512 + 1.5 * max(chunked, 2048) + tp / 8 * 1024 + 2 * graph_bs + 8 * prefill_graph_count(chunked)
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of a (possibly vision-language) config."""
    return config.get("text_config") or config


def model_dtype(config: dict[str, Any]) -> str:
    """The checkpoint dtype name (bfloat16 when the config does not say)."""
    text = text_config(config)
    return str(text.get("dtype") or text.get("torch_dtype") or config.get("torch_dtype") or "bfloat16")


def layer_kinds(config: dict[str, Any]) -> tuple[int, int]:
    """(full-attention layers, linear-attention layers); sliding layers count as attention."""
    text = text_config(config)
    layers = int(text.get("num_hidden_layers", 0))
    types = text.get("layer_types") or []
    linear = sum(1 for t in types if t == "linear_attention")
    return layers - linear, linear


def estimate_params(config: dict[str, Any], with_embeddings: bool = True) -> int:
    """Parameter count from config.json: embeddings, attention (full and linear) and MLP blocks."""
    t = text_config(config)
    h = int(t.get("hidden_size", 0))
    inter = int(t.get("intermediate_size", 0))
    heads = int(t.get("num_attention_heads", 1))
    kv = int(t.get("num_key_value_heads", heads))
    hd = int(t.get("head_dim") or (h // max(heads, 1)))
    full, linear = layer_kinds(config)
    q_factor = 2 if t.get("attn_output_gate") else 1
    full_attn = h * heads * hd * q_factor + 2 * h * kv * hd + heads * hd * h
    lk, lv = int(t.get("linear_num_key_heads", 0)), int(t.get("linear_num_value_heads", 0))
    dk, dv = int(t.get("linear_key_head_dim", 0)), int(t.get("linear_value_head_dim", 0))
    conv_k = int(t.get("linear_conv_kernel_dim", 4))
    lin_attn = 2 * h * lk * dk + 2 * h * lv * dv + lv * dv * h + 2 * h * lv + (2 * lk * dk + lv * dv) * conv_k
    mlp = 3 * h * inter
    params = full * (full_attn + mlp) + linear * (lin_attn + mlp)
    if with_embeddings:
        vocab = int(t.get("vocab_size", config.get("vocab_size", 0)))
        tied = bool(t.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
        params += vocab * h * (1 if tied else 2)
    return params


def kv_bytes_per_token(config: dict[str, Any], tp: int, dtype_bytes: int) -> int:
    """K+V bytes per token per GPU over the attention layers (KV heads replicated when tp > heads)."""
    t = text_config(config)
    heads = int(t.get("num_attention_heads", 1))
    kv = int(t.get("num_key_value_heads", heads))
    hd = int(t.get("head_dim") or (int(t.get("hidden_size", 0)) // max(heads, 1)))
    full, _ = layer_kinds(config)
    return full * 2 * max(kv // tp, 1) * hd * dtype_bytes


def mamba_state_bytes(config: dict[str, Any], tp: int, ssm_dtype_bytes: int, conv_dtype_bytes: int) -> tuple[int, int]:
    """(conv state, ssm state) bytes of one request slot per GPU over all linear-attention layers."""
    t = text_config(config)
    _, linear = layer_kinds(config)
    lk, lv = int(t.get("linear_num_key_heads", 0)), int(t.get("linear_num_value_heads", 0))
    dk, dv = int(t.get("linear_key_head_dim", 0)), int(t.get("linear_value_head_dim", 0))
    conv_k = int(t.get("linear_conv_kernel_dim", 4))
    conv = (2 * lk * dk + lv * dv) // tp * (conv_k - 1) * conv_dtype_bytes
    ssm = max(lv // tp, 1) * dk * dv * ssm_dtype_bytes
    return linear * conv, linear * ssm


@dataclass(frozen=True)
class Inputs:
    """What the simulation needs: the GPU, the parallelism, the flags and both model configs."""

    gpu_mib: int
    gpu_used_mib: int
    tp: int
    mem_fraction_static: float | None
    target_config: dict[str, Any]
    draft_config: dict[str, Any] | None
    num_draft_tokens: int
    max_running_requests: int | None
    mamba_full_memory_ratio: float
    mamba_ssm_dtype: str | None
    kv_cache_dtype: str | None
    chunked_prefill_size: int | None
    cuda_graph_max_bs: int | None


@dataclass(frozen=True)
class Startup:
    """Per-GPU memory figures (GiB unless named otherwise) in the order the engine logs them."""

    mem_fraction_static: float
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    kv_dtype: str
    model_dtype: str
    avail_begin: float
    target_weights: float
    draft_weights: float
    mamba_slots: int
    conv_state: float
    ssm_state: float
    intermediate_ssm: float
    intermediate_conv: float
    hybrid: bool
    kv_tokens: int
    k_size: float
    v_size: float
    draft_k_size: float
    draft_v_size: float
    graph_usage: float
    max_running_requests: int

    @property
    def after_target_weights(self) -> float:
        return self.avail_begin - self.target_weights

    @property
    def after_draft_weights(self) -> float:
        return self.after_target_weights - self.draft_weights

    @property
    def mamba_total(self) -> float:
        return self.conv_state + self.ssm_state + self.intermediate_ssm + self.intermediate_conv

    @property
    def after_target_pool(self) -> float:
        return self.after_draft_weights - self.mamba_total - self.k_size - self.v_size

    @property
    def after_draft_pool(self) -> float:
        return self.after_target_pool - self.draft_k_size - self.draft_v_size

    @property
    def after_graphs(self) -> float:
        return self.after_draft_pool - self.graph_usage

    def used_mib(self, gpu_mib: int, gpu_used_mib: int) -> int:
        """Memory this process holds per GPU, as nvidia-smi would list it."""
        return round(gpu_mib - gpu_used_mib - self.after_graphs * 1024)


def simulate(i: Inputs) -> Startup:
    """The stand-in's start-up memory figures for one GPU of the deployment."""
    cap = capacity(i.gpu_mib, i.tp)
    chunked = i.chunked_prefill_size or cap.chunked_prefill_size
    graph_bs = i.cuda_graph_max_bs or cap.cuda_graph_max_bs
    fraction = i.mem_fraction_static or default_mem_fraction(i.gpu_mib, i.tp, chunked, graph_bs)
    total = i.gpu_mib / 1024
    avail_begin = (i.gpu_mib - i.gpu_used_mib - CUDA_CONTEXT_MIB) / 1024

    mdtype = model_dtype(i.target_config)
    wbytes = DTYPE_BYTES.get(mdtype, 2)
    target_w = estimate_params(i.target_config) * wbytes / i.tp / GIB
    draft_w = (estimate_params(i.draft_config, with_embeddings=False) * wbytes / i.tp / GIB
               if i.draft_config else 0.0)
    kv_dtype = mdtype if i.kv_cache_dtype in (None, "auto") else str(i.kv_cache_dtype)
    kv_bytes = DTYPE_BYTES.get(kv_dtype, 2)

    rest = avail_begin - target_w - draft_w - total * (1 - fraction)
    _full, linear = layer_kinds(i.target_config)
    running = i.max_running_requests
    conv = ssm = inter_ssm = inter_conv = 0.0
    slots = 0
    if linear:
        tdtype = text_config(i.target_config)
        ssm_dtype = i.mamba_ssm_dtype or str(tdtype.get("mamba_ssm_dtype") or "float32")
        conv_b, ssm_b = mamba_state_bytes(i.target_config, i.tp, DTYPE_BYTES.get(ssm_dtype, 4), wbytes)
        per_req = conv_b + ssm_b
        budget = max(rest, 0.0) * GIB * i.mamba_full_memory_ratio / (1 + i.mamba_full_memory_ratio)
        d = i.num_draft_tokens if i.draft_config else 0
        if d:
            slots = int((budget - per_req * (1 + d)) // (per_req * (1 + d / MAMBA_SLOTS_PER_REQUEST)))
        else:
            slots = int((budget - per_req) // per_req)
        slots = max(slots, 0)
        limit = slots // MAMBA_SLOTS_PER_REQUEST
        running = min(running, limit) if running else limit
        conv, ssm = (slots + 1) * conv_b / GIB, (slots + 1) * ssm_b / GIB
        if d:
            inter_ssm = (running + 1) * d * ssm_b / GIB
            inter_conv = (running + 1) * d * conv_b / GIB
    kv_rest = rest - (conv + ssm + inter_ssm + inter_conv)
    per_token = kv_bytes_per_token(i.target_config, i.tp, kv_bytes)
    draft_per_token = kv_bytes_per_token(i.draft_config, i.tp, kv_bytes) if i.draft_config else 0
    tokens = int(kv_rest * GIB // max(per_token + draft_per_token, 1)) if kv_rest > 0 else 0
    if running is None:
        running = max(1, min(4096, tokens // 2))
    return Startup(
        mem_fraction_static=fraction, chunked_prefill_size=chunked, cuda_graph_max_bs=graph_bs,
        kv_dtype=TORCH_DTYPES.get(kv_dtype, f"torch.{kv_dtype}"),
        model_dtype=TORCH_DTYPES.get(mdtype, f"torch.{mdtype}"),
        avail_begin=avail_begin, target_weights=target_w, draft_weights=draft_w,
        mamba_slots=slots, conv_state=conv, ssm_state=ssm, intermediate_ssm=inter_ssm, intermediate_conv=inter_conv,
        hybrid=bool(linear), kv_tokens=tokens,
        k_size=tokens * per_token / 2 / GIB, v_size=tokens * per_token / 2 / GIB,
        draft_k_size=tokens * draft_per_token / 2 / GIB, draft_v_size=tokens * draft_per_token / 2 / GIB,
        graph_usage=0.35 + 0.004 * graph_bs, max_running_requests=int(running),
    )
