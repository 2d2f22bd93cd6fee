"""Ansible filters of playbooks/status.yml; thin adapters over dflash_infra.status, no logic of their own."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    from dflash_infra import status
    from dflash_infra.ansible_filters import as_filters
except ImportError:  # running from a checkout whose package is not installed in this Python
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dflash_infra import status
    from dflash_infra.ansible_filters import as_filters


class FilterModule:
    """dflash_status* filters."""

    def filters(self) -> dict[str, Any]:
        return as_filters({
            "dflash_status": status.report,
            "dflash_status_candidates": status.candidates,
            "dflash_status_lines": status.lines,
            "dflash_status_document": status.document,
        })
