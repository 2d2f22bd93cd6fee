"""Metrics for people: the scrape configuration made from the plans (dflash_infra/monitoring.py, checked by the
real promtool) and the Grafana dashboard (tools/grafana_dashboard.py), which may read only metrics that exist."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dflash_infra import monitoring
from helpers import ROOT, debian_prometheus
from test_gateway_plan import planned

sys.path.insert(0, str(ROOT / "lab" / "engine"))
sys.path.insert(0, str(ROOT / "tools"))
import grafana_dashboard  # tools/ is no package
from sglang.standin import metrics as standin_metrics  # the stand-in package, not an engine


def hosts() -> list[dict[str, Any]]:
    """ct200 behind the gateway (4 replicas of tp 2), ct129 one engine, as the production inventory plans them."""
    return [{"host": "ct200", "address": "ct200.internal", "plan": planned(gateway={})},
            {"host": "ct129", "address": "ct129.internal", "plan": planned("eval")}]


def test_the_gateway_and_every_engine_are_targets_by_their_host_names() -> None:
    config = monitoring.scrape_config(hosts())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert list(jobs) == ["dflash-gateway", "dflash-engine"]
    assert all(job["metrics_path"] == "/metrics" and job["scrape_interval"] == "15s" for job in jobs.values())
    assert jobs["dflash-gateway"]["static_configs"] == [
        {"targets": ["ct200.internal:29000"], "labels": {"dflash_host": "ct200"}}]
    engines = [(g["targets"], g["labels"]) for g in jobs["dflash-engine"]["static_configs"]]
    assert engines == [
        (["ct129.internal:30000"], {"dflash_host": "ct129", "replica": "0", "gpus": "0,1"}),
        *[([f"ct200.internal:{30001 + i}"], {"dflash_host": "ct200", "replica": str(i), "gpus": f"{2 * i},{2 * i + 1}"})
          for i in range(4)]]
    assert "127.0.0.1" not in json.dumps(config)  # the plan's listen addresses never become targets


def test_loopback_listeners_are_named_as_reachable_from_their_host_only() -> None:
    lines = monitoring.unreachable(hosts())
    assert len(lines) == 5 and all(line.startswith("ct200: ") for line in lines)
    assert lines[0] == ('ct200: dflash-gateway target ct200.internal:29000 listens on 127.0.0.1 only; a Prometheus '
                        'on ct200 reaches it, one elsewhere does not (docs/serving.md, "Metrics")')
    lab = [{"host": "ct200", "address": "127.0.200.1", "plan": planned(gateway={})}]
    assert monitoring.unreachable(lab) == []  # the lab's own loopback address: the same host
    local = [{"host": "ct200", "address": "localhost", "plan": planned(gateway={})}]
    assert monitoring.unreachable(local) == []  # a Prometheus on the container itself


def test_a_plan_with_errors_gives_no_target() -> None:
    assert monitoring.scrape_config([{"host": "x", "address": "x.internal", "plan": {"errors": ["no"]}}]) == {
        "scrape_configs": []}


def test_the_playbook_writes_the_file_from_the_library(tmp_path: Path) -> None:
    """Checked as a person runs it: offline plans of the production inventory, the file on the controller."""
    out = tmp_path / "dflash.yml"
    settings = yaml.safe_load((ROOT / "group_vars" / "all" / "monitoring.yml").read_text())["dflash_monitoring"]
    settings.update(address="{{ ansible_host }}", scrape_config=str(out), rules_file=str(tmp_path / "alerts.yml"))
    run = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "playbooks/monitoring.yml",
                          "-e", json.dumps({"dflash_monitoring": settings})],
                         cwd=ROOT, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert yaml.safe_load(out.read_text()) == monitoring.scrape_config(hosts())
    assert "ct200: dflash-engine target ct200.internal:30004 listens on 127.0.0.1 only" in run.stdout


@pytest.fixture(scope="session")
def promtool() -> Path:
    """Debian's promtool (package prometheus), fetched once into .cache/promtool and unpacked, never installed."""
    return debian_prometheus() / "usr" / "bin" / "promtool"


