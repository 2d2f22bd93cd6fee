"""Ansible filters for the model_sync and training_stop roles; thin adapters over dflash_infra."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    from dflash_infra import manifest, model_checks, training
    from dflash_infra.ansible_filters import as_filters
except ImportError:  # running from a checkout whose package is not installed in this Python
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dflash_infra import manifest, model_checks, training
    from dflash_infra.ansible_filters import as_filters


def dflash_published_problems(manifest_data: dict[str, Any], name: str) -> list[str]:
    """Differences between a model directory's manifest and the published manifest of `name`."""
    return model_checks.published_problems(name, manifest_data)


def dflash_sync_summary(plan: dict[str, Any]) -> str:
    """One line saying what a sync does (or would do) for one model."""
    return model_checks.plan_summary(plan)


def dflash_synced_models(described: list[dict[str, Any]], models: dict[str, Any], manifests: dict[str, Any],
                         speculative: dict[str, Any]) -> dict[str, Any]:
    """Synced config, weights bytes and manifest sha256 per catalogue entry, plus drafter/target problems."""
    return model_checks.synced_models(described, models, manifests, speculative)


def dflash_plan_models(models: dict[str, Any], synced: dict[str, Any] | None = None) -> dict[str, Any]:
    """The planner's model sections: catalogue entries with the synced config and weight bytes where known."""
    return model_checks.plan_models(models, synced)


def dflash_human_bytes(n: int) -> str:
    return manifest.human(int(n))


def dflash_gpus_held(apps: list[dict[str, Any]], gpus: list[dict[str, Any]]) -> dict[int, list[int]]:
    """pid -> GPU indexes, from parsed --query-compute-apps and --query-gpu index,uuid."""
    return training.gpus_held(apps, gpus)


def dflash_gpu_holders(apps: list[dict[str, Any]], gpus: list[dict[str, Any]], needed: list[int] | None = None,
                       allowed_pids: list[int] | None = None) -> list[dict[str, Any]]:
    """Processes still holding the needed GPUs (all when none are named), except the allowed pids."""
    return training.gpu_holders(apps, gpus, needed or [], allowed_pids or [])


def dflash_gpu_holders_message(holders: list[dict[str, Any]], host: str) -> str:
    return training.holders_message(host, holders)


def dflash_training_record(found: dict[str, Any], host: str, held: dict[Any, list[int]], unit: dict[str, Any] | None,
                           env_file: str, resume_command: list[str], now: str,
                           boot_units: list[str] | None = None) -> dict[str, Any]:
    """The stopped-training.json record."""
    return training.stop_record(host, found, held, unit or {}, env_file, resume_command, now, boot_units or [])


def dflash_pid_start(proc: dict[str, Any]) -> str:
    """PID:START_TICKS of a recorded process."""
    return training.pid_start(proc)


def dflash_training_line(proc: dict[str, Any]) -> str:
    """One line describing a recorded training process."""
    return training.describe_line(proc)


class FilterModule:
    """Filters of the model_sync and training_stop roles."""

    def filters(self) -> dict[str, Any]:
        return as_filters({
            "dflash_published_problems": dflash_published_problems,
            "dflash_sync_summary": dflash_sync_summary,
            "dflash_synced_models": dflash_synced_models,
            "dflash_plan_models": dflash_plan_models,
            "dflash_human_bytes": dflash_human_bytes,
            "dflash_gpus_held": dflash_gpus_held,
            "dflash_gpu_holders": dflash_gpu_holders,
            "dflash_gpu_holders_message": dflash_gpu_holders_message,
            "dflash_training_record": dflash_training_record,
            "dflash_pid_start": dflash_pid_start,
            "dflash_training_line": dflash_training_line,
        })
