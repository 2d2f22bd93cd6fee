"""Alerts for people: the rules made from the plans and the last load gate (dflash_infra/alerts.py), each checked and
fed synthetic series by Debian's promtool (firing and not), and the team's Alertmanager configuration, checked by
Debian's amtool; the playbook writes both on the controller and never prints the webhook URL."""

from __future__ import annotations

import copy
import json
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dflash_infra import alerts
from helpers import ROOT, debian_alertmanager, debian_prometheus
from test_gateway_plan import planned

GROUP_VARS = ROOT / "group_vars" / "all"
WEBHOOK = "https://hooks.example.internal/dflash/T0KEN-s3cret"


def settings() -> dict[str, Any]:
    """dflash_monitoring.alerts as group_vars set it, the load gate's floor taken from its one home."""
    section = yaml.safe_load((GROUP_VARS / "monitoring.yml").read_text())["dflash_monitoring"]["alerts"]
    assert section["accept_floor"]["min_accept_length"] == "{{ dflash_load_gate.min_accept_length }}"
    floor = yaml.safe_load((GROUP_VARS / "load_gate.yml").read_text())["dflash_load_gate"]["min_accept_length"]
    section["accept_floor"]["min_accept_length"] = floor
    return dict(section)


def alertmanager_settings() -> dict[str, Any]:
    return dict(yaml.safe_load((GROUP_VARS / "monitoring.yml").read_text())["dflash_monitoring"]["alertmanager"])


# ct200's last load gate: replica 0 from its deployment record (two concurrencies), replica 1 from its figures.
LOAD = {"0": {"load": {"inputs": {"max_tokens": 64},
                       "figures": [{"concurrency": 31, "output_tokens_per_s": 1240.0, "accept_length_mean": 4.2},
                                   {"concurrency": 1, "output_tokens_per_s": 95.0, "accept_length_mean": 4.6}]}},
        "1": {"figures": [{"concurrency": 31, "output_tokens_per_s": 1178.0, "accept_length_mean": None}]}}


