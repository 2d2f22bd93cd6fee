"""Serving through the real SGLang Model Gateway in the lab: deploy_dflash.yml on ct200, whose group pro6000 serves
through the gateway (dflash_serve_through_gateway): four engine stand-ins of tp 2, one per GPU pair, behind smg
1.13.0 from its lab lock, under load from a real load client (Locust, headless, tools/locustfile.py and
tools/load.py; bounded by users and a SIGTERM when the play ends, loopback only).

Order is the operator's: the single-process deploy migrated by the first gateway deploy, the no-op re-run and a
dry run of a changed plan, the benchmark, Debian's Prometheus scraping the gateway and the replicas, a losing canary
(checked, then kept out), a winning one promoted under load (the rolling redeploy of a changed plan: every replica
drained, restarted and put back one at a time, no request failed), a replica failing its gates mid-rollout under
load, one crashing under its load gate, one replica SIGKILLed under load, a changed gateway setting with the promoted
candidate's settings kept (its restart is the one outage), a candidate whose acceptance collapses under load failing
on the canary. The user's way back to training (stop_serving.yml, resume) and the keys are
tests/lab/test_deploy.py's, on the same topology.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import ROOT, ansible_environment, debian_prometheus, tool

sys.path.insert(0, str(ROOT / "tools"))
from load import Load

if TYPE_CHECKING:
    from tests.lab.conftest import LabHandle

pytestmark = pytest.mark.lab

REPLICAS = [f"sglang-qwen-r{i}.service" for i in range(4)]
# The deploy as it was before the group served through the gateway: one --dp-size engine process on the endpoint.
SINGLE = {"dflash_serve_through_gateway": False}


def play(name: str, *args: str, extra: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [tool("ansible-playbook"), "-i", "inventory/lab", "-l", "ct200", name, *args]
    if extra is not None:
        argv += ["-e", json.dumps(extra)]
    return subprocess.run(argv, cwd=ROOT, env=ansible_environment(), capture_output=True, text=True)


def recap(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    match = re.search(r"^ct200\s+:\s+(.*)$", result.stdout, re.MULTILINE)
    assert match, f"no PLAY RECAP line for ct200:\n{result.stdout[-3000:]}"
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(1))}


FIRST: dict[str, subprocess.CompletedProcess[str]] = {}


def failures(out: str) -> str:
    """The failed tasks' messages of a play's output (whitespace folded), for an assertion's message: the output's
    tail is the journal of the failed attempt, not what failed."""
    return " | ".join(re.findall(r"(?:fatal|failed): \[[^\]]+\].{0,1500}", out)) or out[-5000:]


@pytest.fixture(scope="module")
def routed(lab: LabHandle) -> LabHandle:
    """ct200 as the deploy left it before its group served through the gateway (one --dp-size engine process on the
    endpoint), then the first gateway deploy."""
    lab.cli_ok("reset", "ct200")
    single = play("deploy_dflash.yml", extra=SINGLE)
    assert single.returncode == 0, single.stdout[-5000:]
    assert lab.ssh("ct200", "systemctl", "is-active", "sglang-qwen.service").stdout.strip() == "active"
    FIRST["deploy"] = play("deploy_dflash.yml")
    return lab


def unit_state(lab: LabHandle, unit: str) -> tuple[str, str]:
    out = lab.ssh("ct200", "systemctl", "show", unit, "--property=ActiveState,UnitFileState").stdout
    props = dict(line.split("=", 1) for line in out.split())
    return props["ActiveState"], props["UnitFileState"]


def test_the_first_gateway_deploy_migrates_the_single_process_unit_and_serves_every_replica(routed: LabHandle) -> None:
    result = FIRST["deploy"]
    out = " ".join(result.stdout.split())  # the callback folds long messages
    assert result.returncode == 0, result.stdout[-5000:]
    ct200 = routed.addresses["ct200"]
    assert "sglang-qwen.service: back up, stop and disable (the single-process unit; replicas replace it)" in out
    assert "outage: sglang-qwen.service serves every GPU and must stop before the first replica starts" in out
    assert f"serving: http://{ct200}:30000/v1 (Qwen3.6-27B) through smg-gateway.service, 4 replica(s)" in out
    for i in range(4):
        assert (f"replica {i}: sglang-qwen-r{i}.service on GPUs {2 * i},{2 * i + 1} at http://{ct200}:{30001 + i}, "
                "started; gates ready (generated 16 tokens)") in out, out[-3000:]
        assert unit_state(routed, REPLICAS[i]) == ("active", "enabled")
        env = routed.ssh("ct200", "systemctl", "show", REPLICAS[i], "--property=Environment").stdout
        assert f"CUDA_VISIBLE_DEVICES={2 * i},{2 * i + 1}" in env
    assert "smg-gateway.service: /health 200; 4 worker(s) ready" in out
    assert re.search(r"outage: the endpoint http://\S+ was down [0-9.]+ s while smg-gateway.service started", out)
    assert unit_state(routed, "sglang-qwen.service") == ("inactive", "disabled")
    backup = routed.ssh("ct200", "ls /var/lib/dflash-infra/units/*-migrated/").stdout.split()
    assert {"sglang-qwen.service", "sglang-qwen.env"} <= set(backup), backup
    # Each replica listens only on the address the gateway reaches it at; the endpoint is the gateway's.
    listeners = routed.ssh("ct200", "ss", "-Hltnp").stdout
    for i in range(4):
        assert f"{ct200}:{30001 + i} " in listeners
    assert re.search(rf"{re.escape(ct200)}:30000 .*smg", listeners), listeners
    record = json.loads(routed.ssh("ct200", "cat", "/var/lib/dflash-infra/sglang-qwen-r2/deployment.json").stdout)
    assert record["gates"]["state"] == "ready" and record["plan"]["gpu_ids"] == [4, 5]
    # The load gate ran on each replica at the plan's concurrency (32), and its figures are in the record and the
    # summary; a first deployment has nothing to compare with.
    (figures,) = record["load"]["figures"]
    assert (figures["concurrency"], figures["requests"], figures["failed"]) == (32, 32, 0), figures
    assert figures["accept_length_mean"] >= 1.5 and figures["output_tokens"] == 32 * 64, figures
    assert record["load"]["inputs"]["prompts"] == ["code", "math", "chat"]
    # Each replica's own load gate, and the endpoint's through the gateway after them.
    assert out.count("first deployment with load figures: recorded, nothing to compare with") == 5, out[-3000:]
    # Every second request streamed: time to first token and inter-token latency beside the acceptance.
    assert re.search(r"load at concurrency 32: 32 requests, 0 failed, [0-9.]+ output tok/s, [0-9.]+ req/s, "
                     r"acceptance length [0-9.]+ \(verify count \d+\), TTFT p50/p99 [0-9.]+/[0-9.]+ ms, "
                     r"ITL p50/p99 [0-9.]+/[0-9.]+ ms", out), out[-3000:]
    # A median gap between streamed chunks may round to 0.0 ms on a busy machine (chunks read back to back).
    assert figures["ttft_ms_p50"] > 0 and 0 <= figures["itl_ms_p50"] <= figures["itl_ms_p99"], figures
    assert figures["itl_ms_p99"] > 0, figures
    # The gateway from its lab lock, hashes required; its record names that lock.
    lock = ROOT / "locks" / "smg-1.13.0-py3.11-x86_64-manylinux_2_34.txt"
    gateway = json.loads(routed.ssh("ct200", "cat", "/var/lib/dflash-infra/smg-gateway.json").stdout)
    assert gateway["lock"]["sha256"] == hashlib.sha256(lock.read_bytes()).hexdigest()
    assert (gateway["smg"], gateway["lock"]["file"], len(gateway["workers"])) == ("1.13.0", lock.name, 4)
    assert f"gateway: smg 1.13.0 at /opt/smg/venv, locked by {lock.name} (7 packages, sha256 " \
           f"{gateway['lock']['sha256'][:16]})" in out


def test_a_second_run_changes_nothing_and_check_lists_the_replicas_a_changed_plan_would_restart(
        routed: LabHandle) -> None:
    again = play("deploy_dflash.yml")
    assert again.returncode == 0 and recap(again)["changed"] == 0, again.stdout[-3000:]
    before = routed.changeable_state()
    dry = play("deploy_dflash.yml", "--check", "--diff",
               extra={"dflash_plan_overrides": {"max_running_requests": 24}})
    assert dry.returncode == 0, dry.stdout[-5000:]
    for unit in REPLICAS:  # each replica's unit would change: its diff is shown, and its drain is skipped
        assert re.search(rf"TASK \[sglang_service : Write the unit, validated with systemd-analyze verify, "
                         rf"{re.escape(unit)}\][^\n]*\n(?:(?!TASK).*\n)*?\+\s+--max-running-requests 24", dry.stdout), \
            dry.stdout[-5000:]
    assert "check mode: nothing was changed" in dry.stdout
    # ... and the summary lists, one line each, what the run would do to every replica.
    assert " ".join(dry.stdout.split()).count("would be drained, restarted and added back (check mode)") == 4, \
        dry.stdout[-3000:]
    assert routed.changeable_state() == before


def test_the_benchmark_measures_the_endpoint_through_the_gateway_and_changes_nothing(routed: LabHandle) -> None:
    before = routed.changeable_state()
    result = play("playbooks/benchmark.yml")
    out = " ".join(result.stdout.split())
    assert result.returncode == 0, out[-5000:]
    # Concurrency 1, 4 and the endpoint's maximum: four replicas of max_running_requests 32.
    # Through smg: the streamed requests' chunks (their first token, their sglext acceptance) pass the gateway.
    for c in (1, 4, 128):
        assert re.search(rf"ct200: load at concurrency {c}: 32 requests, 0 failed, [0-9.]+ output tok/s, [0-9.]+ "
                         r"req/s, acceptance length [0-9.]+ \(verify count \d+\), TTFT p50/p99 [0-9.]+/[0-9.]+ ms, "
                         r"ITL p50/p99 [0-9.]+/[0-9.]+ ms", out), out[-3000:]
    assert recap(result)["changed"] == 0 and routed.changeable_state() == before


def prometheus_query(base: str, query: str) -> list[dict[str, Any]]:
    """The vector a PromQL query returns from Prometheus's HTTP API (GET /api/v1/query)."""
    with urllib.request.urlopen(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': query})}", timeout=5) as r:
        answer = json.load(r)
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def gauge(exposition: str, name: str) -> float:
    """A gauge's one sample in a Prometheus text exposition."""
    (value,) = [line.rsplit(" ", 1)[1] for line in exposition.splitlines() if line.startswith(name + "{")]
    return float(value)


def test_prometheus_scrapes_the_gateway_and_every_replica_and_reads_their_acceptance_length(
        routed: LabHandle, tmp_path: Path) -> None:
    """Debian's prometheus (the package's own binary, unpacked, on 127.0.0.1) with the scrape configuration
    playbooks/monitoring.yml writes for the lab inventory: the gateway and the four replicas are up, and each
    replica's acceptance length read back through the query API is the one its /metrics shows (the benchmark above
    left one on every replica; nothing runs on the endpoint meanwhile)."""
    config = tmp_path / "dflash.yml"
    settings = yaml.safe_load((ROOT / "group_vars" / "all" / "monitoring.yml").read_text())["dflash_monitoring"]
    made = play("playbooks/monitoring.yml", extra={"dflash_monitoring": {  # -e replaces the whole mapping
        **settings, "address": "{{ ansible_host }}", "scrape_interval": "1s", "scrape_config": str(config),
        "rules_file": str(tmp_path / "dflash-alerts.yml")}})
    assert made.returncode == 0, made.stdout[-3000:]
    address = routed.addresses["ct200"]
    scrape = yaml.safe_load(config.read_text())
    engine_targets = sorted(t for job in scrape["scrape_configs"] if job["job_name"] == "dflash-engine"
                            for group in job["static_configs"] for t in group["targets"])
    assert engine_targets == [f"{address}:{30001 + i}" for i in range(4)], scrape
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [str(debian_prometheus() / "usr" / "bin" / "prometheus"), f"--config.file={config}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=(tmp_path / "prometheus.log").open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        series: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            try:
                up = prometheus_query(base, "up == 1")
                series = prometheus_query(base, "sglang:spec_accept_length")
            except OSError:
                up, series = [], []
            if len(up) == 5 and len(series) == 4:
                break
            time.sleep(0.5)
        assert sorted((s["metric"]["job"], s["metric"]["instance"]) for s in up) == sorted(
            [("dflash-gateway", f"{address}:29000")] + [("dflash-engine", t) for t in engine_targets]), \
            (tmp_path / "prometheus.log").read_text()[-2000:]
        by_replica = {s["metric"]["replica"]: float(s["value"][1]) for s in series}
        assert sorted(by_replica) == ["0", "1", "2", "3"]
        assert all(s["metric"]["dflash_host"] == "ct200" for s in series)
        for replica, value in by_replica.items():
            with urllib.request.urlopen(f"http://{address}:{30001 + int(replica)}/metrics", timeout=5) as r:
                direct = gauge(r.read().decode(), "sglang:spec_accept_length")
            assert value == pytest.approx(direct) and value > 1.0, (replica, value, direct)
        assert prometheus_query(base, 'sum(smg_cache_aware_policy_branch_total{job="dflash-gateway"})')
    finally:
        server.terminate()
        server.wait(timeout=30)


# The canary (playbooks/canary.yml): candidates of the stand-in's step time, twice as slow and twice as fast as the
# inventory's 20 ms (inventory/lab/group_vars/proxmox_containers.yml); the canary is r3, the baseline r0.
# The losing one also tries an engine flag the planner has no setting for (overrides.engine_flags): the canary
# replica starts with it, and goes back without it.
LOSING = {"environment": {"SGLANG_STANDIN_STEP_MS": "40"},
          "plan_overrides": {"engine_flags": {"--mamba-radix-cache-strategy": "extra_buffer"}}}
# Promoted under load: the four replicas drained, restarted on the candidate's plan and put back one at a time.
WINNING = {"plan_overrides": {"max_running_requests": 24}, "environment": {"SGLANG_STANDIN_STEP_MS": "10"}}
# What the winning canary said to put in group_vars; the later deploys run with it (they then change no replica).
KEPT: dict[str, Any] = {}


def canary_record(lab: LabHandle) -> dict[str, Any]:
    return json.loads(lab.ssh("ct200", "cat", "/var/lib/dflash-infra/canary.json").stdout)


def test_a_losing_candidate_is_checked_then_kept_out_and_its_replica_returns_to_the_baseline(routed: LabHandle) -> None:
    before = {u: routed.ssh("ct200", "systemctl", "cat", u).stdout for u in REPLICAS}
    state = routed.changeable_state()
    check = play("playbooks/canary.yml", "--check", extra={"candidate": LOSING})
    out = " ".join(check.stdout.split())
    assert check.returncode == 0, out[-3000:]
    assert ("ct200: canary sglang-qwen-r3.service (GPUs 6,7) would take the candidate, measured against "
            "sglang-qwen-r0.service in 2 rounds; promoted when it wins by +5.0% at every concurrency:' - "
            "'--mamba-radix-cache-strategy: (absent) -> extra_buffer' - SGLANG_STANDIN_STEP_MS=20 -> 40") in out, \
        out[-3000:]
    assert recap(check)["changed"] == 0 and routed.changeable_state() == state

    result = play("playbooks/canary.yml", extra={"candidate": LOSING})
    out = " ".join(result.stdout.split())
    assert result.returncode == 0, out[-5000:]
    lost = re.search(r"ct200: canary: concurrency 32: candidate ([0-9.]+) tok/s vs baseline ([0-9.]+) tok/s "
                     r"\((-[0-9.]+)%, needs \+5.0%\); acceptance [0-9.]+ vs [0-9.]+; failed 0 vs 0 of 64", out)
    assert lost, out[-3000:]
    assert f"keep out: concurrency 32: {lost.group(3)}% tok/s is not the +5.0% the candidate must win by" in out
    print(f"\nlosing canary: {lost.group(1)} tok/s vs baseline {lost.group(2)} ({lost.group(3)}%)")
    assert {u: routed.ssh("ct200", "systemctl", "cat", u).stdout for u in REPLICAS} == before
    assert all(unit_state(routed, u)[0] == "active" for u in REPLICAS)
    record = canary_record(routed)
    assert (record["promote"], record["outcome"], record["canary"]) == (
        False, "the canary replica back on the baseline", "sglang-qwen-r3.service")
    assert record["changes"] == ["--mamba-radix-cache-strategy: (absent) -> extra_buffer",
                                 "SGLANG_STANDIN_STEP_MS=20 -> 40"]
    assert [f["rounds"] for f in record["figures"]["candidate"]] == [2]


def test_a_winning_candidate_is_promoted_to_every_replica_under_load_failing_no_request(
        routed: LabHandle, tmp_path: Path) -> None:
    load = Load(f"http://{routed.addresses['ct200']}:30000", tmp_path / "load")
    result = play("playbooks/canary.yml", extra={"candidate": WINNING})
    figures = load.stop()
    out = " ".join(result.stdout.split())
    assert result.returncode == 0, out[-5000:]
    assert "ct200: canary: promote: the candidate wins at every concurrency" in out, out[-3000:]
    for unit in (routed.ssh("ct200", "systemctl", "cat", u).stdout for u in REPLICAS):
        assert re.search(r"--max-running-requests\s+24", unit), unit
        assert 'Environment="SGLANG_STANDIN_STEP_MS=10"' in unit, unit
    # Each replica's turn passed its load gate at the candidate's concurrency; the gateway kept running.
    assert out.count("load gate: concurrency 24: 32 requests, 0 failed") == 4, out[-3000:]
    assert "smg-gateway.service" not in re.findall(r"changed: \[ct200\].*", result.stdout)
    print(f"\npromotion under load: {figures['requests']} requests, {figures['failed']} failed")
    assert figures["requests"] > 100 and figures["failed"] == 0, figures
    assert canary_record(routed)["outcome"] == "promoted to every replica"
    keep = ("Keep it: put these lines in the group_vars of pro6000 (until then the next deploy_dflash.yml rolls the "
            "replicas back to the settings of the inventory):'")
    assert keep in out and "max_running_requests: 24" in out.split(keep)[1], out[-3000:]
    lines = canary_record(routed)["keep"]
    KEPT.update(yaml.safe_load("\n".join(lines)))
    assert KEPT == {"dflash_plan_overrides": {"max_running_requests": 24},
                    "sglang_service_extra_environment": {"SGLANG_STANDIN_STEP_MS": "10"}}, lines


def test_a_replica_failing_its_gates_mid_rollout_is_rolled_back_alone_and_the_endpoint_stays_up(
        routed: LabHandle, tmp_path: Path) -> None:
    before = {u: routed.ssh("ct200", "systemctl", "cat", u).stdout for u in REPLICAS}
    load = Load(f"http://{routed.addresses['ct200']}:30000", tmp_path / "load")
    crash = {"SGLANG_STANDIN_CRASH_AT_START": "1"}
    result = play("deploy_dflash.yml", extra={"dflash_plan_overrides": {"max_running_requests": 24},
                                              "sglang_service_extra_environment": crash})
    figures = load.stop()
    out = result.stdout
    assert result.returncode != 0, out[-3000:]
    assert "replica 0 (sglang-qwen-r0.service, GPUs 0,1) failed its turn of the rollout" in out, out[-5000:]
    assert "Back in the gateway on its old unit" in out, out[-5000:]
    after = {u: routed.ssh("ct200", "systemctl", "cat", u).stdout for u in REPLICAS}
    assert after == before  # r0 back on its last good unit, the others never touched
    assert all(unit_state(routed, u)[0] == "active" for u in REPLICAS)
    assert figures["requests"] > 50 and figures["failed"] == 0, figures
    workers = json.loads(routed.ssh("ct200", "python3", "/usr/local/lib/dflash-infra/smg-ctl", "--url",
                                    f"http://{routed.addresses['ct200']}:30000", "--credentials",
                                    "/etc/dflash-infra/smg-gateway", "workers").stdout)["workers"]
    assert sorted(w["url"] for w in workers) == [f"http://{routed.addresses['ct200']}:{30001 + i}" for i in range(4)]


def test_a_replica_crashing_under_the_load_gate_is_rolled_back_alone_and_the_endpoint_stays_up(
        routed: LabHandle, tmp_path: Path) -> None:
    """Its readiness gates pass (one request at a time); at the plan's concurrency it dies of an illegal memory
    access (the stand-in's SGLANG_STANDIN_CRASH_UNDER_LOAD), systemd restarts it, and the load gate fails it."""
    before = {u: routed.ssh("ct200", "systemctl", "cat", u).stdout for u in REPLICAS}
    record = routed.ssh("ct200", "cat", "/var/lib/dflash-infra/sglang-qwen-r0/deployment.json").stdout
    load = Load(f"http://{routed.addresses['ct200']}:30000", tmp_path / "load")
    crash = {"SGLANG_STANDIN_CRASH_UNDER_LOAD": "8"}
    result = play("deploy_dflash.yml", extra={"dflash_plan_overrides": {"max_running_requests": 24},
                                              "sglang_service_extra_environment": crash})
    figures = load.stop()
    out = " ".join(result.stdout.split())
    assert result.returncode != 0, out[-3000:]
    assert "sglang-qwen-r0.service failed the load gate: sglang-qwen-r0.service restarted during the load run" in out, \
        failures(out)
    assert re.search(r"concurrency 24: \d+ of 32 requests failed", out), out[-5000:]
    assert "CUDA error: an illegal memory access was encountered" in out  # the journal of the failed attempt
    assert "replica 0 (sglang-qwen-r0.service, GPUs 0,1) failed its turn of the rollout" in out
    assert "Back in the gateway on its old unit" in out, out[-5000:]
    assert {u: routed.ssh("ct200", "systemctl", "cat", u).stdout for u in REPLICAS} == before
    assert routed.ssh("ct200", "cat", "/var/lib/dflash-infra/sglang-qwen-r0/deployment.json").stdout == record
    assert figures["requests"] > 50 and figures["failed"] == 0, figures


def test_a_replica_slower_than_its_previous_deployment_fails_the_load_gate_and_is_rolled_back_alone(
        routed: LabHandle, tmp_path: Path) -> None:
    """A throughput regression (the stand-in's SGLANG_STANDIN_SLOWDOWN: every decode step 40x slower, far below the
    floor whatever the requests' own overhead on a busy CPU; at 8x a replica's ratio came near the floor, and the
    first replica to fail was not always the first turned) passes the readiness gates; the load gate compares the
    replica's output tok/s with its previous deployment's at the same concurrency and prompts (the promoted
    canary's, concurrency 24), finds it below the lab's floor (a fifth), and the replica goes back to its last good
    unit, back into the gateway; no request through the gateway fails."""
    before = {u: routed.ssh("ct200", "systemctl", "cat", u).stdout for u in REPLICAS}
    record = routed.ssh("ct200", "cat", "/var/lib/dflash-infra/sglang-qwen-r0/deployment.json").stdout
    load = Load(f"http://{routed.addresses['ct200']}:30000", tmp_path / "load")
    slower = {**KEPT["sglang_service_extra_environment"], "SGLANG_STANDIN_SLOWDOWN": "40"}
    result = play("deploy_dflash.yml", extra={**KEPT, "sglang_service_extra_environment": slower})
    figures = load.stop()
    out = " ".join(result.stdout.split())
    assert result.returncode != 0, out[-3000:]
    assert re.search(r"sglang-qwen-r0\.service failed the load gate: .*concurrency 24: [0-9.]+ tok/s is \d+% below "
                     r"the previous deployment's [0-9.]+ \(at most 80% allowed\)", out), out[-5000:]
    assert "replica 0 (sglang-qwen-r0.service, GPUs 0,1) failed its turn of the rollout" in out
    assert "Back in the gateway on its old unit" in out, out[-5000:]
    assert {u: routed.ssh("ct200", "systemctl", "cat", u).stdout for u in REPLICAS} == before
    assert routed.ssh("ct200", "cat", "/var/lib/dflash-infra/sglang-qwen-r0/deployment.json").stdout == record
    assert figures["requests"] > 50 and figures["failed"] == 0, figures
    # The failed run gave its deploy lock back (the `always` of the play's changes): the next run takes it at once.
    assert routed.ssh("ct200", "test", "!", "-e", "/run/dflash-infra/deploy.lock").returncode == 0


def test_a_replica_killed_under_load_is_routed_around_and_rejoins(routed: LabHandle, tmp_path: Path) -> None:
    unit = REPLICAS[1]
    pid = routed.ssh("ct200", "systemctl", "show", unit, "--property=MainPID", "--value").stdout.strip()
    load = Load(f"http://{routed.addresses['ct200']}:30000", tmp_path / "load")
    load.wait_requests(20)  # flowing through every replica
    assert routed.ssh("ct200", "kill", "-KILL", pid).returncode == 0
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        now = routed.ssh("ct200", "systemctl", "show", unit, "--property=MainPID,ActiveState,NRestarts").stdout
        props = dict(line.split("=", 1) for line in now.split())
        if props["ActiveState"] == "active" and props["MainPID"] not in ("0", pid) and int(props["NRestarts"]) >= 1:
            ready = routed.ssh("ct200", "python3", "/usr/local/lib/dflash-infra/smg-ctl", "--url",
                               f"http://{routed.addresses['ct200']}:30000", "--credentials",
                               "/etc/dflash-infra/smg-gateway", "ready", "--workers",
                               *[f"http://{routed.addresses['ct200']}:{30001 + i}" for i in range(4)])
            if ready.returncode == 0:
                break
        time.sleep(1)
    else:
        pytest.fail(f"{unit} did not come back behind the gateway: {now}")
    load.wait_requests(20)  # requests through the rejoined replica too
    figures = load.stop()
    print(f"\nreplica SIGKILLed under load: {figures['requests']} requests, {figures['failed']} failed")
    assert figures["requests"] > 50 and figures["failed"] == 0, figures


def gateway_workers(lab: LabHandle) -> list[str]:
    """The URLs ct200's gateway routes to, from its control plane on the host."""
    out = lab.ssh("ct200", "python3", "/usr/local/lib/dflash-infra/smg-ctl", "--url",
                  f"http://{lab.addresses['ct200']}:30000", "--credentials", "/etc/dflash-infra/smg-gateway",
                  "workers").stdout
    return sorted(w["url"] for w in json.loads(out)["workers"])


def killed_after_the_first_drain(extra: dict[str, Any]) -> str:
    """A deploy SIGKILLed (with its ssh connections) as soon as it says it drained a replica, before that replica's
    unit is written: what a run that died mid-rollout leaves. Returns what it printed."""
    argv = [tool("ansible-playbook"), "-i", "inventory/lab", "-l", "ct200", "deploy_dflash.yml", "-e",
            json.dumps(extra)]
    proc = subprocess.Popen(argv, cwd=ROOT, env={**ansible_environment(), "PYTHONUNBUFFERED": "1"}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    seen: list[str] = []
    draining = False
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if draining and line.startswith("changed: [ct200"):
            os.killpg(proc.pid, signal.SIGKILL)
            break
        if line.startswith("TASK ["):
            draining = line.startswith("TASK [Take the replica out of the gateway")
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(seen)[-3000:]
    return "".join(seen)


def test_a_replica_left_drained_by_a_deploy_killed_mid_rollout_is_put_back_by_the_next_run(
        routed: LabHandle, tmp_path: Path) -> None:
    """The deploy SIGKILLed right after it drained replica 0 (before its restart) leaves the endpoint on three
    replicas; the team reverts the change and runs again: replica 0's unit matches the inventory, so no turn would
    touch it, and the run's reconciling puts it back into the gateway (--check lists it first). A load client streams
    through the gateway throughout: no request fails. A third run changes nothing."""
    ct200 = routed.addresses["ct200"]
    urls = [f"http://{ct200}:{30001 + i}" for i in range(4)]
    load = Load(f"http://{ct200}:30000", tmp_path / "load")
    killed = killed_after_the_first_drain({**KEPT, "dflash_plan_overrides": {"max_running_requests": 16}})
    assert "sglang-qwen-r0.service" in killed, killed[-3000:]
    assert gateway_workers(routed) == urls[1:]  # replica 0 serves, out of the gateway, and nothing says so
    assert unit_state(routed, REPLICAS[0])[0] == "active"
    before = routed.changeable_state()
    dry = play("deploy_dflash.yml", "--check", extra=KEPT)
    left_out = (f"ct200: gateway: sglang-qwen-r0.service ({urls[0]}) is a worker of the plan the gateway does not "
                "route to:")
    assert dry.returncode == 0 and f"{left_out} would be added back once ready (check mode)" in " ".join(
        dry.stdout.split()), dry.stdout[-5000:]
    assert routed.changeable_state() == before and gateway_workers(routed) == urls[1:]
    healed = play("deploy_dflash.yml", extra=KEPT)
    out = " ".join(healed.stdout.split())
    assert healed.returncode == 0, failures(healed.stdout)
    assert f"{left_out} added back once ready" in out and recap(healed)["changed"] >= 1, out[-3000:]
    assert re.search(r"changed: \[ct200\] => \(item=sglang-qwen-r0\.service\)", healed.stdout), healed.stdout[-3000:]
    assert gateway_workers(routed) == urls
    load.wait_requests(20)  # through the replica put back too
    figures = load.stop()
    print(f"\nkilled mid-rollout, healed by the next run: {figures['requests']} requests, {figures['failed']} failed")
    assert figures["requests"] > 50 and figures["failed"] == 0, figures
    again = play("deploy_dflash.yml", extra=KEPT)
    assert again.returncode == 0 and recap(again)["changed"] == 0, again.stdout[-3000:]
    assert "the gateway does not route to" not in again.stdout


GATEWAY_LOAD = "/var/lib/dflash-infra/smg-gateway.load.json"


def faster_gateway_record(recorded: str) -> dict[str, Any]:
    """The figures through the gateway as a deploy a hundred times faster at the endpoint's capacity would have left
    them, from the last record's inputs and figures: the next gate through the gateway fails against them. A hundred,
    not ten: the lab allows an 80 % drop (dflash_load_gate_max_regression 0.8), and the record may come from a run on
    a busier machine, or from a lower concurrency than the endpoint's capacity (its first row)."""
    first = json.loads(recorded)["load"]
    row = first["figures"][0]
    return {"recorded_at": "2026-12-01T00:00:00Z", "load": {**first, "figures": [
        {**row, "concurrency": 96, "output_tokens_per_s": row["output_tokens_per_s"] * 100}]}}


def changed_gateway_settings(address: str) -> dict[str, Any]:
    """The gateway settings the changed-setting test deploys, and the tests after it keep."""
    return {"worker_host": address, "prometheus_host": address, "retry_max_retries": 5}


def test_a_changed_gateway_setting_restarts_only_the_gateway_and_the_outage_is_measured(
        routed: LabHandle, tmp_path: Path) -> None:
    """A new gateway unit that fails the load gate through the gateway (the previous deploy's figures through it
    written a hundred times faster) goes back to the unit the gateway ran before, restarted and gated (an outage,
    measured), its record as it was; no replica is touched. A good change restarts only the gateway, under load, and
    the play measures the outage."""
    ct200 = routed.addresses["ct200"]
    settings = changed_gateway_settings(ct200)
    plan = dict(KEPT)  # the promoted canary's settings, as the team keeps them in group_vars
    gateway = routed.ssh("ct200", "systemctl", "cat", "smg-gateway.service").stdout
    record = routed.ssh("ct200", "cat", "/var/lib/dflash-infra/smg-gateway.json").stdout
    recorded = routed.ssh("ct200", "cat", GATEWAY_LOAD).stdout
    faster = faster_gateway_record(recorded)
    (tmp_path / "faster.json").write_text(json.dumps(faster))
    (tmp_path / "recorded.json").write_text(recorded)
    routed.put("ct200", tmp_path / "faster.json", GATEWAY_LOAD)
    try:
        slower = play("deploy_dflash.yml", extra={**plan, "dflash_gateway_settings": settings})
    finally:
        routed.put("ct200", tmp_path / "recorded.json", GATEWAY_LOAD)
    out = " ".join(slower.stdout.split())
    assert slower.returncode != 0, out[-3000:]
    # The replicas as the earlier tests leave them: the promoted candidate's (the failed rollouts were rolled back;
    # the replica rolled back is gated and recorded again): no restart; the failed runs before gave their lock back.
    assert "restarted and added back" not in out and "took over the deploy lock" not in out, out[-3000:]
    assert "ct200: the endpoint failed the load gate through smg-gateway.service (figures: " in out, out[-5000:]
    assert re.search(r"No replica of ct200 was rolled back\. smg-gateway\.service went back to the unit it ran before "
                     r"this run \(down [0-9.]+ s while it restarted\); (the API key of this run stays in force|"
                     r"this run sets no API key) \(the key file is not part of a restore\)\. Run the deploy again",
                     out), out[-3000:]
    assert routed.ssh("ct200", "systemctl", "cat", "smg-gateway.service").stdout == gateway
    assert routed.ssh("ct200", "cat", "/var/lib/dflash-infra/smg-gateway.json").stdout == record
    assert unit_state(routed, "smg-gateway.service")[0] == "active"

    load = Load(f"http://{ct200}:30000", tmp_path / "load")
    result = play("deploy_dflash.yml", extra={**plan, "dflash_gateway_settings": settings})
    figures = load.stop()
    out = " ".join(result.stdout.split())  # the callback folds long messages
    assert result.returncode == 0, result.stdout[-5000:]
    outage = re.search(rf"outage: the endpoint http://{re.escape(ct200)}:30000 was down ([0-9.]+) s while "
                       r"smg-gateway.service restarted", out)
    assert outage, out[-3000:]
    assert out.count("unchanged; gates ready") == 4, out[-3000:]
    assert "--retry-max-retries 5" in routed.ssh("ct200", "systemctl", "cat", "smg-gateway.service").stdout.replace(
        " \\\n    ", " ")
    print(f"\ngateway restart: play says {outage.group(1)} s down; load client {figures['requests']} requests, "
          f"{figures['failed']} failed")
    assert figures["requests"] > 50


def lab_ca(folder: Path, name: str) -> tuple[Path, Path]:
    """A CA made on the fly with Debian's openssl: its certificate and key."""
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "30", "-subj", f"/CN={name}"],
                   check=True, capture_output=True)
    return cert, key


def endpoint_certificate(folder: Path, ca: tuple[Path, Path], address: str, days: int,
                         name: str = "ct200") -> tuple[str, str]:
    """A host's certificate (its address as an IP SAN, valid `days`) signed by `ca`, and its key (PEM)."""
    key, csr, cert = folder / f"{name}.key", folder / f"{name}.csr", folder / f"{name}.pem"
    subprocess.run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}"], check=True, capture_output=True)
    (folder / "san.cnf").write_text(f"subjectAltName=IP:{address}\n")
    subprocess.run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
                    "-CAcreateserial", "-out", str(cert), "-days", str(days), "-extfile", str(folder / "san.cnf")],
                   check=True, capture_output=True)
    return cert.read_text(), key.read_text()


