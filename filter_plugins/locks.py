"""Ansible filters over dflash_infra.locks (hash-locked venvs); thin adapters, no logic of their own."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    from dflash_infra import locks
    from dflash_infra.ansible_filters import as_filters
except ImportError:  # running from a checkout whose package is not installed in this Python
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dflash_infra import locks
    from dflash_infra.ansible_filters import as_filters

# The repository's locks/ folder (this file is <repo>/filter_plugins/locks.py): the same for every playbook,
# molecule scenario and inventory.
LOCKS_DIR = Path(__file__).resolve().parents[1] / "locks"


def dflash_lock_path(requirement: str, platform: dict[str, Any]) -> str:
    """The controller path of the lock of a pin for a target platform ({python, platform})."""
    return str(LOCKS_DIR / locks.file_name(requirement, str(platform["python"]), str(platform["platform"])))


class FilterModule:
    """dflash_lock_* and dflash_venv_* filters."""

    def filters(self) -> dict[str, Any]:
        return as_filters({
            "dflash_lock_path": dflash_lock_path,
            "dflash_venv_lock_status": locks.venv_status,
            "dflash_venv_installed_problems": locks.installed_problems,
        })
