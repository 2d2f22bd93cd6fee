#!/usr/bin/python
"""Ansible module dflash_host_lock: the host's deploy lock, taken and given back atomically."""

from __future__ import annotations

DOCUMENTATION = r"""
module: dflash_host_lock
short_description: Take or give back the host's one-deploy-at-a-time lock
description:
  - Runs as its action plugin (action_plugins/dflash_host_lock.py), with one shell command on the host per call; this
    file documents it.
  - The lock is a JSON file naming its holder (owner, controller, pid, start_ticks, started_at, playbook; a run is its
    controller, pid and start_ticks), written whole to a temporary file and hard-linked into place, so of two runs
    exactly one gets it and no reader sees half a lock; the holder taking it again is a no-op. A lock of another live
    run fails the task at once, naming that run. A dead run's lock (its process gone from this controller, or its
    heartbeat older than I(stale_after_s)) is replaced with a warning naming it.
  - The lock file's modification time is the run's heartbeat. C(state=heartbeat) touches it (each stage and replica
    turn does; the engine's readiness probe touches it on every attempt while a turn waits) and fails when this run
    no longer holds the lock.
  - C(state=released) removes the lock when this run holds it. Under check mode no lock is taken; a holder is named
    in a warning.
  - The lock is bookkeeping of a run, not configuration of the host: it always reports C(changed=false).
options:
  path:
    description: The lock file.
    type: path
    required: true
  state:
    description: acquired, heartbeat or released.
    type: str
    choices: [acquired, heartbeat, released]
    default: acquired
  stale_after_s:
    description: Age of its heartbeat after which the lock of a run on another controller counts as dead.
    type: int
    default: 900
  playbook:
    description: The run's name in the lock (the play's name).
    type: str
    default: ""
"""

RETURN = r"""
acquired:
  description: Whether this run holds the lock now.
  type: bool
  returned: state=acquired
held_by:
  description: The holder found in the lock file (none when there was none).
  type: dict
  returned: always
took_over:
  description: The dead run's holder that was replaced.
  type: dict
  returned: when a lock was taken over
"""

from ansible.module_utils.basic import AnsibleModule


def main() -> None:
    module = AnsibleModule(argument_spec={
        "path": {"type": "path", "required": True},
        "state": {"type": "str", "choices": ["acquired", "heartbeat", "released"], "default": "acquired"},
        "stale_after_s": {"type": "int", "default": 900},
        "playbook": {"type": "str", "default": ""},
    }, supports_check_mode=True)
    module.fail_json(msg="dflash_host_lock runs as its action plugin (action_plugins/dflash_host_lock.py); this file "
                         "holds its documentation")


if __name__ == "__main__":
    main()
