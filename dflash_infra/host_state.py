"""The state of one host as the deploy's stages decide from it, built from one dflash_host_state read.

The module on the host only reads; the text it returns (nvidia-smi CSV, /proc files, dpkg lines) is parsed
here with the project's parsers, so each format has one parser, tested on real captures. Stages compare
this state with what they would write and change nothing when the host already matches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dflash_infra import driver, parsers

Json = dict[str, Any]


def _parse_smi_query(kind: str, result: Mapping[str, Any] | None, fields: Sequence[str]) -> list[Json]:
    if not result or result.get("rc") != 0:
        return []
    parsed: list[Json] = parsers.parse_text(kind, str(result.get("stdout") or ""), f"nvidia-smi --query-{kind}",
                                            list(fields))
    return parsed


def _gpu_information(proc: Mapping[str, Any]) -> list[Json]:
    """Each GPU's /proc/driver/nvidia/gpus/<bus>/information, parsed, in bus order."""
    out: list[Json] = []
    for entry in proc.get("gpus") or []:
        info: Json = parsers.parse_gpu_information(str(entry["information"]),
                                                   source=f"{proc.get('dir')}/gpus/{entry['bus']}/information")
        out.append(info)
    return out


def nvidia_state(raw: Mapping[str, Any]) -> Json:
    """Kernel module, per-GPU /proc information, nvidia-smi's status, GPUs and their compute processes."""
    proc = raw.get("proc") or {}
    smi_raw = raw.get("smi") or {}
    query = smi_raw.get("gpus") or {}
    version_text = proc.get("version")
    kernel_module: Json = (parsers.parse_text("driver", str(version_text), f"{proc.get('dir')}/version")
                           if version_text else {})
    smi = driver.smi_status(query.get("rc"), str(query.get("stdout") or ""), str(query.get("stderr") or ""),
                            str(query.get("stderr") or ""))
    ok = smi["status"] == "ok"
    return {
        "kernel_module": kernel_module,
        "gpu_information": _gpu_information(proc),
        "smi": smi,
        "gpus": _parse_smi_query("gpus", query, smi_raw.get("gpu_fields") or []) if ok else [],
        "gpu_processes": (_parse_smi_query("apps", smi_raw.get("apps"), smi_raw.get("app_fields") or [])
                          if ok else []),
    }


def identity(state: Mapping[str, Any]) -> Json:
    """The GPUs to check against the group: nvidia-smi's when it works, else the /proc information files
    (model and count; memory and compute capability are not readable there)."""
    if state.get("gpus"):
        return {"source": "nvidia-smi", "gpus": list(state["gpus"])}
    gpus = [{"index": i, "name": g.get("name"), "uuid": g.get("uuid"), "pci_bus_id": g.get("bus_location"),
             "memory_total_mib": None, "compute_cap": None} for i, g in enumerate(state.get("gpu_information") or [])]
    return {"source": "/proc/driver/nvidia/gpus" if gpus else "none", "gpus": gpus}


def normalize(raw: Mapping[str, Any], deny_extra: Sequence[str] = ()) -> Json:
    """The stages' view of a dflash_host_state result (`state`): parsed, with the driver summary."""
    state: Json = {"sections": sorted(raw)}
    if "nvidia" in raw:
        state.update(nvidia_state(raw["nvidia"]))
        state["identity"] = identity(state)
    if "userspace" in raw:
        probe = driver.parse_userspace_probe(str(raw["userspace"].get("probe") or ""),
                                             "dflash_host_state: user-space probe")
        state["userspace"] = probe.to_dict()
        state["debs"] = list(raw["userspace"].get("debs") or [])
        state["dpkg"] = dict(raw["userspace"].get("dpkg") or {})
        if "nvidia" in raw:
            state["driver"] = driver.driver_state(state["kernel_module"], probe, state["smi"],
                                                  driver.DENY_PATTERNS + tuple(deny_extra))
    for key in ("files", "accounts", "units", "venvs", "training", "models", "ports", "system", "health", "gateway"):
        if key in raw:
            state[key] = raw[key]
    return state


def merge(raw: Mapping[str, Any], fresh: Mapping[str, Any]) -> Json:
    """A raw read with some sections read again: the fresh sections replace the old ones."""
    return {**raw, **fresh}


def file_sha256(state: Mapping[str, Any], path: str) -> str | None:
    """The sha256 of a file the state read (None when it does not exist or was not read)."""
    entry = (state.get("files") or {}).get(path) or {}
    return entry.get("sha256") if entry.get("exists") else None


def file_matches(state: Mapping[str, Any], path: str, sha256: str, mode: str = "", owner: str = "",
                 group: str = "") -> bool:
    """Whether the host already has this exact file (content, and mode/owner/group where given), so the task
    that would write it can be left out: a converged host costs no round trip."""
    entry = (state.get("files") or {}).get(path) or _child(state, path) or {}
    if not entry.get("exists") or entry.get("kind") != "file" or entry.get("sha256") != sha256:
        return False
    return all(not want or entry.get(key) == want for key, want in (("mode", mode), ("owner", owner), ("group", group)))