def test_the_endpoint_serves_tls_that_real_clients_verify_and_a_wrong_ca_is_refused(
        routed: LabHandle, tmp_path: Path) -> None:
    """dflash_endpoint_tls with a CA made on the fly: the real smg serves HTTPS with the endpoint's certificate (its
    key a credential of the unit, never in a file anyone else reads); curl --cacert and OpenAI's Python client verify
    it and get the model list and a completion; a client trusting another CA is refused, and plain HTTP gets no answer.
    Only the gateway restarts; a certificate valid 20 days is warned about (30 days ahead); a second run changes
    nothing; turning TLS off serves plain HTTP again."""
    import ssl

    import httpx
    import openai

    ct200 = routed.addresses["ct200"]
    ca = lab_ca(tmp_path, "lab-ca")
    wrong = lab_ca(tmp_path, "other-ca")
    certificate, key = endpoint_certificate(tmp_path, ca, ct200, days=20)
    settings = {**KEPT, "dflash_gateway_settings": changed_gateway_settings(ct200)}
    on = {**settings, "dflash_endpoint_tls": {"enabled": True, "certificate": certificate, "key": key,
                                              "ca": ca[0].read_text()}}
    result = play("deploy_dflash.yml", extra=on)
    out = " ".join(result.stdout.split())
    assert result.returncode == 0, out[-5000:]
    assert out.count("unchanged; gates ready") == 4, out[-3000:]  # the replicas are not touched
    assert re.search(r"ct200: the endpoint'?'s certificate expires on \d{4}-\d\d-\d\d \(in 19 days\); renew it", out), \
        out[-3000:]
    # Figures over HTTPS are not held against the previous deploy's over HTTP (a handshake per connection).
    gate = re.search(r"load gate through smg-gateway\.service: ([^']*)'", out)
    assert gate and "previous deployment:" not in gate.group(1), out[-3000:]
    unit = routed.ssh("ct200", "systemctl", "cat", "smg-gateway.service").stdout
    assert "LoadCredential=tls-key:/etc/dflash-infra/smg-gateway/tls-key" in unit and "BEGIN" not in unit
    assert key.splitlines()[1] not in result.stdout + routed.ssh("ct200", "journalctl", "-u", "smg-gateway.service",
                                                                  "--no-pager").stdout

    url = f"https://{ct200}:30000"
    verified = subprocess.run(["curl", "-sS", "--noproxy", "*", "--cacert", str(ca[0]), f"{url}/v1/models"],
                              capture_output=True, text=True, timeout=30)
    assert verified.returncode == 0 and "Qwen3.6-27B" in verified.stdout, verified.stderr
    refused = subprocess.run(["curl", "-sS", "--noproxy", "*", "--cacert", str(wrong[0]), f"{url}/v1/models"],
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode == 60, (refused.returncode, refused.stderr)  # peer certificate cannot be verified
    plain = subprocess.run(["curl", "-sS", "--noproxy", "*", "-o", "/dev/null", "-w", "%{http_code}",
                            f"http://{ct200}:30000/health"], capture_output=True, text=True, timeout=30)
    assert plain.returncode != 0 or plain.stdout != "200", plain
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0,
                           http_client=httpx.Client(verify=ssl.create_default_context(cafile=str(ca[0])),
                                                       trust_env=False, timeout=30))
    assert "Qwen3.6-27B" in [m.id for m in client.models.list().data]
    answer = client.chat.completions.create(model="Qwen3.6-27B", max_tokens=8,
                                            messages=[{"role": "user", "content": "Say hello"}])
    assert answer.choices[0].message.content
    stranger = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0,
                             http_client=httpx.Client(verify=ssl.create_default_context(cafile=str(wrong[0])),
                                                       trust_env=False, timeout=30))
    with pytest.raises(openai.APIConnectionError):
        stranger.models.list()

    again = play("deploy_dflash.yml", extra=on)
    assert again.returncode == 0 and recap(again)["changed"] == 0, again.stdout[-3000:]
    # TLS off in a run whose load gate through the gateway fails (an acceptance floor no engine reaches): the gateway
    # goes back to its HTTPS unit, gated where its record says it serves, and its TLS files are still there for it.
    gate = yaml.safe_load((ROOT / "group_vars/all/load_gate.yml").read_text())["dflash_load_gate"]
    failed = play("deploy_dflash.yml", extra={**settings, "dflash_load_gate": {**gate, "min_accept_length": 100}})
    out = " ".join(failed.stdout.split())
    assert failed.returncode != 0 and "is below 100" in out, failures(out)
    assert "smg-gateway.service went back to the unit it ran before this run" in out, failures(out)
    folder = routed.ssh("ct200", "ls", "/etc/dflash-infra/smg-gateway").stdout.split()
    assert {"tls-cert", "tls-key", "tls-ca"} <= set(folder), folder
    assert "LoadCredential=tls-key:" in routed.ssh("ct200", "systemctl", "cat", "smg-gateway.service").stdout
    served = subprocess.run(["curl", "-sS", "--noproxy", "*", "--cacert", str(ca[0]), f"{url}/v1/models"],
                            capture_output=True, text=True, timeout=30)
    assert served.returncode == 0 and "Qwen3.6-27B" in served.stdout, served.stderr
    # The same change without the fault: the files go only after every gate passed.
    off = play("deploy_dflash.yml", extra=settings)
    out = " ".join(off.stdout.split())
    assert off.returncode == 0, failures(out)
    assert re.search(r"TASK \[smg_gateway : Remove the endpoint's TLS files the settings no longer ask for\]"
                     r"(?:(?!TASK \[).)*changed: \[ct200\]", out), out[-5000:]
    assert out.index("Run the load gate's requests through the gateway") < out.index(
        "Remove the endpoint's TLS files the settings no longer ask for"), out[-5000:]
    assert "tls-" not in routed.ssh("ct200", "ls", "/etc/dflash-infra/smg-gateway").stdout
    with urllib.request.urlopen(f"http://{ct200}:30000/health", timeout=10) as response:
        assert response.status == 200


