"""Serving through the SGLang Model Gateway (PyPI `smg`): one engine per TP group behind one endpoint.

With a `gateway` section in the request the plan has no `--dp-size`: each DP replica becomes its own engine
process on its own GPUs (CUDA_VISIBLE_DEVICES) and port, listening where the gateway reaches it, and the gateway
(`smg launch`) serves the team's endpoint with the replicas as workers. The gateway's argv is spelled for the
pinned smg release (1.13.0, `smg/router_args.py`); tests/test_gateway_real_parser.py parses it with that release's
own parser. API keys never enter an argv here: the gateway's launcher adds them from its secrets file.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# smg 1.13.0's --policy choices for a regular (not disaggregated) router (COMMON_POLICY_CHOICES).
POLICIES = ("random", "round_robin", "passthrough", "cache_aware", "power_of_two", "least_load", "manual",
            "consistent_hashing", "prefix_hash")
# The routes SGLang's HTTP server answers for a health check (srt/entrypoints/http_server.py): the gateway's health
# check must ask one of them.
ENGINE_HEALTH_PATHS = ("/health", "/health_generate")
# The endpoint itself (host, port) is the request's `serve` section, as without a gateway.
DEFAULTS: dict[str, Any] = {
    "worker_host": "127.0.0.1",  # where the replicas listen: only the gateway (on the same host) reaches them
    "worker_base_port": 30001,  # replica i listens on worker_base_port + i
    "policy": "cache_aware",
    "retry_max_retries": 3,
    "health_check_endpoint": "/health",
    "health_check_interval_secs": 5,
    "health_check_timeout_secs": 5,
    "health_failure_threshold": 3,
    "health_success_threshold": 1,
    "request_timeout_secs": 1800,
    "prometheus_host": "127.0.0.1",
    "prometheus_port": 29000,
    # How long smg keeps a worker taken out of it before removing it (not a flag: smg-launch gives it to the router
    # from the unit's SMG_DRAIN_SETTLE_SECS). smg-ctl's drain waits on the engine's queue after, so 1 s suffices.
    "drain_settle_secs": 1,
    # true on a host whose replicas a gateway on ANOTHER host fronts (the inventory's dflash_gateway_host): they
    # listen on worker_host (any address; 0.0.0.0 for every interface) and that gateway reaches them at
    # worker_address (the inventory's name of this host). Their /health and /metrics answer without a key there.
    "remote": False,
    "worker_address": "",  # the host part of the replicas' URLs for the gateway; empty: worker_host
    # true on such a host when its replicas serve HTTPS (dflash_worker_tls: the engine's --ssl-certfile/--ssl-keyfile
    # from its unit's credentials): the gateway reaches them at https:// and verifies them against the team's CA.
    "worker_tls": False,
}
# Setting -> smg flag, in the order the argv lists them (after --host, --port, --worker-urls).
FLAGS = (("policy", "--policy"), ("retry_max_retries", "--retry-max-retries"),
         ("health_check_endpoint", "--health-check-endpoint"),
         ("health_check_interval_secs", "--health-check-interval-secs"),
         ("health_check_timeout_secs", "--health-check-timeout-secs"),
         ("health_failure_threshold", "--health-failure-threshold"),
         ("health_success_threshold", "--health-success-threshold"),
         ("request_timeout_secs", "--request-timeout-secs"),
         ("prometheus_host", "--prometheus-host"), ("prometheus_port", "--prometheus-port"))
PORT_KEYS = ("worker_base_port", "prometheus_port")
COUNT_KEYS = ("retry_max_retries", "health_check_interval_secs", "health_check_timeout_secs",
              "health_failure_threshold", "health_success_threshold", "request_timeout_secs", "drain_settle_secs")


@dataclass(frozen=True)
class Gateway:
    """The checked gateway settings (DEFAULTS with the request's on top) and the endpoint it serves."""

    settings: dict[str, Any]
    host: str
    port: int

    def worker_port(self, index: int) -> int:
        return int(self.settings["worker_base_port"]) + index

    @property
    def scheme(self) -> str:
        return "https" if self.settings.get("worker_tls") is True else "http"

    def worker_url(self, index: int) -> str:
        """Where the gateway reaches replica `index`."""
        return _url(str(self.settings["worker_address"] or self.settings["worker_host"]), self.worker_port(index),
                    self.scheme)

    def local_url(self, index: int) -> str:
        """Where the replica's own host reaches it (loopback for a wildcard listen address)."""
        host = str(self.settings["worker_host"])
        wildcard = _address(host)
        return _url("127.0.0.1" if wildcard is not None and wildcard.is_unspecified else host, self.worker_port(index),
                    self.scheme)


def _url(host: str, port: int, scheme: str = "http") -> str:
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def _address(value: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(str(value))
    except ValueError:
        return None


def validate(raw: Any, serve: Mapping[str, Any], errors: list[str]) -> Gateway | None:
    """The request's `gateway` section checked, for the endpoint `serve` names (None when absent); every mistake
    becomes an error."""
    if raw is None or raw is False:
        return None
    if not isinstance(raw, Mapping):
        errors.append(f"gateway: expected a mapping of settings, found {type(raw).__name__}")
        return None
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        errors.append(f"gateway.{unknown[0]}: unknown setting; known: {', '.join(DEFAULTS)}")
    settings = {**DEFAULTS, **{k: v for k, v in raw.items() if k in DEFAULTS}}
    before = len(errors)
    for key in PORT_KEYS:
        if not isinstance(settings[key], int) or isinstance(settings[key], bool) or not 1 <= settings[key] <= 65535:
            errors.append(f"gateway.{key}: expected a TCP port (1-65535), found {settings[key]!r}")
    for key in COUNT_KEYS:
        if not isinstance(settings[key], int) or isinstance(settings[key], bool) or settings[key] < 1:
            errors.append(f"gateway.{key}: expected a whole number >= 1, found {settings[key]!r}")
    if settings["policy"] not in POLICIES:
        errors.append(f"gateway.policy: {settings['policy']!r} is not one of smg's policies ({', '.join(POLICIES)})")
    for key in ("worker_host", "prometheus_host"):
        if _address(settings[key]) is None:
            errors.append(f"gateway.{key}: expected an IP address, found {settings[key]!r}")
    host, port = serve.get("host"), serve.get("port")
    if _address(host) is None or not isinstance(port, int) or not 1 <= port <= 65535:
        errors.append(f"serve: the gateway's endpoint needs an IP address and a port, found host {host!r}, "
                      f"port {port!r}")
    worker = _address(settings["worker_host"])
    if not isinstance(settings["worker_tls"], bool):
        errors.append(f"gateway.worker_tls: expected true or false, found {settings['worker_tls']!r}")
    elif settings["worker_tls"] and settings["remote"] is not True:
        errors.append("gateway.worker_tls: only replicas a gateway on another host fronts serve TLS (remote: true); "
                      "this host's own replicas are reached on loopback")
    if not isinstance(settings["remote"], bool):
        errors.append(f"gateway.remote: expected true or false, found {settings['remote']!r}")
    elif settings["remote"]:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]*|[0-9a-fA-F:]*:[0-9a-fA-F:.]*", str(settings["worker_address"])):
            errors.append(f"gateway.worker_address: the replicas of a remote gateway need the name or address it "
                          f"reaches this host by (the inventory's), found {settings['worker_address']!r}")
    else:
        if worker is not None and not worker.is_loopback:
            errors.append(f"gateway.worker_host: {settings['worker_host']} is not a loopback address; the replicas "
                          "listen only where the gateway on the same host reaches them (127.0.0.1); replicas "
                          "fronted by another host's gateway are `remote` (dflash_gateway_host)")
        if settings["worker_address"] not in ("", settings["worker_host"]):
            errors.append(f"gateway.worker_address: {settings['worker_address']!r} is only for replicas a gateway on "
                          "another host fronts (remote: true)")
    if settings["health_check_endpoint"] not in ENGINE_HEALTH_PATHS:
        errors.append(f"gateway.health_check_endpoint: expected one of the engine's health routes "
                      f"({', '.join(ENGINE_HEALTH_PATHS)}), found {settings['health_check_endpoint']!r}: smg 1.13 "
                      "keeps routing to a worker whose health check fails, so another path only fills its log")
    if len(errors) > before or not isinstance(port, int):
        return None
    return Gateway(settings, str(host), port)


def port_problems(gateway: Gateway, replicas: int) -> list[str]:
    """Ports that collide: the endpoint, the metrics port and every replica's port must all differ."""
    used: dict[int, str] = {}
    problems = []
    named = [(gateway.port, "the gateway's port"),
             (int(gateway.settings["prometheus_port"]), "the gateway's metrics port")]
    named += [(gateway.worker_port(i), f"replica {i}'s port") for i in range(replicas)]
    for port, what in named:
        if port in used:
            problems.append(f"gateway: {what} {port} is also {used[port]}; move worker_base_port or the port")
        elif port > 65535:
            problems.append(f"gateway: {what} would be {port}, beyond 65535; lower worker_base_port")
        used.setdefault(port, what)
    return problems


def argv(gateway: Gateway, replicas: int) -> list[str]:
    """`smg launch` arguments: the endpoint, the replicas as workers, routing, retries, health checks, metrics."""
    s = gateway.settings
    out = ["--host", gateway.host, "--port", str(gateway.port), "--worker-urls",
           *[gateway.worker_url(i) for i in range(replicas)]]
    for key, flag in FLAGS:
        out += [flag, str(s[key])]
    return out


def with_workers(section: Mapping[str, Any], urls: list[str]) -> dict[str, Any]:
    """The gateway `section` fronting other hosts' replicas too (`urls`, after its own): its workers and smg's
    `--worker-urls` in its argv. The same section without them when `urls` is empty."""
    own = list(section.get("workers") or [])
    extra = [str(u) for u in urls if str(u) not in own]
    if not extra or not section:
        return dict(section)
    args = list(section["args"])
    at = args.index("--worker-urls") + 1 + len(own)
    return {**section, "args": args[:at] + extra + args[at:], "workers": own + extra}


def section(gateway: Gateway, replicas: int) -> dict[str, Any]:
    """The plan's `gateway` section: the endpoint, smg's argv, the workers it fronts and the checked settings."""
    return {"host": gateway.host, "port": gateway.port, "args": argv(gateway, replicas),
            "environment": {"SMG_DRAIN_SETTLE_SECS": str(gateway.settings["drain_settle_secs"])},
            "workers": [gateway.worker_url(i) for i in range(replicas)], "settings": dict(gateway.settings)}


class GatewayError(ValueError):
    """A gateway section that cannot be served (its messages joined)."""


def checked_section(raw: Any, serve: Mapping[str, Any], replicas: int) -> dict[str, Any]:
    """`section` for settings given outside a plan (a host whose replicas are already known); refuses mistakes."""
    errors: list[str] = []
    gateway = validate(raw if raw is not None else {}, serve, errors)
    if gateway is not None:
        errors += port_problems(gateway, replicas)
    if gateway is None or errors:
        raise GatewayError("; ".join(errors))
    return section(gateway, replicas)


def replica(index: int, gpu_ids: list[int], gateway: Gateway, args: list[str]) -> dict[str, Any]:
    """One replica: its GPUs (as the host numbers them), port, URL and engine argv; `tls` when it serves HTTPS
    (its unit gives the engine its certificate and key)."""
    return {"index": index, "gpu_ids": list(gpu_ids), "cuda_visible_devices": ",".join(str(g) for g in gpu_ids),
            "host": str(gateway.settings["worker_host"]), "port": gateway.worker_port(index),
            "url": gateway.worker_url(index), "local_url": gateway.local_url(index), "args": list(args),
            "tls": gateway.scheme == "https"}
