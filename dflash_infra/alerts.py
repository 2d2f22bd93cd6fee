"""Alerts for people: the Prometheus rules made from each container's plan (and, where known, the last deployment's
load-gate figures), and the team's Alertmanager configuration.

The rules read only what the scrape configuration of dflash_infra/monitoring.py collects: the engines' `/metrics`
(job `dflash-engine`, labels `dflash_host` and `replica`) and the gateway's Prometheus port (job `dflash-gateway`,
label `dflash_host`; smg 1.13 labels its worker metrics with `worker`, the worker's URL as the gateway registered it,
which the rules turn into the plan's `replica`). One rule group per host: its thresholds come from its own plan.
Every alert carries `severity`, `dflash_host` and `replica` (`all` for the endpoint as a whole) and a summary that
names them and the runbook step in docs/serving.md ("Alerts"), whose headings are the alert names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from dflash_infra.monitoring import ENGINE_JOB, GATEWAY_JOB

SEVERITIES = ("critical", "warning", "info")
# The settings each alert reads from dflash_monitoring.alerts (group_vars/all/monitoring.yml), beside for/severity.
ALERTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "DFlashEndpointDown": ("endpoint_down", ()),
    "DFlashReplicaDown": ("replica_down", ()),
    "DFlashReplicaUnhealthyInGateway": ("replica_unhealthy", ()),
    "DFlashCircuitBreakerOpen": ("circuit_open", ()),
    "DFlashGatewayErrorRatioHigh": ("error_ratio", ("above", "window")),
    "DFlashRequestsQueueing": ("queueing", ("capacity_fraction",)),
    "DFlashAcceptanceBelowFloor": ("accept_floor", ("min_accept_length", "window")),
    "DFlashAcceptanceBelowLastDeploy": ("accept_drop", ("fraction", "window")),
    "DFlashDecodeThroughputLow": ("decode_slow", ("fraction",)),
}
RECEIVER = "dflash-team"
ENGINE_JOBS = f'job=~"{ENGINE_JOB}(-tls)?"'
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
# smg's circuit breaker states (smg_worker_cb_state's help: 0=closed, 1=open, 2=half_open).
BREAKER_CLOSED = 0
# What the annotations print of an alert's series (Prometheus' templates, rendered when it fires).
HOST = "{{ $labels.dflash_host }}"
REPLICA = "{{ $labels.replica }}"
VALUE = '{{ $value | printf "%.3g" }}'


@dataclass(frozen=True)
class LastLoad:
    """What a replica's last load gate measured, as the rules compare with it: the lowest mean acceptance length over
    its concurrencies, and the lowest output tokens/s per concurrent request (None where the record has none)."""

    accept_length: float | None
    tokens_per_s_per_request: float | None


def _settings(alerts: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each alert's settings, checked: a Prometheus duration for `for` and `window`, a known severity, numbers above 0
    (fractions at most 1)."""
    out: dict[str, dict[str, Any]] = {}
    for name, (key, extra) in ALERTS.items():
        section = alerts.get(key)
        if not isinstance(section, Mapping):
            raise ValueError(f"dflash_monitoring.alerts.{key} ({name}): expected a mapping with for, severity"
                             f"{''.join(', ' + e for e in extra)}; found {section!r}")
        checked: dict[str, Any] = {}
        for field in ("for", "window"):
            if field == "for" or field in extra:
                value = str(section.get(field, ""))
                if not DURATION.match(value):
                    raise ValueError(f"dflash_monitoring.alerts.{key}.{field} ({name}): expected a Prometheus "
                                     f"duration such as 5m or 90s, found {section.get(field)!r}")
                checked[field] = value
        severity = section.get("severity")
        if severity not in SEVERITIES:
            raise ValueError(f"dflash_monitoring.alerts.{key}.severity ({name}): expected one of "
                             f"{', '.join(SEVERITIES)}, found {severity!r}")
        checked["severity"] = severity
        for field in extra:
            if field == "window":
                continue
            try:
                number = float(section[field])
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"dflash_monitoring.alerts.{key}.{field} ({name}): expected a number, found "
                                 f"{section.get(field)!r}") from None
            bounded = field in ("above", "fraction")
            if number <= 0 or (bounded and number > 1):
                raise ValueError(f"dflash_monitoring.alerts.{key}.{field} ({name}): expected a number above 0"
                                 f"{' and at most 1' if bounded else ''}, found {number}")
            checked[field] = number
        out[name] = checked
    return out


