#!/usr/bin/python
"""Ansible module dflash_unit_snapshot: keep a unit and its environment file in a snapshot folder, and (after the
gates) point last-good at it and write the deployment record, in one round trip."""

from __future__ import annotations

DOCUMENTATION = r"""
module: dflash_unit_snapshot
short_description: Snapshot a unit and its environment file; optionally point a link at the snapshot and write a record
description:
  - Copies each of I(files) that exists into the folder I(dest) (created C(0700) root:root; each copy C(0600)
    root:root, written under a temporary name and renamed into place). A file of I(files) that does not exist is
    left out and reported in C(missing).
  - With I(link), the symbolic link I(link) is pointed at I(dest)'s base name (relative, in the same folder), swapped
    atomically (a new link renamed over the old one).
  - With I(record), its C(content) is written to its C(path) (C(0644) root:root, written under a temporary name,
    flushed to disk and renamed into place); a record already holding exactly that content is left alone.
  - With I(keep) (and I(link)), the snapshot folders beside I(dest) are pruned after the record is written: I(dest),
    the snapshots the record names (its own C(unit_backup) and its previous deployment's, which a rollback restores)
    and the newest other C(<stamp>-deployed) ones up to I(keep) in all stay; every other C(<stamp>-deployed) or
    C(<stamp>-replaced) folder goes (they hold environment files with keys that may since have been rotated).
    Nothing else in that folder is touched.
  - The steps run in that order, so a record never names a snapshot that is not complete on disk.
  - Under check mode nothing is written; C(changed) says whether anything would be. With C(--diff) the record's
    change is shown.
options:
  files: {description: The files to copy into I(dest)., type: list, elements: path, required: true}
  dest: {description: The snapshot folder., type: path, required: true}
  link: {description: A symbolic link to point at I(dest) (e.g. the service's last-good)., type: path}
  record:
    description: "{path, content}: the deployment record to write after the snapshot and the link."
    type: dict
  keep:
    description: How many good (deployed) snapshots to keep after linking; 0 prunes nothing.
    type: int
    default: 0
"""

RETURN = r"""
copied: {description: The files copied into I(dest)., type: list, returned: always}
missing: {description: The files of I(files) that did not exist (not copied)., type: list, returned: always}
linked: {description: Whether I(link) was (or would be) pointed at I(dest)., type: bool, returned: always}
recorded: {description: Whether the record was (or would be) written., type: bool, returned: always}
pruned: {description: The snapshot folders removed (or that would be) by I(keep)., type: list, returned: always}
"""

import json
import os
import re
import shutil
import tempfile
from typing import Any

from ansible.module_utils.basic import AnsibleModule


def _temporary(folder: str, name: str) -> str:
    handle, path = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
    os.close(handle)
    return path


def copy_into(source: str, folder: str) -> None:
    """A 0600 root:root copy of `source` in `folder`, renamed into place."""
    name = os.path.basename(source)
    temporary = _temporary(folder, name)
    try:
        shutil.copyfile(source, temporary)
        os.chown(temporary, 0, 0)
        os.chmod(temporary, 0o600)
        os.replace(temporary, os.path.join(folder, name))
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise


def point(link: str, target: str) -> bool:
    """Point the symbolic link `link` at `target` (relative), atomically; False when it already points there."""
    if os.path.islink(link) and os.readlink(link) == target:
        return False
    temporary = os.path.join(os.path.dirname(link), f".{os.path.basename(link)}.{os.getpid()}")
    if os.path.lexists(temporary):
        os.unlink(temporary)
    os.symlink(target, temporary)
    os.replace(temporary, link)
    return True


def write_record(path: str, content: str) -> bool:
    """Write the record (0644 root:root), flushed and renamed into place; False when it holds that content."""
    if not record_would_change(path, content):
        return False
    temporary = _temporary(os.path.dirname(path) or ".", os.path.basename(path))
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chown(temporary, 0, 0)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise
    return True


