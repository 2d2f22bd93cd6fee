#!/usr/bin/python
"""Ansible module dflash_model_sync: manifests at the source, verified copies at the destination."""

from __future__ import annotations

DOCUMENTATION = r"""
module: dflash_model_sync
short_description: Verified, resumable, atomic copies of model folders
description:
  - C(action=scan), at the source host, computes the manifest (every file's size and sha256) of a model folder,
    cached by size and mtime so an unchanged file is not read again. Under check mode the cache is read but not
    written. C(changed) is always false (the cache is bookkeeping, not state).
  - C(action=sync), at the destination, compares the folder with the source manifest and, unless under check
    mode, pulls what is missing or different with rsync over SSH into a staging folder on the same file system
    (resumable from partial files), hashes each file while rsync writes it, renames verified files into place,
    removes files the source does not have and records the verified state. A folder that already matches its
    verified state is a no-op that reads no model byte and writes nothing. Under check mode it reports the plan
    (what would be copied, adopted, removed, and free-space problems) and changes nothing.
  - With I(versions), each copy is a version folder named by its manifest (module_utils/dflash_sync/versions.py):
    unchanged files are hard-linked from the kept versions, the old layout is migrated by one rename, and the
    version becomes the one the next plan serves. C(action=promote) makes a model's last synced version (or
    I(version)) the one in use (its configured path, a link, switched atomically) and keeps the newest I(keep).
    C(action=check_versions) says whether the recorded version folders can be served again (read-only).
  - C(action=describe) reads the config.json and index of model folders (small files only): I(paths), or each
    of I(models)' last synced version.
options:
  action:
    description: What to do.
    type: str
    required: true
    choices: [scan, sync, describe, promote, check_versions]
  root:
    description: (scan) The model folder to list (or C(folders) for several in one call).
    type: path
  folders:
    description: (scan) Several model folders in one call, as {name, root, cache}; the result's C(manifests) maps
      each name to what a single scan returns.
    type: list
    elements: dict
  cache:
    description: (scan) Manifest cache file; empty for none.
    type: path
  write_cache:
    description: (scan) Write the cache when the manifest differs from it; false reads it only (a verified state
      used as the cache). Never written under check mode.
    type: bool
    default: true
  name:
    description: (sync) The model's name (the catalogue's), used for the staging, state, report and log names.
    type: str
  manifest:
    description: (sync) The source manifest, as C(action=scan) returned it.
    type: dict
  dest:
    description: (sync) The model folder at the destination.
    type: path
  state_dir:
    description: (sync) Where the verified state (<name>.manifest.json) and the last report (<name>.sync.json) live.
    type: path
    default: /var/lib/dflash-infra/models
  log_dir:
    description: (sync) Where the transfer progress log (model-sync-<name>.log) is written.
    type: path
    default: /var/log/dflash-infra
  verify:
    description: (sync) changed trusts files unchanged since the last verified sync; full hashes every file again.
    type: str
    default: changed
    choices: [changed, full]
  reserve_bytes:
    description: (sync) Free bytes that must remain on the destination's file system after the copy.
    type: int
    default: 0
  source:
    description: (sync) Where to pull from over SSH; omit when the files are already at the destination.
    type: dict
    suboptions:
      address: {description: Address of the source host as the destination reaches it., type: str, required: true}
      path: {description: Folder as the source's rsync sees it (under the rrsync root)., type: str, required: true}
      user: {description: SSH user., type: str, default: root}
      port: {description: SSH port., type: int, default: 22}
      ssh_key: {description: Private key file at the destination., type: path}
      known_hosts: {description: known_hosts file holding the source's host key., type: path}
      ciphers: {description: SSH cipher preference., type: str}
  bwlimit_kbps:
    description: (sync) rsync bandwidth limit in KiB/s; 0 for none.
    type: int
    default: 0
  owner:
    description: (sync) Owner of the synced files; empty to leave it.
    type: str
    default: ""
  group:
    description: (sync) Group of the synced files; empty to leave it.
    type: str
    default: ""
  file_mode:
    description: (sync) Mode of the synced files, in octal.
    type: str
    default: "0644"
  dir_mode:
    description: (sync) Mode of the synced folders, in octal.
    type: str
    default: "0755"
  delete_extra:
    description:
      - (sync) Remove files at the destination that the source no longer has, when this project wrote them (the
        model's last verified state lists them). Any other file there is never removed: it is named in the result's
        C(plan.foreign) (or refused with I(strict)).
    type: bool
    default: true
  model_root:
    description:
      - (sync) The model root (dflash_model_root): I(dest) must be an absolute, normalised folder strictly under it,
        else nothing is copied or removed.
    type: path
  strict:
    description: (sync) Refuse to sync beside files this project did not write, instead of leaving and naming them.
    type: bool
    default: false
  heartbeat:
    description: (sync) The deploy lock, touched as a transfer progresses (the run's heartbeat during a long copy).
    type: path
  versions:
    description: (sync) Keep each copy in a version folder named by its manifest, the configured I(dest) a link.
    type: bool
    default: false
  keep:
    description: (sync, promote) Versions that passed a deploy kept per model (1 removes the others before a copy).
    type: int
    default: 2
  models:
    description:
      - (promote) {name, path, and optionally version or folder (a record's version folder); else the last synced
        one} per model.
      - (check_versions) {name, path, folder, manifest_sha256} per model, as a deployment record names them.
      - (describe) {name, path} per model: its last synced version is read.
    type: list
    elements: dict
  prune:
    description: (promote) Remove the versions beyond I(keep) (false for a rollback).
    type: bool
    default: true
  paths:
    description: (describe) Model folders to read.
    type: list
    elements: path
author: dflash-infra
"""

