"""Models the project knows offline: their real config.json files and published weight sizes.

Lets a plan be made from model names alone, on the controller, before any host is contacted.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from dflash_infra.engine import DATA
from dflash_infra.models import dtype_bytes

MODELS = DATA / "models"


@cache
def published() -> dict[str, Any]:
    """The published weight-file manifest (data/models/published-files.json)."""
    manifest: dict[str, Any] = json.loads((MODELS / "published-files.json").read_text())
    return manifest


def known_models() -> list[str]:
    return sorted(p.name for p in MODELS.iterdir() if (p / "config.json").is_file())


def config(name: str) -> dict[str, Any]:
    """The config.json of a catalogued model; KeyError naming the known ones otherwise."""
    path = MODELS / name / "config.json"
    if not path.is_file():
        raise KeyError(f"model {name!r} is not in the catalogue; known: {', '.join(known_models())}")
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def weights_bytes(name: str) -> int | None:
    """Total weight bytes from the published manifest (index total_size, or parameters x dtype)."""
    entry = published().get(name)
    if not entry:
        return None
    if entry.get("index_metadata_total_size"):
        return int(entry["index_metadata_total_size"])
    files = entry.get("files") or []
    if files and all("parameters" in f for f in files):
        return sum(int(f["parameters"]) * dtype_bytes(f.get("dtype")) for f in files)
    return None


def expected_gpus(hardware: dict[str, Any]) -> list[dict[str, Any]]:
    """The GPU list a group's expected hardware declares, in nvidia-smi's shape (for offline plans)."""
    missing = [key for key in ("gpu_name", "gpu_count", "memory_total_mib") if key not in hardware]
    if missing:
        raise ValueError(f"dflash_expected_hardware: expected gpu_name, gpu_count and memory_total_mib, found no "
                         f"{', '.join(missing)} (group_vars/<group>.yml)")
    return [{"index": i, "name": hardware["gpu_name"], "memory_total_mib": int(hardware["memory_total_mib"]),
             "compute_cap": str(hardware.get("compute_cap")) if hardware.get("compute_cap") else None}
            for i in range(int(hardware["gpu_count"]))]