def test_a_candidate_whose_acceptance_collapses_under_load_fails_on_the_canary_and_is_rolled_back(
        routed: LabHandle, tmp_path: Path) -> None:
    """Acceptance collapsing to 1.0 at concurrency >= 2 (the full-CUDA-graph verify fault; the stand-in's
    SGLANG_STANDIN_ACCEPT_COLLAPSE): the canary replica passes its readiness gates (one request at a time) and fails
    its load gate, is rolled back alone and put back; the play fails naming it; the endpoint serves throughout."""
    ct200 = routed.addresses["ct200"]
    # The host as the previous test left it: the kept candidate's settings and the changed gateway setting.
    settings = {**KEPT, "dflash_gateway_settings": {"worker_host": ct200, "prometheus_host": ct200,
                                                    "retry_max_retries": 5}}
    before = {u: routed.ssh("ct200", "systemctl", "cat", u).stdout for u in REPLICAS}
    collapse = {"environment": {"SGLANG_STANDIN_ACCEPT_COLLAPSE": "1"}}
    load = Load(f"http://{ct200}:30000", tmp_path / "load")
    result = play("playbooks/canary.yml", extra={**settings, "candidate": collapse})
    figures = load.stop()
    out = " ".join(result.stdout.split())
    assert result.returncode != 0, out[-3000:]
    assert re.search(r"sglang-qwen-r3.service failed the load gate: concurrency 24: mean acceptance length "
                     r"1(\.\d+)? is below 1.5", out), out[-5000:]
    assert "replica 3 (sglang-qwen-r3.service, GPUs 6,7) failed its turn of the rollout" in out, out[-5000:]
    assert "Back in the gateway on its old unit" in out, out[-5000:]
    assert {u: routed.ssh("ct200", "systemctl", "cat", u).stdout for u in REPLICAS} == before
    assert all(unit_state(routed, u)[0] == "active" for u in REPLICAS)
    print(f"\ncollapsing canary: {figures['requests']} requests through the gateway, {figures['failed']} failed")
    assert figures["requests"] > 50 and figures["failed"] == 0, figures


