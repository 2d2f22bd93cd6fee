"""Controller-side checks of synced models: the published manifest, the planner's DFlash checks on the
synced config.json files, and the weight bytes the plan should use. Small pure functions over the JSON
that the hosts' manifest tool prints."""

from __future__ import annotations

from typing import Any, Mapping

from dflash_infra import catalogue, manifest
from dflash_infra.models import ModelConfigError, model_spec
from dflash_infra.planner import dflash_problems


def published_problems(name: str, manifest_data: Mapping[str, Any]) -> list[str]:
    """Why a model directory's manifest is not the published `name` (catalogue's published-files.json)."""
    return manifest.published_problems(name, manifest.Manifest.from_dict(manifest_data, name),
                                       catalogue.published().get(name))


def plan_summary(plan: Mapping[str, Any]) -> str:
    """One line per model for the play output: what a sync does (or would do) at the destination."""
    counts = {a: sum(1 for f in plan["files"] if f["action"] == a) for a in ("ok", "adopt", "staged", "transfer")}
    resume = sum(int(f.get("resume_bytes") or 0) for f in plan["files"])
    parts = [f"{plan['name']}: {len(plan['files'])} files, {manifest.human(plan['total_bytes'])}"]
    parts.append(f"{counts['ok']} verified in place")
    if counts["adopt"]:
        parts.append(f"{counts['adopt']} present and adopted after hashing")
    if counts["staged"]:
        parts.append(f"{counts['staged']} received earlier, to verify")
    if counts["transfer"]:
        parts.append(f"{counts['transfer']} to copy ({manifest.human(plan['transfer_bytes'])}"
                     + (f", {manifest.human(resume)} already received" if resume else "") + ")")
    if plan.get("extras"):
        parts.append(f"{len(plan['extras'])} extra files to remove ({', '.join(plan['extras'][:3])})")
    parts.append(f"hashed {manifest.human(plan.get('hashed_bytes', 0))} to decide")
    parts.append(f"free {manifest.human(plan['free_bytes'])}")
    return ", ".join(parts)


def synced_models(described: list[Mapping[str, Any]], models: Mapping[str, Mapping[str, Any]],
                  manifests: Mapping[str, Mapping[str, Any]], speculative: Mapping[str, Any]) -> dict[str, Any]:
    """The catalogue entries with the synced config, weights bytes (index total_size, else the safetensors
    bytes) and manifest sha256, plus the planner's drafter/target problems on the synced files."""
    by_path = {str(d["path"]): d for d in described}
    out: dict[str, Any] = {}
    problems: list[str] = []
    specs = {}
    for key, model in models.items():
        d = by_path.get(str(model["path"]), {})
        if not d.get("present"):
            problems.append(f"{model['name']}: no config.json at {model['path']} after the sync")
            continue
        entry = {"name": model["name"], "path": model["path"], "config": d["config"],
                 "weights_bytes": int(d.get("index_total_size") or d.get("weights_file_bytes") or 0) or None,
                 "manifest_sha256": (manifests.get(model["name"]) or {}).get("manifest_sha256")}
        out[key] = entry
        try:
            specs[key] = model_spec(d["config"], name=model["name"])
        except ModelConfigError as exc:
            problems.append(f"{model['name']}: the synced config.json at {model['path']} is not usable: {exc}")
    if "target" in specs and "draft" in specs and speculative.get("algorithm", "dflash") != "none":
        problems += dflash_problems(specs["target"], specs["draft"], speculative)
    return {"models": out, "problems": problems}


def plan_models(models: Mapping[str, Mapping[str, Any]], synced: Mapping[str, Mapping[str, Any]] | None
                ) -> dict[str, dict[str, Any]]:
    """The planner's model sections with the config.json and weight bytes it will use: the synced ones (the
    destination's index) where this run synced and checked the model, the catalogue's otherwise. Explicit,
    so two plans can be compared by their inputs."""
    out: dict[str, dict[str, Any]] = {}
    for key, model in models.items():
        section = dict(model)
        got = (synced or {}).get(key) or {}
        name = str(model.get("name", ""))
        if got.get("name") == name and got.get("config"):
            section["config"] = got["config"]
            weights = got.get("weights_bytes")
        elif "config" not in section and "config_path" not in section and name in catalogue.known_models():
            section["config"] = catalogue.config(name)
            weights = catalogue.weights_bytes(name)
        else:
            weights = None
        if weights and not section.get("weights_bytes"):
            section["weights_bytes"] = int(weights)
        out[key] = section
    return out
