"""Ansible filters of the host_state and deploy_summary roles and of playbooks/status.yml; thin adapters over
dflash_infra.host_state, dflash_infra.summary and dflash_infra.status."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

try:
    from dflash_infra import host_state, status, summary
    from dflash_infra.ansible_filters import as_filters
except ImportError:  # running from a checkout whose package is not installed in this Python
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dflash_infra import host_state, status, summary
    from dflash_infra.ansible_filters import as_filters


def dflash_role_file_sha256(name: str, folder: str) -> str:
    """sha256 of a file the role ships (its files/ folder on the controller), to compare with host_state."""
    return hashlib.sha256((Path(folder) / name).read_bytes()).hexdigest()


def dflash_summary(inputs: dict[str, Any], host: str, groups: list[str], check_mode: bool) -> list[str]:
    """The deploy's summary lines for one host (dflash_infra.summary.lines over the run's facts)."""
    return summary.lines(host=host, groups=groups, check_mode=bool(check_mode), **inputs)


class FilterModule:
    """dflash_host_state* and dflash_status* filters."""

    def filters(self) -> dict[str, Any]:
        return as_filters({
            "dflash_state_models": host_state.model_entries,
            "dflash_state_file_matches": host_state.file_matches,
            "dflash_state_secret_matches": host_state.secret_matches,
            "dflash_state_existing": host_state.existing,
            "dflash_training_idle": host_state.training_idle,
            "dflash_gpu_holders_problems": host_state.gpu_holders_problems,
            "dflash_driver_protection_needed": host_state.driver_protection_needed,
            "dflash_summary": dflash_summary,
            "dflash_summary_load_lines": summary.load_lines,
            "dflash_failure_message": summary.failure_message,
            "dflash_role_file_sha256": dflash_role_file_sha256,
            "dflash_state_path": host_state.path_entry,
            "dflash_status": status.report,
            "dflash_status_candidates": status.candidates,
            "dflash_status_lines": status.lines,
            "dflash_status_document": status.document,
        })