def test_replicas_roll_back_on_demand_one_at_a_time_under_load_to_their_previous_deployment(
        routed: LabHandle, tmp_path: Path) -> None:
    """playbooks/rollback.yml -e dflash_rollback=replicas: the replicas as the earlier tests leave them run the
    promoted canary's settings, their records name the baseline as the previous deployment. --check lists every
    replica and changes nothing; asked for r2 and r3, those two go back to their previous unit snapshot, drained
    and added back one at a time under load, and the others are left alone."""
    ct200 = routed.addresses["ct200"]
    records = {u: json.loads(routed.ssh("ct200", "cat", f"/var/lib/dflash-infra/{u[:-8]}/deployment.json").stdout)
               for u in REPLICAS}
    assert all(r["previous"]["unit_backup"] for r in records.values())
    state = routed.changeable_state()
    check = play("playbooks/rollback.yml", "--check", extra={"dflash_rollback": "replicas"})
    out = " ".join(check.stdout.split())
    assert check.returncode == 0, out[-3000:]
    assert "would roll back (check mode, nothing changes)" in out and all(
        f"{u}: back from the deployment of {records[u]['deployed_at']} to that of "
        f"{records[u]['previous']['deployed_at']}" in out for u in REPLICAS), out[-3000:]
    assert recap(check)["changed"] == 0 and routed.changeable_state() == state

    before = {u: routed.ssh("ct200", "systemctl", "cat", u).stdout for u in REPLICAS[:2]}
    load = Load(f"http://{ct200}:30000", tmp_path / "load")
    result = play("playbooks/rollback.yml", extra={"dflash_rollback": "replicas", "dflash_rollback_replicas": [2, 3]})
    figures = load.stop()
    out = " ".join(result.stdout.split())
    assert result.returncode == 0, out[-5000:]
    for unit in REPLICAS[2:]:
        snapshot = records[unit]["previous"]["unit_backup"]
        now = routed.ssh("ct200", "cat", f"/etc/systemd/system/{unit}").stdout
        assert now == routed.ssh("ct200", "cat", f"{snapshot}/{unit}").stdout and "--max-running-requests 24" not in \
            now.replace(" \\\n    ", " ")
        record = json.loads(routed.ssh("ct200", "cat", f"/var/lib/dflash-infra/{unit[:-8]}/deployment.json").stdout)
        assert record["deployed_at"] == records[unit]["previous"]["deployed_at"], record
        assert unit_state(routed, unit)[0] == "active"
    assert {u: routed.ssh("ct200", "systemctl", "cat", u).stdout for u in REPLICAS[:2]} == before
    workers = json.loads(routed.ssh("ct200", "python3", "/usr/local/lib/dflash-infra/smg-ctl", "--url",
                                    f"http://{ct200}:30000", "--credentials", "/etc/dflash-infra/smg-gateway",
                                    "workers").stdout)["workers"]
    assert sorted(w["url"] for w in workers) == [f"http://{ct200}:{30001 + i}" for i in range(4)]
    print(f"\non-demand rollback of r2, r3 under load: {figures['requests']} requests, {figures['failed']} failed")
    assert figures["requests"] > 20 and figures["failed"] == 0, figures
    # Nothing to go back to is refused up front, naming the replica, and changes nothing.
    again = play("playbooks/rollback.yml", extra={"dflash_rollback": "replicas", "dflash_rollback_replicas": [7]})
    assert again.returncode != 0 and ("sglang-qwen-r7.service: expected a deployment record naming a previous "
                                      "deployment to go back to, found no deployment record") in " ".join(
        again.stdout.split()), again.stdout[-3000:]




