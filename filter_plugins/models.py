"""Ansible filters for the model_sync role and the plan; thin adapters over dflash_infra.model_checks."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    from dflash_infra import model_checks
    from dflash_infra.ansible_filters import as_filters
except ImportError:  # running from a checkout whose package is not installed in this Python
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dflash_infra import model_checks
    from dflash_infra.ansible_filters import as_filters


def dflash_published_problems(manifest_data: dict[str, Any], name: str) -> list[str]:
    """Differences between a model folder's manifest and the published manifest of `name`."""
    return model_checks.published_problems(name, manifest_data)


def dflash_synced_models(described: list[dict[str, Any]], models: dict[str, Any], manifests: dict[str, Any],
                         speculative: dict[str, Any]) -> dict[str, Any]:
    """Synced config, weights bytes and manifest sha256 per catalogue entry, drafter/target problems, a summary."""
    return model_checks.synced_models(described, models, manifests, speculative)


class FilterModule:
    """Filters of the model_sync role and the plan."""

    def filters(self) -> dict[str, Any]:
        return as_filters({
            "dflash_published_problems": dflash_published_problems,
            "dflash_synced_models": dflash_synced_models,
            "dflash_models_verified_in_place": model_checks.verified_in_place,
            "dflash_model_scan_folder": model_checks.scan_folder,
        })
