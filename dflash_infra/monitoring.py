"""Metrics for people: the team's Prometheus scrape configuration, made from each container's plan.

Two jobs: `dflash-gateway` scrapes the SGLang Model Gateway's Prometheus port (`smg launch --prometheus-port`), and
`dflash-engine` each engine's `/metrics` (SGLang with `--enable-metrics`, on the engine's own port): every replica
behind a gateway, or the single engine. Targets are the inventory's host names (never an address the plan picked)
with the port the plan gives; each carries the labels a dashboard groups by (`dflash_host`, `replica`, `gpus`).
A target whose service listens only on loopback is reachable from that host alone, which `unreachable` says.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

GATEWAY_JOB = "dflash-gateway"
ENGINE_JOB = "dflash-engine"
METRICS_PATH = "/metrics"


def _is_loopback(address: Any) -> bool:
    if str(address) == "localhost":
        return True
    try:
        return ipaddress.ip_address(str(address)).is_loopback
    except ValueError:
        return False


def _target(address: str, port: Any) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def engine_targets(host: str, address: str, plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One static config per engine of the plan: each replica behind a gateway, else the single engine."""
    replicas = plan.get("replicas") or []
    if replicas:
        return [{"targets": [_target(address, r["port"])],
                 "labels": {"dflash_host": host, "replica": str(r["index"]), "gpus": str(r["cuda_visible_devices"])},
                 "listen": str(r["host"]), "tls": bool(r.get("tls"))} for r in replicas]
    serve = plan.get("serve") or {}
    if not serve.get("port"):
        return []
    gpus = ",".join(str(g) for g in plan.get("gpu_ids") or [])
    return [{"targets": [_target(address, serve["port"])],
             "labels": {"dflash_host": host, "replica": "0", "gpus": gpus}, "listen": str(serve.get("host") or "")}]


def gateway_targets(host: str, address: str, plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The gateway's Prometheus port, when the plan serves through one of its own."""
    settings = (plan.get("gateway") or {}).get("settings") or {}
    if not settings or settings.get("remote"):  # another host's gateway fronts these replicas: none runs here
        return []
    return [{"targets": [_target(address, settings["prometheus_port"])], "labels": {"dflash_host": host},
             "listen": str(settings["prometheus_host"])}]


def scrape_config(hosts: Sequence[Mapping[str, Any]], scrape_interval: str = "15s",
                  ca_file: str = "") -> dict[str, Any]:
    """A Prometheus configuration (`scrape_configs` only) for the hosts' plans.

    `hosts`: one mapping per container, {"host": inventory name, "address": the name Prometheus reaches it by,
    "plan": its plan}. Hosts are sorted by name so the file is the same for the same inventory. Replicas that serve
    HTTPS (dflash_worker_tls) are a job of their own, scraped over HTTPS and verified against `ca_file` (the team's
    CA on the Prometheus host; empty: the system store).
    """
    gateway: list[dict[str, Any]] = []
    engines: list[dict[str, Any]] = []
    for entry in sorted(hosts, key=lambda h: str(h["host"])):
        host, address, plan = str(entry["host"]), str(entry["address"]), entry["plan"]
        gateway += gateway_targets(host, address, plan)
        engines += engine_targets(host, address, plan)
    jobs = []
    plain = [g for g in engines if not g.get("tls")]
    secure = [g for g in engines if g.get("tls")]
    for name, groups in ((GATEWAY_JOB, gateway), (ENGINE_JOB, plain), (f"{ENGINE_JOB}-tls", secure)):
        if groups:
            job: dict[str, Any] = {"job_name": name, "scrape_interval": scrape_interval, "metrics_path": METRICS_PATH,
                                   "static_configs": [{k: v for k, v in g.items() if k not in ("listen", "tls")}
                                                      for g in groups]}
            if groups is secure:
                job["scheme"] = "https"
                if ca_file:
                    job["tls_config"] = {"ca_file": ca_file}
            jobs.append(job)
    return {"scrape_configs": jobs}


def unreachable(hosts: Sequence[Mapping[str, Any]]) -> list[str]:
    """Targets that listen on loopback only: a Prometheus elsewhere cannot reach them, one on that host can."""
    lines = []
    for entry in sorted(hosts, key=lambda h: str(h["host"])):
        host, address, plan = str(entry["host"]), str(entry["address"]), entry["plan"]
        for job, groups in ((GATEWAY_JOB, gateway_targets(host, address, plan)),
                            (ENGINE_JOB, engine_targets(host, address, plan))):
            for g in groups:
                if _is_loopback(g["listen"]) and not _is_loopback(address):
                    lines.append(f"{host}: {job} target {g['targets'][0]} listens on {g['listen']} only; a "
                                 f"Prometheus on {host} reaches it, one elsewhere does not (docs/serving.md, "
                                 "\"Metrics\")")
    return lines
