"""What runs where, in the lab (playbooks/status.yml): after the demo's deploy (ct200 serving through the real SGLang
Model Gateway, four engine stand-ins of tp 2) the view says the host is as the inventory says, in one round trip,
without the lock, changed=0 also under --check; after a drift (a replica stopped, one drained from the gateway by
hand, one unit edited by hand) it names each; a held deploy lock is named with its holder; the next deploy repairs the
drift and the view says so again. Its JSON document is read back as a consumer would (dflash_infra.status.extract).
"""

from __future__ import annotations

import http.server
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dflash_infra import status
from helpers import ROOT, ansible_environment, debian_alertmanager_argv, debian_prometheus, tool

sys.path.insert(0, str(ROOT / "tools"))
from load import Load

if TYPE_CHECKING:
    from tests.lab.conftest import LabHandle

pytestmark = pytest.mark.lab

REPLICAS = [f"sglang-qwen-r{i}.service" for i in range(4)]
GATEWAY = "smg-gateway.service"
LOCK = "/run/dflash-infra/deploy.lock"
CTL = ["python3", "/usr/local/lib/dflash-infra/smg-ctl", "--credentials", "/etc/dflash-infra/smg-gateway"]


def limit(lab: LabHandle) -> str:
    """ct200, and ct201 when a test built it (ct200's gateway then fronts it: a deploy runs them together)."""
    return "ct200,ct201" if "ct201" in lab.names else "ct200"


def play(lab: LabHandle, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [tool("ansible-playbook"), "-i", "inventory/lab", "-l", limit(lab), name, *args]
    return subprocess.run(argv, cwd=ROOT, env=ansible_environment(), capture_output=True, text=True)


def recap(result: subprocess.CompletedProcess[str], host: str = "ct200") -> dict[str, int]:
    match = re.search(rf"^{host}\s+:\s+(.*)$", result.stdout, re.MULTILINE)
    assert match, f"no PLAY RECAP line for {host}:\n{result.stdout[-3000:]}"
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(1))}


def view(lab: LabHandle, *args: str) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """playbooks/status.yml -e status_format=json: ct200's report, and the run."""
    run = play(lab, "playbooks/status.yml", "-e", "status_format=json", *args)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    assert recap(run)["changed"] == 0 and recap(run)["failed"] == 0, run.stdout[-3000:]
    document = status.extract(run.stdout)
    assert "ct200" in document and set(document) <= {"ct200", "ct201"}, sorted(document)
    return document["ct200"], run


def one_round_trip(run: subprocess.CompletedProcess[str]) -> None:
    """The tasks that ran on ct200: the host_state read is the only one that is not decided on the controller."""
    tasks = re.findall(r"^TASK \[(.+?)\] \*+$", run.stdout, re.MULTILINE)
    assert len([t for t in tasks if t.startswith("host_state : ")]) == 1, tasks
    assert not [t for t in tasks if "lock" in t.lower()], tasks


@pytest.fixture(scope="module")
def served(lab: LabHandle) -> LabHandle:
    """ct200 as `make demo` leaves it: deployed through the gateway with the inventory's settings (a no-op when the demo
    already ran; in the suite it follows test_deploy.py, so it only rolls the replicas back to the inventory's)."""
    deploy = play(lab, "deploy_dflash.yml")
    assert deploy.returncode == 0, deploy.stdout[-5000:]
    return lab