def test_replicas_slower_together_than_the_last_deploy_through_the_gateway_all_go_back_under_load(
        routed: LabHandle, tmp_path: Path) -> None:
    """The load gate through the gateway, after every replica passed its own: the previous deploy's figures through
    the gateway (smg-gateway.load.json; written here as a deploy a hundred times faster at this concurrency would have
    left them, from the last record's inputs and figures) make this deploy's a regression.
    Every replica this run restarted goes back to its previous deployment, one at a time under load, the play fails
    with the figures side by side, the record is left as it was, and no request through the gateway fails."""
    recorded = routed.ssh("ct200", "cat", GATEWAY_LOAD).stdout  # the last deploy's that restarted something
    faster = faster_gateway_record(recorded)
    before = {u: routed.ssh("ct200", "systemctl", "cat", u).stdout for u in REPLICAS}
    deployed = {u: json.loads(routed.ssh("ct200", "cat", f"/var/lib/dflash-infra/{u[:-8]}/deployment.json").stdout)
                ["deployed_at"] for u in REPLICAS}
    (tmp_path / "faster.json").write_text(json.dumps(faster))
    (tmp_path / "recorded.json").write_text(recorded)
    routed.put("ct200", tmp_path / "faster.json", GATEWAY_LOAD)
    try:
        load = Load(f"http://{routed.addresses['ct200']}:30000", tmp_path / "load")
        changed = {**KEPT["sglang_service_extra_environment"], "SGLANG_STANDIN_SLOWDOWN": "1"}  # every unit differs
        # The gateway's settings as the changed-setting test left them: the gateway itself does not restart.
        result = play("deploy_dflash.yml", extra={**KEPT, "sglang_service_extra_environment": changed,
                                                  "dflash_gateway_settings": changed_gateway_settings(
                                                      routed.addresses["ct200"])})
        figures = load.stop()
        out = " ".join(result.stdout.split())
        assert result.returncode != 0, out[-3000:]
        assert re.search(r"ct200: the endpoint failed the load gate through smg-gateway\.service \(figures: "
                         r"concurrency 96: 128 requests, 0 failed, [0-9.]+ tok/s, [0-9.]+ req/s, "
                         r".*\(previous deployment: [0-9.]+ tok/s.*\): "
                         r"concurrency 96: [0-9.]+ tok/s is \d+% below the previous deployment's", out), \
            out[-5000:]
        assert ("Rolled back to their previous deployment, one at a time with the endpoint up: "
                + ", ".join(REPLICAS)) in out, out[-5000:]
        assert len(re.findall(r"load gate: concurrency 24: 32 requests, 0 failed", out)) == 4  # each replica's own gate
        assert "smg-gateway.service restarted" not in out, out[-3000:]
        assert {u: routed.ssh("ct200", "systemctl", "cat", u).stdout for u in REPLICAS} == before
        assert {u: json.loads(routed.ssh("ct200", "cat", f"/var/lib/dflash-infra/{u[:-8]}/deployment.json").stdout)
                ["deployed_at"] for u in REPLICAS} == deployed
        assert json.loads(routed.ssh("ct200", "cat", GATEWAY_LOAD).stdout) == faster  # a failed gate records nothing
        print(f"\nrolled back through the gateway's load gate under load: {figures['requests']} requests, "
              f"{figures['failed']} failed")
        assert figures["requests"] > 50 and figures["failed"] == 0, figures
    finally:
        routed.put("ct200", tmp_path / "recorded.json", GATEWAY_LOAD)


