#!/usr/bin/python
"""Ansible module dflash_host_state: read, in one round trip, everything the deploy's stages decide from."""

from __future__ import annotations

DOCUMENTATION = r"""
module: dflash_host_state
short_description: Read a GPU container's state in one round trip (read-only)
description:
  - Reads the NVIDIA kernel module's /proc files (version banner, per-GPU information readable without NVML),
    nvidia-smi's GPU and compute-process queries, the NVIDIA user-space packages with their holds and the
    libraries the loader finds, the .debs in the package folders, files the stages compare with what they
    would write (sha256, content or JSON where asked), systemd units, Python virtual environments (their
    distributions and the engine's capability cache), the training job, model folders against their
    verified state (sizes and mtimes only), who listens on the given ports, /dev/shm, free space, the
    platform and local HTTP health endpoints.
  - Never changes anything; runs the same under check mode. C(changed) is always false.
  - Text that the controller parses with its own tested parsers (nvidia-smi CSV, /proc text, dpkg lines) is
    returned as text. The action plugin of the same name (action_plugins/dflash_host_state.py) turns the result into
    the fact host_state_current on the controller (dflash_infra.host_state.normalize); its options deny_extra (package
    patterns treated as kernel side) and fact (the fact's name) stay on the controller.
options:
  sections:
    description: What to read; the default reads everything (the host_state role does, every time).
    type: list
    elements: str
    choices: [nvidia, userspace, files, accounts, units, venvs, training, models, ports, system, health, gateway]
  nvidia:
    description: nvidia_smi (command), proc_dir (the driver's /proc folder or a stand-in), gpu_fields, app_fields.
    type: dict
  deb_dirs:
    description: Folders whose *.deb files are listed (candidates for the user-space alignment).
    type: list
    elements: path
  files:
    description:
      - Paths to read, as {path, content (bool), json (bool), children (bool), secret (bool), mtime (bool)}; without
        them only existence, mode, owner and sha256; C(mtime) adds the modification time (the deploy lock's
        heartbeat). C(children) lists a folder one level deep (its JSON files parsed).
        C(secret) (a key file, or a folder of them) is never hashed nor returned, see I(secrets).
    type: list
    elements: dict
  secrets:
    description:
      - What the deploy would write into secret files, as {path, content}. The module answers for each such file
        only C(matches) (its bytes are exactly that), never a hash, so no output at any verbosity lets a key be
        recovered. Not logged (no_log).
    type: list
    elements: dict
  users:
    description: Accounts whose existence (uid, groups) is read.
    type: list
    elements: str
  groups:
    description: Groups whose existence is read.
    type: list
    elements: str
  units:
    description: systemd units whose state is read.
    type: list
    elements: str
  venvs:
    description:
      - Virtual environments to read, as {path, capabilities_file, lock_file, interpreter}; the interpreter that
        would create a missing venv is asked for its version.
    type: list
    elements: dict
  training:
    description:
      - How to find the training job (unit, match, pidfile, protect_match, protect_units, env_keep); empty for none.
    type: dict
  models:
    description:
      - Model folders, as {key, name, path, state_dir} (or {key, path, state_file} for a folder of its own); each is
        described and compared with its verified state. With state_dir, the folder is the model's last synced
        version (module_utils/dflash_sync/versions.py), else its configured path (the layout before versions).
    type: list
    elements: dict
  ports:
    description: TCP ports whose listeners are looked up.
    type: list
    elements: int
  filesystems:
    description: Paths whose file system's free space is read.
    type: list
    elements: path
  health:
    description: Local URLs to GET, as {url, timeout}; the status code is reported, nothing else is asked.
    type: list
    elements: dict
  gateway:
    description:
      - The gateway on this host, as {url, key_file, timeout}; its GET /workers is asked with the control-plane key read
        from key_file here (never returned). Empty for a host without a gateway.
    type: dict
author: dflash-infra
"""

RETURN = r"""
state:
  description: One key per section read (see the options); the controller's dflash_host_state filter reads it.
  returned: always
  type: dict
sections:
  description: The sections read.
  returned: always
  type: list
seconds:
  description: Seconds each section took on the host.
  returned: always
  type: dict
elapsed_s:
  description: Seconds the reading took on the host.
  returned: always
  type: float
"""

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ansible.module_utils.basic import AnsibleModule

if TYPE_CHECKING:
    from dflash_state import files, health, nvidia, python_env, sockets, system, systemd, userspace
    from dflash_sync.describe import describe, stamp
    from dflash_sync.errors import SyncError
    from dflash_sync.versions import ModelHome, serving
    from dflash_training.selection import find
else:
    from ansible.module_utils.dflash_state import files, health, nvidia, python_env, sockets, system, systemd, userspace
    from ansible.module_utils.dflash_sync.describe import describe, stamp
    from ansible.module_utils.dflash_sync.errors import SyncError
    from ansible.module_utils.dflash_sync.versions import ModelHome, serving
    from ansible.module_utils.dflash_training.selection import find

SECTIONS = ["nvidia", "userspace", "files", "accounts", "units", "venvs", "training", "models", "ports", "system",
            "health", "gateway"]
GPU_FIELDS = ["index", "name", "memory.total", "compute_cap", "driver_version", "pci.bus_id", "uuid"]
APP_FIELDS = ["pid", "process_name", "used_gpu_memory", "gpu_uuid"]


