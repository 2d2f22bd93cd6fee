"""Ansible filters over dflash_infra.canary (playbooks/canary.yml); thin adapters, no logic of their own."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    from dflash_infra import canary
    from dflash_infra.ansible_filters import as_filters
except ImportError:  # running from a checkout whose package is not installed in this Python
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dflash_infra import canary
    from dflash_infra.ansible_filters import as_filters


class FilterModule:
    """dflash_canary_* filters."""

    def filters(self) -> dict[str, Any]:
        return as_filters({
            "dflash_canary_candidate": canary.candidate,
            "dflash_canary_changes": canary.changes,
            "dflash_canary_measured": canary.measured,
            "dflash_canary_judge": canary.judge,
            "dflash_canary_keep_lines": canary.keep_lines,
            "dflash_canary_merged": canary.merged,
        })