EXAMPLES = r"""
- name: Compute the manifest at the source
  dflash_model_sync:
    action: scan
    root: /root/models/Qwen3.6-27B
    cache: /var/cache/dflash-infra/manifests/Qwen3.6-27B.json
  delegate_to: ct129
  register: scanned

- name: Copy, verify and move the model into place
  dflash_model_sync:
    action: sync
    name: Qwen3.6-27B
    manifest: "{{ scanned }}"
    dest: /root/models/Qwen3.6-27B
    source: {address: 10.0.0.129, path: Qwen3.6-27B, ssh_key: /root/.ssh/dflash_model_sync_ed25519}
"""

RETURN = r"""
manifest:
  description: (scan) The manifest, {schema, root, total_bytes, manifest_sha256, files (path, size, sha256,
    mtime_ns)}, as C(action=sync) takes it.
  returned: scan
  type: dict
manifest_sha256:
  description: sha256 of the manifest's (path, size, sha256) listing; equal for equal copies.
  returned: scan, sync
  type: str
total_bytes:
  description: Bytes of the model.
  returned: scan, sync
  type: int
files:
  description: (sync) How many files the model has.
  returned: sync
  type: int
scan:
  description: (scan) files, cached_files, hashed_files, hashed_bytes of this scan.
  returned: scan
  type: dict
cache_written:
  description: (scan) Whether the cache file was written (under check mode, whether it would be).
  returned: scan
  type: bool
plan:
  description: (sync) Per file ok/adopt/staged/transfer with the reason, extras, permissions, transfer_bytes,
    needed_bytes, free_bytes, hashed_bytes (what deciding read), problems, changes.
  returned: sync
  type: dict
summary:
  description: (sync) One line saying what the sync did, or under check mode what it would do.
  returned: sync
  type: str
moved:
  description: (sync) Files renamed into place; also removed, permissions, adopted, repaired.
  returned: sync, not under check mode
  type: list
transfers:
  description: (sync) Each rsync run with files, bytes, seconds, rc, stats (literal_data, matched_data, ...),
    adopted_partials and resumed_bytes.
  returned: sync, not under check mode
  type: list
hashed_bytes:
  description: (sync) Bytes hashed by sha256 in all; hashed_while_receiving of it while rsync was writing.
  returned: sync, not under check mode
  type: int
models:
  description: (describe) Per folder its path, present, config, index_total_size and weights_file_bytes;
    (promote) per model its version, switched {from, to}, pruned and foreign folders.
  returned: describe, promote
  type: list
problems:
  description: (check_versions) Why a recorded version cannot be served again, one sentence each.
  returned: check_versions
  type: list
io_read_bytes:
  description: Bytes the module's process read through read() (/proc/self/io rchar), the proof of what a run read.
  returned: always
  type: int
"""

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ansible.module_utils.basic import AnsibleModule

if TYPE_CHECKING:
    from dflash_sync.commit import Ownership
    from dflash_sync.describe import describe
    from dflash_sync.errors import SyncError
    from dflash_sync.manifest import Manifest, scan_cached
    from dflash_sync.messages import plan_summary, sync_summary
    from dflash_sync.rsync import Remote
    from dflash_sync.sync import ModelPaths, SyncOptions, diff, preview, sync
    from dflash_sync.versions import ModelHome, label_of, promote, serving, version_problem
