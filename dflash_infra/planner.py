"""The serving planner: from GPUs, model configs and speculative settings to a checked SGLang plan.

Pure functions; user mistakes become `errors` sentences in the plan, never exceptions, so a play can
print all of them at once and stop before anything on a host is touched. `plan` runs the steps of
`dflash_infra.planning` in order: validate the request, size each TP's memory and choose TP and DP,
size the chosen layout's settings, render the engine argv.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dflash_infra.models import dtype_bytes
from dflash_infra.planning import argv, sizing, topology
from dflash_infra.planning.notes import Notes
from dflash_infra.planning.request import KNOWN_OVERRIDES, SPEC_ALGORITHMS, Gpu
from dflash_infra.planning.sizing import (
    ENGINE_MAX_RUNNING_SPEC,
    GIB,
    MAMBA_FULL_MEMORY_RATIO,
    MAMBA_SLOTS_PER_REQUEST,
    MIB,
    Layout,
    layout,
)
from dflash_infra.planning.validate import (
    DEFAULT_CAPACITY,
    dflash_problems,
    speculative_problems,
    validate_request,
)


@dataclass
class Plan:
    """The planner's answer: the `dflash-infra plan` JSON (settings, their reasons, warnings, errors)."""

    tp_size: int | None = None
    dp_size: int | None = None
    gpu_ids: list[int] = field(default_factory=list)
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    context_length: int | None = None
    per_gpu: dict[str, float] = field(default_factory=dict)
    kv_cache_tokens: int | None = None
    # What SGLang itself would pick on this card where the plan sets a memory setting, and why the plan's stands.
    engine_picks: dict[str, dict[str, Any]] = field(default_factory=dict)
    speculative: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, str] = field(default_factory=dict)
    # Where the engine listens and what it serves, as the argv says: the service and its gates read them here.
    serve: dict[str, Any] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    # Behind the SGLang Model Gateway (a `gateway` section in the request): one engine per replica, each with its
    # GPUs, port and argv (`args` is replica 0's), and the gateway's own argv (`smg launch ...`).
    replicas: list[dict[str, Any]] = field(default_factory=list)
    gateway: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    candidates: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan(request: Mapping[str, Any], base: Path | None = None) -> Plan:
    """Plan one deployment from a request (the keys of examples/*.yml); stops at the first refused step."""
    out = Plan()
    notes = Notes(out.errors, out.warnings, out.reasons)  # the plan's own lists: every step writes into them

    checked = validate_request(request, base, notes)
    out.engine = checked.engine
    req = checked.request
    if req is None:
        return out
    out.serve = {key: req.serve.get(key) for key in ("host", "port", "served_model_name")}

    kernels = argv.kernel_settings(req)
    model = sizing.memory_model(req, kernels.ssm_dtype, notes)
    choice = topology.choose_tp(req, model, notes)
    out.candidates = choice.candidates
    chosen = choice.layout
    if chosen is None or out.errors:
        return out
    spread = topology.choose_dp(req, chosen.tp, notes)
    if spread is None:
        return out
    out.tp_size, out.dp_size, out.gpu_ids = spread.tp, spread.dp, spread.gpu_ids

    fraction = sizing.static_fraction(chosen, model, notes)
    if fraction is None:
        return out
    out.mem_fraction_static = fraction
    running = sizing.running_requests(chosen, req, model, notes)
    if running is None:
        return out
    out.max_running_requests = running
    context = sizing.context_length(chosen, req, notes)
    if context is None:
        return out
    out.context_length, out.kv_cache_tokens = context, chosen.kv_tokens
    out.per_gpu = sizing.per_gpu(chosen, notes)
    out.engine_picks = sizing.engine_picks(chosen, req, notes)

    rendered = argv.render(req, spread, chosen, context, kernels, notes)
    out.speculative, out.args = rendered.speculative, rendered.args
    out.replicas, out.gateway = rendered.replicas, rendered.gateway
    return out


# The plan table's labels of SGLang's own picks (sizing.engine_picks), short enough to keep the table's first column.
PICK_LABELS = {"mem_fraction_static": "mem_fraction", "cuda_graph_max_bs_decode": "decode_graph_bs",
               "max_running_requests": "max_running"}


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
    for key, pick in (result.get("engine_picks") or {}).items():
        rows.append((f"sglang.{PICK_LABELS.get(key, key)}", json.dumps(pick["sglang"]),
                     f"SGLang's own pick on this card without the plan's value; the plan's {pick['plan']}: "
                     f"{pick['why']}"))
    if result.get("speculative"):
        rows.append(("speculative", result["speculative"].get("mode", ""), result["reasons"].get("speculative", "")))
    if result.get("engine"):
        rows.append(("engine", f"sglang {result['engine'].get('version')}", result["reasons"].get("args", "")))
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = [f"{r[0]:<{width[0]}}  {r[1]:<{width[1]}}  {r[2]}".rstrip() for r in rows]
    lines.insert(1, "-" * (width[0] + width[1] + 10))
    if result.get("args"):
        lines.append("")
        label = "replica 0 engine argv: " if result.get("replicas") else "engine argv: "
        lines.append(label + " ".join(result["args"]))
    for replica in result.get("replicas") or []:
        lines.append(f"replica {replica['index']}: GPUs {replica['cuda_visible_devices']} at {replica['url']}")
    gateway = result.get("gateway")
    if gateway and (gateway.get("settings") or {}).get("remote"):
        lines.append(f"gateway: another host's, which fronts these replicas at {', '.join(gateway['workers'])}")
    elif gateway:
        lines.append("gateway argv: smg launch " + " ".join(gateway["args"]))
    for w in result.get("warnings", []):
        lines.append(f"WARNING: {w}")
    for e in result.get("errors", []):
        lines.append(f"ERROR: {e}")
    return "\n".join(lines)


def plan_dict(request: Mapping[str, Any], base: Path | None = None) -> dict[str, Any]:
    """plan() as a JSON-safe dict (the filter plugins' and the CLI's shape)."""
    return plan(request, base).to_dict()


__all__ = ["DEFAULT_CAPACITY", "ENGINE_MAX_RUNNING_SPEC", "GIB", "KNOWN_OVERRIDES", "MAMBA_FULL_MEMORY_RATIO",
           "MAMBA_SLOTS_PER_REQUEST", "MIB", "SPEC_ALGORITHMS", "Gpu", "Layout", "Plan", "dflash_problems",
           "dtype_bytes", "layout", "plan", "plan_dict", "plan_table", "speculative_problems"]