SNAPSHOT = re.compile(r"^[0-9]{8}T[0-9]{6}Z-(deployed|replaced)$")


def named(record: str | None) -> set[str]:
    """The snapshot folders a deployment record names: its own and its previous deployment's (unit_backup)."""
    try:
        data = json.loads(record or "{}")
    except ValueError:
        return set()
    out = set()
    for entry in (data, data.get("previous") if isinstance(data, dict) else None):
        if isinstance(entry, dict) and isinstance(entry.get("unit_backup"), str):
            out.add(os.path.basename(entry["unit_backup"].rstrip("/")))
    return out


def prunable(folder: str, target: str, keep: int, record: str | None = None) -> list[str]:
    """The snapshot folders of `folder` that `keep` good ones leave over: `target` (the new good one) and the ones the
    record names always stay, then the newest other deployed ones up to `keep`; only folders named as this module
    names snapshots."""
    if keep < 1:
        return []
    try:
        names = sorted(n for n in os.listdir(folder) if SNAPSHOT.match(n) and os.path.isdir(os.path.join(folder, n))
                       and not os.path.islink(os.path.join(folder, n)))
    except FileNotFoundError:
        return []
    kept = {target} | (named(record) & set(names))
    for name in reversed([n for n in names if n.endswith("-deployed") and n not in kept]):
        if len(kept) >= keep:
            break
        kept.add(name)
    return [n for n in names if n not in kept]


def record_would_change(path: str, content: str) -> bool:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read() != content or (os.stat(path).st_mode & 0o7777) != 0o644
    except FileNotFoundError:
        return True


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "list", "elements": "path", "required": True},
            "dest": {"type": "path", "required": True},
            "link": {"type": "path"},
            "record": {"type": "dict", "options": {"path": {"type": "path", "required": True},
                                                   "content": {"type": "str", "required": True}}},
            "keep": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    params: dict[str, Any] = module.params
    dest = params["dest"].rstrip("/")
    present = [f for f in params["files"] if os.path.isfile(f)]
    missing = [f for f in params["files"] if f not in present]
    target = os.path.basename(dest)
    link = params["link"]
    record = params["record"]
    diff: dict[str, str] = {}
    if record and module._diff:
        try:
            with open(record["path"], encoding="utf-8") as handle:
                before = handle.read()
        except FileNotFoundError:
            before = ""
        diff = {"before": before, "after": record["content"], "before_header": record["path"],
                "after_header": record["path"]}
    folder = os.path.dirname(dest)
    keep = int(params["keep"]) if link else 0
    if module.check_mode:
        linked = bool(link) and not (os.path.islink(link) and os.readlink(link) == target)
        recorded = bool(record) and record_would_change(record["path"], record["content"])
        pruned = prunable(folder, target, keep, (record or {}).get("content"))
        module.exit_json(changed=bool(present) or not os.path.isdir(dest) or linked or recorded or bool(pruned),
                         copied=present, missing=missing, linked=linked, recorded=recorded, pruned=pruned, diff=diff)
    try:
        made = not os.path.isdir(dest)
        os.makedirs(dest, mode=0o700, exist_ok=True)
        os.chown(dest, 0, 0)
        os.chmod(dest, 0o700)
        for source in present:
            copy_into(source, dest)
        linked = point(link, target) if link else False
        recorded = write_record(record["path"], record["content"]) if record else False
        pruned = prunable(folder, target, keep, (record or {}).get("content"))
        for name in pruned:
            shutil.rmtree(os.path.join(folder, name))
    except OSError as exc:
        module.fail_json(msg=f"dflash_unit_snapshot: {exc}", copied=[], missing=missing)
    module.exit_json(changed=made or bool(present) or linked or recorded or bool(pruned), copied=present,
                     missing=missing, linked=linked, recorded=recorded, pruned=pruned, diff=diff if recorded else {})


if __name__ == "__main__":
    main()