@pytest.mark.promtool
def test_promtool_accepts_the_scrape_configuration(promtool: Path, tmp_path: Path) -> None:
    path = tmp_path / "dflash.yml"
    path.write_text(yaml.safe_dump(monitoring.scrape_config(hosts()), sort_keys=False))
    check = subprocess.run([str(promtool), "check", "config", str(path)], capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr


def test_the_committed_dashboard_is_what_the_tool_builds() -> None:
    assert grafana_dashboard.OUTPUT.read_text() == grafana_dashboard.render(), \
        "dashboards/dflash.json is stale: run .venv/bin/python tools/grafana_dashboard.py"


def test_the_dashboard_has_its_panels_on_a_prometheus_data_source() -> None:
    board = json.loads(grafana_dashboard.OUTPUT.read_text())
    assert [p["title"] for p in board["panels"]] == ["Output tokens/s", "Mean acceptance length",
                                                      "Running and queued requests", "Errors per replica",
                                                      "Replicas in the gateway", "Firing alerts"]
    state, firing = board["panels"][4:]
    assert state["type"] == "state-timeline" and firing["type"] == "table"
    assert firing["targets"][0]["expr"] == ('sum by (alertname, severity, dflash_host, replica) '
                                            '(ALERTS{alertstate="firing"})') and firing["targets"][0]["instant"]
    words = {m["type"]: m["options"] for m in state["fieldConfig"]["defaults"]["mappings"]}
    assert {k: v["text"] for k, v in words["value"].items()} == {"0": "routed", "1": "breaker open",
                                                                  "2": "breaker half open"}
    assert (words["range"]["from"], words["range"]["to"], words["range"]["result"]["text"]) == (10, 12, "unhealthy")
    assert board["templating"]["list"][0]["type"] == "datasource"
    assert all(t["datasource"]["uid"] == "${datasource}" for p in board["panels"] for t in p["targets"])


def test_every_expression_reads_only_metrics_the_engine_or_the_gateway_exports() -> None:
    exported = {*standin_metrics.SCHEDULER_GAUGES, *standin_metrics.TOKENIZER_COUNTERS,
                *grafana_dashboard.GATEWAY_METRICS, *grafana_dashboard.PROMETHEUS_METRICS}
    board = json.loads(grafana_dashboard.OUTPUT.read_text())
    used: set[str] = set()
    for panel in board["panels"]:
        for target in panel["targets"]:
            names = grafana_dashboard.metric_names(target["expr"])
            assert names and names <= exported, (panel["title"], target["expr"], names - exported)
            used |= names
    assert set(grafana_dashboard.GATEWAY_METRICS) <= used  # no name listed for nothing
    assert grafana_dashboard.metric_names(
        'sum by (worker) (rate(smg_worker_cb_outcomes_total{outcome="failure"}[$__rate_interval]))') == {
        "smg_worker_cb_outcomes_total"}


def test_the_stand_in_prints_sglang_s_exposition_format() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    m = standin_metrics.Metrics("Qwen3.6-27B", max_running_requests=2, max_total_num_tokens=625533)
    m.finished({"prompt_tokens": 5, "completion_tokens": 64, "spec_accept_length": 4.0, "spec_accept_rate": 0.2},
               now=100.0)
    m.finished({"prompt_tokens": 7, "completion_tokens": 32, "spec_accept_length": 2.0, "spec_accept_rate": 0.1},
               now=101.0)
    text = m.exposition(in_flight=3)
    assert ('sglang:num_running_reqs{engine_type="unified",model_name="Qwen3.6-27B",pp_rank="0",tp_rank="0"} 2.0'
            in text.splitlines())
    assert "# TYPE sglang:generation_tokens_total counter" in text
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["sglang:num_queue_reqs"] == 1 and samples["sglang:generation_tokens_total"] == 96
    assert samples["sglang:spec_accept_length"] == 3.0 and samples["sglang:max_total_num_tokens"] == 625533
    assert samples["sglang:gen_throughput"] == 96.0  # tokens finished in the window over its span (at least 1 s)
    assert [standin_metrics.format_value(v) for v in (1, 0.5, 8128902, 625533, float("inf"))] == [
        "1.0", "0.5", "8.128902e+06", "625533.0", "+Inf"]
