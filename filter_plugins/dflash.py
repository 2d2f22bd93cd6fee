"""Ansible filters over the dflash_infra planner library: the plan's inputs, its table, the preflight checks,
the scrape configuration and alert rules made from the plans, the team's Alertmanager configuration.
Thin adapters, no logic of their own (the planner itself runs in action_plugins/dflash_plan.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    from dflash_infra import alerts, monitoring, plan_inputs, planner, preflight, rollout, tls
    from dflash_infra.ansible_filters import as_filters
except ImportError:  # running from a checkout whose package is not installed in this Python
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dflash_infra import alerts, monitoring, plan_inputs, planner, preflight, rollout, tls
    from dflash_infra.ansible_filters import as_filters


def dflash_identity_problems(identity: dict[str, Any], host: str, hardware: dict[str, Any]) -> list[str]:
    """Why the host's GPUs (host_state_current.identity) are not the group's expected hardware (empty when they are)."""
    return preflight.identity_problems(host, hardware, identity)


def dflash_serving_problems(state: dict[str, Any], host: str, plan: dict[str, Any], port: int, unit: str,
                            gateway_unit: str = "") -> list[str]:
    """/dev/shm for the plan's TP group and the ports (where the plan listens) free or held by our units: the engine,
    or behind the gateway the gateway and each replica's own unit."""
    replicas = [{"name": rollout.replica_unit(unit, int(r["index"])), "host": r["host"], "port": r["port"]}
                for r in plan.get("replicas") or []]
    settings = (plan.get("gateway") or {}).get("settings") or {}
    return preflight.serving_problems(host, state, int(plan["tp_size"]), int(port), unit,
                                      str((plan.get("serve") or {}).get("host") or ""), replicas, gateway_unit,
                                      [(int(settings["prometheus_port"]), str(settings.get("prometheus_host") or ""))]
                                      if replicas and "prometheus_port" in settings else [])


class FilterModule:
    """dflash_* filters of the plan, the preflight, the scrape configuration, the alerts and Alertmanager."""

    def filters(self) -> dict[str, Any]:
        return as_filters({
            "dflash_plan_table": planner.plan_table,
            "dflash_monitoring_scrape_config": monitoring.scrape_config,
            "dflash_monitoring_unreachable": monitoring.unreachable,
            "dflash_monitoring_alert_rules": alerts.rules,
            "dflash_monitoring_status_loads": alerts.status_loads,
            "dflash_alertmanager_config": alerts.alertmanager_config,
            "dflash_alertmanager_webhook_problems": alerts.webhook_problems,
            "dflash_plan_gpus": plan_inputs.plan_gpus,
            "dflash_gpu_host_basis": plan_inputs.gpu_host_basis,
            "dflash_plan_models_from": plan_inputs.plan_models,
            "dflash_record_models": plan_inputs.manifests,
            "dflash_identity_problems": dflash_identity_problems,
            "dflash_serving_problems": dflash_serving_problems,
            "dflash_endpoint_problems": preflight.endpoint_problems,
            "dflash_tls_preflight": tls.preflight,
        })
