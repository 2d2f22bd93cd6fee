"""The serving planner: from GPUs, model configs and speculative settings to a checked SGLang plan.

Pure functions; user mistakes become `errors` sentences in the plan, never exceptions, so a play can
print all of them at once and stop before anything on a host is touched.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from dflash_infra import catalogue, engine, memory
from dflash_infra.models import ModelConfigError, ModelSpec, dtype_bytes, model_spec

GIB = 1024**3
MIB = 1024**2

# What a plan must hold per replica to count as useful (overridable per request under `capacity`).
DEFAULT_CAPACITY = {"min_running_requests": 8, "min_kv_cache_tokens": 65536}
# Engine defaults the planner restates explicitly on the command line so its arithmetic holds.
ENGINE_MAX_RUNNING_SPEC = 48
MAMBA_FULL_MEMORY_RATIO = 0.9
MAMBA_SLOTS_PER_REQUEST = 3
KNOWN_OVERRIDES = ("tp_size", "dp_size", "mem_fraction_static", "max_running_requests", "context_length",
                   "attention_backend", "prefill_attention_backend", "decode_attention_backend",
                   "draft_attention_backend", "mamba_ssm_dtype", "chunked_prefill_size")
SPEC_ALGORITHMS = {"dflash": "DFLASH", "ddtree": "DFLASH", "none": None}


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi reports it."""

    name: str
    memory_total_mib: int
    compute_cap: str | None = None
    index: int | None = None


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
    problems: list[str] = field(default_factory=list)

    @property
    def static_bytes(self) -> float:
        return self.fraction * self.gpu_mib * MIB


@dataclass
class Plan:
    """The planner's answer (ARCHITECTURE.md `dflash-infra plan` contract)."""

    tp_size: int | None = None
    dp_size: int | None = None
    gpu_ids: list[int] = field(default_factory=list)
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    context_length: int | None = None
    per_gpu: dict[str, float] = field(default_factory=dict)
    kv_cache_tokens: int | None = None
    speculative: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    candidates: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------

def _gpus(raw: Any, errors: list[str]) -> list[Gpu]:
    if not isinstance(raw, list) or not raw:
        errors.append("gpus: expected a non-empty list of {name, memory_total_mib}, found "
                      f"{type(raw).__name__ if raw else 'nothing'}")
        return []
    gpus = []
    for i, item in enumerate(raw):
        try:
            gpus.append(Gpu(name=str(item["name"]), memory_total_mib=int(item["memory_total_mib"]),
                            compute_cap=None if item.get("compute_cap") is None else str(item["compute_cap"]),
                            index=int(item["index"]) if item.get("index") is not None else i))
        except (KeyError, TypeError, ValueError) as exc:
            errors.append(f"gpus[{i}]: expected name and integer memory_total_mib, found {item!r} ({exc})")
    return gpus


def _load_config(section: Mapping[str, Any], label: str, base: Path | None) -> dict[str, Any]:
    if "config" in section and section["config"] is not None:
        return dict(section["config"])
    if not section.get("config_path") and section.get("name"):
        try:
            return catalogue.config(str(section["name"]))
        except KeyError as exc:
            raise ModelConfigError(f"{label}: {exc.args[0]}; give `config` or `config_path`") from exc
    if section.get("config_path"):
        path = Path(section["config_path"])
        if base is not None and not path.is_absolute():
            path = base / path
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelConfigError(f"{label}: cannot read config_path {path}: {exc}") from exc
    raise ModelConfigError(f"{label}: expected `config` (a config.json object), `config_path` or a catalogued "
                           f"`name` ({', '.join(catalogue.known_models())}), found none of them")


def _model(section: Any, label: str, base: Path | None, errors: list[str]) -> tuple[ModelSpec | None, float | None]:
    if not isinstance(section, Mapping):
        errors.append(f"{label}: expected an object with config or config_path, found {section!r}")
        return None, None
    try:
        spec = model_spec(_load_config(section, label, base), name=str(section.get("name", label)))
    except ModelConfigError as exc:
        errors.append(str(exc))
        return None, None
    weights = section.get("weights_bytes") or catalogue.weights_bytes(str(section.get("name", "")))
    return spec, float(weights) if weights else None


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------

