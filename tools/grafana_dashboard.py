"""The team's Grafana dashboard (dashboards/dflash.json), built with Grafana's own SDK (PyPI grafana-foundation-sdk).

Per replica: output tokens/s, mean acceptance length, running and queued requests, errors (the engine's aborted
requests and the gateway's failed requests to that worker), over the two jobs of the scrape configuration
(dflash_infra/monitoring.py); then each replica's state in the gateway and the firing alerts of the rules
(dflash_infra/alerts.py). Every expression uses only metrics that SGLang 0.5.23 (and so the lab's engine stand-in)
or the gateway exports, and Prometheus' own ALERTS. Regenerate after a change:
`.venv/bin/python tools/grafana_dashboard.py`; tests/test_monitoring.py fails when the committed JSON differs from what
this builds.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, statetimeline, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DashboardRangeMapOptions,
    DataSourceRef,
    RangeMap,
    ValueMap,
    ValueMappingResult,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "dashboards" / "dflash.json"
UID = "dflash-serving"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# The gateway's metrics the dashboard reads: smg's names (docs/reference/metrics.md of lightseekorg/smg, the
# gateway's source). `worker` is the worker's URL, as the gateway registered it.
GATEWAY_METRICS = ("smg_http_responses_total", "smg_worker_cb_outcomes_total", "smg_worker_requests_active",
                   "smg_worker_health", "smg_worker_cb_state")
# Prometheus' own series: the state of every alerting rule.
PROMETHEUS_METRICS = ("ALERTS",)
REPLICA = "{{dflash_host}} r{{replica}}"
RATE = "$__rate_interval"
# (title, unit, description, [(expr, legend)]) per panel, in the dashboard's order, two to a row.
PANELS: tuple[tuple[str, str, str, tuple[tuple[str, str], ...]], ...] = (
    ("Output tokens/s", "short", "Generated tokens per second of each replica (sglang:generation_tokens_total), "
     "and the engine's own decode throughput gauge.",
     ((f"sum by (dflash_host, replica) (rate(sglang:generation_tokens_total[{RATE}]))", REPLICA),
      ("sum by (dflash_host, replica) (sglang:gen_throughput)", REPLICA + " (engine gauge)"))),
    ("Mean acceptance length", "short", "Tokens per verify step of the last decode window "
     "(sglang:spec_accept_length); the load gate refuses a deployment below 1.5, a collapse reads 1.0.",
     (("avg by (dflash_host, replica) (sglang:spec_accept_length)", REPLICA),)),
    ("Running and queued requests", "short", "Requests each engine runs, and those waiting behind "
     "--max-running-requests; the gateway's requests in flight to each worker.",
     (("sum by (dflash_host, replica) (sglang:num_running_reqs)", REPLICA + " running"),
      ("sum by (dflash_host, replica) (sglang:num_queue_reqs)", REPLICA + " queued"),
      ("sum by (dflash_host, worker) (smg_worker_requests_active)", "{{dflash_host}} {{worker}} at the gateway"))),
    ("Errors per replica", "reqps", "Requests each engine aborted, failed requests of the gateway to each worker "
     "(its circuit breaker's failures) and the endpoint's 5xx answers.",
     ((f"sum by (dflash_host, replica) (rate(sglang:num_aborted_requests_total[{RATE}]))", REPLICA + " aborted"),
      (f'sum by (dflash_host, worker) (rate(smg_worker_cb_outcomes_total{{outcome="failure"}}[{RATE}]))',
       "{{dflash_host}} {{worker}} failed"),
      (f'sum by (dflash_host) (rate(smg_http_responses_total{{status_code=~"5.."}}[{RATE}]))',
       "{{dflash_host}} endpoint 5xx"))),
)
# Each worker's state in the gateway as one number: smg_worker_cb_state (0 closed, 1 open, 2 half open), plus 10 when
# smg_worker_health says unhealthy (0); mapped to words by the panel.
WORKER_STATE = ("10 * (1 - max by (dflash_host, worker) (smg_worker_health)) "
                "+ max by (dflash_host, worker) (smg_worker_cb_state)")
WORKER_STATES = (("0", "routed", "green"), ("1", "breaker open", "red"), ("2", "breaker half open", "orange"))
FIRING = 'sum by (alertname, severity, dflash_host, replica) (ALERTS{alertstate="firing"})'
# What an expression holds beside metric names: PromQL's aggregations, functions and keywords used above.
PROMQL_WORDS = frozenset({"sum", "avg", "max", "min", "rate", "by", "without"})


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: its identifiers less label matchers, grouping labels, ranges,
    variables and PromQL's own words."""
    rest = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\b(?:by|without)\s*\([^)]*\)", " ", expr)
    rest = re.sub(r"\$\w+", " ", rest)
    return {word for word in re.findall(r"[A-Za-z_:][\w:]*", rest) if word not in PROMQL_WORDS}


def build() -> dict[str, object]:
    """The dashboard as Grafana's JSON model."""
    board = (dashboard.Dashboard("DFlash serving").uid(UID).tags(["dflash", "sglang", "smg"])
             .description("SGLang engines (DFlash speculative decoding) behind the SGLang Model Gateway, per "
                          "replica; scraped as docs/serving.md \"Metrics\" says.")
             .time("now-1h", "now").refresh("30s").tooltip(DashboardCursorSync.CROSSHAIR)
             .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")))
    for title, unit, description, queries in PANELS:
        panel = (timeseries.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
                 .height(8).span(12).min(0))
        for ref, (expr, legend) in zip("ABCDEFGH", queries, strict=False):
            panel = panel.with_target(prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)
                                      .datasource(DATASOURCE))
        board = board.with_panel(panel)
    state = (statetimeline.Panel().title("Replicas in the gateway")
             .description("Each worker as the gateway sees it (legend: its URL; replica i listens on the plan's "
                          "worker_base_port + i): routed, its circuit breaker open or half open "
                          "(smg_worker_cb_state), or unhealthy (smg_worker_health 0, no request routed).")
             .datasource(DATASOURCE).height(8).span(12)
             .mappings([ValueMap({value: ValueMappingResult(text=text, color=color, index=i)
                                  for i, (value, text, color) in enumerate(WORKER_STATES)}),
                        RangeMap(DashboardRangeMapOptions(from_val=10, to=12, result=ValueMappingResult(
                            text="unhealthy", color="dark-red", index=len(WORKER_STATES))))])
             .with_target(prometheus.Dataquery().expr(WORKER_STATE).legend_format("{{dflash_host}} {{worker}}")
                          .ref_id("A").datasource(DATASOURCE)))
    firing = (table.Panel().title("Firing alerts")
              .description("The alert rules of playbooks/monitoring.yml firing now (ALERTS), one row per alert, host "
                           "and replica; each alert's runbook step: docs/serving.md, \"Alerts\".")
              .datasource(DATASOURCE).height(8).span(12).no_value("none firing")
              .with_target(prometheus.Dataquery().expr(FIRING).instant().format(PromQueryFormat.TABLE)
                           .ref_id("A").datasource(DATASOURCE)))
    board = board.with_panel(state).with_panel(firing)
    built: dict[str, object] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return built


def render() -> str:
    """The committed file's text: sorted keys, two-space indent, a final newline."""
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(render())
    print(OUTPUT.relative_to(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main())