def last_load(load: Any) -> LastLoad:
    """The figures the rules compare with, from one replica's last load gate: its deployment record, the record's
    `load` ({"inputs", "figures"}) or the figures themselves (loadgate.figures, one per concurrency)."""
    if isinstance(load, Mapping) and "load" in load:
        load = load["load"]
    if isinstance(load, Mapping):
        load = load.get("figures")
    rows = [row for row in load or [] if isinstance(row, Mapping)]
    accept = [float(r["accept_length_mean"]) for r in rows if r.get("accept_length_mean") is not None]
    rates = [float(r["output_tokens_per_s"]) / int(r["concurrency"]) for r in rows
             if r.get("output_tokens_per_s") and int(r.get("concurrency") or 0) > 0]
    return LastLoad(min(accept) if accept else None, min(rates) if rates else None)


def status_loads(status_output: Any, host: str) -> dict[str, Any]:
    """The last load gate's figures of `host`'s replicas, by replica index ("0" for a single engine), from what
    `playbooks/status.yml -e status_format=json` printed (its whole output, or the document itself): what the rules
    that compare with the last deploy read. Empty when the host is not in it or has no figures."""
    from dflash_infra import status  # the view's own reader of its document

    if isinstance(status_output, str):
        try:
            document: Any = status.extract(status_output)
        except ValueError as exc:
            raise ValueError(f"dflash_monitoring_status_file: expected the output of playbooks/status.yml -e "
                             f"status_format=json, found no JSON document in it ({exc})") from exc
    else:
        document = status_output
    report = document.get(host) if isinstance(document, Mapping) else None
    if not isinstance(report, Mapping):
        return {}
    loads = (report.get("load") or {}).get("replicas") or {}
    out: dict[str, Any] = {}
    for replica in report.get("replicas") or []:
        figures = (loads.get(replica.get("name")) or {}).get("figures")
        if figures:
            out[str(replica.get("index") if replica.get("index") is not None else 0)] = {"figures": list(figures)}
    return out


def _number(value: float) -> str:
    """A threshold as the rule prints it: at most three decimals, no trailing zeros."""
    return f"{value:.3f}".rstrip("0").rstrip(".")


def _by_replica(expr: str, replicas: Sequence[Mapping[str, Any]]) -> str:
    """`expr` (series of smg labelled by `worker`) with the plan's `replica` label added: one label_replace per
    replica, matching the worker URL the gateway registered (the regex is anchored; a raw string, so its escapes stay
    the regex's)."""
    for r in replicas:
        expr = f'label_replace({expr}, "replica", "{r["index"]}", "worker", `{re.escape(str(r["url"]))}`)'
    return expr