def dflash_problems(target: ModelSpec, draft: ModelSpec, spec: Mapping[str, Any]) -> list[str]:
    """Why this drafter cannot draft for this target with these settings (empty when it can)."""
    problems = []
    if not draft.is_dflash_drafter:
        problems.append(f"{draft.name}: architecture {draft.architecture} is not a DFlash drafter "
                        f"(expected DFlashDraftModel)")
    dcfg = draft.raw.get("dflash_config") or {}
    layers = dcfg.get("target_layer_ids") or []
    bad = [i for i in layers if not 0 <= int(i) < target.num_layers]
    if bad:
        problems.append(f"{draft.name}: target_layer_ids {bad} lie outside the target's "
                        f"{target.num_layers} layers (0..{target.num_layers - 1})")
    declared = draft.raw.get("num_target_layers")
    if declared is not None and int(declared) != target.num_layers:
        problems.append(f"{draft.name}: trained for a {declared}-layer target, {target.name} has "
                        f"{target.num_layers} layers")
    mask = dcfg.get("mask_token_id")
    if mask is not None and not 0 <= int(mask) < target.vocab_size:
        problems.append(f"{draft.name}: mask_token_id {mask} is outside the target vocabulary "
                        f"of {target.vocab_size}")
    if draft.vocab_size != target.vocab_size:
        problems.append(f"{draft.name}: vocab {draft.vocab_size} differs from the target's {target.vocab_size} "
                        "(the drafter borrows the target's embedding and LM head)")
    if draft.hidden_size != target.hidden_size:
        problems.append(f"{draft.name}: hidden size {draft.hidden_size} differs from the target's "
                        f"{target.hidden_size} (the drafter reads the target's hidden states)")
    return problems


def speculative_problems(spec: Mapping[str, Any]) -> list[str]:
    """Block size, draft window and tree budget against each other and the deployment's cap."""
    problems = []
    cap = int(spec.get("max_draft_tokens") or 16)
    block = spec.get("block_size")
    window = spec.get("draft_window")
    budget = spec.get("tree_budget")
    if block is None or int(block) < 1:
        problems.append(f"speculative.block_size: expected an integer >= 1, found {block!r}")
        return problems
    block = int(block)
    if block > cap:
        problems.append(f"speculative.block_size {block} exceeds the deployment's max_draft_tokens {cap}")
    if window is not None:
        if int(window) < block:
            problems.append(f"speculative.draft_window {window} is smaller than block_size {block} "
                            "(SGLang requires window >= block size)")
        if int(window) > cap:
            problems.append(f"speculative.draft_window {window} exceeds the deployment's max_draft_tokens {cap}")
    if budget is not None:
        if int(budget) < 1:
            problems.append(f"speculative.tree_budget: expected an integer >= 1, found {budget!r}")
        elif int(budget) > cap:
            problems.append(f"speculative.tree_budget {budget} exceeds the deployment's max_draft_tokens {cap}")
    return problems


# ---------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------

def _weights(model: ModelSpec, declared: float | None) -> float:
    return declared if declared else float(model.estimated_weight_bytes())


