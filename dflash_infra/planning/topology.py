"""Step 2 of a plan: the tensor-parallel size (smallest that fits and meets the capacity target), then DP.

TP candidates are the powers of two up to the GPU count; each must divide both models' heads and leave
the static pool room for a cache. DP fills the remaining GPUs with independent replicas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dflash_infra.planning import fit
from dflash_infra.planning.notes import Notes
from dflash_infra.planning.request import Request
from dflash_infra.planning.sizing import Layout, MemoryModel


@dataclass(frozen=True)
class TpChoice:
    """The chosen TP size's layout (None when none is possible) and every TP size that was tried."""

    layout: Layout | None
    candidates: list[dict[str, Any]]  # tp, fits, meets_capacity, max_running_requests, kv_cache_tokens, problems


@dataclass(frozen=True)
class Topology:
    """How the plan spreads over the host's GPUs: TP ranks per replica, replicas, the GPUs used."""

    tp: int
    dp: int
    gpu_ids: list[int]


def tp_candidates(n_gpus: int) -> list[int]:
    """The TP sizes worth trying on n GPUs: 1, 2, 4, ... up to n."""
    out, tp = [], 1
    while tp <= n_gpus:
        out.append(tp)
        tp *= 2
    return out


def _head_problems(request: Request, tp: int) -> list[str]:
    """Why TP does not split the target's (and the drafter's) attention heads evenly."""
    return request.target.tp_problems(tp) + (request.draft.tp_problems(tp) if request.draft else [])


def _meets(lay: Layout, capacity: dict[str, Any]) -> bool:
    """The layout holds the running requests and KV tokens a replica must hold to be worth deploying
    (KV tokens beside the decode-step reserve the running requests keep free)."""
    return (lay.max_running >= int(capacity["min_running_requests"])
            and lay.kv_tokens_free >= int(capacity["min_kv_cache_tokens"]))


def _what_fits(request: Request, model: MemoryModel, tps: list[int] | None = None) -> str:
    """The planner's nearest requests that fit (planning/fit.py), as the end of a refusal."""
    found = fit.suggestions(request, model, tps)
    return (". What would fit: " + "; ".join(found)) if found else ". Nothing nearby fits: use larger GPUs"


def _tp_override(request: Request, model: MemoryModel, notes: Notes) -> TpChoice:
    """overrides.tp_size: taken as given when both models and the host allow it."""
    gpus = request.gpus
    tp = int(request.overrides["tp_size"])
    problems = _head_problems(request, tp)
    if tp > len(gpus):
        problems.append(f"tp {tp} needs {tp} GPUs, the host has {len(gpus)}")
    if problems:
        notes.errors.append(f"overrides.tp_size {tp} is not possible: " + "; ".join(problems))
        return TpChoice(None, [])
    chosen = model.layout(tp)
    if chosen.problems:
        notes.errors.append("; ".join(chosen.problems) + _what_fits(request, model, [tp]))
    notes.reasons["tp_size"] = "override; valid for both models' head counts"
    return TpChoice(chosen, [])


def _tp_search(request: Request, model: MemoryModel, notes: Notes) -> TpChoice:
    """The smallest TP that meets the capacity target, else the one that holds the most."""
    gpus, capacity = request.gpus, request.capacity
    candidates: list[dict[str, Any]] = []
    fitting: list[Layout] = []
    for tp in tp_candidates(len(gpus)):
        problems = _head_problems(request, tp)
        lay = model.layout(tp)
        lay.problems = problems + lay.problems
        candidates.append({"tp": tp, "fits": not lay.problems,
                           "meets_capacity": not lay.problems and _meets(lay, capacity),
                           "max_running_requests": lay.max_running, "kv_cache_tokens": lay.kv_tokens,
                           "problems": lay.problems})
        if not lay.problems:
            fitting.append(lay)
    good = [lay for lay in fitting if _meets(lay, capacity)]
    if good:
        chosen = good[0]
        skipped = [c for c in candidates if c["tp"] < chosen.tp]
        why_not = "; ".join(f"tp {c['tp']}: " + ("; ".join(c["problems"]) if c["problems"] else
                            f"only {c['max_running_requests']} requests / {c['kv_cache_tokens']} tokens")
                            for c in skipped)
        notes.reasons["tp_size"] = (f"smallest TP valid for both models that holds >= "
                                    f"{capacity['min_running_requests']} running requests and >= "
                                    f"{capacity['min_kv_cache_tokens']} KV tokens"
                                    + (f" ({why_not})" if why_not else ""))
        return TpChoice(chosen, candidates)
    if fitting:
        chosen = max(fitting, key=lambda lay: (lay.max_running, lay.kv_tokens))
        notes.warnings.append(f"no TP meets the capacity target ({capacity['min_running_requests']} requests, "
                              f"{capacity['min_kv_cache_tokens']} tokens); tp {chosen.tp} holds the most: "
                              f"{chosen.max_running} requests, {chosen.kv_tokens} tokens")
        notes.reasons["tp_size"] = "largest capacity among the TP sizes that fit (capacity target not met)"
        return TpChoice(chosen, candidates)
    detail = "; ".join("; ".join(c["problems"]) for c in candidates)
    notes.errors.append(f"{request.target.name} does not fit on {len(gpus)}x {gpus[0].name} "
                        f"({model.gpu_mib} MiB): {detail}" + _what_fits(request, model))
    return TpChoice(None, candidates)


def choose_tp(request: Request, model: MemoryModel, notes: Notes) -> TpChoice:
    """The TP size: the override when there is one, else the search over the candidates."""
    if request.overrides.get("tp_size"):
        return _tp_override(request, model, notes)
    return _tp_search(request, model, notes)


def choose_dp(request: Request, tp: int, notes: Notes) -> Topology | None:
    """DP replicas of `tp` GPUs each (the override, or as many as the host holds) and the GPUs they use."""
    gpus, overrides = request.gpus, request.overrides
    dp = int(overrides.get("dp_size") or max(1, len(gpus) // tp))
    if tp * dp > len(gpus):
        notes.errors.append(f"tp {tp} x dp {dp} needs {tp * dp} GPUs, the host has {len(gpus)}")
        return None
    notes.reasons["dp_size"] = ("override" if overrides.get("dp_size") else
                                f"{len(gpus)} GPUs / tp {tp}: one replica per group of {tp} GPUs")
    if dp > 1 and request.speculative.enabled:
        notes.warnings.append(f"dp {dp}: SGLang runs {dp} independent replicas behind its router; each replica "
                              "has the per-GPU memory shown")
    gpu_ids = [g.index if g.index is not None else i for i, g in enumerate(gpus)][: tp * dp]
    notes.reasons["gpu_ids"] = f"the first {tp * dp} GPUs by index"
    return Topology(tp, dp, gpu_ids)