def group_play(limit: str, *args: str, extra: dict[str, Any] | None = None,
               playbook: str = "deploy_dflash.yml") -> subprocess.CompletedProcess[str]:
    """deploy_dflash.yml (or `playbook`) on the hosts of `limit` (a serving group of several hosts is deployed
    together)."""
    argv = [tool("ansible-playbook"), "-i", "inventory/lab", "-l", limit, playbook, *args]
    if extra is not None:
        argv += ["-e", json.dumps(extra)]
    return subprocess.run(argv, cwd=ROOT, env=ansible_environment(), capture_output=True, text=True)


def host_recap(result: subprocess.CompletedProcess[str], host: str) -> dict[str, int]:
    match = re.search(rf"^{host}\s+:\s+(.*)$", result.stdout, re.MULTILINE)
    assert match, f"no PLAY RECAP line for {host}:\n{result.stdout[-3000:]}"
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(1))}


def requests_served(url: str, cafile: Path | None = None) -> float:
    """How many requests an engine finished since it started (its sglang:num_requests_total); over HTTPS verified
    against `cafile`."""
    import ssl

    context = ssl.create_default_context(cafile=str(cafile)) if cafile is not None else None
    with urllib.request.urlopen(f"{url}/metrics", timeout=5, context=context) as r:
        return sum(float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                   if line.startswith("sglang:num_requests_total"))


TARGET = "/root/models/Qwen3.6-27B"
TARGET_STATE = "/var/lib/dflash-infra/models/Qwen3.6-27B"


def tree_sha256(lab: LabHandle, host: str, folder: str) -> str:
    """sha256sum of every file under a folder, sorted by path (an independent check of the sync's own)."""
    script = f"set -o pipefail && cd {folder} && find . -type f -print0 | sort -z | xargs -0 sha256sum"
    return lab.ssh(host, "bash", "-c", shlex.quote(script)).stdout


def new_revision(lab: LabHandle, offset: int) -> None:
    """A new revision of the target at the source: one byte of one shard changed (same size, new sha256)."""
    flip = (f"import sys; f = open('{TARGET}/model-00007-of-00015.safetensors', 'r+b'); f.seek({offset}); "
            f"b = f.read(1); f.seek({offset}); f.write(bytes([b[0] ^ 0xFF])); f.close()")
    lab.ssh("ct129", "python3", "-c", shlex.quote(flip))


def test_a_new_model_revision_failing_its_gates_goes_back_to_the_previous_version_and_a_good_one_replaces_it(
        routed: LabHandle, tmp_path: Path) -> None:
    """Journey 2: a new target revision (one changed shard) whose engine fails the load gate: the replica goes back
    to its unit and the model version it ran on, whose bytes are the previous manifest's; the endpoint serves
    throughout. A good revision then deploys: the model's path switches to it, and the failed version is pruned
    (the previous one is kept for a rollback). The new version costs its changed shard: the rest is hard-linked."""
    ct200 = routed.addresses["ct200"]
    # The settings in force as the earlier tests leave the host (the kept candidate's, the changed gateway setting),
    # converged first so that only the model and the injected fault change below.
    settings = {**KEPT, "dflash_gateway_settings": changed_gateway_settings(ct200)}
    converged = play("deploy_dflash.yml", extra=settings)
    assert converged.returncode == 0, failures(" ".join(converged.stdout.split()))
    v1 = routed.ssh("ct200", "readlink", "-f", TARGET).stdout.strip()
    v1_bytes = tree_sha256(routed, "ct129", TARGET)
    assert "/.dflash-versions/Qwen3.6-27B/" in v1 and tree_sha256(routed, "ct200", v1) == v1_bytes
    before = {u: routed.ssh("ct200", "systemctl", "cat", u).stdout for u in REPLICAS}
    assert all(f"--model-path {v1}" in " ".join(unit.split()) for unit in before.values()), before[REPLICAS[0]]
    new_revision(routed, 100_000)
    load = Load(f"http://{ct200}:30000", tmp_path / "load")
    # The lab's stand-in for an engine the new weights break: it dies under the load gate's concurrency.
    crash = {**settings.get("sglang_service_extra_environment", {}), "SGLANG_STANDIN_CRASH_UNDER_LOAD": "8"}
    result = play("deploy_dflash.yml", extra={**settings, "sglang_service_extra_environment": crash})
    failed = load.stop()
    out = " ".join(result.stdout.split())
    assert result.returncode != 0, out[-3000:]
    assert "replica 0 (sglang-qwen-r0.service, GPUs 0,1) failed its turn of the rollout" in out, failures(out)
    assert "Back in the gateway on its old unit" in out, out[-5000:]
    report = json.loads(routed.ssh("ct200", "cat", f"{TARGET_STATE}.sync.json").stdout)
    v2 = report["dest"]
    assert v2 != v1 and report["written_bytes"] > 0 and report["linked"], report
    assert report["written_bytes"] + report["linked_bytes"] == report["total_bytes"]
    shown = r"Qwen3.6-27B: .*1 files moved into place \([0-9.]+ KiB written\), \d+ unchanged hard-linked"
    assert re.search(shown, out), out[-5000:]
    # The replica's unit and the version it ran on came back; the bytes under its path are the previous manifest's.
    assert {u: routed.ssh("ct200", "systemctl", "cat", u).stdout for u in REPLICAS} == before
    assert routed.ssh("ct200", "readlink", "-f", TARGET).stdout.strip() == v1
    assert tree_sha256(routed, "ct200", v1) == v1_bytes != tree_sha256(routed, "ct129", TARGET)
    assert all(unit_state(routed, u)[0] == "active" for u in REPLICAS)
    assert failed["requests"] > 50 and failed["failed"] == 0, failed
    versions = json.loads(routed.ssh("ct200", "cat", f"{TARGET_STATE}.versions.json").stdout)
    assert versions["current"] == v1.rsplit("/", 1)[1] and versions["synced"] == v2.rsplit("/", 1)[1], versions
    # A good revision: served by every replica under load, the model's path switched, the failed version pruned.
    new_revision(routed, 150_000)
    load = Load(f"http://{ct200}:30000", tmp_path / "load-good")
    good = play("deploy_dflash.yml", extra=settings)
    figures = load.stop()
    gout = " ".join(good.stdout.split())
    assert good.returncode == 0, failures(gout)
    v3 = routed.ssh("ct200", "readlink", "-f", TARGET).stdout.strip()
    assert v3 not in (v1, v2) and tree_sha256(routed, "ct200", v3) == tree_sha256(routed, "ct129", TARGET)
    assert all(f"--model-path {v3}" in " ".join(routed.ssh("ct200", "systemctl", "cat", u).stdout.split())
               for u in REPLICAS)
    assert f"Qwen3.6-27B: now uses version {v3.rsplit('/', 1)[1]} (was {v1.rsplit('/', 1)[1]}); removed versions " \
           f"{v2.rsplit('/', 1)[1]}" in gout, gout[-5000:]
    kept = routed.ssh("ct200", "ls", "/root/models/.dflash-versions/Qwen3.6-27B").stdout.split()
    assert sorted(kept) == sorted([v1.rsplit("/", 1)[1], v3.rsplit("/", 1)[1]]), kept
    assert figures["requests"] > 50 and figures["failed"] == 0, figures
    report = json.loads(routed.ssh("ct200", "cat", f"{TARGET_STATE}.sync.json").stdout)
    again = play("deploy_dflash.yml", extra=settings)
    assert again.returncode == 0 and recap(again)["changed"] == 0, again.stdout[-3000:]
    print(f"\na new revision with one changed shard: {report['written_bytes']} bytes written of the model's "
          f"{report['total_bytes']} ({100 * report['written_bytes'] / report['total_bytes']:.1f} %), "
          f"{report['linked_bytes']} hard-linked; under load through the gateway, the failed deploy: "
          f"{failed['requests']} requests, {failed['failed']} failed; the good one: {figures['requests']} requests, "
          f"{figures['failed']} failed")