def host_rules(entry: Mapping[str, Any], alerts: Mapping[str, Any]) -> dict[str, Any] | None:
    """The rule group of one host (None for a plan that serves nothing: one with errors, or no engine)."""
    settings, runbook = _settings(alerts), str(alerts.get("runbook") or "")
    if not runbook:
        raise ValueError("dflash_monitoring.alerts.runbook: expected where the runbook is (docs/serving.md, or its "
                         "address on the team's forge), found nothing")
    host, plan = str(entry["host"]), entry["plan"]
    replicas = list(plan.get("replicas") or [])
    if plan.get("errors") or not (replicas or (plan.get("serve") or {}).get("port")):
        return None
    sel = f'dflash_host="{host}"'
    rules: list[dict[str, Any]] = []

    def add(name: str, expr: str, summary: str, description: str, replica: str | None = None) -> None:
        """One alerting rule. Its labels name the host (and the replica where the expression reads one replica, or
        `all` for the endpoint), as its series do: the rules of several hosts, or replicas, that share a name stay
        distinct (promtool's lint)."""
        labels = {"severity": settings[name]["severity"], "dflash_host": host}
        if replica is not None:
            labels["replica"] = replica
        anchor = f"{runbook}#{name.lower()}"
        rules.append({"alert": name, "expr": expr, "for": settings[name]["for"], "labels": labels,
                      "annotations": {"summary": f"{summary}; runbook: {anchor}", "description": description,
                                      "runbook_url": anchor}})

    def replica_down() -> None:
        s = settings["DFlashReplicaDown"]
        add("DFlashReplicaDown", f"up{{{ENGINE_JOBS},{sel}}} == 0",
            f"{HOST} replica {REPLICA}: its engine does not answer Prometheus for {s['for']}",
            f"The engine of replica {REPLICA} (GPUs {{{{ $labels.gpus }}}}) has not answered /metrics for "
            f"{s['for']}: its unit stopped, restarts or hangs; the gateway sends its share to the others.")

    remote = bool(((plan.get("gateway") or {}).get("settings") or {}).get("remote"))
    if replicas and remote:
        # Another host's gateway fronts these replicas: the endpoint and the gateway's view of them are that host's
        # (its rule group); here only whether each engine answers.
        replica_down()
    elif replicas:
        s = settings["DFlashEndpointDown"]
        add("DFlashEndpointDown", f'up{{job="{GATEWAY_JOB}",{sel}}} == 0',
            f"{HOST}: the gateway in front of all {len(replicas)} replicas does not answer Prometheus for {s['for']}",
            f"The gateway's metrics port ({GATEWAY_JOB}) has not answered for {s['for']}: the endpoint is down or cut "
            "off from Prometheus.", replica="all")
        replica_down()
        s = settings["DFlashReplicaUnhealthyInGateway"]
        add("DFlashReplicaUnhealthyInGateway", _by_replica(f"smg_worker_health{{{sel}}}", replicas) + " == 0",
            f"{HOST} replica {REPLICA}: the gateway marks it unhealthy for {s['for']}",
            "smg_worker_health of worker {{ $labels.worker }} is 0: the gateway's health checks fail and it "
            "routes no request to this replica.")
        s = settings["DFlashCircuitBreakerOpen"]
        add("DFlashCircuitBreakerOpen",
            _by_replica(f"smg_worker_cb_state{{{sel}}}", replicas) + f" > {BREAKER_CLOSED}",
            f"{HOST} replica {REPLICA}: the gateway's circuit breaker is not closed for {s['for']}",
            "smg_worker_cb_state of worker {{ $labels.worker }} is not 0 (1 open, 2 half open): requests to "
            "this replica failed in a row and the gateway holds them back.")
        s = settings["DFlashGatewayErrorRatioHigh"]
        answers = f'smg_http_responses_total{{{sel},path!~"/health.*"'
        ratio = (f'sum by (dflash_host) (rate({answers},status_code=~"5.."}}[{s["window"]}]))'
                 f" / sum by (dflash_host) (rate({answers}}}[{s['window']}]))")
        add("DFlashGatewayErrorRatioHigh", f"{ratio} > {_number(s['above'])}",
            f"{HOST}, all replicas: {{{{ $value | humanizePercentage }}}} of the endpoint's answers are 5xx (above "
            f"{s['above']:.0%}) for {s['for']}",
            f"The gateway answered more than {s['above']:.0%} of its requests (health probes left out) with a 5xx "
            f"over {s['window']}, for {s['for']}.", replica="all")
    else:
        s = settings["DFlashEndpointDown"]
        add("DFlashEndpointDown", f"up{{{ENGINE_JOBS},{sel}}} == 0",
            f"{HOST} replica {REPLICA}: the endpoint's engine does not answer Prometheus for {s['for']}",
            f"The single engine of {HOST} has not answered /metrics for {s['for']}: the endpoint is down or cut off "
            "from Prometheus.")
    # Each engine's capacity: a replica's own; a single process (--dp-size) runs one scheduler per DP rank, each with
    # max_running_requests, and the rule sums their queues.
    capacity = int(plan.get("max_running_requests") or 0) * (1 if replicas else int(plan.get("dp_size") or 1))
    s = settings["DFlashRequestsQueueing"]
    if capacity:
        queued = capacity * s["capacity_fraction"]
        add("DFlashRequestsQueueing",
            f"sum by (dflash_host, replica) (sglang:num_queue_reqs{{{sel}}}) > {_number(queued)}",
            f"{HOST} replica {REPLICA}: {VALUE} requests wait beyond its {capacity} running ones for {s['for']}",
            f"More than {_number(queued)} requests ({s['capacity_fraction']:.0%} of the plan's max_running_requests, "
            f"{capacity}) have waited in the engine's queue for {s['for']}: the endpoint is short of capacity.")
    if plan.get("speculative"):
        s = settings["DFlashAcceptanceBelowFloor"]
        floor = _number(s["min_accept_length"])
        add("DFlashAcceptanceBelowFloor",
            f"avg by (dflash_host, replica) (sglang:spec_accept_length{{{sel}}} > 0) < {floor} and on (dflash_host, "
            f"replica) sum by (dflash_host, replica) (rate(sglang:generation_tokens_total{{{sel}}}[{s['window']}]))"
            " > 0",
            f"{HOST} replica {REPLICA}: acceptance length {VALUE} below the load gate's floor {floor} for {s['for']}",
            f"While requests flow, the drafter's mean acceptance length (sglang:spec_accept_length) has stayed below "
            f"{floor} tokens per verify step for {s['for']}: speculative decoding costs more than it saves (1.0 is "
            "a collapse).")
    loads = entry.get("load") or {}
    for r in replicas or [{"index": 0}]:
        index = str(r["index"])
        last = last_load(loads.get(index, loads.get(int(index))) if isinstance(loads, Mapping) else None)
        one = f'{sel},replica="{index}"'
        s = settings["DFlashAcceptanceBelowLastDeploy"]
        if plan.get("speculative") and last.accept_length is not None:
            below, measured = _number(last.accept_length * s["fraction"]), _number(last.accept_length)
            add("DFlashAcceptanceBelowLastDeploy",
                f"avg by (dflash_host, replica) (sglang:spec_accept_length{{{one}}} > 0) < {below} and on "
                f"(dflash_host, replica) sum by (dflash_host, replica) (rate(sglang:generation_tokens_total{{{one}}}"
                f"[{s['window']}])) > 0",
                f"{HOST} replica {REPLICA}: acceptance length {VALUE} below {s['fraction']:.0%} of the last deploy's "
                f"{measured} for {s['for']}",
                f"While requests flow, the mean acceptance length has stayed below {below} for {s['for']}: "
                f"{s['fraction']:.0%} of the {measured} the last deployment's load gate measured on this replica.",
                replica=index)
        s = settings["DFlashDecodeThroughputLow"]
        if last.tokens_per_s_per_request is not None:
            slow, measured = (_number(last.tokens_per_s_per_request * s["fraction"]),
                              _number(last.tokens_per_s_per_request))
            running = f"sum by (dflash_host, replica) (sglang:num_running_reqs{{{one}}})"
            add("DFlashDecodeThroughputLow",
                f"sum by (dflash_host, replica) (sglang:gen_throughput{{{one}}}) / {running} < {slow} and on "
                f"(dflash_host, replica) {running} > 0",
                f"{HOST} replica {REPLICA}: {VALUE} tokens/s per running request, below {s['fraction']:.0%} of the "
                f"last deploy's {measured} for {s['for']}",
                f"The engine's decode throughput (sglang:gen_throughput) per running request has stayed below {slow} "
                f"tokens/s for {s['for']}: {s['fraction']:.0%} of the {measured} the last load gate measured per "
                "concurrent request.", replica=index)
    return {"name": f"dflash-{host}", "rules": rules}