def hosts(load: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """ct200 behind the gateway (4 replicas of tp 2), ct129 one engine, as the production inventory plans them."""
    return [{"host": "ct200", "address": "ct200.internal", "plan": planned(gateway={}), "load": load or {}},
            {"host": "ct129", "address": "ct129.internal", "plan": planned("eval")}]


def by_name(rules: dict[str, Any]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """{group: {alert: [rules]}}."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for group in rules["groups"]:
        for rule in group["rules"]:
            out.setdefault(group["name"], {}).setdefault(rule["alert"], []).append(rule)
    return out


def test_each_host_gets_its_group_with_the_alerts_its_plan_calls_for() -> None:
    groups = by_name(alerts.rules(hosts(), settings()))
    assert list(groups) == ["dflash-ct129", "dflash-ct200"]
    assert list(groups["dflash-ct200"]) == [
        "DFlashEndpointDown", "DFlashReplicaDown", "DFlashReplicaUnhealthyInGateway", "DFlashCircuitBreakerOpen",
        "DFlashGatewayErrorRatioHigh", "DFlashRequestsQueueing", "DFlashAcceptanceBelowFloor"]
    # One engine, no gateway: it is the endpoint, and the gateway's views of it do not exist.
    assert list(groups["dflash-ct129"]) == ["DFlashEndpointDown", "DFlashRequestsQueueing",
                                            "DFlashAcceptanceBelowFloor"]
    assert groups["dflash-ct129"]["DFlashEndpointDown"][0]["expr"] == (
        'up{job=~"dflash-engine(-tls)?",dflash_host="ct129"} == 0')
    assert groups["dflash-ct200"]["DFlashEndpointDown"][0]["expr"] == (
        'up{job="dflash-gateway",dflash_host="ct200"} == 0')


def test_every_rule_names_its_host_replica_and_runbook_step_with_a_severity() -> None:
    headings = set(re.findall(r"^#### (DFlash\w+)$", (ROOT / "docs" / "serving.md").read_text(), re.M))
    assert headings == set(alerts.ALERTS)  # each alert has its runbook step, and each step its alert
    for group in alerts.rules(hosts(LOAD), settings())["groups"]:
        for rule in group["rules"]:
            name, labels, notes = rule["alert"], rule["labels"], rule["annotations"]
            assert labels["severity"] in ("critical", "warning") and labels["dflash_host"] == group["name"][7:]
            assert notes["summary"].startswith("{{ $labels.dflash_host }}"), notes["summary"]
            assert "{{ $labels.replica }}" in notes["summary"] or labels.get("replica") == "all", notes["summary"]
            assert notes["runbook_url"] == f"docs/serving.md#{name.lower()}"
            assert notes["summary"].endswith(f"; runbook: docs/serving.md#{name.lower()}")
            assert rule["for"] == settings()[alerts.ALERTS[name][0]]["for"]


SMG_CAPTURES = ROOT / "tests" / "fixtures" / "smg"
PROMQL = frozenset({"sum", "avg", "max", "rate", "label_replace", "and", "on", "by"})


def rule_metrics(expr: str) -> set[str]:
    """The metric names an expression reads: its words less strings, matchers, ranges, label lists and PromQL's."""
    rest = re.sub(r'"[^"]*"|`[^`]*`|\{[^}]*\}|\[[^\]]*\]|\b(?:by|on)\s*\([^)]*\)', " ", expr)
    return {word for word in re.findall(r"[A-Za-z_:][\w:]*", rest) if word not in PROMQL}


def captured(path: Path) -> dict[str, list[dict[str, str]]]:
    """{metric: [labels of each sample]} of one captured exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(dict(sample.labels))
    return out


def test_the_rules_read_only_metrics_sglang_smg_or_prometheus_export() -> None:
    """SGLang's names as the stand-in exports them (checked against 0.5.23 by its own tests), smg's from the real
    1.13.0 captures, Prometheus' `up`: a rule over a misspelt metric would never fire."""
    import sys

    sys.path.insert(0, str(ROOT / "lab" / "engine"))
    from sglang.standin import metrics as standin  # the stand-in package, not an engine

    smg = {name for path in SMG_CAPTURES.glob("*.txt") for name in captured(path)}
    exported = {*standin.SCHEDULER_GAUGES, *standin.TOKENIZER_COUNTERS, *smg, "up"}
    used: set[str] = set()
    for group in alerts.rules(hosts(LOAD), settings())["groups"]:
        for rule in group["rules"]:
            names = rule_metrics(rule["expr"])
            assert names and names <= exported, (rule["alert"], names - exported)
            used |= names
    assert {"smg_worker_health", "smg_worker_cb_state", "smg_http_responses_total"} <= used
    assert rule_metrics('sum by (w) (rate(a:b_total{x="y"}[5m])) / on (w) label_replace(c, "r", "0", "w", `u`)') == {
        "a:b_total", "c"}


def test_the_captures_show_the_states_the_rules_read() -> None:
    """smg 1.13.0 labels health and breaker by `worker`, the worker's URL as registered; 1 healthy, 0 unhealthy;
    breaker 0 closed, 1 open; answers by `path` and `status_code`."""
    def value(capture: str, name: str, worker: str) -> float:
        from prometheus_client.parser import text_string_to_metric_families

        text = (SMG_CAPTURES / f"metrics-1.13.0-{capture}.txt").read_text()
        (found,) = [s.value for f in text_string_to_metric_families(text) for s in f.samples
                    if s.name == name and s.labels.get("worker") == worker]
        return float(found)

    up, down = "http://127.0.45.1:30451", "http://127.0.45.1:30452"
    assert [value("healthy", "smg_worker_health", w) for w in (up, down)] == [1, 1]
    assert [value("worker-down", "smg_worker_health", w) for w in (up, down)] == [1, 0]
    assert [value("breaker-open", "smg_worker_cb_state", w) for w in (up, down)] == [0, 1]
    answers = captured(SMG_CAPTURES / "metrics-1.13.0-healthy.txt")["smg_http_responses_total"]
    assert {"path", "status_code"} <= set(answers[0])


def test_the_thresholds_come_from_the_plan_and_group_vars() -> None:
    ct200 = by_name(alerts.rules(hosts(), settings()))["dflash-ct200"]
    # The plan's max_running_requests (31) times capacity_fraction 1.0.
    assert ct200["DFlashRequestsQueueing"][0]["expr"] == (
        'sum by (dflash_host, replica) (sglang:num_queue_reqs{dflash_host="ct200"}) > 31')
    assert ct200["DFlashAcceptanceBelowFloor"][0]["expr"] == (
        'avg by (dflash_host, replica) (sglang:spec_accept_length{dflash_host="ct200"} > 0) < 1.5 and on '
        '(dflash_host, replica) sum by (dflash_host, replica) '
        '(rate(sglang:generation_tokens_total{dflash_host="ct200"}[5m])) > 0')
    assert ct200["DFlashGatewayErrorRatioHigh"][0]["expr"].endswith(") > 0.05")
    # smg labels by the worker's URL; the plan's replica index replaces it, anchored, its dots escaped.
    health = ct200["DFlashReplicaUnhealthyInGateway"][0]["expr"]
    assert ('label_replace(smg_worker_health{dflash_host="ct200"}, "replica", "0", "worker", '
            '`http://127\\.0\\.0\\.1:30001`)') in health
    assert health.count("label_replace(") == 4 and health.endswith(" == 0")
    half = copy.deepcopy(settings())
    half["queueing"]["capacity_fraction"] = 0.5
    assert by_name(alerts.rules(hosts(), half))["dflash-ct200"]["DFlashRequestsQueueing"][0]["expr"].endswith("> 15.5")


def test_without_the_last_load_gate_the_rules_that_compare_with_it_are_left_out() -> None:
    plan_only = by_name(alerts.rules(hosts(), settings()))["dflash-ct200"]
    assert "DFlashAcceptanceBelowLastDeploy" not in plan_only and "DFlashDecodeThroughputLow" not in plan_only
    known = by_name(alerts.rules(hosts(LOAD), settings()))["dflash-ct200"]
    # Replica 0: the lowest acceptance (4.2) times 0.5; the lowest tokens/s per concurrent request (1240/31 = 40)
    # times 0.5. Replica 1 reported no acceptance: only its throughput rule (1178/31 = 38, times 0.5).
    (accept,) = known["DFlashAcceptanceBelowLastDeploy"]
    assert accept["labels"]["replica"] == "0" and "< 2.1 and on" in accept["expr"]
    assert 'sglang:spec_accept_length{dflash_host="ct200",replica="0"}' in accept["expr"]
    assert [(r["labels"]["replica"], r["expr"].split(" < ")[1].split(" ")[0])
            for r in known["DFlashDecodeThroughputLow"]] == [("0", "20"), ("1", "19")]
    assert alerts.last_load(LOAD["0"]) == alerts.last_load(LOAD["0"]["load"]) == alerts.last_load(
        LOAD["0"]["load"]["figures"]) == alerts.LastLoad(4.2, 40.0)
    assert alerts.last_load(None) == alerts.last_load({}) == alerts.LastLoad(None, None)


def test_a_plan_without_speculative_decoding_gets_no_acceptance_rule_and_one_with_errors_no_group() -> None:
    plain = dict(planned(gateway={}), speculative={})
    names = by_name(alerts.rules([{"host": "ct200", "plan": plain, "load": LOAD}], settings()))["dflash-ct200"]
    assert not {"DFlashAcceptanceBelowFloor", "DFlashAcceptanceBelowLastDeploy"} & set(names)
    assert "DFlashDecodeThroughputLow" in names
    assert alerts.rules([{"host": "x", "plan": {"errors": ["no"]}}], settings()) == {"groups": []}


@pytest.mark.parametrize(("key", "field", "value", "message"), [
    ("replica_down", "for", "5 minutes", "dflash_monitoring.alerts.replica_down.for (DFlashReplicaDown): expected a "
                                         "Prometheus duration such as 5m or 90s, found '5 minutes'"),
    ("error_ratio", "above", 5, "dflash_monitoring.alerts.error_ratio.above (DFlashGatewayErrorRatioHigh): expected a "
                                "number above 0 and at most 1, found 5.0"),
    ("endpoint_down", "severity", "page", "expected one of critical, warning, info, found 'page'"),
    ("accept_floor", "min_accept_length", "", "accept_floor.min_accept_length (DFlashAcceptanceBelowFloor): expected "
                                              "a number, found ''"),
])
def test_a_bad_setting_is_refused_naming_it_what_was_expected_and_found(key: str, field: str, value: Any,
                                                                        message: str) -> None:
    bad = copy.deepcopy(settings())
    bad[key][field] = value
    with pytest.raises(ValueError, match=re.escape(message)):
        alerts.rules(hosts(), bad)


def test_the_alertmanager_configuration_routes_every_alert_to_the_team_s_webhook() -> None:
    config = alerts.alertmanager_config(WEBHOOK, alertmanager_settings())
    assert config["route"] == {"receiver": "dflash-team", "group_by": ["alertname", "dflash_host", "replica"],
                               "group_wait": "30s", "group_interval": "5m", "repeat_interval": "4h"}
    assert config["receivers"] == [{"name": "dflash-team",
                                    "webhook_configs": [{"url": WEBHOOK, "send_resolved": True}]}]
    endpoint, replica = config["inhibit_rules"]
    assert endpoint["equal"] == ["dflash_host"] and replica["equal"] == ["dflash_host", "replica"]


@pytest.mark.parametrize("url", ["", "hooks.example.internal/T0KEN-s3cret", "ftp://hooks.example.internal/T0KEN-s3cret"])
def test_a_webhook_url_alertmanager_cannot_use_is_refused_without_showing_it(url: str) -> None:
    with pytest.raises(ValueError, match="vault_dflash_alertmanager_webhook_url: expected") as refused:
        alerts.alertmanager_config(url, alertmanager_settings())
    assert "T0KEN" not in str(refused.value) and "hooks" not in str(refused.value)
    assert alerts.webhook_problems(url) == ([] if not url else [str(refused.value)])
    assert alerts.webhook_problems(WEBHOOK) == []


def monitoring_extra_vars(tmp_path: Path) -> dict[str, Any]:
    """dflash_monitoring as group_vars set it, every file under tmp_path (-e replaces the whole mapping)."""
    section = yaml.safe_load((GROUP_VARS / "monitoring.yml").read_text())["dflash_monitoring"]
    section.update(address="{{ ansible_host }}", scrape_config=str(tmp_path / "dflash.yml"),
                   rules_file=str(tmp_path / "dflash-alerts.yml"))
    section["alertmanager"]["config"] = str(tmp_path / "alertmanager.yml")
    return {"dflash_monitoring": section}


def play(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "extra.json").write_text(json.dumps(monitoring_extra_vars(tmp_path)))
    return subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "playbooks/monitoring.yml",
                           "-e", f"@{tmp_path / 'extra.json'}", *extra],
                          cwd=ROOT, capture_output=True, text=True, check=False)


