"""Ansible filters over the dflash_infra planner library; thin adapters, no logic of their own."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    from dflash_infra import catalogue, parsers, plan_inputs, planner, preflight
    from dflash_infra.ansible_filters import as_filters
except ImportError:  # running from a checkout whose package is not installed in this Python
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dflash_infra import catalogue, parsers, plan_inputs, planner, preflight
    from dflash_infra.ansible_filters import as_filters


def dflash_plan(request: dict[str, Any]) -> dict[str, Any]:
    """The plan for a request dict (see `dflash-infra plan`)."""
    return planner.plan_dict(request)


def dflash_expected_gpus(hardware: dict[str, Any]) -> list[dict[str, Any]]:
    """The GPU list a group's dflash_expected_hardware declares (for offline plans)."""
    return catalogue.expected_gpus(hardware)


def dflash_hardware_problems(gpus: list[dict[str, Any]], host: str, group: str,
                             hardware: dict[str, Any]) -> list[str]:
    """Why the probed GPUs are not the group's expected hardware (empty when they are)."""
    return preflight.hardware_problems(host, group, hardware, gpus)


def dflash_identity_problems(identity: dict[str, Any], host: str, hardware: dict[str, Any]) -> list[str]:
    """Why the host's GPUs (host_state.identity) are not the group's expected hardware (empty when they are)."""
    return preflight.identity_problems(host, hardware, identity)


def dflash_serving_problems(state: dict[str, Any], host: str, tp: int, port: int, unit: str) -> list[str]:
    """/dev/shm for a TP group of this size and the engine port free or held by our unit."""
    return preflight.serving_problems(host, state, int(tp), int(port), unit)


def dflash_plan_table(plan: dict[str, Any]) -> str:
    """The people's table of a plan."""
    return planner.plan_table(plan)


def dflash_parse_gpus(text: str, fields: list[str] | None = None, source: str = "nvidia-smi --query-gpu"):
    """nvidia-smi --query-gpu CSV -> list of GPU dicts."""
    return parsers.parse_text("gpus", text, source, fields)


def dflash_parse_apps(text: str, fields: list[str] | None = None, source: str = "nvidia-smi --query-compute-apps"):
    """nvidia-smi --query-compute-apps CSV -> list of process dicts."""
    return parsers.parse_text("apps", text, source, fields)


def dflash_parse_driver(text: str, source: str = "/proc/driver/nvidia/version"):
    """/proc/driver/nvidia/version text -> {version, flavor, arch}."""
    return parsers.parse_text("driver", text, source)


def dflash_parse_nvml(text: str, source: str = "nvidia-smi"):
    """nvidia-smi output, possibly an NVML error -> {status, library_version, message}."""
    return parsers.parse_text("nvml", text, source)


def dflash_upstream_version(version: str) -> str:
    """Upstream part of a Debian version: 580.126.09-0ubuntu0.24.04.1 -> 580.126.09."""
    return parsers.debian_upstream(version)


class FilterModule:
    """dflash_* filters."""

    def filters(self) -> dict[str, Any]:
        return as_filters({
            "dflash_plan": dflash_plan,
            "dflash_plan_table": dflash_plan_table,
            "dflash_expected_gpus": dflash_expected_gpus,
            "dflash_plan_gpus": plan_inputs.plan_gpus,
            "dflash_plan_models_from": plan_inputs.plan_models,
            "dflash_record_models": plan_inputs.manifests,
            "dflash_hardware_problems": dflash_hardware_problems,
            "dflash_identity_problems": dflash_identity_problems,
            "dflash_serving_problems": dflash_serving_problems,
            "dflash_parse_gpus": dflash_parse_gpus,
            "dflash_parse_apps": dflash_parse_apps,
            "dflash_parse_driver": dflash_parse_driver,
            "dflash_parse_nvml": dflash_parse_nvml,
            "dflash_upstream_version": dflash_upstream_version,
        })
