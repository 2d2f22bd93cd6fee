"""What runs where, in the lab (playbooks/status.yml): after the demo's deploy (ct200 serving through the real SGLang
Model Gateway, four engine stand-ins of tp 2) the view says the host is as the inventory says, in one round trip,
without the lock, changed=0 also under --check; after a drift (a replica stopped, one drained from the gateway by
hand, one unit edited by hand) it names each; a held deploy lock is named with its holder; the next deploy repairs the
drift and the view says so again. Its JSON document is read back as a consumer would (dflash_infra.status.extract).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dflash_infra import status
from helpers import ROOT, ansible_environment, tool

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
    """ct200 as `make demo` leaves it: deployed through the gateway (a no-op when the demo already ran)."""
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