def layout(tp: int, gpu_mib: int, target: ModelSpec, target_weights: float, draft: ModelSpec | None,
           draft_weights: float, draft_tokens: int, max_running_cap: int, ssm_dtype: str | None,
           fraction_override: float | None = None, chunked_override: int | None = None) -> Layout:
    """Per-GPU memory for one TP size: engine reserve, static pool, weights, KV and mamba pools."""
    caps = memory.capacity_defaults(gpu_mib, tp)
    chunked = chunked_override or caps.chunked_prefill_size
    engine_reserved = memory.engine_reserved_mib(gpu_mib, tp, chunked, caps.cuda_graph_max_bs)
    draft_reserved = memory.draft_worker_reserved_mib(caps.cuda_graph_max_bs) if draft else 0.0
    vlm = memory.vlm_fraction_factor(target)
    fraction = fraction_override or memory.round_down((gpu_mib - engine_reserved - draft_reserved) / gpu_mib * vlm)
    weights = target_weights / tp + (draft_weights / tp if draft else 0.0)
    lay = Layout(tp=tp, gpu_mib=gpu_mib, fraction=fraction, engine_reserved_mib=engine_reserved,
                 draft_reserved_mib=draft_reserved, vlm_factor=vlm, weights_bytes=weights, kv_bytes=0.0,
                 mamba_bytes=0.0, kv_bytes_per_token=0, kv_tokens=0, max_running=0, mamba_slots=0,
                 chunked_prefill_size=chunked, cuda_graph_max_bs=caps.cuda_graph_max_bs)
    rest = lay.static_bytes - weights
    if rest <= 0:
        lay.problems.append(f"tp {tp}: weights need {weights / GIB:.1f} GiB per GPU but the static pool is "
                            f"{lay.static_bytes / GIB:.1f} GiB ({fraction:.3f} of {gpu_mib} MiB)")
        return lay
    per_token = target.kv_bytes_per_token(tp) + (draft.kv_bytes_per_token(tp) if draft else 0)
    lay.kv_bytes_per_token = per_token
    if target.is_hybrid:
        pool = memory.mamba_pool(rest, target.mamba_state_bytes_per_request(tp, ssm_dtype),
                                 MAMBA_FULL_MEMORY_RATIO, draft_tokens if draft else 0,
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


# ---------------------------------------------------------------------------------------------
# Plan
# ---------------------------------------------------------------------------------------------

def _tp_candidates(n_gpus: int) -> list[int]:
    out, tp = [], 1
    while tp <= n_gpus:
        out.append(tp)
        tp *= 2
    return out


def _kernel_settings(gpus: list[Gpu], target: ModelSpec) -> tuple[dict[str, Any], str]:
    """Attention backends per GPU generation (FACTS.md, Kernels)."""
    cc = gpus[0].compute_cap or ""
    if cc.startswith("12.") and target.is_hybrid:
        return ({"prefill_attention_backend": "triton", "decode_attention_backend": "flashinfer",
                 "mamba_ssm_dtype": "bfloat16", "draft_attention_backend": "flashinfer"},
                f"sm_{cc.replace('.', '')} has no FlashAttention 3; the known working mix for hybrid GDN "
                "models there is triton prefill + flashinfer decode + bf16 SSM state")
    return ({"draft_attention_backend": "flashinfer"},
            f"compute capability {cc or 'unknown'}: engine default attention backends; flashinfer for the drafter")


def plan(request: Mapping[str, Any], base: Path | None = None) -> Plan:
    """Plan one deployment from a request (see ARCHITECTURE.md for the keys)."""
    out = Plan()
    errors, warnings, reasons = out.errors, out.warnings, out.reasons
    if not isinstance(request, Mapping):
        errors.append(f"request: expected a JSON/YAML object, found {type(request).__name__}")
        return out
    overrides = dict(request.get("overrides") or {})
    for key in sorted(set(overrides) - set(KNOWN_OVERRIDES)):
        errors.append(f"overrides.{key}: unknown override; known: {', '.join(KNOWN_OVERRIDES)}")
    capacity = {**DEFAULT_CAPACITY, **(request.get("capacity") or {})}

    gpus = _gpus(request.get("gpus"), errors)
    target, target_weights = _model(request.get("target"), "target", base, errors)
    draft, draft_weights = (None, None)
    if request.get("draft"):
        draft, draft_weights = _model(request.get("draft"), "draft", base, errors)

    spec = dict(request.get("speculative") or {"algorithm": "none"})
    mode = str(spec.get("algorithm", "dflash")).lower()
    if mode not in SPEC_ALGORITHMS:
        errors.append(f"speculative.algorithm: expected one of {', '.join(SPEC_ALGORITHMS)}, found {mode!r}")
        mode = "none"
    speculative = mode != "none"
    if speculative:
        errors.extend(speculative_problems(spec))
        if mode == "ddtree" and spec.get("tree_budget") is None:
            errors.append("speculative.tree_budget: ddtree needs a tree budget (<= max_draft_tokens)")
        if draft is None and not request.get("draft"):
            errors.append("draft: speculative decoding needs a drafter model (SGLang requires "
                          "--speculative-draft-model-path)")
    if target and draft and speculative:
        errors.extend(dflash_problems(target, draft, spec))
        block_cfg = draft.raw.get("block_size")
        if block_cfg is not None and spec.get("block_size") and int(block_cfg) != int(spec["block_size"]):
            warnings.append(f"speculative.block_size {spec['block_size']} differs from the drafter's trained "
                            f"block_size {block_cfg}; acceptance will drop")

    version = str(request.get("sglang_version") or "")
    table = None
    try:
        release = engine.release_of(version)
        table = engine.flag_table(release)
        if request.get("engine_options"):
            table = engine.FlagTable.from_options(release, request["engine_options"])
        out.engine = {"name": "sglang", "version": version, "flag_table": release}
        rel = engine.parse_version(release)
        if speculative and rel < engine.DFLASH_SINCE:
            errors.append(f"SGLang {version} has no DFLASH (needs >= 0.5.11)")
        elif speculative and rel < engine.DRAFT_SLIDING_WINDOW_SINCE:
            warnings.append(f"SGLang {version} runs the drafter's sliding-window layers as full attention "
                            "(fixed in 0.5.15); acceptance will be lower")
    except (KeyError, ValueError):
        errors.append(f"sglang_version: expected one of {', '.join(engine.supported_releases())}, "
                      f"found {version or 'nothing'!r}")
    if errors or not gpus or target is None:
        return out

    gpu_mib = min(g.memory_total_mib for g in gpus)
    if len({(g.name, g.memory_total_mib) for g in gpus}) > 1:
        warnings.append(f"GPUs differ ({sorted({g.name for g in gpus})}); planning for the smallest, {gpu_mib} MiB")

    kernels, kernel_reason = _kernel_settings(gpus, target)
    for key in ("attention_backend", "prefill_attention_backend", "decode_attention_backend",
                "draft_attention_backend", "mamba_ssm_dtype"):
        if overrides.get(key):
            kernels[key] = overrides[key]
    if not speculative:
        kernels.pop("draft_attention_backend", None)
    block = int(spec.get("block_size") or 0) if speculative else 0
    tree_budget = spec.get("tree_budget") if mode == "ddtree" else None
    draft_tokens = max(block, int(tree_budget) + 1) if tree_budget else block
    cap_running = int(overrides.get("max_running_requests") or ENGINE_MAX_RUNNING_SPEC)
    use_draft = draft if speculative else None
    t_weights = _weights(target, target_weights)
    d_weights = _weights(draft, draft_weights) if use_draft else 0.0
    if target_weights is None:
        warnings.append(f"target weights_bytes unknown; estimated {t_weights / 1e9:.1f} GB from the config shapes")

    def candidate(tp: int) -> Layout:
        return layout(tp, gpu_mib, target, t_weights, use_draft, d_weights, draft_tokens, cap_running,
                      kernels.get("mamba_ssm_dtype"), overrides.get("mem_fraction_static"),
                      overrides.get("chunked_prefill_size"))

    def head_problems(tp: int) -> list[str]:
        return target.tp_problems(tp) + (use_draft.tp_problems(tp) if use_draft else [])

    def meets(lay: Layout) -> bool:
        return (lay.max_running >= int(capacity["min_running_requests"])
                and lay.kv_tokens >= int(capacity["min_kv_cache_tokens"]))

    chosen: Layout | None = None
    if overrides.get("tp_size"):
        tp = int(overrides["tp_size"])
        problems = head_problems(tp)
        if tp > len(gpus):
            problems.append(f"tp {tp} needs {tp} GPUs, the host has {len(gpus)}")
        if problems:
            errors.append(f"overrides.tp_size {tp} is not possible: " + "; ".join(problems))
            return out
        chosen = candidate(tp)
        errors.extend(chosen.problems)
        reasons["tp_size"] = f"override; valid for both models' head counts"
    else:
        fitting: list[Layout] = []
        for tp in _tp_candidates(len(gpus)):
            problems = head_problems(tp)
            lay = candidate(tp)
            lay.problems = problems + lay.problems
            out.candidates.append({"tp": tp, "fits": not lay.problems, "meets_capacity": not lay.problems and meets(lay),
                                   "max_running_requests": lay.max_running, "kv_cache_tokens": lay.kv_tokens,
                                   "problems": lay.problems})
            if not lay.problems:
                fitting.append(lay)
        good = [lay for lay in fitting if meets(lay)]
        if good:
            chosen = good[0]
            skipped = [c for c in out.candidates if c["tp"] < chosen.tp]
            why_not = "; ".join(f"tp {c['tp']}: " + ("; ".join(c["problems"]) if c["problems"] else
                                f"only {c['max_running_requests']} requests / {c['kv_cache_tokens']} tokens")
                                for c in skipped)
            reasons["tp_size"] = (f"smallest TP valid for both models that holds >= {capacity['min_running_requests']} "
                                  f"running requests and >= {capacity['min_kv_cache_tokens']} KV tokens"
                                  + (f" ({why_not})" if why_not else ""))
        elif fitting:
            chosen = max(fitting, key=lambda lay: (lay.max_running, lay.kv_tokens))
            warnings.append(f"no TP meets the capacity target ({capacity['min_running_requests']} requests, "
                            f"{capacity['min_kv_cache_tokens']} tokens); tp {chosen.tp} holds the most: "
                            f"{chosen.max_running} requests, {chosen.kv_tokens} tokens")
            reasons["tp_size"] = "largest capacity among the TP sizes that fit (capacity target not met)"
        else:
            detail = "; ".join("; ".join(c["problems"]) for c in out.candidates)
            errors.append(f"{target.name} does not fit on {len(gpus)}x {gpus[0].name} ({gpu_mib} MiB): {detail}")
            return out
    assert chosen is not None
    if errors:
        return out

    tp = chosen.tp
    dp = int(overrides.get("dp_size") or max(1, len(gpus) // tp))
    if tp * dp > len(gpus):
        errors.append(f"tp {tp} x dp {dp} needs {tp * dp} GPUs, the host has {len(gpus)}")
        return out
    reasons["dp_size"] = ("override" if overrides.get("dp_size") else
                          f"{len(gpus)} GPUs / tp {tp}: one replica per group of {tp} GPUs")
    if dp > 1 and speculative:
        warnings.append(f"dp {dp}: SGLang runs {dp} independent replicas behind its router; each replica "
                        "has the per-GPU memory shown")
    out.tp_size, out.dp_size = tp, dp
    out.gpu_ids = [g.index if g.index is not None else i for i, g in enumerate(gpus)][: tp * dp]
    reasons["gpu_ids"] = f"the first {tp * dp} GPUs by index"

    frac_override = overrides.get("mem_fraction_static")
    if frac_override is not None:
        if not 0 < float(frac_override) < 1:
            errors.append(f"overrides.mem_fraction_static: expected a fraction in (0, 1), found {frac_override}")
            return out
        safe = memory.round_down((gpu_mib - chosen.engine_reserved_mib - chosen.draft_reserved_mib)
                                 / gpu_mib * chosen.vlm_factor)
        if float(frac_override) > safe:
            warnings.append(f"overrides.mem_fraction_static {frac_override} leaves less than the engine's "
                            f"reserve for activations and CUDA graphs (planned {safe}); expect OOM under load")
        if chosen.problems or chosen.kv_tokens < 1:
            errors.append(f"overrides.mem_fraction_static {frac_override} leaves no cache: "
                          + ("; ".join(chosen.problems) or "no KV tokens"))
            return out
    out.mem_fraction_static = chosen.fraction
    reasons["mem_fraction_static"] = (
        "override" if frac_override is not None else
        f"(GPU {gpu_mib} MiB - engine reserve {chosen.engine_reserved_mib:.0f} MiB - draft worker "
        f"{chosen.draft_reserved_mib:.0f} MiB) / GPU" + (f" x VLM factor {chosen.vlm_factor:.3f}"
                                                         if chosen.vlm_factor != 1 else "")
        + f"; engine reserve = SGLang 0.5.23 heuristic for chunked prefill {chosen.chunked_prefill_size}, "
          f"decode graphs {chosen.cuda_graph_max_bs}")

    if overrides.get("max_running_requests") and chosen.max_running < cap_running:
        errors.append(f"overrides.max_running_requests {cap_running}: the linear-attention pool holds only "
                      f"{chosen.max_running} at tp {tp}")
        return out
    out.max_running_requests = chosen.max_running
    reasons["max_running_requests"] = (
        f"{chosen.mamba_slots} mamba state slots / {MAMBA_SLOTS_PER_REQUEST} per request"
        + (f", with {draft_tokens} speculative scratch states each" if speculative else "")
        + f" (cap {cap_running})" if target.is_hybrid else f"engine cap {cap_running}")

    model_max = target.max_position_embeddings or chosen.kv_tokens
    wanted = overrides.get("context_length") or request.get("context_length")
    if wanted is not None and int(wanted) > model_max:
        errors.append(f"context_length {wanted} exceeds {target.name}'s max_position_embeddings {model_max}")
        return out
    fit_tokens = chosen.kv_tokens // 1024 * 1024
    context = min(int(wanted or model_max), fit_tokens)
    if wanted is not None and int(wanted) > fit_tokens:
        warnings.append(f"context_length {wanted} exceeds the {chosen.kv_tokens} tokens the KV pool holds; "
                        f"capped to {context}")
    out.context_length = context
    out.kv_cache_tokens = chosen.kv_tokens
    reasons["context_length"] = (f"min(requested or model max {model_max}, KV pool {chosen.kv_tokens} tokens "
                                 "rounded down to 1024)")
    reserved_gib = (gpu_mib * MIB - chosen.static_bytes) / GIB
    out.per_gpu = {
        "gpu_gib": round(gpu_mib / 1024, 2),
        "weights_gib": round(chosen.weights_bytes / GIB, 2),
        "kv_pool_gib": round(chosen.kv_bytes / GIB, 2),
        "mamba_pool_gib": round(chosen.mamba_bytes / GIB, 2),
        "reserved_gib": round(reserved_gib, 2),
        "kv_bytes_per_token": chosen.kv_bytes_per_token,
    }
    reasons["per_gpu"] = ("weights = (target + drafter) / tp; the rest of the static pool splits "
                          f"mamba : KV = {MAMBA_FULL_MEMORY_RATIO} : 1 as SGLang does")

    serve = request.get("serve") or {}
    values: dict[str, Any] = {
        "model_path": (request.get("target") or {}).get("path") or target.name,
        "served_model_name": serve.get("served_model_name"),
        "host": serve.get("host"),
        "port": serve.get("port"),
        "tp_size": tp,
        "dp_size": dp if dp > 1 else None,
        "mem_fraction_static": chosen.fraction,
        "max_running_requests": chosen.max_running,
        "context_length": context,
        "chunked_prefill_size": chosen.chunked_prefill_size,
        "cuda_graph_max_bs": min(chosen.cuda_graph_max_bs, chosen.max_running),
        "mamba_full_memory_ratio": MAMBA_FULL_MEMORY_RATIO if target.is_hybrid else None,
        **kernels,
    }
    reasons["kernels"] = kernel_reason
    if speculative:
        out.speculative = {"mode": mode, "algorithm": SPEC_ALGORITHMS[mode], "block_size": block,
                           "draft_window": spec.get("draft_window"), "tree_budget": tree_budget,
                           "max_draft_tokens": int(spec.get("max_draft_tokens") or 16)}
        values.update({
            "speculative_algorithm": SPEC_ALGORITHMS[mode],
            "draft_model_path": (request.get("draft") or {}).get("path") or draft.name,
            "block_size": block,
            "draft_window": spec.get("draft_window"),
            "tree_budget": tree_budget,
        })
        reasons["speculative"] = (f"{mode}: block {block}, window {spec.get('draft_window')}"
                                  + (f", tree budget {tree_budget}" if tree_budget else "")
                                  + f", cap {out.speculative['max_draft_tokens']}")
    argv, flag_errors = engine.render_argv(values, version, table)
    if mode == "ddtree":
        flag_errors = [e + " (ddtree needs an engine build with draft trees; refusing to fall back to linear "
                       "DFLASH silently)" if e.startswith("tree_budget") else e for e in flag_errors]
    errors.extend(flag_errors)
    out.args = argv if not flag_errors else []
    reasons["args"] = f"flags as spelled by SGLang {out.engine.get('flag_table')} (extracted flag table)"
    return out


def plan_table(result: Mapping[str, Any]) -> str:
    """One row per setting with its reason, for people."""
    rows = [("setting", "value", "reason")]
    for key in ("tp_size", "dp_size", "gpu_ids", "mem_fraction_static", "max_running_requests",
                "context_length", "kv_cache_tokens"):
        rows.append((key, json.dumps(result.get(key)), result.get("reasons", {}).get(key, "")))
    per_gpu = result.get("per_gpu") or {}
    for key in ("weights_gib", "kv_pool_gib", "mamba_pool_gib", "reserved_gib"):
        if key in per_gpu:
            rows.append((f"per_gpu.{key}", str(per_gpu[key]),
                         result.get("reasons", {}).get("per_gpu", "") if key == "weights_gib" else ""))
    if result.get("speculative"):
        rows.append(("speculative", result["speculative"].get("mode", ""), result["reasons"].get("speculative", "")))
    if result.get("engine"):
        rows.append(("engine", f"sglang {result['engine'].get('version')}", result["reasons"].get("args", "")))
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = [f"{r[0]:<{width[0]}}  {r[1]:<{width[1]}}  {r[2]}".rstrip() for r in rows]
    lines.insert(1, "-" * (width[0] + width[1] + 10))
    if result.get("args"):
        lines.append("")
        lines.append("engine argv: " + " ".join(result["args"]))
    for w in result.get("warnings", []):
        lines.append(f"WARNING: {w}")
    for e in result.get("errors", []):
        lines.append(f"ERROR: {e}")
    return "\n".join(lines)


def plan_dict(request: Mapping[str, Any], base: Path | None = None) -> dict[str, Any]:
    """plan() as a JSON-safe dict (the filter plugins' and the CLI's shape)."""
    return plan(request, base).to_dict()


__all__ = ["Gpu", "Layout", "Plan", "dflash_problems", "layout", "plan", "plan_dict", "plan_table",
           "speculative_problems", "dtype_bytes"]
