"""Controller-side checks of synced models: the published manifest, the planner's DFlash checks on the
synced config.json files, and the weight bytes the plan should use. Small pure functions over the JSON
that the hosts' dflash_model_sync module returns (manifests: {files: [{path, size, sha256}]}; described folders)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dflash_infra import catalogue
from dflash_infra.models import ModelConfigError, model_spec
from dflash_infra.planner import dflash_problems

DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float32": 4, "fp32": 4, "float8_e4m3fn": 1}
# Largest safetensors header we accept around the tensor bytes a published entry declares.
SAFETENSORS_HEADER_MAX = 16 << 20


def human_bytes(n: float) -> str:
    """Bytes for people: B, then KiB to TiB with two decimals."""
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    step = 0
    while abs(n) >= 1024 and step < len(units) - 1:
        n /= 1024
        step += 1
    return f"{n:.0f} B" if step == 0 else f"{n:.2f} {units[step]}"


def manifest_files(name: str, manifest: Any) -> dict[str, tuple[int, str]]:
    """path -> (size, sha256) of a manifest's JSON form; a ValueError names what is missing."""
    files = manifest.get("files") if isinstance(manifest, Mapping) else None
    if not isinstance(files, list):
        raise ValueError(f"{name}: expected a manifest object with a `files` list, found {type(manifest).__name__}")
    try:
        return {str(f["path"]): (int(f["size"]), str(f["sha256"])) for f in files}
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{name}: every file of the manifest needs path, size and sha256 ({exc})") from None


def _published_present(name: str, files: Mapping[str, tuple[int, str]], entries: list[Mapping[str, Any]], kind: str,
                       problems: list[str]) -> list[tuple[Mapping[str, Any], int, str]]:
    """The published entries the manifest has, with its size and sha256 of each; a missing one is a problem."""
    found = []
    for entry in entries:
        got = files.get(entry["file"])
        if got is None:
            problems.append(f"{name}: published {kind} {entry['file']} is missing")
        else:
            found.append((entry, *got))
    return found


def _shard_problems(name: str, files: Mapping[str, tuple[int, str]], shards: list[Mapping[str, Any]]) -> list[str]:
    problems: list[str] = []
    for shard, size, sha in _published_present(name, files, shards, "shard", problems):
        if int(shard["bytes"]) != size:
            problems.append(f"{name}: {shard['file']} is {size} bytes, the published file has {shard['bytes']}")
        elif shard.get("sha256") and shard["sha256"] != sha:
            problems.append(f"{name}: {shard['file']} sha256 {sha[:12]}... differs from the published "
                            f"{shard['sha256'][:12]}...")
    return problems


def _file_problems(name: str, files: Mapping[str, tuple[int, str]], items: list[Mapping[str, Any]]) -> list[str]:
    problems: list[str] = []
    for item, size, sha in _published_present(name, files, items, "file", problems):
        prefix = item.get("sha256_prefix") or item.get("sha256")
        if prefix and not sha.startswith(str(prefix)):
            problems.append(f"{name}: {item['file']} sha256 {sha[:12]}... does not start with the published {prefix}")
        if item.get("parameters"):
            data = int(item["parameters"]) * DTYPE_BYTES.get(str(item.get("dtype", "bfloat16")).lower(), 2)
            if not data <= size <= data + SAFETENSORS_HEADER_MAX:
                problems.append(f"{name}: {item['file']} is {size} bytes; {item['parameters']} "
                                f"{item.get('dtype', 'bfloat16')} parameters need {data} bytes plus a header")
    return problems


def published_problems(name: str, manifest_data: Mapping[str, Any]) -> list[str]:
    """Why a model folder's manifest is not the published `name` (catalogue's published-files.json); empty when
    every published fact (shard sizes and hashes, file hash prefixes, parameter bytes, index hash) matches."""
    entry = catalogue.published().get(name)
    if not entry:
        return [f"{name}: no published manifest is known (dflash_infra/data/models/published-files.json); "
                "add it or switch the published check off for this inventory"]
    files = manifest_files(name, manifest_data)
    problems = _shard_problems(name, files, entry.get("shards") or [])
    problems += _file_problems(name, files, entry.get("files") or [])
    index_sha = entry.get("index_sha256")
    index = files.get("model.safetensors.index.json")
    if index_sha and (index is None or index[1] != index_sha):
        found = "missing" if index is None else f"sha256 {index[1][:12]}..."
        problems.append(f"{name}: model.safetensors.index.json is {found}, published {index_sha[:12]}...")
    return problems


