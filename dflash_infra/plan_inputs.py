"""What the planner plans from, decided from the host's state: one answer whatever the entry point.

The deploy, serve.yml, plan.yml and gpu_host_check.yml all plan with these functions, so the same host
gives the same plan (and the same unit) however it is reached.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dflash_infra import catalogue, host_state, model_checks, preflight

Json = dict[str, Any]


def plan_gpus(state: Mapping[str, Any] | None, hardware: Mapping[str, Any] | None) -> list[Json]:
    """The GPUs to plan on: nvidia-smi's when it works; the group's expected hardware for an offline plan, or
    when only the /proc information files could identify the GPUs (a driver/library mismatch: they name the
    model and count, which preflight checked, but not the memory) until the driver is aligned. A host in no
    group with expected hardware (`hardware` None) is planned on nvidia-smi's GPUs only."""
    if not state:
        return catalogue.expected_gpus(dict(hardware)) if hardware else []
    if state.get("gpus"):
        return [dict(g) for g in state["gpus"]]
    identity = state.get("identity") or {}
    if hardware and identity.get("gpus") and str(identity.get("source", "")).startswith("/proc"):
        return catalogue.expected_gpus(dict(hardware))
    return []


def gpu_host_basis(state: Mapping[str, Any], hardware: Mapping[str, Any] | None, host: str) -> Json:
    """What playbooks/gpu_host_check.yml checks a host against, said in one line: its group's expected hardware
    when it has one, else its own GPUs. `ok` is false, with the reason, for a host with no NVIDIA GPU, one that
    is not its group's hardware, or one whose GPU memory cannot be read (nvidia-smi fails and no group says it)."""
    identity = state.get("identity") or host_state.identity(state)
    gpus = list(identity.get("gpus") or [])
    smi = state.get("smi") or {}
    if not gpus:
        return {"ok": False, "msg": (
            f"{host} has no NVIDIA GPU to check: nvidia-smi: {smi.get('message') or smi.get('status') or 'not run'}; "
            "/proc/driver/nvidia/gpus lists none. gpu_host_check.yml checks a GPU host: run it against one, or "
            "give this container its GPUs (docs/proxmox.md, passthrough).")}
    names = ", ".join(sorted({str(g.get("name")) for g in gpus}))
    if hardware:
        problems = preflight.identity_problems(host, hardware, identity)
        said = (f"{host} is checked against group {hardware.get('group')}'s expected hardware "
                f"({preflight.expected_text(hardware)})")
        return {"ok": not problems, "msg": "; ".join(problems) if problems else f"{said}: it matches."}
    if identity.get("source") != "nvidia-smi":
        return {"ok": False, "msg": (
            f"{host} is in no group with dflash_expected_hardware and nvidia-smi cannot run "
            f"({smi.get('message') or smi.get('status')}); its /proc information files name {len(gpus)}x {names} "
            "but not their memory, so there is nothing to plan on. Align the NVIDIA user space with the kernel module "
            "(docs/driver.md) or add the host to its group (README, adding a host), then run this again.")}
    memory = sorted({int(g.get("memory_total_mib") or 0) for g in gpus})
    caps = sorted({str(g.get("compute_cap")) for g in gpus})
    return {"ok": True, "msg": (
        f"{host} is in no group with dflash_expected_hardware: planned on its own GPUs as nvidia-smi reports them, "
        f"{len(gpus)}x {names} ({'/'.join(map(str, memory))} MiB, compute capability {'/'.join(caps)}).")}


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
                    "manifest_sha256": (model.get("stamp") or {}).get("state_digest"),
                    "folder": model.get("folder") or model.get("path")}
    return out


def plan_models(models: Mapping[str, Mapping[str, Any]], state: Mapping[str, Any] | None,
                speculative: Mapping[str, Any]) -> dict[str, Json]:
    """The planner's target and draft sections: the host's verified copies where it has them, the catalogue's
    published config and sizes before the first sync; no draft when speculative decoding is off."""
    chosen = model_checks.plan_models(models, synced_from_state(state))
    # A speculative section that is not an object is the planner's to refuse, naming it (planning/schema.py).
    if isinstance(speculative, Mapping) and str(speculative.get("algorithm", "dflash")) == "none":
        chosen.pop("draft", None)
    return chosen


def manifests(models: Mapping[str, Mapping[str, Any]], state: Mapping[str, Any] | None) -> dict[str, Json]:
    """What the deployment record says of each model: its path and the verified manifest's sha256 (None
    when the folder is not a verified copy)."""
    synced = synced_from_state(state)
    return {key: {"path": (synced.get(key) or {}).get("folder") or model.get("path"),
                  "manifest_sha256": (synced.get(key) or {}).get("manifest_sha256")}
            for key, model in models.items()}
