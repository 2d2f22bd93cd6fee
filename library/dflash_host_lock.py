#!/usr/bin/python
"""Ansible module dflash_host_lock: the host's deploy lock, taken and given back atomically."""

from __future__ import annotations

DOCUMENTATION = r"""
module: dflash_host_lock
short_description: Take, give back or read the host's one-deploy-at-a-time lock
description:
  - The lock is a JSON file naming its holder (owner, controller, pid, started_at, playbook). C(state=acquired)
    creates it with O_EXCL, so of two runs exactly one gets it; the holder taking it again is a no-op. A lock held by
    another run is left alone and returned as C(held_by), unless it is exactly the one in I(take_over) (a run the
    controller found dead), which is then replaced in one rename.
  - C(state=released) removes the lock when this holder holds it; C(state=read) only reads it.
  - Use it through the action plugin of the same name, which names the holder and judges a stale lock.
  - The lock is bookkeeping of a run, not configuration of the host: every state reports C(changed=false).
options:
  path:
    description: The lock file.
    type: path
    required: true
  state:
    description: acquired, released or read.
    type: str
    choices: [acquired, released, read]
    default: acquired
  holder:
    description: This run (owner, controller, pid, started_at, playbook).
    type: dict
    default: {}
  take_over:
    description: The holder of a dead run whose lock may be replaced; anything else holding the lock is kept.
    type: dict
"""

RETURN = r"""
acquired:
  description: Whether this run holds the lock now (state=acquired).
  type: bool
  returned: always
held_by:
  description: The holder found in the lock file (none when there was none).
  type: dict
  returned: always
took_over:
  description: The dead run's holder that was replaced.
  type: dict
  returned: when a lock was taken over
"""

import json
import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule

KEYS = ("controller", "pid", "started_at")


def same(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    return bool(a and b) and all((a or {}).get(k) == (b or {}).get(k) for k in KEYS)


def read(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"unreadable": str(exc)}
    return data if isinstance(data, dict) else {"unreadable": f"not a JSON object: {data!r}"[:200]}


def write_new(path: str, holder: dict[str, Any]) -> bool:
    """Create the lock; False when it exists already."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(holder, fh, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    return True


def replace(path: str, holder: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(holder, fh, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main() -> None:
    module = AnsibleModule(argument_spec={
        "path": {"type": "path", "required": True},
        "state": {"type": "str", "choices": ["acquired", "released", "read"], "default": "acquired"},
        "holder": {"type": "dict", "default": {}},
        "take_over": {"type": "dict"},
    }, supports_check_mode=True)
    path, state, holder = module.params["path"], module.params["state"], module.params["holder"]
    current = read(path)
    if state == "read" or module.check_mode:
        module.exit_json(changed=False, acquired=False, held_by=current)
    if state == "released":
        if current is not None and same(current, holder):
            os.unlink(path)
        module.exit_json(changed=False, acquired=False, held_by=current, released=same(current, holder))
    if not holder or not all(holder.get(k) for k in KEYS):
        module.fail_json(msg=f"dflash_host_lock: expected a holder with {', '.join(KEYS)}, found {holder!r}")
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    if write_new(path, holder):
        module.exit_json(changed=False, acquired=True, held_by=None)
    current = read(path)
    if same(current, holder):
        module.exit_json(changed=False, acquired=True, held_by=current)
    take_over = module.params["take_over"]
    if take_over is not None and current is not None and (same(current, take_over) or current == take_over):
        replace(path, holder)
        module.exit_json(changed=False, acquired=True, held_by=current, took_over=current)
    module.exit_json(changed=False, acquired=False, held_by=current)


if __name__ == "__main__":
    main()