def synced_models(described: Sequence[Mapping[str, Any]], models: Mapping[str, Mapping[str, Any]],
                  manifests: Mapping[str, Mapping[str, Any]], speculative: Mapping[str, Any]) -> dict[str, Any]:
    """The catalogue entries with the synced config, weights bytes (index total_size, else the safetensors
    bytes) and manifest sha256, the planner's drafter/target problems on the synced files, and a summary line
    of the weights the plan will use."""
    by_path = {str(d["path"]): d for d in described}
    out: dict[str, Any] = {}
    problems: list[str] = []
    specs = {}
    for i, (key, model) in enumerate(models.items()):
        # The configured path, or (with versions) the version folder read in its place, in the catalogue's order.
        d = by_path.get(str(model["path"])) or (dict(described[i]) if i < len(described) else {})
        if not d.get("present"):
            problems.append(f"{model['name']}: no config.json at {d.get('path') or model['path']} after the sync")
            continue
        entry = {"name": model["name"], "path": d.get("path") or model["path"], "config": d["config"],
                 "weights_bytes": int(d.get("index_total_size") or d.get("weights_file_bytes") or 0) or None,
                 "manifest_sha256": (manifests.get(model["name"]) or {}).get("manifest_sha256")}
        out[key] = entry
        try:
            specs[key] = model_spec(d["config"], name=model["name"])
        except ModelConfigError as exc:
            problems.append(f"{model['name']}: the synced config.json at {entry['path']} is not usable: {exc}")
    if "target" in specs and "draft" in specs and speculative.get("algorithm", "dflash") != "none":
        problems += dflash_problems(specs["target"], specs["draft"], speculative)
    summary = ", ".join(f"{m['name']} {human_bytes(m['weights_bytes'] or 0)}" for m in out.values())
    return {"models": out, "problems": problems, "summary": summary}


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
            section["path"] = got.get("folder") or section.get("path")  # the version folder the engine loads
        elif "config" not in section and "config_path" not in section and name in catalogue.known_models():
            section["config"] = catalogue.config(name)
            weights = catalogue.weights_bytes(name)
        else:
            weights = None
        if weights and not section.get("weights_bytes"):
            section["weights_bytes"] = int(weights)
        out[key] = section
    return out


def verified_in_place(state: Mapping[str, Any], models: Mapping[str, Mapping[str, Any]],
                      manifests: Mapping[str, Mapping[str, Any]], ownership: Mapping[str, str]) -> dict[str, str]:
    """name -> why the destination needs no plan, for each model whose folder host_state found to be a verified
    copy of exactly this source manifest (its files match the verified state by size and mtime, that state is
    the manifest, and every file and folder has the configured mode and owner). The others are planned."""
    want_files = f"{ownership['file_mode']} {ownership['owner']}:{ownership['group']}"
    want_dirs = f"{ownership['dir_mode']} {ownership['owner']}:{ownership['group']}"
    out: dict[str, str] = {}
    for key, model in models.items():
        seen = ((state.get("models") or {}).get(key)) or {}
        stamp = seen.get("stamp") or {}
        modes = seen.get("modes") or {}
        digest = (manifests.get(str(model["name"])) or {}).get("manifest_sha256")
        if (stamp.get("matches") and digest and stamp.get("state_digest") == digest
                and modes.get("files") == [want_files] and modes.get("dirs") == [want_dirs]):
            out[str(model["name"])] = (f"{model['name']}: a verified copy of the source's manifest {str(digest)[:16]} "
                                       f"({stamp.get('files')} files, {human_bytes(int(stamp.get('bytes') or 0))}; "
                                       "sizes and mtimes match its verified state, no byte read)")
    return out


def scan_folder(model: Mapping[str, Any], mode: str, source_root: str, controller_root: str, state_dir: str,
                cache_dir: str, controller_cache_dir: str) -> dict[str, str]:
    """Where one model's manifest is computed ({name, root, cache}): the source host's folder with its manifest
    cache, the controller's copy, or (present mode) the destination's own folder with its verified state."""
    name = str(model["name"])
    if mode == "present":
        return {"name": name, "root": str(model["path"]), "cache": f"{state_dir}/{name}.manifest.json"}
    if mode == "controller":
        return {"name": name, "root": f"{controller_root}/{name}", "cache": f"{controller_cache_dir}/{name}.json"}
    return {"name": name, "root": f"{source_root}/{name}", "cache": f"{cache_dir}/{name}.json"}
