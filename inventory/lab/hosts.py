#!/usr/bin/env python3
"""Lab inventory (Ansible's script inventory: `-i inventory/lab` runs this with --list).

The production groups and host names (inventory/production/hosts.yml), pointing at the systemd-nspawn machines that
`make lab-up` boots on this machine. Each machine's sshd listens only on its own loopback address, 127.N.x.1 for
lab N (LAB_INSTANCE, 0 when unset): the addresses and the state folder (LAB_STATE_DIR) come from the lab's own
machine table and settings (lab/labbuilder/config.py), read once here, so every variable below is a plain value
and no task of a play templates an environment lookup again. A second lab of this machine is the same inventory
with LAB_INSTANCE=1. Add `-i inventory/lab-pct` to reach ct200 through the Proxmox node stand-in (pve1) with
`pct exec`, the production `via_pct` way (lab/README.md).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab"))

try:
    from labbuilder.config import INSTANCE, Paths, Settings, machine_table
except ValueError as exc:  # a bad LAB_INSTANCE: Ansible shows this line and stops (ansible.cfg any_unparsed_is_failed)
    sys.exit(f"inventory/lab: {exc}")


def inventory() -> dict[str, object]:
    """The groups and host variables of the lab of this environment (LAB_INSTANCE, LAB_STATE_DIR, LAB_WHEELS_DIR)."""
    paths = Paths(state=Settings.from_env().state)
    ssh = {
        "ansible_user": "root",
        "ansible_python_interpreter": "/usr/bin/python3",
        "lab_instance": str(INSTANCE),
        "lab_state_dir": str(paths.state),
        # The lab's wheelhouses (the stand-in's built wheel, the gateway's downloaded ones): built once for every lab.
        "lab_wheels_dir": os.environ.get("LAB_WHEELS_DIR") or str(REPO / ".cache" / "lab"),
        "ansible_ssh_private_key_file": str(paths.key),
        # Host keys are checked against the lab's own known_hosts, written by `lab up`.
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={paths.known_hosts} -o GlobalKnownHostsFile=/dev/null "
                                   "-o IdentitiesOnly=yes",
    }
    machines = machine_table(INSTANCE)
    node = next(m for m in machines if m.is_node)
    groups: dict[str, dict[str, object]] = {
        "all": {"children": ["proxmox_nodes", "proxmox_containers"]},
        # The Proxmox node STAND-IN (lab/README.md): sshd and a `pct` that reaches the lab containers.
        "proxmox_nodes": {"hosts": [node.name], "vars": ssh},
        "proxmox_containers": {"children": [], "vars": ssh},
    }
    hostvars: dict[str, dict[str, object]] = {node.name: {"ansible_host": node.address}}
    for machine in machines:
        if machine.is_node or (machine.on_demand and not paths.created_stamp(machine.name).exists()):
            continue
        groups["proxmox_containers"]["children"].append(machine.group)  # type: ignore[union-attr]
        groups[machine.group] = {"hosts": [machine.name]}
        hostvars[machine.name] = {"ansible_host": machine.address, "proxmox_vmid": machine.vmid,
                                  "proxmox_node": node.name}
    return {**groups, "_meta": {"hostvars": hostvars}}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--host":  # Ansible asks only without _meta; kept for the protocol
        print(json.dumps(inventory()["_meta"]["hostvars"].get(sys.argv[2], {})))  # type: ignore[index]
    else:
        print(json.dumps(inventory(), indent=1))