def test_the_playbook_writes_the_rules_and_says_when_no_receiver_is_configured(tmp_path: Path) -> None:
    run = play(tmp_path, "-e", json.dumps({"dflash_monitoring_last_load": LOAD}))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    written = yaml.safe_load((tmp_path / "dflash-alerts.yml").read_text())
    # Every host of the play got the same last load (one -e); ct129's replica 0 compares with LOAD["0"] too.
    expected = alerts.rules([{**h, "load": LOAD} for h in hosts()], settings())
    assert written == expected
    assert "{{ $labels.replica }}" in (tmp_path / "dflash-alerts.yml").read_text()  # Prometheus' templates, kept
    assert not (tmp_path / "alertmanager.yml").exists()
    assert "No Alertmanager configuration written: vault_dflash_alertmanager_webhook_url is empty" in \
        " ".join(run.stdout.split())


def test_the_playbook_writes_the_alertmanager_configuration_and_never_prints_the_url(tmp_path: Path) -> None:
    run = play(tmp_path, "-e", json.dumps({"vault_dflash_alertmanager_webhook_url": WEBHOOK}), "--diff", "-vv")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    path = tmp_path / "alertmanager.yml"
    assert yaml.safe_load(path.read_text()) == alerts.alertmanager_config(WEBHOOK, alertmanager_settings())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "T0KEN" not in run.stdout + run.stderr and "No Alertmanager configuration" not in run.stdout
    bad = play(tmp_path, "-e", json.dumps({"vault_dflash_alertmanager_webhook_url": "hooks.internal/T0KEN"}))
    assert bad.returncode != 0 and "expected an http:// or https:// URL with a host" in bad.stdout
    assert "T0KEN" not in bad.stdout + bad.stderr


