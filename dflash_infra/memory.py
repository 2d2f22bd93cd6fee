"""GPU memory model: SGLang's own start-up reservation logic, plus what it leaves out for a DFlash deployment.

The engine part mirrors `sglang/srt/arg_groups/memory_hook.py` (handle_gpu_memory_settings,
reserve_for_graph_mb, adjust_mem_fraction_for_vlm) and the hybrid-model mamba pool sizing of
`mem_cache/kv_cache_configurator.py` in SGLang 0.5.23. The planner then adds the draft worker's own
CUDA graphs and activations, and carves drafter weights, the draft KV pool and the speculative SSM
scratch out of the static pool, which the engine heuristic does not plan for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dflash_infra.models import ModelSpec

MIB = 1024 * 1024
GIB_MIB = 1024


@dataclass(frozen=True)
class CapacityDefaults:
    """chunked_prefill_size and decode CUDA-graph max batch the engine picks for a GPU size."""

    chunked_prefill_size: int
    cuda_graph_max_bs: int


def capacity_defaults(gpu_mib: int, tp: int) -> CapacityDefaults:
    """The GPU-memory buckets of handle_gpu_memory_settings (0.5.23)."""
    if gpu_mib < 20 * 1024:
        return CapacityDefaults(2048, 8)
    if gpu_mib < 35 * 1024:
        return CapacityDefaults(4096, 48 if tp < 4 else 160)
    if gpu_mib < 60 * 1024:
        return CapacityDefaults(4096, 32 if tp < 4 else 160)
    if gpu_mib < 160 * 1024:
        return CapacityDefaults(8192, 256 if tp < 4 else 512)
    return CapacityDefaults(16384, 512)


def prefill_graph_sizes(max_bs: int) -> list[int]:
    """Token counts captured as prefill CUDA graphs (generate_prefill_cuda_graph_batch_sizes)."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1024 + 1, 64))
        + list(range(1280, 4096 + 1, 256))
        + list(range(4608, max_bs + 1, 512))
    )
    return [s for s in sizes if s <= max_bs]


def engine_reserved_mib(gpu_mib: int, tp: int, chunked_prefill_size: int, cuda_graph_max_bs: int,
                        pp: int = 1) -> float:
    """Activations + CUDA graph buffers the engine keeps outside the static pool (MiB)."""
    reserved = 512.0
    reserved += max(chunked_prefill_size, 2048) * 1.5
    reserved += tp * pp / 8 * 1024
    reserved += cuda_graph_max_bs * 2
    reserved += len(prefill_graph_sizes(chunked_prefill_size)) * 8
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return reserved


def engine_fraction(gpu_mib: int, engine_reserved: float, vlm_factor: float) -> float:
    """--mem-fraction-static as SGLang 0.5.23 picks it when unset (_handle_gpu_memory_settings): the share left
    after its reserve, rounded to three places, then shrunk by the VLM factor."""
    return round((gpu_mib - engine_reserved) / gpu_mib, 3) * vlm_factor


def vlm_fraction_factor(model: ModelSpec) -> float:
    """adjust_mem_fraction_for_vlm: shrink the static fraction for the vision encoder's working set."""
    if not model.multimodal or not model.vision:
        return 1.0
    layers = int(model.vision.get("num_hidden_layers", 24))
    hidden = int(model.vision.get("hidden_size", 1024))
    ratio = layers * hidden**2 / (24 * 1024**2)
    adjustment = max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))
    return 0.95 * adjustment


def draft_worker_reserved_mib(cuda_graph_max_bs: int) -> float:
    """The planner's allowance for the draft worker's own CUDA graphs and activations (MiB).

    Mirrors the engine's constant + per-batch graph terms for a second model in the same process;
    the deploy compares it with the engine's measured memory lines and warns on drift. Measured on an
    H200 (tests/fixtures/nvidia/h200-device-run/overhead.json): CUDA context + cuBLAS take 783 MiB per
    process, more than the engine's 512 MiB constant; this allowance's own 512 MiB covers the difference.
    """
    return 512.0 + cuda_graph_max_bs * 2


@dataclass(frozen=True)
class MambaPool:
    """Hybrid-model state pool of SGLang 0.5.23: slots, request limit and bytes (per GPU)."""

    slots: int
    max_requests: int
    state_bytes: int
    scratch_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.scratch_bytes


def verify_activation_mib(graph_bs: int, verify_tokens: int, chunked_prefill_size: int) -> float:
    """Activations of the largest verify CUDA graph beyond what the engine's activation reserve covers (MiB).

    The verify graphs run graph_bs x verify_tokens tokens; the engine reserves 1.5 MiB per token for
    max(chunked_prefill_size, 2048) tokens (memory_hook, 0.5.23), which covers the verify pass unless
    that is larger.
    """
    tokens = graph_bs * verify_tokens
    return max(tokens - max(chunked_prefill_size, 2048), 0) * 1.5


def decode_kv_reserve_tokens(running_requests: int, verify_tokens: int) -> int:
    """KV slots a decode step keeps free for the running requests.

    SGLang 0.5.23 `get_alloc_reserve_per_decode`: twice the KV one request allocates per step, which is
    max(steps x topk, draft tokens) = the verify tokens for DFLASH and DDTree (page size 1 or topk 1),
    and 1 without speculative decoding.
    """
    return running_requests * 2 * max(verify_tokens, 1)


def mamba_pool(rest_bytes: float, per_req: int, full_memory_ratio: float, verify_tokens: int,
               slots_per_request: int, max_running_requests: int) -> MambaPool:
    """Joint solve of persistent state slots and speculative scratch, as kv_cache_configurator does.

    Budget = rest * r / (1 + r); with speculative decoding each slot also prices verify_tokens/ratio
    scratch states (one intermediate SSM state per verified token), and the scratch is sized for the
    requests that can actually run.
    """
    if per_req <= 0:
        return MambaPool(0, max_running_requests, 0, 0)
    budget = rest_bytes * full_memory_ratio / (1 + full_memory_ratio)
    d = verify_tokens
    if d > 0:
        slots = int((budget - per_req * (1 + d)) // (per_req * (1 + d / slots_per_request)))
    else:
        slots = int((budget - per_req) // per_req)
    slots = max(slots, 0)
    running = min(max_running_requests, slots // slots_per_request)
    scratch = per_req * (running + 1) * d if d > 0 else 0
    return MambaPool(slots, running, (slots + 1) * per_req, scratch)


def round_down(value: float, places: int = 3) -> float:
    """Round toward zero so a fraction never promises more memory than computed."""
    factor: int = 10**places
    return math.floor(value * factor) / factor