def test_a_second_host_serves_the_same_endpoint_behind_ct200s_gateway_and_rolls_under_load(
        routed: LabHandle, tmp_path: Path) -> None:
    """Adding a host is an inventory change: ct201 (the lab's on-demand second PRO 6000 box, group pro6000_pair,
    whose group_vars name ct200 as its dflash_gateway_host) is built, and one deploy of both serves one endpoint from
    replicas on two containers: ct201's replica listens on its own address, ct200's gateway fronts it after its own
    four (restarted once, for its new worker list). Either host alone is refused before anything changes. A change
    of ct201's plan rolls its replica under load through ct200's gateway (drained there with the endpoint's key
    file, restarted, gated, added back): no request fails, ct200 is untouched. ct201 alone rolls it back on demand;
    the same change against figures through the gateway a hundred times better fails the gate on ct200, and ct201 puts
    its replica back, drained on ct200, with the load running."""
    ct200, ct201 = routed.addresses["ct200"], routed.addresses["ct201"]
    routed.cli_ok("up", "ct201")
    try:
        for limit, refusal in (("ct201", "ct201: its replicas are served by ct200's gateway, which is not in this "
                                         "run; run with -l ct200,ct201"),
                               ("ct200", "ct200: its gateway also fronts the replicas of ct201, not in this run; run "
                                         "with -l ct200,ct201")):
            alone = group_play(limit)
            assert alone.returncode != 0 and refusal in " ".join(alone.stdout.split()), alone.stdout[-3000:]
            assert host_recap(alone, limit)["changed"] == 0
        assert "sglang-qwen-r0.service" not in routed.ssh("ct201", "ls", "/etc/systemd/system").stdout

        joined = group_play("ct200,ct201")
        out = " ".join(joined.stdout.split())
        assert joined.returncode == 0, out[-5000:]
        worker = f"http://{ct201}:30001"
        assert f"--host {ct201} --port 30001" in routed.ssh("ct201", "systemctl", "cat",
                                                           "sglang-qwen-r0.service").stdout.replace(" \\\n    ", " ")
        assert "smg-gateway.service" not in routed.ssh("ct201", "ls", "/etc/systemd/system").stdout
        assert worker in routed.ssh("ct200", "systemctl", "cat", "smg-gateway.service").stdout
        ctl = ["python3", "/usr/local/lib/dflash-infra/smg-ctl", "--url", f"http://{ct200}:30000", "--credentials",
               "/etc/dflash-infra/smg-gateway", "workers"]
        workers = {w["url"]: w for w in json.loads(routed.ssh("ct200", *ctl).stdout)["workers"]}
        assert sorted(workers) == sorted([f"http://{ct200}:{30001 + i}" for i in range(4)] + [worker]), workers
        assert workers[worker]["status"] == "ready" and workers[worker]["healthy"], workers[worker]
        again = group_play("ct200,ct201")
        assert again.returncode == 0 and host_recap(again, "ct200")["changed"] == 0 and \
            host_recap(again, "ct201")["changed"] == 0, again.stdout[-3000:]

        load = Load(f"http://{ct200}:30000", tmp_path / "load")
        served = requests_served(worker)
        while served == 0 and load.requests() < 400:  # the gateway routes the endpoint's load to ct201 too
            load.wait_requests(10)
            served = requests_served(worker)
        assert served > 0, f"{load.requests()} requests through the gateway, none on {worker}"
        # A change of ct201's plan only (an extra variable templated per host, as a host_vars file would set it).
        before = routed.ssh("ct201", "systemctl", "cat", "sglang-qwen-r0.service").stdout
        rolled = group_play("ct200,ct201", extra={"dflash_plan_overrides": (
            "{{ {'max_running_requests': 20} if inventory_hostname == 'ct201' else {} }}")})
        forward = routed.ssh("ct201", "systemctl", "cat", "sglang-qwen-r0.service").stdout
        # ct201 alone rolls its replica back on demand, drained and added back on ct200's gateway.
        back = subprocess.run([tool("ansible-playbook"), "-i", "inventory/lab", "-l", "ct201", "playbooks/rollback.yml",
                               "-e", "dflash_rollback=replicas"], cwd=ROOT, env=ansible_environment(),
                              capture_output=True, text=True)
        # The same change again, against figures through the gateway 100 times those the forward roll recorded: the
        # gate through ct200's gateway fails, and ct201 puts the replica this run restarted back (drained on ct200).
        recorded = routed.ssh("ct200", "cat", GATEWAY_LOAD).stdout
        faster = json.loads(recorded)
        faster["load"]["figures"] = [{**row, "output_tokens_per_s": row["output_tokens_per_s"] * 100}
                                     for row in faster["load"]["figures"]]
        (tmp_path / "faster.json").write_text(json.dumps(faster))
        routed.put("ct200", tmp_path / "faster.json", GATEWAY_LOAD)
        try:
            slower = group_play("ct200,ct201", extra={"dflash_plan_overrides": (
                "{{ {'max_running_requests': 20} if inventory_hostname == 'ct201' else {} }}")})
            after_gate = routed.ssh("ct201", "systemctl", "cat", "sglang-qwen-r0.service").stdout
            record_after = json.loads(routed.ssh("ct200", "cat", GATEWAY_LOAD).stdout)
        finally:
            (tmp_path / "recorded.json").write_text(recorded)
            routed.put("ct200", tmp_path / "recorded.json", GATEWAY_LOAD)
        figures = load.stop()
        out = " ".join(rolled.stdout.split())
        assert rolled.returncode == 0, out[-5000:]
        # ct200's one change: the figures of the load gate through its gateway, which ct201's restart made it run.
        assert host_recap(rolled, "ct200")["changed"] == 1, out[-3000:]
        assert re.search(r"ct200 \(pro6000\):.* through the gateway, load at concurrency \d+: \d+ requests, 0 failed",
                         out), out[-3000:]
        assert re.search(r"--max-running-requests\s+20", forward)
        summary = (f"serving: http://{ct200}:30000/v1 (Qwen3.6-27B) through smg-gateway.service on ct200, 1 replica(s) "
                   f"replica 0: sglang-qwen-r0.service on GPUs 0,1 at {worker}, drained, restarted and added back")
        assert summary in out, out[-3000:]
        assert "smg-gateway.service (also fronting ct201), 4 replica(s)" in out, out[-3000:]
        out = " ".join(back.stdout.split())
        assert back.returncode == 0, out[-5000:]
        assert re.search(r"TASK \[Take the replica out of the gateway \(requests finish\), "
                         r"sglang-qwen-r0\.service\] \*+ changed: \[ct201 -> ct200", out), out[-5000:]
        assert routed.ssh("ct201", "systemctl", "cat", "sglang-qwen-r0.service").stdout == before
        out = " ".join(slower.stdout.split())
        assert slower.returncode != 0, out[-5000:]
        assert re.search(r"ct200: the endpoint failed the load gate through smg-gateway\.service \(figures: "
                         r"concurrency \d+: \d+ requests, 0 failed, .*% below the previous deployment's",
                         out), out[-5000:]
        assert ("No replica of ct200 was rolled back. The replicas of ct201 that this run restarted go back next, "
                "each host one replica at a time.") in out, out[-5000:]
        assert re.search(r"TASK \[Take the replica out of the gateway \(requests finish\), "
                         r"sglang-qwen-r0\.service\] \*+ changed: \[ct201 -> ct200", out), out[-5000:]
        assert ("ct201: the endpoint failed the load gate through smg-gateway.service on ct200 (its figures are in its "
                "failure). Rolled back to their previous deployment, one at a time with the endpoint up: "
                "sglang-qwen-r0.service.") in out, out[-5000:]
        assert after_gate == before and record_after == faster  # back on its unit; a failed gate records nothing
        workers = {w["url"]: w for w in json.loads(routed.ssh("ct200", *ctl).stdout)["workers"]}
        assert workers[worker]["status"] == "ready" and workers[worker]["healthy"], workers[worker]
        print(f"\nct201 rolled forward and back under load behind ct200's gateway: {figures['requests']} requests, "
              f"{figures['failed']} failed; ct201's replica had served {served:.0f} before its turn")
        assert figures["requests"] > 20 and figures["failed"] == 0, figures
        # The endpoint is measured where it is, on ct200 alone; ct201 has none, and a canary needs a group of one host.
        measured = group_play("ct200", extra={"dflash_benchmark_concurrency": [4]}, playbook="playbooks/benchmark.yml")
        assert measured.returncode == 0 and "concurrency 4: 32 requests, 0 failed" in " ".join(
            measured.stdout.split()), measured.stdout[-3000:]
        for limit, name, refusal in (
                ("ct201", "playbooks/benchmark.yml", "ct201: its replicas are served by ct200's gateway, which is the "
                                                     "endpoint to measure; run with -l ct200"),
                ("ct200", "playbooks/canary.yml", "ct200: its endpoint is served by the replicas of ct200, ct201 "
                                                  "behind ct200's gateway; a canary's promotion would leave")):
            refused = group_play(limit, extra={"candidate": {"environment": {"SGLANG_STANDIN_STEP_MS": "3"}}},
                                 playbook=name)
            assert refused.returncode != 0 and refusal in " ".join(refused.stdout.split()), refused.stdout[-3000:]
            assert host_recap(refused, limit)["changed"] == 0
        check_the_hop_over_tls(routed, tmp_path, ct200, ct201)
    finally:
        routed.cli_ok("remove", "ct201")
    assert "ct201" not in subprocess.run([tool("ansible-inventory"), "-i", "inventory/lab", "--list"], cwd=ROOT,
                                         env=ansible_environment(), capture_output=True, text=True).stdout