def status_output(figures: list[dict[str, Any]]) -> str:
    """What `playbooks/status.yml -e status_format=json` prints for ct200 (its report cut to what the feed reads),
    framed by Ansible's output as a team saves it."""
    from dflash_infra import status

    report = {"replicas": [{"index": i, "name": f"sglang-qwen-r{i}.service"} for i in range(2)],
              "load": {"replicas": {"sglang-qwen-r0.service": {"at": "2026-12-06T10:00:00Z", "age_s": 60,
                                                               "figures": figures}}, "gateway": None}}
    framing = "TASK [Print every host's status as one JSON document]\nok: [ct200] =>\n"
    return f"{framing}{status.document({'ct200': report})}\n"


def test_the_last_load_comes_from_what_the_status_view_printed(tmp_path: Path) -> None:
    figures = LOAD["0"]["load"]["figures"]
    assert alerts.status_loads(status_output(figures), "ct200") == {"0": {"figures": figures}}
    assert alerts.status_loads(status_output(figures), "ct129") == {}
    with pytest.raises(ValueError, match=r"dflash_monitoring_status_file: expected the output of playbooks/status.yml"):
        alerts.status_loads("PLAY RECAP", "ct200")
    (tmp_path / "status.out").write_text(status_output(figures))
    run = play(tmp_path, "-e", json.dumps({"dflash_monitoring_status_file": str(tmp_path / "status.out")}))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    written = by_name(yaml.safe_load((tmp_path / "dflash-alerts.yml").read_text()))
    (accept,) = written["dflash-ct200"]["DFlashAcceptanceBelowLastDeploy"]
    assert accept["labels"]["replica"] == "0" and "< 2.1 and on" in accept["expr"], accept
    assert "DFlashAcceptanceBelowLastDeploy" not in written["dflash-ct129"]


