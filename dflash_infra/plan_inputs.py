"""What the planner plans from, decided from the host's state: one answer whatever the entry point.

The deploy, serve.yml, plan.yml and gpu_host_check.yml all plan with these functions, so the same host
gives the same plan (and the same unit) however it is reached.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dflash_infra import catalogue, model_checks

Json = dict[str, Any]


def plan_gpus(state: Mapping[str, Any] | None, hardware: Mapping[str, Any]) -> list[Json]:
    """The GPUs to plan on: nvidia-smi's when it works; the group's expected hardware for an offline plan, or
    when only the /proc information files could identify the GPUs (a driver/library mismatch: they name the
    model and count, which preflight checked, but not the memory) until the driver is aligned."""
    if not state:
        return catalogue.expected_gpus(dict(hardware))
    if state.get("gpus"):
        return [dict(g) for g in state["gpus"]]
    identity = state.get("identity") or {}
    if identity.get("gpus") and str(identity.get("source", "")).startswith("/proc"):
        return catalogue.expected_gpus(dict(hardware))
    return []


def synced_from_state(state: Mapping[str, Any] | None) -> dict[str, Json]:
    """Per catalogue key, the config.json and weight bytes of a folder that is a verified copy (its files
    match the state model_sync recorded); folders that are absent or differ from it give nothing."""
    out: dict[str, Json] = {}
    for key, model in ((state or {}).get("models") or {}).items():
        described = model.get("describe") or {}
        if not (model.get("stamp") or {}).get("matches") or not described.get("present"):
            continue
        weights = int(described.get("index_total_size") or described.get("weights_file_bytes") or 0) or None
        out[key] = {"name": model.get("name"), "config": described.get("config"), "weights_bytes": weights,
                    "manifest_sha256": (model.get("stamp") or {}).get("state_digest")}
    return out


def plan_models(models: Mapping[str, Mapping[str, Any]], state: Mapping[str, Any] | None,
                speculative: Mapping[str, Any]) -> dict[str, Json]:
    """The planner's target and draft sections: the host's verified copies where it has them, the catalogue's
    published config and sizes before the first sync; no draft when speculative decoding is off."""
    chosen = model_checks.plan_models(models, synced_from_state(state))
    if str(speculative.get("algorithm", "dflash")) == "none":
        chosen.pop("draft", None)
    return chosen


def manifests(models: Mapping[str, Mapping[str, Any]], state: Mapping[str, Any] | None) -> dict[str, Json]:
    """What the deployment record says of each model: its path and the verified manifest's sha256 (None
    when the folder is not a verified copy)."""
    synced = synced_from_state(state)
    return {key: {"path": model.get("path"), "manifest_sha256": (synced.get(key) or {}).get("manifest_sha256")}
            for key, model in models.items()}