def check_the_hop_over_tls(routed: LabHandle, tmp_path: Path, ct200: str, ct201: str) -> None:
    """The hop from ct200's gateway to ct201's replica over TLS (dflash_worker_tls on ct201, the team's CA in ct200's
    dflash_endpoint_tls.ca; a CA made on the fly): the replica serves HTTPS only with ct201's certificate, the gateway
    reaches it at https:// and verifies it against the CA, the load through the gateway reaches it with no request
    failing, a client trusting another CA is refused; a second run changes nothing on either host."""
    folder = tmp_path / "hop"
    folder.mkdir()
    ca = lab_ca(folder, "team-ca")
    wrong = lab_ca(folder, "other-ca")
    certificate, key = endpoint_certificate(folder, ca, ct201, days=90, name="ct201")
    with_ca = {"dflash_endpoint_tls": {"enabled": False, "certificate": "", "key": "", "ca": ca[0].read_text()}}
    extra = {**with_ca, "ct201_tls": {"enabled": True, "certificate": certificate, "key": key},
             "dflash_worker_tls": "{{ ct201_tls if inventory_hostname == 'ct201' else {'enabled': false} }}"}
    # The gateway must run with the team's CA before a replica it fronts turns to HTTPS (it is added back there as
    # it rolls, before the gateway's own turn): refused up front, then the CA first, then the hop.
    early = group_play("ct200,ct201", extra=extra)
    assert early.returncode != 0 and "ct201: dflash_worker_tls: the gateway on ct200 does not run with the team" in \
        " ".join(early.stdout.split()), early.stdout[-3000:]
    assert host_recap(early, "ct201")["changed"] == 0
    ca_first = group_play("ct200,ct201", extra=with_ca)
    assert ca_first.returncode == 0, ca_first.stdout[-3000:]
    assert "restarted and added back" not in ca_first.stdout, ca_first.stdout[-3000:]  # no replica restarts for it
    assert "LoadCredential=tls-ca:" in routed.ssh("ct200", "systemctl", "cat", "smg-gateway.service").stdout
    hopped = group_play("ct200,ct201", extra=extra)  # the gateway restarts for its new worker URL: its one outage
    out = " ".join(hopped.stdout.split())
    assert hopped.returncode == 0, failures(out)
    load = Load(f"http://{ct200}:30000", tmp_path / "hop-load")
    worker = f"https://{ct201}:30001"
    unit = routed.ssh("ct201", "systemctl", "cat", "sglang-qwen-r0.service").stdout
    assert "LoadCredential=tls-key:/etc/dflash-infra/sglang-qwen-r0.tls-key" in unit and "BEGIN" not in unit
    assert worker in routed.ssh("ct200", "systemctl", "cat", "smg-gateway.service").stdout
    ctl = ["python3", "/usr/local/lib/dflash-infra/smg-ctl", "--url", f"http://{ct200}:30000", "--credentials",
           "/etc/dflash-infra/smg-gateway", "workers"]
    workers = {w["url"]: w for w in json.loads(routed.ssh("ct200", *ctl).stdout)["workers"]}
    assert workers[worker]["status"] == "ready" and workers[worker]["healthy"], workers
    served = requests_served(worker, ca[0])
    while served == 0 and load.requests() < 400:  # the gateway routes the endpoint's load to ct201 over TLS
        load.wait_requests(10)
        served = requests_served(worker, ca[0])
    figures = load.stop()
    assert served > 0 and figures["failed"] == 0, (served, figures)
    verified = subprocess.run(["curl", "-sS", "--noproxy", "*", "--cacert", str(ca[0]), f"{worker}/health"],
                              capture_output=True, text=True, timeout=30)
    assert verified.returncode == 0, verified.stderr
    refused = subprocess.run(["curl", "-sS", "--noproxy", "*", "--cacert", str(wrong[0]), f"{worker}/health"],
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode == 60, (refused.returncode, refused.stderr)
    plain = subprocess.run(["curl", "-sS", "--noproxy", "*", "-o", "/dev/null", "-w", "%{http_code}",
                            f"http://{ct201}:30001/health"], capture_output=True, text=True, timeout=30)
    assert plain.returncode != 0 or plain.stdout != "200", plain
    again = group_play("ct200,ct201", extra=extra)
    assert again.returncode == 0 and host_recap(again, "ct200")["changed"] == 0 and \
        host_recap(again, "ct201")["changed"] == 0, again.stdout[-3000:]
    print(f"\nthe hop to ct201 over TLS: {figures['requests']} requests through the gateway, {figures['failed']} "
          f"failed; ct201's replica served {served:.0f} over HTTPS")
    # TLS off again on ct201: its replica serves plain HTTP, and its certificate and key are removed only after every
    # gate passed, the load gate through ct200's gateway included (the unit a failed gate's rollback would put back
    # loads them). Going back on demand to the HTTPS deployment then needs them: refused before anything stops,
    # naming them.
    # First in a run whose load gate through ct200's gateway fails (an acceptance floor no engine reaches; each
    # replica's own gate keeps the usual one): ct200's gateway goes back to its unit, gated for the workers the plan
    # still has where they were, and ct201's replica to its HTTPS deployment, whose certificate and key are there.
    gate = yaml.safe_load((ROOT / "group_vars/all/load_gate.yml").read_text())["dflash_load_gate"]
    failing = group_play("ct200,ct201", extra={**with_ca, "sglang_service_load_gate": gate,
                                               "dflash_load_gate": {**gate, "min_accept_length": 100}})
    out = " ".join(failing.stdout.split())
    assert failing.returncode != 0 and "is below 100" in out, failures(out)
    assert "smg-gateway.service went back to the unit it ran before this run" in out, failures(out)
    assert ("Rolled back to their previous deployment, one at a time with the endpoint up: sglang-qwen-r0.service"
            in out), failures(out)
    assert "LoadCredential=tls-key:" in routed.ssh("ct201", "systemctl", "cat", "sglang-qwen-r0.service").stdout
    workers = {w["url"]: w for w in json.loads(routed.ssh("ct200", *ctl).stdout)["workers"]}
    assert workers[worker]["status"] == "ready" and workers[worker]["healthy"], workers
    plain_again = group_play("ct200,ct201", extra=with_ca)
    out = " ".join(plain_again.stdout.split())
    assert plain_again.returncode == 0, failures(out)
    passed = out.rindex("TASK [Run the load gate's requests through the gateway, at the endpoint's capacity]")
    assert passed > out.index("TASK [sglang_service : Check that every gate passed] *"), out[-5000:]
    removed = re.search(r"TASK \[Remove the replicas' TLS files no longer asked for, now that every gate passed\]"
                        r"(?:(?!TASK \[).)*changed: \[ct201\]", out)
    assert removed and removed.start() > passed, out[-5000:]
    assert "tls-" not in routed.ssh("ct201", "ls", "/etc/dflash-infra").stdout
    assert "http://" + ct201 + ":30001" in routed.ssh("ct200", "systemctl", "cat", "smg-gateway.service").stdout
    back = subprocess.run([tool("ansible-playbook"), "-i", "inventory/lab", "-l", "ct201", "playbooks/rollback.yml",
                           "-e", "dflash_rollback=replicas"], cwd=ROOT, env=ansible_environment(), capture_output=True,
                          text=True)
    out = " ".join(back.stdout.split())
    assert back.returncode != 0 and ("sglang-qwen-r0.service: expected the TLS certificate and key that the unit of "
                                     "its previous deployment (") in out and \
        "/etc/dflash-infra/sglang-qwen-r0.tls-cert, /etc/dflash-infra/sglang-qwen-r0.tls-key gone" in out, out[-3000:]
    assert host_recap(back, "ct201")["changed"] == 0, out[-3000:]