def test_after_the_demo_the_view_says_ct200_is_as_the_inventory_says(served: LabHandle) -> None:
    ct200 = served.addresses["ct200"]
    report, run = view(served)
    one_round_trip(run)
    assert report["drifted"] is False and report["drift"] == [], report["drift"]
    assert report["plan"]["changes"] == []
    in_force = report["plan"]["in_force"]
    assert (in_force["topology"], in_force["tp_size"], in_force["replicas"]) == ("gateway", 2, 4), in_force
    assert in_force["speculative"]["algorithm"] == "DFLASH" and in_force["speculative"]["block_size"], in_force
    assert report["engine"]["lock"]["in_sync"] and report["gateway"]["lock"]["in_sync"], report["engine"]
    assert (report["gateway"]["ActiveState"], report["gateway"]["UnitFileState"]) == ("active", "enabled")
    assert report["gateway"]["routes_read"] is True
    replicas = {r["name"]: r for r in report["replicas"]}
    assert sorted(replicas) == REPLICAS, sorted(replicas)
    for i, name in enumerate(REPLICAS):
        r = replicas[name]
        assert (r["ActiveState"], r["UnitFileState"], r["routed"], r["health"]["status"], r["unit_file"]) == \
            ("active", "enabled", True, 200, "matches"), r
        assert r["url"] == f"http://{ct200}:{30001 + i}" and r["gates"] == "ready", r
    assert set(report["models"]["served"]) == {"target", "draft"}
    figures = report["load"]["replicas"]["sglang-qwen-r0.service"]["figures"]
    assert figures and figures[0]["failed"] == 0 and report["load"]["replicas"]["sglang-qwen-r0.service"]["age_s"] >= 0
    assert report["load"]["gateway"] is None or report["load"]["gateway"]["figures"], report["load"]["gateway"]
    assert report["lock"] is None
    # The table for people, and --check: the same run, nothing changed.
    table = play(served, "playbooks/status.yml", "--check")
    out = " ".join(table.stdout.split())
    assert table.returncode == 0 and recap(table)["changed"] == 0, table.stdout[-3000:]
    assert "ct200 (pro6000): as the inventory says: a deploy would change nothing" in out, out[-3000:]
    assert "plan in force: tp 2 x 4 replica(s) through the gateway" in out and "deploy lock: free" in out