else:
    from ansible.module_utils.dflash_sync.commit import Ownership
    from ansible.module_utils.dflash_sync.describe import describe
    from ansible.module_utils.dflash_sync.errors import SyncError
    from ansible.module_utils.dflash_sync.manifest import Manifest, scan_cached
    from ansible.module_utils.dflash_sync.messages import plan_summary, sync_summary
    from ansible.module_utils.dflash_sync.rsync import Remote
    from ansible.module_utils.dflash_sync.sync import ModelPaths, SyncOptions, diff, preview, sync
    from ansible.module_utils.dflash_sync.versions import ModelHome, label_of, promote, serving, version_problem

SOURCE_OPTIONS: dict[str, Any] = {
    "address": {"type": "str", "required": True}, "path": {"type": "str", "required": True},
    "user": {"type": "str", "default": "root"}, "port": {"type": "int", "default": 22},
    "ssh_key": {"type": "path"}, "known_hosts": {"type": "path"}, "ciphers": {"type": "str"}}

ARGUMENT_SPEC: dict[str, Any] = {
    "action": {"type": "str", "required": True, "choices": ["scan", "sync", "describe", "promote", "check_versions"]},
    "root": {"type": "path"}, "cache": {"type": "path"}, "folders": {"type": "list", "elements": "dict"},
    "write_cache": {"type": "bool", "default": True},
    "name": {"type": "str"}, "manifest": {"type": "dict"}, "dest": {"type": "path"},
    "state_dir": {"type": "path", "default": "/var/lib/dflash-infra/models"},
    "log_dir": {"type": "path", "default": "/var/log/dflash-infra"},
    "verify": {"type": "str", "default": "changed", "choices": ["changed", "full"]},
    "reserve_bytes": {"type": "int", "default": 0},
    "source": {"type": "dict", "options": SOURCE_OPTIONS},
    "bwlimit_kbps": {"type": "int", "default": 0},
    "owner": {"type": "str", "default": ""}, "group": {"type": "str", "default": ""},
    "file_mode": {"type": "str", "default": "0644"}, "dir_mode": {"type": "str", "default": "0755"},
    "delete_extra": {"type": "bool", "default": True},
    "model_root": {"type": "path"},
    "strict": {"type": "bool", "default": False},
    "heartbeat": {"type": "path"},
    "versions": {"type": "bool", "default": False},
    "keep": {"type": "int", "default": 2},
    "models": {"type": "list", "elements": "dict"},
    "prune": {"type": "bool", "default": True},
    "paths": {"type": "list", "elements": "path"},
}
REQUIRED_IF = [("action", "scan", ["root", "folders"], True), ("action", "sync", ["name", "manifest", "dest"]),
               ("action", "describe", ["paths", "models"], True), ("action", "promote", ["models"]),
               ("action", "check_versions", ["models"])]


def io_read_bytes() -> int:
    """Bytes this process read through read() so far (/proc/self/io rchar): proof of what a run read."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


def octal(option: str, value: str) -> int:
    """A file mode given as an octal string; a SyncError says what was expected."""
    try:
        mode = int(str(value), 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o7777:
        raise SyncError(f"{option}: expected an octal mode such as '0644', found {value!r}")
    return mode


def ownership(p: dict[str, Any]) -> Ownership:
    """The owner, group and modes to set, checked against this host's users and groups."""
    own = Ownership(p["owner"], p["group"], octal("file_mode", p["file_mode"]), octal("dir_mode", p["dir_mode"]))
    try:
        own.ids()
    except KeyError as exc:
        raise SyncError(f"owner/group: expected a user {own.owner!r} and a group {own.group!r} on this host, "
                        f"found no {exc}; create them or set model_sync_owner/model_sync_group") from None
    return own


def sync_options(p: dict[str, Any]) -> SyncOptions:
    """The sync of one model from the module's parameters."""
    src = p["source"]
    remote = None if src is None else Remote(src["user"], src["address"], src["path"], src["ssh_key"] or "",
                                             src["known_hosts"] or "", src["ciphers"] or "", src["port"])
    manifest = Manifest.from_dict(p["manifest"], "manifest (pass the result of action=scan at the source)")
    home = ModelHome(p["name"], Path(p["dest"]), Path(p["state_dir"])) if p["versions"] else None
    paths = (ModelPaths.of_version(home, label_of(manifest.digest()), Path(p["log_dir"])) if home
             else ModelPaths.of(p["name"], Path(p["dest"]), Path(p["state_dir"]), Path(p["log_dir"])))
    return SyncOptions(p["name"], manifest, paths, remote, p["verify"] == "full", p["reserve_bytes"],
                       p["bwlimit_kbps"], p["delete_extra"], ownership(p),
                       root=Path(p["model_root"]) if p["model_root"] else None, strict=bool(p["strict"]),
                       heartbeat=Path(p["heartbeat"]) if p["heartbeat"] else None, home=home, keep=p["keep"])