def read_section(name: str, p: dict[str, Any]) -> Any:
    """One section of the state (see DOCUMENTATION)."""
    if name == "nvidia":
        opts = p["nvidia"] or {}
        return {"proc": nvidia.read_proc(opts.get("proc_dir") or "/proc/driver/nvidia"),
                "smi": nvidia.query(opts.get("nvidia_smi") or "nvidia-smi", list(opts.get("gpu_fields") or GPU_FIELDS),
                                    list(opts.get("app_fields") or APP_FIELDS))}
    if name == "userspace":
        return {"probe": userspace.probe(), "dpkg": userspace.dpkg_health(),
                "debs": [path for folder in p["deb_dirs"] or [] for path in files.list_dir(folder, ".deb")]}
    if name == "files":
        expect = {str(e["path"]): str(e.get("content") or "") for e in p["secrets"] or []}
        return {f["path"]: files.read_file(f["path"], bool(f.get("content")), bool(f.get("json")),
                                           bool(f.get("children")), bool(f.get("secret")), expect,
                                           bool(f.get("mtime")))
                for f in p["files"] or []}
    if name == "accounts":
        return files.accounts(list(p["users"] or []), list(p["groups"] or []))
    if name == "units":
        return systemd.show(list(p["units"] or []))
    if name == "venvs":
        return {v["path"]: python_env.venv(v["path"], v.get("capabilities_file") or "", v.get("lock_file") or "",
                                           v.get("interpreter") or "") for v in p["venvs"] or []}
    if name == "training":
        return training_job(p["training"])
    if name == "models":
        return {m["key"]: model_folder(m) for m in p["models"] or []}
    if name == "ports":
        return {str(port): sockets.holders(int(port)) for port in p["ports"] or []}
    if name == "system":
        return {"platform": system.platform_info(), "shm": system.shm(),
                "filesystems": {path: system.filesystem(path) for path in p["filesystems"] or []}}
    if name == "health":
        return {h["url"]: health.get(h["url"], float(h.get("timeout") or 3)) for h in p["health"] or []}
    if name == "gateway":
        gw = p["gateway"] or {}
        return (health.gateway_workers(str(gw["url"]), str(gw.get("key_file") or ""), float(gw.get("timeout") or 3))
                if gw.get("url") else {"asked": False})
    raise ValueError(name)


TRAINING_KEYS = ("unit", "match", "pidfile", "protect_match", "protect_units", "env_keep")


def training_job(options: dict[str, Any] | None) -> dict[str, Any]:
    """The training job as dflash_training finds it ({mode, notes, roots, descendants, protected}); with no
    options none is looked for."""
    if not options:
        return {"looked_for": False}
    found = find(**{k: options[k] for k in TRAINING_KEYS if options.get(k) is not None})
    return {"looked_for": True, **found}


def model_folder(entry: dict[str, Any]) -> dict[str, Any]:
    """A model folder's config and index, and how it stands against its verified state (sizes and mtimes only)."""
    out: dict[str, Any] = {"name": entry.get("name"), "path": entry["path"]}
    state_file = entry.get("state_file")
    folder = entry["path"]
    if entry.get("state_dir") and entry.get("name"):
        try:
            version = serving(ModelHome(str(entry["name"]), Path(entry["path"]), Path(entry["state_dir"])))
        except (OSError, SyncError) as exc:
            version = {"folder": entry["path"], "state_file": "", "error": str(exc)}
        folder, state_file = version["folder"], version["state_file"]
        out.update(folder=folder, version=version.get("version"), current=version.get("current"),
                   versions=version.get("versions") or {}, versions_error=version.get("error"))
    try:
        out["describe"] = describe(Path(folder))
    except (OSError, ValueError, SyncError) as exc:
        out["describe"] = {"path": folder, "present": False, "error": str(exc)}
    out["stamp"] = stamp(Path(folder), Path(state_file)) if state_file else {"state_present": False}
    out["modes"] = files.tree_modes(folder)
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "sections": {"type": "list", "elements": "str", "choices": SECTIONS},
            "nvidia": {"type": "dict"},
            "deb_dirs": {"type": "list", "elements": "path"},
            "files": {"type": "list", "elements": "dict"},
            # What the deploy would write into secret files: compared on the host, never returned or logged.
            "secrets": {"type": "list", "elements": "dict", "no_log": True},
            "users": {"type": "list", "elements": "str"},
            "groups": {"type": "list", "elements": "str"},
            "units": {"type": "list", "elements": "str"},
            "venvs": {"type": "list", "elements": "dict"},
            "training": {"type": "dict"},
            "models": {"type": "list", "elements": "dict"},
            "ports": {"type": "list", "elements": "int"},
            "filesystems": {"type": "list", "elements": "path"},
            "health": {"type": "list", "elements": "dict"},
            "gateway": {"type": "dict"},
        },
        supports_check_mode=True,
    )
    p = module.params
    for option, key in (("files", "path"), ("venvs", "path"), ("models", "path"), ("health", "url")):
        missing = [i for i, item in enumerate(p[option] or []) if not item.get(key)]
        if missing:
            module.fail_json(msg=f"dflash_host_state: expected every entry of {option} to have a {key}, found "
                                 f"entries {missing} without one")
    sections = p["sections"] or SECTIONS
    start = time.monotonic()
    state: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for name in sections:
        begun = time.monotonic()
        state[name] = read_section(name, p)
        seconds[name] = round(time.monotonic() - begun, 3)
    module.exit_json(changed=False, state=state, sections=sections, seconds=seconds,
                     elapsed_s=round(time.monotonic() - start, 3))


if __name__ == "__main__":
    main()
