"""Steps 2 and 3 of a plan: the per-GPU memory of a TP size, then the settings the chosen one gives.

`layout` splits one GPU into the engine's reserve, the static pool, weights, the KV pool and the mamba
pool; the functions after it turn the chosen layout into the plan's memory settings and their reasons.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflash_infra import memory
from dflash_infra.models import ModelSpec
from dflash_infra.planning.notes import Notes
from dflash_infra.planning.request import Request

GIB = 1024**3
MIB = 1024**2

# Engine defaults the planner restates explicitly on the command line so its arithmetic holds.
ENGINE_MAX_RUNNING_SPEC = 48
MAMBA_FULL_MEMORY_RATIO = 0.9
MAMBA_SLOTS_PER_REQUEST = 3


@dataclass
class Layout:
    """Per-GPU memory of one candidate tensor-parallel size."""

    tp: int
    gpu_mib: int
    fraction: float
    engine_reserved_mib: float
    draft_reserved_mib: float
    vlm_factor: float
    weights_bytes: float
    kv_bytes: float
    mamba_bytes: float
    kv_bytes_per_token: int
    kv_tokens: int
    max_running: int
    mamba_slots: int
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    verify_tokens: int = 0  # tokens verified per running request and step (Speculative.verify_tokens)
    problems: list[str] = field(default_factory=list)

    @property
    def static_bytes(self) -> float:
        return self.fraction * self.gpu_mib * MIB

    @property
    def kv_reserved_tokens(self) -> int:
        """KV slots the running requests' decode steps keep free (memory.decode_kv_reserve_tokens)."""
        return memory.decode_kv_reserve_tokens(self.max_running, self.verify_tokens)

    @property
    def kv_tokens_free(self) -> int:
        """KV tokens left for the requests' contexts once the decode-step reserve is kept."""
        return max(self.kv_tokens - self.kv_reserved_tokens, 0)

    @property
    def cuda_graph_tokens(self) -> int:
        """Tokens of the largest decode/verify CUDA graph: batch x verify tokens (x 1 without a drafter)."""
        return min(self.cuda_graph_max_bs, self.max_running) * max(self.verify_tokens, 1)