# promtool: the rules as Prometheus reads them, fed synthetic series (one minute apart) for each alert.

@pytest.fixture(scope="session")
def promtool() -> Path:
    """Debian's promtool (package prometheus), fetched once into .cache/promtool and unpacked, never installed."""
    return debian_prometheus() / "usr" / "bin" / "promtool"


def rule_file(tmp_path: Path) -> Path:
    """The rules of ct200 (the gateway, its last load gate known) and ct129 (one engine, plan only)."""
    path = tmp_path / "dflash-alerts.yml"
    path.write_text(yaml.safe_dump(alerts.rules(hosts(LOAD), settings()), sort_keys=False))
    return path


GATEWAY = {"job": "dflash-gateway", "dflash_host": "ct200", "instance": "ct200.internal:29000"}
WORKER = "http://127.0.0.1:{}"


def engine(replica: int, host: str = "ct200") -> dict[str, str]:
    """The labels the scrape configuration gives an engine's series (and SGLang's own of its scheduler)."""
    port = 30000 if host == "ct129" else 30001 + replica
    return {"job": "dflash-engine", "dflash_host": host, "instance": f"{host}.internal:{port}",
            "replica": str(replica), "gpus": f"{2 * replica},{2 * replica + 1}", "model_name": "Qwen3.6-27B",
            "engine_type": "unified"}


def scheduler(replica: int, host: str = "ct200") -> dict[str, str]:
    return {**engine(replica, host), "tp_rank": "0", "pp_rank": "0"}


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def description(name: str, labels: dict[str, str]) -> str:
    """The rule's description with its $labels filled in (descriptions print no $value)."""
    rules = [r for g in alerts.rules(hosts(LOAD), settings())["groups"] for r in g["rules"]
             if r["alert"] == name and r["labels"]["dflash_host"] == labels["dflash_host"]
             and r["labels"].get("replica", labels.get("replica")) == labels.get("replica")]
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""),
                  rules[0]["annotations"]["description"])


def fires(name: str, labels: dict[str, str], summary: str) -> dict[str, Any]:
    """One expected alert: every label (the series' and the rule's) and every annotation."""
    return {"exp_labels": labels,
            "exp_annotations": {"summary": f"{summary}; runbook: docs/serving.md#{name.lower()}",
                                "description": description(name, labels),
                                "runbook_url": f"docs/serving.md#{name.lower()}"}}


def case(name: str, at: str, input_series: list[dict[str, str]], expected: list[dict[str, Any]]) -> dict[str, Any]:
    return {"interval": "1m", "input_series": input_series,
            "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": expected}]}


