"""Ansible filters over dflash_infra.proxmox (container config, passthrough audit, snapshots); thin adapters."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

try:
    from dflash_infra import proxmox
    from dflash_infra.ansible_filters import as_filters
except ImportError:  # running from a checkout whose package is not installed in this Python
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dflash_infra import proxmox
    from dflash_infra.ansible_filters import as_filters


def proxmox_guest_audit(request: Mapping[str, Any]) -> dict[str, Any]:
    """{config (API JSON), proc_devices (text), gpu_count|gpu_indexes, include_caps, guest, node} -> audit."""
    return proxmox.audit_request(request).to_dict()


def proxmox_guest_fix(request: Mapping[str, Any]) -> dict[str, Any]:
    """The audit request plus conf_text, conf_path and api_digest -> {text, changed, diff, audit}."""
    return proxmox.fix_request(request).to_dict()


def proxmox_guest_snapshot_name(stage: str, prefix: str, when: str) -> str:
    """'dflash-align-20261129-133612' from the stage and an ISO 8601 UTC time."""
    return proxmox.snapshot_name(prefix, stage, when)


def proxmox_guest_prune(listing: Sequence[Mapping[str, Any]], prefix: str, keep: int) -> list[str]:
    """Our snapshots beyond the newest `keep`, oldest first."""
    return proxmox.snapshots_to_prune(listing, prefix, int(keep))


def proxmox_guest_rollback_target(listing: Sequence[Mapping[str, Any]], prefix: str, requested: str = "",
                                  recorded: str = "", guest: str = "container") -> dict[str, Any]:
    """{name, reason} of the snapshot to roll back to."""
    return proxmox.rollback_target(listing, prefix, requested or "", recorded or "", guest)


class FilterModule:
    """proxmox_guest_* filters."""

    def filters(self) -> dict[str, Any]:
        return as_filters({
            "proxmox_guest_audit": proxmox_guest_audit,
            "proxmox_guest_fix": proxmox_guest_fix,
            "proxmox_guest_snapshot_name": proxmox_guest_snapshot_name,
            "proxmox_guest_prune": proxmox_guest_prune,
            "proxmox_guest_rollback_target": proxmox_guest_rollback_target,
        })