def test_after_a_drift_the_view_names_each_and_the_next_deploy_repairs_them(served: LabHandle, tmp_path: Path) -> None:
    ct200 = served.addresses["ct200"]
    gateway = f"http://{ct200}:30000"
    try:
        assert served.ssh("ct200", "systemctl", "stop", REPLICAS[1]).returncode == 0
        drained = served.ssh("ct200", *CTL[:2], "--url", gateway, *CTL[2:], "drain", "--worker",
                             f"http://{ct200}:30003", "--env-file", "/etc/dflash-infra/sglang-qwen-r2.env")
        assert drained.returncode == 0, drained.stdout + drained.stderr
        edited = served.ssh("ct200", "sh", "-c", f"echo '# edited by hand' >> /etc/systemd/system/{REPLICAS[3]}")
        assert edited.returncode == 0, edited.stderr
        report, _ = view(served)
        drift = report["drift"]
        assert report["drifted"] is True
        assert f"{REPLICAS[1]}: expected active and enabled, found inactive/enabled" in drift, drift
        assert (f"{REPLICAS[2]} (http://{ct200}:30003): expected among the workers {GATEWAY} routes to, found missing "
                "(a deploy adds it back)") in drift, drift
        assert f"{REPLICAS[3]}: its unit differs from what the inventory's plan renders (a deploy restarts it)" \
            in drift, drift
        replicas = {r["name"]: r for r in report["replicas"]}
        assert replicas[REPLICAS[2]]["routed"] is False and replicas[REPLICAS[3]]["unit_file"] == "differs"
        assert replicas[REPLICAS[0]]["routed"] is True and replicas[REPLICAS[0]]["unit_file"] == "matches"

        # A held deploy lock (a run elsewhere): named with its holder; the view takes none and still runs.
        holder = {"owner": "alice", "controller": "ctl9", "pid": 4242, "started_at": "2026-12-06T09:40:00Z",
                  "playbook": "Deploy the SGLang engine with the DFlash drafter"}
        (tmp_path / "deploy.lock").write_text(json.dumps(holder) + "\n")
        assert served.ssh("ct200", "mkdir", "-p", "/run/dflash-infra").returncode == 0
        served.put("ct200", tmp_path / "deploy.lock", LOCK)
        locked, _ = view(served)
        assert locked["lock"]["holder"] == holder and locked["lock"]["describe"] == (
            "Deploy the SGLang engine with the DFlash drafter run by alice on ctl9 (pid 4242, since "
            "2026-12-06T09:40:00Z)"), locked["lock"]
        assert locked["lock"]["heartbeat"] and locked["lock"]["stale"] is False, locked["lock"]  # just written
        assert served.ssh("ct200", "cat", LOCK).stdout.strip() == json.dumps(holder)  # left as it was
    finally:
        served.ssh("ct200", "rm", "-f", LOCK)

    repaired = play(served, "deploy_dflash.yml")
    assert repaired.returncode == 0, repaired.stdout[-5000:]
    report, _ = view(served)
    assert report["drifted"] is False and report["drift"] == [], report["drift"]
    assert {r["routed"] for r in report["replicas"]} == {True}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Webhook(http.server.ThreadingHTTPServer):
    """The team's webhook receiver, on loopback: every notification Alertmanager posts, kept."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    def firing(self) -> set[tuple[str, str]]:
        """(alertname, replica) of every alert a notification said was firing."""
        return {(a["labels"]["alertname"], a["labels"].get("replica", "")) for n in self.received
                for a in n["alerts"] if a["status"] == "firing"}


def lab_monitoring(folder: Path, alertmanager: int) -> dict[str, Any]:
    """group_vars' dflash_monitoring with the lab's evaluation times shortened by variables (not by editing the
    rules): 1 s scrapes, `for` of a few seconds, Alertmanager grouping at once; the files written into `folder`."""
    settings = yaml.safe_load((ROOT / "group_vars" / "all" / "monitoring.yml").read_text())["dflash_monitoring"]
    for alert in settings["alerts"].values():
        if isinstance(alert, dict):
            alert["for"] = "5s"
            if "window" in alert:
                alert["window"] = "15s"
    settings["alertmanager"].update(group_wait="1s", group_interval="2s", repeat_interval="1h",
                                    config=str(folder / "alertmanager.yml"))
    return {**settings, "address": "{{ ansible_host }}", "scrape_interval": "1s",
            "scrape_config": str(folder / "dflash.yml"), "rules_file": str(folder / "dflash-alerts.yml")}


def prometheus_alerts(base: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{base}/api/v1/alerts", timeout=5) as r:
        return list(json.load(r)["data"]["alerts"])


def test_alerts_reach_the_teams_webhook_when_a_replica_dies_or_its_acceptance_collapses(
        served: LabHandle, tmp_path: Path) -> None:
    """Debian's Prometheus and Alertmanager on 127.0.0.1 with what playbooks/monitoring.yml writes for the lab (rules,
    and the Alertmanager configuration with a webhook receiver on loopback), under load through the gateway: a
    healthy endpoint raises nothing; replica 3 stopped raises DFlashReplicaDown for it, and replica 2's acceptance
    collapsing (its stand-in restarted with SGLANG_STANDIN_ACCEPT_COLLAPSE by a runtime drop-in, requests sent to it
    side by side) raises DFlashAcceptanceBelowFloor for it, each at the webhook within a bounded time. Both are put
    back after."""
    ct200 = served.addresses["ct200"]
    am_port, prom_port, hook = free_port(), free_port(), Webhook()
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    webhook_url = f"http://127.0.0.1:{hook.server_address[1]}/hook"
    made = play(served, "playbooks/monitoring.yml", "-e", json.dumps({
        "dflash_monitoring": lab_monitoring(tmp_path, am_port), "vault_dflash_alertmanager_webhook_url": webhook_url}))
    assert made.returncode == 0, made.stdout[-3000:]
    assert webhook_url not in made.stdout  # a secret of the vault
    config = yaml.safe_load((tmp_path / "dflash.yml").read_text())
    config["global"] = {**config.get("global", {}), "evaluation_interval": "1s"}
    config["rule_files"] = [str(tmp_path / "dflash-alerts.yml")]
    config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    logs = (tmp_path / "alertmanager.log").open("w"), (tmp_path / "prometheus.log").open("w")
    servers = [
        subprocess.Popen(debian_alertmanager_argv(
            f"--config.file={tmp_path / 'alertmanager.yml'}", f"--storage.path={tmp_path / 'am'}",
            f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address=", "--log.level=warn"),
            stdout=logs[0], stderr=subprocess.STDOUT),
        subprocess.Popen([str(debian_prometheus() / "usr" / "bin" / "prometheus"),
                          f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                          f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                         stdout=logs[1], stderr=subprocess.STDOUT)]
    base = f"http://127.0.0.1:{prom_port}"
    dropin = "/run/systemd/system/sglang-qwen-r2.service.d"
    load = Load(f"http://{ct200}:30000", tmp_path / "load", users=16)
    loads = [load]

    def wait_for(alert: tuple[str, str], what: str, timeout_s: float = 120) -> float:
        began = time.monotonic()
        while alert not in hook.firing():
            seen = [(a["labels"].get("alertname"), a["labels"].get("replica"), a["state"])
                    for a in prometheus_alerts(base)]
            assert time.monotonic() - began < timeout_s, (
                f"{what}: {alert} did not reach the webhook in {timeout_s:.0f} s; Prometheus: {seen}; received "
                f"{sorted(hook.firing())}; {(tmp_path / 'prometheus.log').read_text()[-1500:]}")
            time.sleep(0.5)
        return time.monotonic() - began

    try:
        # Healthy, under load: every target up and the rules evaluated for longer than their `for`, and nothing fires.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{base}/api/v1/query?query=" + urllib.parse.quote("count(up == 1)"),
                                            timeout=5) as r:
                    result = json.load(r)["data"]["result"]
                if result and float(result[0]["value"][1]) == 5:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail((tmp_path / "prometheus.log").read_text()[-2000:])
        load.wait_requests(200)
        time.sleep(20)  # longer than every shortened `for` and window: a rule that would fire on health has fired
        assert prometheus_alerts(base) == [] and hook.received == [], (prometheus_alerts(base), hook.received)

        assert served.ssh("ct200", "systemctl", "stop", REPLICAS[3]).returncode == 0
        took = wait_for(("DFlashReplicaDown", "3"), "replica 3 stopped")
        print(f"\nreplica 3 stopped: DFlashReplicaDown at the webhook after {took:.1f} s")
        assert served.ssh("ct200", "systemctl", "start", REPLICAS[3]).returncode == 0

        (tmp_path / "collapse.conf").write_text("[Service]\nEnvironment=SGLANG_STANDIN_ACCEPT_COLLAPSE=1\n")
        assert served.ssh("ct200", "mkdir", "-p", dropin).returncode == 0
        served.put("ct200", tmp_path / "collapse.conf", f"{dropin}/collapse.conf")
        assert served.ssh("ct200", "systemctl", "daemon-reload").returncode == 0
        assert served.ssh("ct200", "systemctl", "restart", REPLICAS[2]).returncode == 0
        # Requests side by side on replica 2 itself (the gateway's cache-aware routing may send the load's few
        # prompts elsewhere): the stand-in's collapse needs two or more running at once.
        loads.append(Load(f"http://{ct200}:30003", tmp_path / "direct", users=4))
        took = wait_for(("DFlashAcceptanceBelowFloor", "2"), "replica 2's acceptance collapsed")
        print(f"replica 2's acceptance collapsed: DFlashAcceptanceBelowFloor at the webhook after {took:.1f} s")
        summary = next(a["annotations"]["summary"] for n in hook.received for a in n["alerts"]
                       if a["labels"]["alertname"] == "DFlashAcceptanceBelowFloor")
        assert summary.startswith("ct200 replica 2: acceptance length 1") and "runbook: docs/serving.md#" in summary, \
            summary
        assert ("DFlashAcceptanceBelowFloor", "0") not in hook.firing()  # the healthy replicas raise nothing
    finally:
        for each in loads:
            each.stop()
        served.ssh("ct200", "rm", "-rf", dropin)
        served.ssh("ct200", "systemctl", "daemon-reload")
        served.ssh("ct200", "systemctl", "restart", REPLICAS[2])
        served.ssh("ct200", "systemctl", "start", REPLICAS[3])
        for server in servers:
            server.terminate()
            server.wait(timeout=30)
        hook.shutdown()
    again = play(served, "deploy_dflash.yml")
    assert again.returncode == 0, again.stdout[-5000:]