def cases() -> list[tuple[str, dict[str, Any]]]:
    """(what it shows, one promtool test) for every alert: firing with its labels and annotations, and not firing on
    healthy series, on a blip shorter than its `for`, or without the traffic it needs."""
    up_all = [series("up", engine(i), "1x20") for i in range(4)] + [series("up", GATEWAY, "1x20")]
    health = [series("smg_worker_health", {**GATEWAY, "worker": WORKER.format(30001 + i)}, "1x20") for i in range(4)]
    breaker = [series("smg_worker_cb_state", {**GATEWAY, "worker": WORKER.format(30001 + i)}, "0x20")
               for i in range(4)]
    flowing = [series("sglang:generation_tokens_total", engine(i), "0+600x60") for i in range(4)]
    idle = [series("sglang:generation_tokens_total", engine(i), "600x60") for i in range(4)]
    out: list[tuple[str, dict[str, Any]]] = []

    name = "DFlashEndpointDown"
    down = [series("up", GATEWAY, "1 1 0x10"), *up_all[:4]]
    out.append(("gateway silent 3m", case(name, "5m", down, [fires(
        name, {**GATEWAY, "severity": "critical", "replica": "all"},
        "ct200: the gateway in front of all 4 replicas does not answer Prometheus for 1m")])))
    out.append(("gateway silent less than its for", case(name, "2m", down, [])))
    out.append(("every target up", case(name, "10m", up_all, [])))
    single = [series("up", engine(0, "ct129"), "1 0x10")]
    out.append(("ct129's single engine silent", case(name, "5m", single, [fires(
        name, {**engine(0, "ct129"), "severity": "critical"},
        "ct129 replica 0: the endpoint's engine does not answer Prometheus for 1m")])))
    out.append(("ct129's engine up", case(name, "5m", [series("up", engine(0, "ct129"), "1x10")], [])))

    name = "DFlashReplicaDown"
    down = [*up_all[:2], series("up", engine(2), "1 0x20"), *up_all[3:]]
    out.append(("replica 2 silent 10m", case(name, "10m", down, [fires(
        name, {**engine(2), "severity": "warning"},
        "ct200 replica 2: its engine does not answer Prometheus for 5m")])))
    out.append(("replica 2 silent less than its for (a restart)", case(name, "4m", down, [])))
    out.append(("every replica up", case(name, "10m", up_all, [])))

    name = "DFlashReplicaUnhealthyInGateway"
    sick = [*health[:3], series("smg_worker_health", {**GATEWAY, "worker": WORKER.format(30004)}, "1 0x10")]
    out.append(("the gateway marks replica 3 unhealthy", case(name, "5m", sick, [fires(
        name, {**GATEWAY, "worker": WORKER.format(30004), "replica": "3", "severity": "warning"},
        "ct200 replica 3: the gateway marks it unhealthy for 2m")])))
    blip = [*health[:3], series("smg_worker_health", {**GATEWAY, "worker": WORKER.format(30004)}, "1 0 1x10")]
    out.append(("one failed round of health checks", case(name, "5m", blip, [])))
    out.append(("every worker healthy", case(name, "10m", health, [])))

    name = "DFlashCircuitBreakerOpen"
    opened = [breaker[0], series("smg_worker_cb_state", {**GATEWAY, "worker": WORKER.format(30002)},
                                 "0 1 1 2 1 1 1 2 1"), *breaker[2:]]
    out.append(("replica 1's breaker open, its half-open trials failing", case(name, "6m", opened, [fires(
        name, {**GATEWAY, "worker": WORKER.format(30002), "replica": "1", "severity": "warning"},
        "ct200 replica 1: the gateway's circuit breaker is not closed for 2m")])))
    closed_again = [breaker[0], series("smg_worker_cb_state", {**GATEWAY, "worker": WORKER.format(30002)},
                                       "0 1 2 0x10"), *breaker[2:]]
    out.append(("a breaker that closed again on its trial", case(name, "6m", closed_again, [])))
    out.append(("every breaker closed", case(name, "10m", breaker, [])))

    name = "DFlashGatewayErrorRatioHigh"
    answers = {**GATEWAY, "path": "/v1/chat/completions", "error_code": ""}
    probes = series("smg_http_responses_total", {**GATEWAY, "path": "/health", "status_code": "200", "error_code": ""},
                    "0+5000x20")
    failing = [series("smg_http_responses_total", {**answers, "status_code": "200"}, "0+90x20"),
               series("smg_http_responses_total", {**answers, "status_code": "503"}, "0+10x20"), probes]
    out.append(("10% of the API's answers are 503, health probes beside", case(name, "12m", failing, [fires(
        name, {"dflash_host": "ct200", "replica": "all", "severity": "critical"},
        "ct200, all replicas: 10% of the endpoint's answers are 5xx (above 5%) for 5m")])))
    fine = [series("smg_http_responses_total", {**answers, "status_code": "200"}, "0+99x20"),
            series("smg_http_responses_total", {**answers, "status_code": "503"}, "0+1x20"), probes]
    out.append(("1% of the answers are 503", case(name, "12m", fine, [])))

    name = "DFlashRequestsQueueing"
    queued = [series("sglang:num_queue_reqs", scheduler(1), "40x10"),
              series("sglang:num_queue_reqs", scheduler(0), "20x10")]
    out.append(("replica 1 holds 40 waiting requests, more than its 31", case(name, "7m", queued, [fires(
        name, {"dflash_host": "ct200", "replica": "1", "severity": "warning"},
        "ct200 replica 1: 40 requests wait beyond its 31 running ones for 5m")])))
    burst = [series("sglang:num_queue_reqs", scheduler(1), "40 40 40 0x10")]
    out.append(("a burst of 3 minutes", case(name, "7m", burst, [])))

    name = "DFlashAcceptanceBelowFloor"
    collapsed = [series("sglang:spec_accept_length", scheduler(i), "1x60" if i == 3 else "4x60") for i in range(4)]
    out.append(("replica 3 accepts 1.0 while requests flow", case(name, "15m", collapsed + flowing, [fires(
        name, {"dflash_host": "ct200", "replica": "3", "severity": "critical"},
        "ct200 replica 3: acceptance length 1 below the load gate's floor 1.5 for 10m")])))
    out.append(("the same gauge on an idle replica", case(name, "15m", collapsed + idle, [])))
    out.append(("healthy acceptance 4", case(name, "15m", collapsed[:3] + flowing, [])))
    unset = [series("sglang:spec_accept_length", scheduler(i), "0x60") for i in range(4)]
    out.append(("a gauge of 0 (no verify step since the engine started) while requests flow",
                case(name, "15m", unset + flowing, [])))

    name = "DFlashAcceptanceBelowLastDeploy"
    drifted = [series("sglang:spec_accept_length", scheduler(i), "1.8x60") for i in range(2)]
    out.append(("replica 0 accepts 1.8, below half its gate's 4.2 (replica 1: no figure)", case(
        name, "40m", drifted + flowing, [fires(
            name, {"dflash_host": "ct200", "replica": "0", "severity": "warning"},
            "ct200 replica 0: acceptance length 1.8 below 50% of the last deploy's 4.2 for 30m")])))
    out.append(("replica 0 accepts 3.0", case(name, "40m", [series("sglang:spec_accept_length", scheduler(0), "3x60"),
                                                             *flowing], [])))
    out.append(("1.8 while idle", case(name, "40m", drifted + idle, [])))
    out.append(("0 (no verify step yet) while requests flow", case(
        name, "40m", [series("sglang:spec_accept_length", scheduler(i), "0x60") for i in range(2)] + flowing, [])))

    name = "DFlashDecodeThroughputLow"
    slow = [series("sglang:gen_throughput", scheduler(0), "300x30"), series("sglang:num_running_reqs", scheduler(0),
                                                                              "30x30")]
    out.append(("replica 0 decodes 10 tokens/s per request, its gate 40", case(name, "20m", slow, [fires(
        name, {"dflash_host": "ct200", "replica": "0", "severity": "warning"},
        "ct200 replica 0: 10 tokens/s per running request, below 50% of the last deploy's 40 for 15m")])))
    out.append(("30 tokens/s per request", case(name, "20m", [
        series("sglang:gen_throughput", scheduler(0), "900x30"),
        series("sglang:num_running_reqs", scheduler(0), "30x30")], [])))
    out.append(("nothing running", case(name, "20m", [
        series("sglang:gen_throughput", scheduler(0), "0x30"),
        series("sglang:num_running_reqs", scheduler(0), "0x30")], [])))
    return out


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    tested = {}
    for _, test in cases():
        (check,) = test["alert_rule_test"]
        tested.setdefault(check["alertname"], set()).add(bool(check["exp_alerts"]))
    assert tested == {name: {True, False} for name in alerts.ALERTS}