def scan_one(root: str, cache: str | None, write_cache: bool, check_mode: bool) -> dict[str, Any]:
    """One folder's manifest, what the scan read, and whether the cache was (under check mode: would be) written."""
    manifest, stats, written = scan_cached(Path(root), Path(cache) if cache else None,
                                           write_cache=write_cache and not check_mode)
    data = manifest.to_dict()
    return {"manifest": data, "manifest_sha256": data["manifest_sha256"], "total_bytes": data["total_bytes"],
            "scan": vars(stats), "cache_written": written and write_cache}


def run_scan(p: dict[str, Any], check_mode: bool) -> dict[str, Any]:
    """action=scan: one folder (root) or several (folders: name -> result) in one call; never a change."""
    write = bool(p["write_cache"])
    if p["folders"]:
        missing = [i for i, f in enumerate(p["folders"]) if not f.get("name") or not f.get("root")]
        if missing:
            raise ValueError(f"expected every entry of folders to have a name and a root, found entries {missing} "
                             "without them")
        return {"manifests": {f["name"]: scan_one(f["root"], f.get("cache"), write, check_mode) for f in p["folders"]},
                "changed": False}
    return {**scan_one(p["root"], p["cache"], write, check_mode), "changed": False}


def homes(p: dict[str, Any]) -> list[tuple[dict[str, Any], ModelHome]]:
    """Each entry of `models` with its ModelHome; a ValueError names an entry without a name or a path."""
    bad = [i for i, m in enumerate(p["models"]) if not m.get("name") or not m.get("path")]
    if bad:
        raise ValueError(f"expected every entry of models to have a name and a path, found entries {bad} without them")
    return [(m, ModelHome(str(m["name"]), Path(str(m["path"])), Path(p["state_dir"]))) for m in p["models"]]


def run_promote(p: dict[str, Any], check_mode: bool) -> dict[str, Any]:
    """action=promote: each model's version in use switched (its configured path), older versions pruned."""
    done = []
    for m, home in homes(p):
        label = home.version_of(str(m["folder"])) if m.get("folder") else (m.get("version") or None)
        if m.get("folder") and label is None:
            continue  # a record from before versions (or the source host's own copy): no version to switch to
        done.append(promote(home, label, p["keep"], p["prune"], check_mode))
    return {"models": done, "changed": any(d["changed"] for d in done)}


def run_check_versions(p: dict[str, Any]) -> dict[str, Any]:
    """action=check_versions: why the recorded versions cannot be served again ([] when they can); read-only."""
    problems = [version_problem(home, str(m.get("folder") or m["path"]), m.get("manifest_sha256"))
                for m, home in homes(p)]
    return {"problems": [x for x in problems if x], "changed": False}


def run_sync(module: AnsibleModule, p: dict[str, Any]) -> dict[str, Any]:
    """action=sync: under check mode the plan (failing on free-space problems), otherwise the sync's report."""
    opt = sync_options(p)
    if module.check_mode:
        plan = preview(opt)
        result: dict[str, Any] = {"name": opt.name, "dest": str(opt.paths.dest), "plan": plan.to_dict(),
                                  "manifest_sha256": opt.source.digest(), "total_bytes": opt.source.total_bytes,
                                  "files": len(opt.source.files), "changed": plan.changes}
        result["summary"] = plan_summary(result["plan"])
        if plan.problems:
            module.fail_json(msg="; ".join(plan.problems) + ". Nothing was copied.", **result)
    else:
        result = sync(opt)
        result["summary"] = sync_summary(result) if result["changed"] else plan_summary(result["plan"])
    if module._diff:
        result["diff"] = diff(result["plan"])
    return result


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, required_if=REQUIRED_IF, supports_check_mode=True)
    p = module.params
    try:
        if p["action"] == "scan":
            result = run_scan(p, module.check_mode)
        elif p["action"] == "sync":
            result = run_sync(module, p)
        elif p["action"] == "promote":
            result = run_promote(p, module.check_mode)
        elif p["action"] == "check_versions":
            result = run_check_versions(p)
        else:
            folders = p["paths"] or [serving(home)["folder"] for _m, home in homes(p)]
            result = {"models": [describe(Path(path)) for path in folders], "changed": False}
    except (SyncError, OSError, ValueError) as exc:
        module.fail_json(msg=f"dflash_model_sync {p['action']}: {exc}")
    module.exit_json(**result, io_read_bytes=io_read_bytes())


if __name__ == "__main__":
    main()