def rules(hosts: Sequence[Mapping[str, Any]], alerts: Mapping[str, Any]) -> dict[str, Any]:
    """A Prometheus rule file (`groups`) for the hosts' plans, one group per host sorted by name.

    `hosts`: one mapping per container as for monitoring.scrape_config, with an optional `load`: the last
    deployment's load gate per replica index (see last_load); without it, the rules that compare with the last
    deploy are left out. `alerts`: dflash_monitoring.alerts (group_vars/all/monitoring.yml).
    """
    groups = [host_rules(entry, alerts) for entry in sorted(hosts, key=lambda h: str(h["host"]))]
    return {"groups": [g for g in groups if g]}


def webhook_problems(url: Any) -> list[str]:
    """Why the Alertmanager webhook URL cannot be used (empty when it can). Never quotes it: it is a secret."""
    text = str(url or "")
    if not text:
        return []
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return [f"vault_dflash_alertmanager_webhook_url: expected an http:// or https:// URL with a host, found a "
                f"value of {len(text)} characters that is not one (not shown: it is a secret)"]
    return []


def alertmanager_config(url: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The team's Alertmanager configuration: every alert to one webhook receiver, grouped per alert, host and
    replica; an endpoint down silences the other alerts of its host, a replica down the gateway's view of it.
    `settings`: dflash_monitoring.alertmanager (group_wait, group_interval, repeat_interval)."""
    problems = webhook_problems(url) or ([] if url else [
        "vault_dflash_alertmanager_webhook_url: expected the team's webhook URL, found it empty"])
    if problems:
        raise ValueError("; ".join(problems))
    for field in ("group_wait", "group_interval", "repeat_interval"):
        if not DURATION.match(str(settings.get(field, ""))):
            raise ValueError(f"dflash_monitoring.alertmanager.{field}: expected a duration such as 5m, found "
                             f"{settings.get(field)!r}")
    replica_view = "|".join(("DFlashReplicaUnhealthyInGateway", "DFlashCircuitBreakerOpen"))
    return {
        "route": {"receiver": RECEIVER, "group_by": ["alertname", "dflash_host", "replica"],
                  "group_wait": str(settings["group_wait"]), "group_interval": str(settings["group_interval"]),
                  "repeat_interval": str(settings["repeat_interval"])},
        "receivers": [{"name": RECEIVER, "webhook_configs": [{"url": str(url), "send_resolved": True}]}],
        "inhibit_rules": [
            {"source_matchers": ['alertname="DFlashEndpointDown"', 'replica="all"'],
             "target_matchers": ['alertname=~"DFlash.+"', 'alertname!="DFlashEndpointDown"'],
             "equal": ["dflash_host"]},
            {"source_matchers": ['alertname="DFlashReplicaDown"'],
             "target_matchers": [f'alertname=~"{replica_view}"'], "equal": ["dflash_host", "replica"]},
        ],
    }