@pytest.mark.promtool
def test_promtool_accepts_the_rules(promtool: Path, tmp_path: Path) -> None:
    path = rule_file(tmp_path)
    check = subprocess.run([str(promtool), "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert check.returncode == 0 and "SUCCESS: 13 rules found" in check.stdout, check.stdout + check.stderr


@pytest.mark.promtool
@pytest.mark.parametrize(("what", "test"), cases(), ids=[f"{t['alert_rule_test'][0]['alertname']}: {what}"
                                                        for what, t in cases()])
def test_promtool_fires_each_alert_on_its_failure_and_not_on_healthy_series(promtool: Path, tmp_path: Path,
                                                                            what: str, test: dict[str, Any]) -> None:
    rules = rule_file(tmp_path)
    tests = tmp_path / "tests.yml"
    tests.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m", "tests": [test]},
                                    sort_keys=False))
    run = subprocess.run([str(promtool), "test", "rules", str(tests)], cwd=tmp_path, capture_output=True,
                         text=True, check=False)
    assert run.returncode == 0 and "SUCCESS" in run.stdout, f"{what}:\n{run.stdout}{run.stderr}"


@pytest.fixture(scope="session")
def amtool() -> Path:
    """Debian's amtool (package prometheus-alertmanager), fetched once into .cache/alertmanager, never installed."""
    return debian_alertmanager() / "usr" / "bin" / "amtool"