def secret_matches(state: Mapping[str, Any], path: str, mode: str = "", owner: str = "", group: str = "") -> bool:
    """Whether a secret file holds exactly what the deploy would write (compared on the host from host_state's
    `secrets`: the read carries only this answer, never a hash of the key), with this mode/owner/group."""
    entry = (state.get("files") or {}).get(path) or _child(state, path) or {}
    if not entry.get("exists") or entry.get("kind") != "file" or entry.get("matches") is not True:
        return False
    return all(not want or entry.get(key) == want for key, want in (("mode", mode), ("owner", owner), ("group", group)))


def dir_matches(state: Mapping[str, Any], path: str, mode: str = "", owner: str = "", group: str = "") -> bool:
    """Whether the host already has this folder with this mode/owner/group (where given)."""
    entry = path_entry(state, path)
    if not entry.get("exists") or entry.get("kind") != "dir":
        return False
    return all(not want or entry.get(key) == want for key, want in (("mode", mode), ("owner", owner), ("group", group)))


def existing(state: Mapping[str, Any], paths: Sequence[str]) -> list[str]:
    """The paths among `paths` that the state found on the host."""
    return [p for p in paths if path_entry(state, p).get("exists")]


def _child(state: Mapping[str, Any], path: str) -> Json | None:
    """A path read as a child of a folder the state listed."""
    parent, _, name = path.rpartition("/")
    folder = (state.get("files") or {}).get(parent) or {}
    child: Json | None = (folder.get("children") or {}).get(name)
    return child


def path_entry(state: Mapping[str, Any], path: str) -> Json:
    """What the state read at a path (directly or as a child of a listed folder); {exists: false} when absent."""
    return (state.get("files") or {}).get(path) or _child(state, path) or {"path": path, "exists": False}


def model_entries(models: Mapping[str, Mapping[str, Any]], state_dir: str) -> list[Json]:
    """dflash_host_state's models option for a catalogue: each model's configured path with model_sync's state
    folder (its versions and their verified states)."""
    return [{"key": key, "name": m["name"], "path": m["path"], "state_dir": state_dir} for key, m in models.items()]


def gpu_holders(state: Mapping[str, Any], gpu_ids: Sequence[int], allowed_pids: Sequence[int] = ()) -> list[Json]:
    """The processes nvidia-smi listed on the given GPUs (all GPUs when none are named), but the allowed pids."""
    index_of = {g.get("uuid"): g.get("index") for g in state.get("gpus") or []}
    wanted = set(gpu_ids)
    return [p for p in state.get("gpu_processes") or [] if int(p.get("pid") or 0) not in set(allowed_pids)
            and (not wanted or index_of.get(p.get("gpu_uuid")) in wanted)]


def protected_pids(state: Mapping[str, Any]) -> list[int]:
    """The processes the training job's selection never stops (the engine's), as host_state found them."""
    return [int(p["pid"]) for p in ((state.get("training") or {}).get("protected") or [])]


def training_idle(state: Mapping[str, Any], gpu_ids: Sequence[int]) -> bool:
    """Whether host_state already shows that there is nothing to stop: it looked for the training job and found
    none, and nvidia-smi listed no process but the protected ones (the engine) on the GPUs the plan needs, or
    cannot run at all (a driver/library mismatch: the GPUs are checked once the driver is aligned)."""
    training = state.get("training") or {}
    if not training.get("looked_for") or training.get("roots"):
        return False
    return state.get("smi", {}).get("status") != "ok" or not gpu_holders(state, gpu_ids, protected_pids(state))


def gpu_holders_problems(state: Mapping[str, Any], host: str, gpu_ids: Sequence[int]) -> list[str]:
    """Why the GPUs the plan needs are not free by host_state (nvidia-smi's processes but the engine's)."""
    if state.get("smi", {}).get("status") != "ok":
        return [f"{host}: nvidia-smi {state.get('smi', {}).get('status')}: the GPUs cannot be checked. Expected a "
                "working nvidia-smi after the driver alignment; run the deploy again once the driver is aligned"]
    holders = gpu_holders(state, gpu_ids, protected_pids(state))
    if not holders:
        return []
    items = "; ".join(f"pid {h.get('pid')} ({h.get('process_name')}) with {h.get('used_memory_mib')} MiB"
                      for h in holders)
    return [f"{host}: expected the GPUs the plan needs ({', '.join(map(str, gpu_ids)) or 'all'}) to be free, found "
            f"{items}. Nothing else was changed. Find the owner with `ps -o pid,user,lstart,args -p <pid>`, stop it, "
            "and run the play again"]


def driver_protection_needed(plan: Mapping[str, Any], state: Mapping[str, Any], hold: bool, pin_path: str,
                             pin_sha256: str, snippet_path: str, snippet_sha256: str) -> bool:
    """Whether an aligned host still lacks a hold of the set, or the pin or unattended-upgrades snippet the role
    would write (content, mode 0644, root-owned), by host_state."""
    unheld = set(plan.get("hold") or []) & set(plan.get("installed") or []) - set(plan.get("held") or [])
    return bool(hold and unheld) or not all(
        file_matches(state, path, sha, "0644", "root", "root")
        for path, sha in ((pin_path, pin_sha256), (snippet_path, snippet_sha256)))