def layout(tp: int, gpu_mib: int, target: ModelSpec, target_weights: float, draft: ModelSpec | None,
           draft_weights: float, verify_tokens: int, max_running_cap: int, ssm_dtype: str | None,
           fraction_override: float | None = None, chunked_override: int | None = None) -> Layout:
    """Per-GPU memory for one TP size: engine reserve, static pool, weights, KV and mamba pools.

    verify_tokens (Speculative.verify_tokens: the block, or a DDTree budget + 1) sizes the verify graphs'
    activations, the SSM scratch per running request and the KV reserve of a decode step.
    """
    caps = memory.capacity_defaults(gpu_mib, tp)
    chunked = chunked_override or caps.chunked_prefill_size
    verify = verify_tokens if draft else 0
    engine_reserved = memory.engine_reserved_mib(gpu_mib, tp, chunked, caps.cuda_graph_max_bs)
    draft_reserved = (memory.draft_worker_reserved_mib(caps.cuda_graph_max_bs)
                      + memory.verify_activation_mib(caps.cuda_graph_max_bs, verify, chunked)) if draft else 0.0
    vlm = memory.vlm_fraction_factor(target)
    fraction = fraction_override or memory.round_down((gpu_mib - engine_reserved - draft_reserved) / gpu_mib * vlm)
    weights = target_weights / tp + (draft_weights / tp if draft else 0.0)
    lay = Layout(tp=tp, gpu_mib=gpu_mib, fraction=fraction, engine_reserved_mib=engine_reserved,
                 draft_reserved_mib=draft_reserved, vlm_factor=vlm, weights_bytes=weights, kv_bytes=0.0,
                 mamba_bytes=0.0, kv_bytes_per_token=0, kv_tokens=0, max_running=0, mamba_slots=0,
                 chunked_prefill_size=chunked, cuda_graph_max_bs=caps.cuda_graph_max_bs, verify_tokens=verify)
    rest = lay.static_bytes - weights
    if rest <= 0:
        lay.problems.append(f"tp {tp}: weights need {weights / GIB:.1f} GiB per GPU but the static pool is "
                            f"{lay.static_bytes / GIB:.1f} GiB ({fraction:.3f} of {gpu_mib} MiB)")
        return lay
    per_token = target.kv_bytes_per_token(tp) + (draft.kv_bytes_per_token(tp) if draft else 0)
    lay.kv_bytes_per_token = per_token
    if target.is_hybrid:
        pool = memory.mamba_pool(rest, target.mamba_state_bytes_per_request(tp, ssm_dtype),
                                 MAMBA_FULL_MEMORY_RATIO, verify,
                                 MAMBA_SLOTS_PER_REQUEST, max_running_cap)
        lay.mamba_bytes, lay.mamba_slots, lay.max_running = pool.total_bytes, pool.slots, pool.max_requests
    else:
        lay.max_running = max_running_cap
    lay.kv_bytes = max(rest - lay.mamba_bytes, 0.0)
    lay.kv_tokens = int(lay.kv_bytes // per_token) if per_token else 0
    if lay.max_running < 1:
        lay.problems.append(f"tp {tp}: the linear-attention state pool holds no request "
                            f"({rest / GIB:.1f} GiB left after weights)")
    return lay


@dataclass(frozen=True)
class MemoryModel:
    """Everything but the TP size that a layout depends on, fixed once per request."""

    gpu_mib: int  # the smallest GPU's memory: every rank of a plan must fit it
    target: ModelSpec
    target_weights: float  # bytes
    draft: ModelSpec | None
    draft_weights: float  # bytes; 0 without a drafter
    verify_tokens: int  # Speculative.verify_tokens of the request
    max_running_cap: int  # the engine's running-request cap, or the override
    ssm_dtype: str | None
    fraction_override: Any  # overrides.mem_fraction_static as written
    chunked_override: Any  # overrides.chunked_prefill_size as written

    def layout(self, tp: int) -> Layout:
        """The per-GPU memory of this request at one TP size."""
        return layout(tp, self.gpu_mib, self.target, self.target_weights, self.draft, self.draft_weights,
                      self.verify_tokens, self.max_running_cap, self.ssm_dtype, self.fraction_override,
                      self.chunked_override)


def _weights(model: ModelSpec, declared: float | None) -> float:
    """Weight bytes: the declared figure, else an estimate from the config's shapes."""
    return declared if declared else float(model.estimated_weight_bytes())


def memory_model(request: Request, ssm_dtype: str | None, notes: Notes) -> MemoryModel:
    """The request's memory inputs; warns when the GPUs differ or the target's weight size is a guess."""
    gpus = request.gpus
    gpu_mib = min(g.memory_total_mib for g in gpus)
    if len({(g.name, g.memory_total_mib) for g in gpus}) > 1:
        notes.warnings.append(f"GPUs differ ({sorted({g.name for g in gpus})}); planning for the smallest, "
                              f"{gpu_mib} MiB")
    target_weights = _weights(request.target, request.target_weights)
    draft_weights = _weights(request.draft, request.draft_weights) if request.draft else 0.0
    if request.target_weights is None:
        notes.warnings.append(f"target weights_bytes unknown; estimated {target_weights / 1e9:.1f} GB from the "
                              "config shapes")
    overrides = request.overrides
    return MemoryModel(
        gpu_mib=gpu_mib,
        target=request.target,
        target_weights=target_weights,
        draft=request.draft,
        draft_weights=draft_weights,
        verify_tokens=request.speculative.verify_tokens,
        max_running_cap=int(overrides.get("max_running_requests") or ENGINE_MAX_RUNNING_SPEC),
        ssm_dtype=ssm_dtype,
        fraction_override=overrides.get("mem_fraction_static"),
        chunked_override=overrides.get("chunked_prefill_size"),
    )


def static_fraction(chosen: Layout, model: MemoryModel, notes: Notes) -> float | None:
    """--mem-fraction-static of the chosen layout; an override is checked against the engine's reserve."""
    override = model.fraction_override
    if override is not None:
        if not 0 < float(override) < 1:
            notes.errors.append(f"overrides.mem_fraction_static: expected a fraction in (0, 1), found {override}")
            return None
        safe = memory.round_down((chosen.gpu_mib - chosen.engine_reserved_mib - chosen.draft_reserved_mib)
                                 / chosen.gpu_mib * chosen.vlm_factor)
        if float(override) > safe:
            notes.warnings.append(f"overrides.mem_fraction_static {override} leaves less than the engine's "
                                  f"reserve for activations and CUDA graphs (planned {safe}); expect OOM under load")
        if chosen.problems or chosen.kv_tokens < 1:
            notes.errors.append(f"overrides.mem_fraction_static {override} leaves no cache: "
                                + ("; ".join(chosen.problems) or "no KV tokens"))
            return None
    notes.reasons["mem_fraction_static"] = (
        "override" if override is not None else
        f"(GPU {chosen.gpu_mib} MiB - engine reserve {chosen.engine_reserved_mib:.0f} MiB - draft worker "
        f"{chosen.draft_reserved_mib:.0f} MiB) / GPU" + (f" x VLM factor {chosen.vlm_factor:.3f}"
                                                         if chosen.vlm_factor != 1 else "")
        + f"; engine reserve = SGLang 0.5.23 heuristic for chunked prefill {chosen.chunked_prefill_size}, "
          f"decode graphs {chosen.cuda_graph_max_bs}")
    return chosen.fraction


def running_requests(chosen: Layout, request: Request, model: MemoryModel, notes: Notes) -> int | None:
    """--max-running-requests: what the mamba pool holds (hybrid models) or the engine cap."""
    cap = model.max_running_cap
    if request.overrides.get("max_running_requests") and chosen.max_running < cap:
        notes.errors.append(f"overrides.max_running_requests {cap}: the linear-attention pool holds only "
                            f"{chosen.max_running} at tp {chosen.tp}")
        return None
    if request.target.is_hybrid:
        scratch = (f", with {model.verify_tokens} speculative scratch states each (verify tokens per request)"
                   if request.speculative.enabled else "")
        notes.reasons["max_running_requests"] = (f"{chosen.mamba_slots} mamba state slots / "
                                                 f"{MAMBA_SLOTS_PER_REQUEST} per request{scratch} (cap {cap})")
    else:
        notes.reasons["max_running_requests"] = f"engine cap {cap}"
    return chosen.max_running


def context_length(chosen: Layout, request: Request, notes: Notes) -> int | None:
    """--context-length: the request's (or the model's maximum), capped to what the KV pool holds."""
    target = request.target
    model_max = target.max_position_embeddings or chosen.kv_tokens
    wanted = request.context_length
    if wanted is not None and int(wanted) > model_max:
        notes.errors.append(f"context_length {wanted} exceeds {target.name}'s max_position_embeddings {model_max}")
        return None
    fit_tokens = chosen.kv_tokens_free // 1024 * 1024
    context = min(int(wanted or model_max), fit_tokens)
    if wanted is not None and int(wanted) > fit_tokens:
        notes.warnings.append(f"context_length {wanted} exceeds the {chosen.kv_tokens_free} tokens the KV pool holds "
                              f"beside the decode reserve of the running requests; "
                              f"capped to {context}")
    notes.reasons["context_length"] = (f"min(requested or model max {model_max}, KV pool {chosen.kv_tokens} tokens "
                                       f"less the decode reserve of {chosen.kv_reserved_tokens} (2 x "
                                       f"{max(chosen.verify_tokens, 1)} per running request), rounded down to 1024)")
    return context


def engine_picks(chosen: Layout, request: Request, notes: Notes) -> dict[str, dict[str, Any]]:
    """What SGLang 0.5.23 picks on this card for the memory settings the plan sets, beside the plan's value and
    why the plan's stands. tests/test_sglang_resolution.py holds each `sglang` figure against the release's own
    resolution of the argv without the plan's flag."""
    engine_fraction = memory.engine_fraction(chosen.gpu_mib, chosen.engine_reserved_mib, chosen.vlm_factor)
    picks: dict[str, dict[str, Any]] = {
        "mem_fraction_static": {
            "sglang": round(engine_fraction, 4), "plan": chosen.fraction,
            "why": (f"SGLang reserves {chosen.engine_reserved_mib:.0f} MiB for one model's activations and graphs; "
                    f"the plan also keeps {chosen.draft_reserved_mib:.0f} MiB for the draft worker's"
                    if chosen.draft_reserved_mib else "the plan's is SGLang's heuristic, rounded down")},
        "cuda_graph_max_bs_decode": {
            "sglang": chosen.cuda_graph_max_bs, "plan": min(chosen.cuda_graph_max_bs, chosen.max_running),
            "why": "no decode graph larger than the requests that can run (each captured graph costs memory)"},
    }
    if request.speculative.enabled:
        picks["max_running_requests"] = {
            "sglang": ENGINE_MAX_RUNNING_SPEC, "plan": chosen.max_running,
            "why": ("what the linear-attention pool holds with the speculative scratch of each request"
                    if request.target.is_hybrid else "SGLang's speculative default, restated")}
    notes.reasons["engine_picks"] = "SGLang 0.5.23's own choice on this card without the plan's flag"
    return picks


def per_gpu(chosen: Layout, notes: Notes) -> dict[str, float]:
    """The plan's per-GPU split in GiB (and the KV bytes of one token)."""
    reserved_gib = (chosen.gpu_mib * MIB - chosen.static_bytes) / GIB
    notes.reasons["per_gpu"] = ("weights = (target + drafter) / tp; the rest of the static pool splits "
                                f"mamba : KV = {MAMBA_FULL_MEMORY_RATIO} : 1 as SGLang does")
    return {
        "gpu_gib": round(chosen.gpu_mib / 1024, 2),
        "weights_gib": round(chosen.weights_bytes / GIB, 2),
        "kv_pool_gib": round(chosen.kv_bytes / GIB, 2),
        "mamba_pool_gib": round(chosen.mamba_bytes / GIB, 2),
        "reserved_gib": round(reserved_gib, 2),
        "kv_bytes_per_token": chosen.kv_bytes_per_token,
    }