@pytest.mark.promtool
def test_amtool_accepts_the_alertmanager_configuration_and_routes_every_alert_to_the_team(amtool: Path,
                                                                                          tmp_path: Path) -> None:
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(alerts.alertmanager_config(WEBHOOK, alertmanager_settings()), sort_keys=False))
    check = subprocess.run([str(amtool), "check-config", str(path)], capture_output=True, text=True, check=False)
    assert check.returncode == 0 and "SUCCESS" in check.stdout and "1 receivers" in check.stdout, \
        check.stdout + check.stderr
    for name in alerts.ALERTS:
        route = subprocess.run([str(amtool), "config", "routes", "test", f"--config.file={path}",
                                "--verify.receivers=dflash-team", f"alertname={name}", "dflash_host=ct200",
                                "replica=0", "severity=warning"], capture_output=True, text=True, check=False)
        assert route.returncode == 0 and route.stdout.strip() == "dflash-team", (name, route.stdout, route.stderr)


def test_a_host_another_gateway_fronts_gets_only_its_engines_rules_and_no_gateway_target() -> None:
    """ct201's replicas behind ct200's gateway: no gateway runs on ct201, so neither a gateway target nor an endpoint
    rule there (it would fire forever and hold back ct201's other alerts); whether each engine answers stays."""
    from dflash_infra import monitoring

    remote = planned(gateway={"remote": True, "worker_host": "0.0.0.0", "worker_address": "ct201.internal"})
    assert remote["gateway"]["settings"]["remote"] is True and remote["replicas"]
    group = by_name(alerts.rules([{"host": "ct201", "address": "ct201.internal", "plan": remote}], settings()))
    names = set(group["dflash-ct201"])
    assert "DFlashReplicaDown" in names and not names & {"DFlashEndpointDown", "DFlashReplicaUnhealthyInGateway",
                                                          "DFlashCircuitBreakerOpen", "DFlashGatewayErrorRatioHigh"}
    assert monitoring.gateway_targets("ct201", "ct201.internal", remote) == []
    assert monitoring.gateway_targets("ct200", "ct200.internal", planned(gateway={}))


def test_a_single_process_queues_against_every_dp_ranks_capacity() -> None:
    """One --dp-size process runs a scheduler per DP rank, each with max_running_requests; the rule sums their
    queues, so its threshold is the ranks' capacity together (31 x 4 on pro6000)."""
    single = planned()
    assert single["dp_size"] == 4 and single["max_running_requests"] == 31
    (rule,) = by_name(alerts.rules([{"host": "ct200", "address": "ct200.internal", "plan": single}],
                                   settings()))["dflash-ct200"]["DFlashRequestsQueueing"]
    assert rule["expr"].endswith("> 124"), rule["expr"]
