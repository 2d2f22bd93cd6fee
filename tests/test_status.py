"""What runs where (dflash_infra.status, playbooks/status.yml): one host's view from one host_state read against the
inventory's plan, every drift named, the JSON document, and the playbook read-only, lock-free and one round trip."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dflash_infra import locks, rollout, serving, status
from dflash_infra.planner import plan_dict

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
ENV, STATE, LIBEXEC = "/etc/dflash-infra", "/var/lib/dflash-infra", "/usr/local/lib/dflash-infra"
SERVICE = "sglang-qwen.service"
GATEWAY = "smg-gateway.service"
SLOTS = rollout.slots(SERVICE, ENV, STATE, LIBEXEC)
SERVICE_PATHS = serving.service_paths(SERVICE, ENV, STATE, LIBEXEC)
GATEWAY_PATHS = serving.gateway_paths(GATEWAY, ENV, LIBEXEC)
ENGINE_LOCK = ROOT / "locks" / "sglang-0.5.23-py3.12-x86_64-manylinux_2_34.txt"
GATEWAY_LOCK = ROOT / "locks" / "smg-1.13.0-py3.12-x86_64-manylinux_2_34.txt"
LOCK_PATH = "/run/dflash-infra/deploy.lock"
NOW = "2026-12-06T10:00:00Z"
DEPLOYED = "2026-12-06T08:00:00+00:00"
MANIFESTS = {"target": {"path": "/root/models/Qwen3.6-27B", "manifest_sha256": "a1" * 32},
             "draft": {"path": "/root/models/Qwen3.6-27B-DFlash", "manifest_sha256": "b2" * 32}}
FIGURES = [{"concurrency": 32, "requests": 32, "failed": 0, "output_tokens_per_s": 812.4, "requests_per_s": 6.3,
            "accept_length_mean": 3.1, "verify_ct": 410}]


def planned(**speculative: Any) -> dict[str, Any]:
    """pro6000's plan behind the gateway (tp 2, four replicas on loopback), as serving_plan makes it."""
    request = yaml.safe_load((EXAMPLES / "pro6000.yml").read_text())
    request["gateway"] = {}
    request["speculative"] = {**request["speculative"], **speculative}
    return plan_dict(request, EXAMPLES)


PLAN = planned()
RENDERED = {s["name"]: hashlib.sha256(f"unit {s['name']}".encode()).hexdigest() for s in SLOTS}
GATEWAY_UNIT_SHA = hashlib.sha256(b"gateway unit").hexdigest()


def venv(lock: Path, changed: dict[str, str] | None = None) -> dict[str, Any]:
    """host_state's read of a venv installed from `lock` (distributions, its copy of the lock), `changed` by hand."""
    text = lock.read_text()
    return {"python": "/opt/venv/bin/python", "python_version": "3.12.3",
            "distributions": {**locks.parse(text).packages, **(changed or {})},
            "lock": {"exists": True, "sha256": locks.sha256(text)}}


def unit_file(sha: str) -> dict[str, Any]:
    return {"exists": True, "kind": "file", "sha256": sha, "mode": "0644", "owner": "root", "group": "root"}


def secret() -> dict[str, Any]:
    return {"exists": True, "kind": "file", "mode": "0600", "owner": "root", "group": "root", "matches": True}


def record(index: int, plan: dict[str, Any] = PLAN) -> dict[str, Any]:
    """A replica's deployment record as sglang_service writes it after its gates."""
    replica = rollout.replica_plan(plan, index)
    rec = serving.record(plan=replica, engine_info={"name": "sglang", "version": "0.5.23", "venv": "/opt/sglang/venv"},
                         models=MANIFESTS, driver={"kernel_module": "595.71.05", "user_space": "595.71.05"},
                         unit={"name": SLOTS[index]["name"], "sha256": RENDERED[SLOTS[index]["name"]],
                               "backup": None},
                         deployed_at=DEPLOYED, journal="", previous=None,
                         gates={"state": "ready", "detail": "generated 16 tokens",
                                "unit": {"InvocationID": f"inv{index}"}},
                         load={"inputs": {"prompts": ["code"]}, "figures": FIGURES})
    return rec


def host(replicas: int = 4, plan: dict[str, Any] = PLAN) -> dict[str, Any]:
    """host_state_current of ct200 as a gateway deploy of `plan` leaves it: `replicas` replica units running their
    recorded units, the gateway routing to each, every /health 200, venvs from their locks, no deploy lock."""
    files: dict[str, Any] = {
        ENV: {"exists": True, "kind": "dir", "children": {f"{s['name'][:-8]}.env": secret() for s in SLOTS[:replicas]}},
        f"{ENV}/smg-gateway": {"exists": True, "kind": "dir", "children": {"api-key": secret(),
                                                                             "control-plane-key": secret()}},
        GATEWAY_PATHS["unit"]: unit_file(GATEWAY_UNIT_SHA),
        STATE: {"exists": True, "kind": "dir", "children": {
            "smg-gateway.json": {"exists": True, "kind": "file", "json": {
                "deployed_at": DEPLOYED, "smg": "1.13.0", "venv": "/opt/smg/venv", "unit_sha256": GATEWAY_UNIT_SHA,
                "endpoint": "0.0.0.0:30000", "workers": [r["url"] for r in plan["replicas"]][:replicas]}},
            "smg-gateway.load.json": {"exists": True, "kind": "file", "json": {
                "recorded_at": "2026-12-06T08:30:00Z", "load": {"figures": FIGURES}}}}},
        SERVICE_PATHS["unit"]: {"exists": True, "kind": "file", "sha256": "c3" * 32, "mode": "0644", "owner": "root",
                                "group": "root"},
    }
    units: dict[str, Any] = {SERVICE: {"ActiveState": "inactive", "UnitFileState": "disabled"},
                             GATEWAY: {"ActiveState": "active", "UnitFileState": "enabled"}}
    health = {"http://127.0.0.1:30000/health": {"status": 200, "error": ""}}
    for s in SLOTS[:replicas]:
        i = int(s["index"])
        files[s["unit"]] = unit_file(RENDERED[s["name"]])
        files[s["state_dir"]] = {"exists": True, "kind": "dir",
                                 "children": {"deployment.json": {"exists": True, "kind": "file",
                                                                  "json": record(min(i, len(plan["replicas"]) - 1),
                                                                                 plan)}}}
        units[s["name"]] = {"ActiveState": "active", "UnitFileState": "enabled", "InvocationID": f"inv{i}"}
        health[f"http://127.0.0.1:{30001 + i}/health"] = {"status": 200, "error": ""}
    workers = [{"url": r["url"], "id": f"w{r['index']}", "status": "ready", "healthy": True}
               for r in plan["replicas"][:replicas]]
    return {"files": files, "units": units, "health": health,
            "venvs": {"/opt/sglang/venv": venv(ENGINE_LOCK), "/opt/smg/venv": venv(GATEWAY_LOCK)},
            "gateway": {"asked": True, "url": "http://127.0.0.1:30000", "status": 200, "error": "", "workers": workers}}


def inputs(state: dict[str, Any], plan: dict[str, Any] | None = PLAN, **changes: Any) -> dict[str, Any]:
    """What playbooks/status.yml gathers for ct200 (pro6000: its own gateway, no other host behind it)."""
    base: dict[str, Any] = {
        "host": "ct200", "now": NOW, "state": state, "plan": plan, "plan_error": "", "through_gateway": True,
        "service": {"name": SERVICE, "paths": SERVICE_PATHS, "url": "http://127.0.0.1:30000"},
        "slots": SLOTS, "slot_urls": rollout.state_inputs(SLOTS, {})["urls"],
        "slot_health": [f"http://127.0.0.1:{30001 + i}/health" for i in range(8)],
        "rendered": {c["name"]: RENDERED[c["name"]] for c in status.candidates(plan, SLOTS, SERVICE, SERVICE_PATHS,
                                                                                True)},
        "engine": {"name": "sglang", "version": "0.5.23",
                   "lock": locks.venv_status(state, "/opt/sglang/venv", ENGINE_LOCK.read_text(), "sglang", "ct200",
                                             ENGINE_LOCK.name)},
        "models": MANIFESTS,
        "gateway": {"host": "ct200", "here": True, "name": GATEWAY, "paths": GATEWAY_PATHS, "version": "1.13.0",
                    "lock": locks.venv_status(state, "/opt/smg/venv", GATEWAY_LOCK.read_text(), "smg", "ct200",
                                              GATEWAY_LOCK.name),
                    "record": f"{STATE}/smg-gateway.json", "load_record": f"{STATE}/smg-gateway.load.json",
                    "rendered": GATEWAY_UNIT_SHA,
                    "health_url": "http://127.0.0.1:30000/health", "routes": state.get("gateway"),
                    "peer_workers": [], "peers_missing": []},
        "lock": {"path": LOCK_PATH, "stale_after_s": 900},
    }
    return base | changes


def test_a_converged_host_is_said_so_with_every_replica_routed_healthy_and_as_planned() -> None:
    rep = status.report(inputs(host()))
    assert rep["drift"] == [] and rep["drifted"] is False and rep["notes"] == [], rep["drift"] + rep["notes"]
    assert rep["plan"]["changes"] == []
    assert rep["plan"]["in_force"]["topology"] == "gateway" and rep["plan"]["in_force"]["replicas"] == 4
    assert rep["plan"]["in_force"]["speculative"] == {"algorithm": "DFLASH", "block_size": 16, "draft_window": 16,
                                                      "max_draft_tokens": 16, "tree_budget": None}
    assert [(r["name"], r["ActiveState"], r["routed"], r["health"]["status"], r["unit_file"])
            for r in rep["replicas"]] == [(f"sglang-qwen-r{i}.service", "active", True, 200, "matches")
                                         for i in range(4)]
    assert rep["engine"]["lock"]["in_sync"] and rep["gateway"]["lock"]["in_sync"]
    assert rep["load"]["replicas"]["sglang-qwen-r0.service"]["age_s"] == 7200
    assert rep["load"]["gateway"]["age_s"] == 5400 and rep["lock"] is None
    assert rep["models"]["served"] == MANIFESTS


def test_the_table_names_each_concern_on_its_own_line() -> None:
    out = status.lines(status.report(inputs(host())), ["proxmox_containers", "pro6000"])
    assert out[0] == "ct200 (pro6000): as the inventory says: a deploy would change nothing"
    assert out[1] == (f"engine: sglang 0.5.23 at /opt/sglang/venv, in sync with {ENGINE_LOCK.name} (sha256 "
                      f"{locks.sha256(ENGINE_LOCK.read_text())[:16]})")
    assert out[2].startswith(f"gateway: smg 1.13.0 at /opt/smg/venv, in sync with {GATEWAY_LOCK.name}")
    assert out[2].endswith("smg-gateway.service active/enabled, /health 200, unit as planned, deployed "
                           "2026-12-06T08:00:00+00:00, routes to 4 worker(s)")
    assert out[3] == ("plan in force: tp 2 x 4 replica(s) through the gateway, DFLASH block 16, draft tokens 16, "
                      "sglang 0.5.23")
    assert out[4] == "inventory's plan: the same"
    assert out[5] == ("replica 0: sglang-qwen-r0.service active/enabled, routed (ready, healthy), /health 200, "
                      "unit as planned, deployed 2026-12-06T08:00:00+00:00")
    assert out[9] == (f"models: target /root/models/Qwen3.6-27B manifest {'a1' * 8}, draft "
                      f"/root/models/Qwen3.6-27B-DFlash manifest {'b2' * 8}")
    assert out[10] == ("load gate of sglang-qwen-r0.service (2026-12-06T08:00:00+00:00, 2.0 h ago): at "
                       "concurrency 32: 32 requests, 0 failed, 812.4 output tok/s, 6.3 req/s, acceptance length 3.1 "
                       "(verify count 410)")
    assert out[14].startswith("load gate through the gateway (2026-12-06T08:30:00Z, 90 min ago): at concurrency 32")
    assert out[-1] == "deploy lock: free"


def drifted() -> dict[str, Any]:
    """ct200 after every kind of drift at once: replica 1 stopped (failed), replica 2's unit edited by hand and
    drained from the gateway, a stranger worker in the gateway, replica 4 of an older plan still running, the
    single-process unit started again, the engine's venv changed by hand, the gateway's unit changed by hand."""
    state = host(5)
    state["units"]["sglang-qwen-r1.service"] = {"ActiveState": "failed", "UnitFileState": "enabled"}
    state["health"]["http://127.0.0.1:30002/health"] = {"status": None, "error": "[Errno 111] Connection refused"}
    state["files"][SLOTS[2]["unit"]]["sha256"] = "d4" * 32
    state["gateway"]["workers"] = [w for w in state["gateway"]["workers"] if w["url"] != "http://127.0.0.1:30003"]
    state["gateway"]["workers"].append({"url": "http://ct209.lab:30001", "id": "x", "status": "ready", "healthy": True})
    state["units"][SERVICE] = {"ActiveState": "active", "UnitFileState": "enabled"}
    state["venvs"]["/opt/sglang/venv"] = venv(ENGINE_LOCK, {"sglang": "0.5.22"})
    state["files"][GATEWAY_PATHS["unit"]]["sha256"] = "e5" * 32
    return state


def test_a_drifted_host_names_each_drift_with_what_was_expected_and_found() -> None:
    rep = status.report(inputs(drifted()))
    drift = rep["drift"]
    assert rep["drifted"] is True
    expected = [
        f"engine venv /opt/sglang/venv: expected exactly {ENGINE_LOCK.name} (sglang==0.5.23), found sglang 0.5.22 -> "
        "0.5.23",
        "sglang-qwen-r1.service: expected active and enabled, found failed/enabled",
        "sglang-qwen-r2.service: its unit differs from what the inventory's plan renders (a deploy restarts it)",
        "sglang-qwen-r2.service (http://127.0.0.1:30003): expected among the workers smg-gateway.service routes to, "
        "found missing (a deploy adds it back)",
        "sglang-qwen-r4.service: runs beyond the plan's 4 replica(s) (a deploy drains, stops and disables it)",
        "sglang-qwen.service: the single process (--dp-size) runs, the plan serves through the gateway (a deploy "
        "backs it up, stops and disables it)",
        "smg-gateway.service: routes to http://ct209.lab:30001, a worker the plan does not have (a deploy removes it)",
    ]
    for line in expected:
        assert line in drift, (line, drift)
    assert any(d.startswith("smg-gateway.service: its unit differs from the one its deploy recorded (sha256 "
                            f"{GATEWAY_UNIT_SHA[:16]}, found {'e5' * 8})") for d in drift), drift
    by_name = {r["name"]: r for r in rep["replicas"]}
    assert by_name["sglang-qwen-r2.service"]["routed"] is False and by_name["sglang-qwen-r2.service"]["unit_file"] \
        == "differs"
    assert by_name["sglang-qwen-r4.service"]["planned"] is False
    assert rep["gateway"]["unknown_workers"] == ["http://ct209.lab:30001"]
    table = status.lines(rep)
    assert table[0] == f"ct200: DRIFTED, a deploy would change {len(drift)} thing(s)"
    assert "replica 2: sglang-qwen-r2.service active/enabled, NOT routed by the gateway, /health 200, unit DIFFERS " \
           "from the plan, deployed 2026-12-06T08:00:00+00:00" in table
    assert [line for line in table if line.startswith("drift: ")] == [f"drift: {d}" for d in drift]


def test_an_active_replica_that_does_not_answer_its_health_is_drift() -> None:
    state = host()
    state["health"]["http://127.0.0.1:30004/health"] = {"status": 503, "error": "Service Unavailable"}
    assert status.report(inputs(state))["drift"] == [
        "sglang-qwen-r3.service: expected http://127.0.0.1:30004/health to answer 200, found 503"]


def test_a_changed_inventory_plan_is_named_setting_by_setting_and_by_argv() -> None:
    candidate = planned(block_size=8, draft_window=8, max_draft_tokens=8)
    rep = status.report(inputs(host(), plan=candidate))
    assert "speculative.block_size 16 -> 8" in rep["plan"]["changes"], rep["plan"]["changes"]
    assert "speculative.max_draft_tokens 16 -> 8" in rep["plan"]["changes"]
    # A smaller draft block holds the capacity on one GPU: the planner makes it tp 1 x 8 replicas.
    assert rep["plan"]["changes"][:2] == ["tp_size 2 -> 1", "replicas 4 -> 8"]
    # The four running replicas' argv change alike: named once.
    (argv,) = [c for c in rep["plan"]["changes"] if c.startswith("argv of ")]
    assert argv.startswith("argv of sglang-qwen-r0.service, sglang-qwen-r1.service, sglang-qwen-r2.service, "
                           "sglang-qwen-r3.service: --context-length 262144 -> "), argv
    assert "--speculative-dflash-block-size 16 -> 8" in argv and "--tp-size 2 -> 1" in argv
    assert "plan: speculative.block_size 16 -> 8" in rep["drift"]
    assert rep["plan"]["inventory"]["speculative"]["block_size"] == 8
    assert (f"inventory's plan: tp 1 x 8 replica(s) through the gateway, DFLASH block 8, draft tokens 8, sglang "
            f"0.5.23; differs in {len(rep['plan']['changes'])} way(s), each under drift") in status.lines(rep)


def test_fewer_replicas_in_the_plan_and_a_gateway_of_another_plan_are_named() -> None:
    state = host(4)
    smaller = copy.deepcopy(PLAN)
    smaller["replicas"], smaller["dp_size"] = smaller["replicas"][:2], 2
    smaller["gateway"]["workers"] = smaller["gateway"]["workers"][:2]
    rep = status.report(inputs(state, plan=smaller))
    assert "replicas 4 -> 2" in rep["plan"]["changes"]
    assert "sglang-qwen-r3.service: runs beyond the plan's 2 replica(s) (a deploy drains, stops and disables it)" \
        in rep["drift"]
    assert ("smg-gateway.service: its unit names the workers of another plan (the plan adds none, removes "
            "['http://127.0.0.1:30003', 'http://127.0.0.1:30004']; a deploy restarts it)") in rep["drift"]


def test_a_host_without_records_says_so_and_what_a_deploy_would_do() -> None:
    state: dict[str, Any] = {"files": {}, "units": {}, "health": {}, "venvs": {},
                             "gateway": {"asked": True, "url": "http://127.0.0.1:30000", "status": None,
                                         "error": "[Errno 111] Connection refused", "workers": []}}
    rep = status.report(inputs(state, models={}))
    assert rep["plan"]["in_force"] is None
    assert rep["plan"]["changes"] == ["no deployment record: a deploy serves the plan for the first time"]
    assert "sglang-qwen-r0.service: expected by the plan, found no unit (a deploy starts it)" in rep["drift"]
    assert f"engine venv /opt/sglang/venv: expected exactly {ENGINE_LOCK.name} (sglang==0.5.23), found no venv" \
        in rep["drift"]
    assert ("smg-gateway.service: expected its deployment record /var/lib/dflash-infra/smg-gateway.json, found none "
            "(a deploy writes it)") in rep["drift"]
    assert rep["notes"] == ["routes not read: http://127.0.0.1:30000/workers: [Errno 111] Connection refused"]
    assert rep["load"] == {"replicas": {}, "gateway": None} and rep["models"]["served"] == {}
    assert rep["lock"] is None and rep["gateway"]["deployed_at"] is None
    table = status.lines(rep)
    assert "plan in force: none (no deployment record)" in table
    assert all(r["routed"] is None for r in rep["replicas"])  # not judged without the gateway's answer


def test_a_read_without_the_gateway_section_judges_no_route() -> None:
    state = host()
    del state["gateway"]
    rep = status.report(inputs(state, gateway={**inputs(state)["gateway"], "routes": {"asked": False}}))
    assert rep["drift"] == [] and rep["notes"] == ["routes not read: host_state did not ask the gateway"]
    assert {r["routed"] for r in rep["replicas"]} == {None}


def test_a_host_fronted_by_a_gateway_not_in_the_run_is_not_judged_on_its_routes() -> None:
    rep = status.report(inputs(host(), gateway={**inputs(host())["gateway"], "here": False, "host": "ct200",
                                                "routes": None}))
    assert rep["gateway"] is None and rep["drift"] == []
    assert rep["notes"] == ["routes not read: the gateway's host is not in this run"]


def test_a_gateway_unit_other_than_the_plan_renders_is_drift_unless_a_fronted_host_is_missing() -> None:
    """A changed gateway setting (a routing policy, say) changes the unit the plan renders, not the workers: the unit
    on the host against that rendering names it; with a host it fronts out of the run, its workers are not known."""
    changed = {**inputs(host())["gateway"], "rendered": "9f" * 32}
    rep = status.report(inputs(host(), gateway=changed))
    assert rep["gateway"]["unit_file"] == "differs"
    assert "smg-gateway.service: its unit differs from what the inventory's plan renders (a deploy restarts it)" \
        in rep["drift"]
    rep = status.report(inputs(host(), gateway={**changed, "peers_missing": ["ct201"]}))
    assert rep["gateway"]["unit_file"] == "not rendered" and rep["drift"] == [], rep["drift"]


def test_a_plan_the_planner_refused_judges_no_replica_or_worker_against_it() -> None:
    """With no plan (a GPU missing, say) a deploy would refuse, not retire every replica or remove every worker."""
    rep = status.report(inputs(host(), plan=None, plan_error="expected 8 GPUs, found 7"))
    judged = [d for d in rep["drift"] if "beyond the plan" in d or "a worker the plan does not have" in d]
    assert judged == [], rep["drift"]
    assert "the inventory's plan could not be made: expected 8 GPUs, found 7" in rep["notes"]


def test_a_gateway_fronting_a_host_not_in_the_run_is_not_judged_on_its_workers() -> None:
    """status.yml -l ct200 with ct201 behind ct200's gateway: its recorded workers include ct201's, which this run did
    not plan; neither the record's workers nor the routes are drift."""
    state = host()
    recorded = state["files"][STATE]["children"]["smg-gateway.json"]["json"]
    recorded["workers"] = [*recorded["workers"], "https://ct201.internal:30001"]
    state["gateway"]["workers"].append({"url": "https://ct201.internal:30001", "id": "p0", "status": "ready",
                                        "healthy": True})
    rep = status.report(inputs(state, gateway={**inputs(state)["gateway"], "peers_missing": ["ct201"]}))
    assert rep["drift"] == [], rep["drift"]
    assert rep["notes"] == ["workers of ct201 not judged: not in this run"]


def test_the_deploy_lock_names_its_holder_and_the_age_of_its_heartbeat() -> None:
    state = host()
    holder = {"owner": "root", "controller": "ctl1", "pid": 4242, "started_at": "2026-12-06T09:40:00Z",
              "playbook": "Deploy the SGLang engine with the DFlash drafter"}
    state["files"][LOCK_PATH] = {"exists": True, "kind": "file", "json": holder}
    rep = status.report(inputs(state))
    assert rep["lock"]["describe"] == ("Deploy the SGLang engine with the DFlash drafter run by root on ctl1 (pid "
                                       "4242, since 2026-12-06T09:40:00Z)")
    assert rep["lock"]["age_s"] == 1200 and rep["lock"]["heartbeat"] is None
    assert status.lines(rep)[-1] == ("deploy lock: held by Deploy the SGLang engine with the DFlash drafter run by "
                                     "root on ctl1 (pid 4242, since 2026-12-06T09:40:00Z), 20 min ago; heartbeat not "
                                     "read")
    # A read that carries the file's modification time gives the heartbeat's age, and says when it is stale.
    state["files"][LOCK_PATH]["mtime"] = status.parse_time(NOW).timestamp() - 1000  # type: ignore[union-attr]
    rep = status.report(inputs(state))
    assert (rep["lock"]["heartbeat_age_s"], rep["lock"]["stale"]) == (1000, True)
    assert rep["drift"] == []  # a lock is a run in progress, not drift


def test_a_single_process_host_compares_its_one_unit() -> None:
    plan = plan_dict(yaml.safe_load((EXAMPLES / "pro6000.yml").read_text()), EXAMPLES)
    state = host(0)
    rec = record(0)
    rec["plan"], rec["args"] = plan, plan["args"]
    state["files"][SERVICE_PATHS["unit"]] = unit_file(RENDERED[SLOTS[0]["name"]])
    state["files"][SERVICE_PATHS["env_file"]] = secret()
    state["files"][STATE]["children"]["deployment.json"] = {"exists": True, "kind": "file", "json": rec}
    state["units"][SERVICE] = {"ActiveState": "active", "UnitFileState": "enabled"}
    state["units"][GATEWAY] = {"ActiveState": "inactive", "UnitFileState": "disabled"}
    rep = status.report(inputs(state, plan=plan, through_gateway=False,
                               rendered={SERVICE: RENDERED[SLOTS[0]["name"]]}))
    assert rep["drift"] == [] and rep["gateway"] is None, rep["drift"]
    assert rep["plan"]["in_force"]["topology"] == "single" and rep["plan"]["in_force"]["replicas"] == 4
    assert status.lines(rep)[2] == ("plan in force: tp 2 x dp 4 (one process), DFLASH block 16, draft tokens 16, "
                                    "sglang 0.5.23")
    assert status.lines(rep)[4].startswith("engine: sglang-qwen.service active/enabled, /health 200, unit as planned")
    # The inventory now serves through the gateway: the topology change is named, the single unit is to go.
    through = status.report(inputs(state, plan=PLAN))
    assert "topology single -> gateway" in through["plan"]["changes"]


def test_the_json_document_is_one_object_with_the_hosts_as_keys_between_its_markers() -> None:
    reports = {"ct200": status.report(inputs(host())), "ct201": status.report(inputs(drifted(), host="ct201"))}
    text = status.document(reports)
    lines = text.splitlines()
    assert lines[0] == status.MARKER_BEGIN and lines[-1] == status.MARKER_END
    # As the default callback prints it (the message indented): read back unchanged.
    framed = "ok: [ct200] => \n    msg: |-\n" + "\n".join("        " + line for line in lines) + "\n\nPLAY RECAP\n"
    found = status.extract(framed)
    assert found == json.loads(json.dumps(reports))
    assert set(found) == {"ct200", "ct201"}
    one = found["ct200"]
    assert set(one) == {"host", "at", "drifted", "drift", "notes", "engine", "gateway", "plan", "replicas", "models",
                        "load", "lock"}
    assert set(one["plan"]) == {"in_force", "inventory", "changes"}
    assert set(one["replicas"][0]) >= {"index", "name", "url", "ActiveState", "UnitFileState", "unit_file", "env_file",
                                       "routed", "route", "health", "deployed_at", "gates", "plan", "models"}
    assert found["ct201"]["drifted"] is True and found["ct201"]["drift"]


def test_candidates_are_the_units_the_deploy_would_render() -> None:
    found = status.candidates(PLAN, SLOTS, SERVICE, SERVICE_PATHS, True)
    assert [c["name"] for c in found] == [f"sglang-qwen-r{i}.service" for i in range(4)]
    assert found[1]["plan"]["gpu_ids"] == [2, 3] and found[1]["paths"]["unit"] == SLOTS[1]["unit"]
    assert status.candidates(PLAN, SLOTS, SERVICE, SERVICE_PATHS, False)[0]["name"] == SERVICE
    assert status.candidates(None, SLOTS, SERVICE, SERVICE_PATHS, True) == []


@pytest.mark.parametrize(("seconds", "text"), [(None, "age unknown"), (45, "45 s ago"), (600, "10 min ago"),
                                               (9000, "2.5 h ago"), (345600, "4.0 d ago")])
def test_ages_read_as_people_say_them(seconds: int | None, text: str) -> None:
    assert status.age_text(seconds) == text


# The playbook: read-only, no lock, one round trip per host.
PLAYBOOK = ROOT / "playbooks" / "status.yml"
# Modules and actions that run on the controller only (the host_state role's read is the one round trip).
CONTROLLER_ONLY = {"ansible.builtin.assert", "ansible.builtin.set_fact", "ansible.builtin.debug", "dflash_plan",
                   "dflash_role_arguments"}
ROLE_ENTRIES = {("host_state", "main"), ("serving_plan", "main"), ("sglang_service", "rendered"),
                ("smg_gateway", "rendered")}
TASK_KEYS = {"name", "vars", "when", "run_once", "tags", "register", "no_log", "changed_when", "check_mode",
             "block", "rescue", "always"}


def actions(tasks: list[dict[str, Any]], base: Path) -> list[str]:
    """Every module or role entry point a task list runs, through blocks, imported task files and roles."""
    out: list[str] = []
    for task in tasks or []:
        for key in ("block", "rescue", "always"):
            out += actions(task.get(key) or [], base)
        for key in ("ansible.builtin.import_role", "ansible.builtin.include_role"):
            if key in task:
                role, entry = task[key]["name"], task[key].get("tasks_from", "main")
                out.append(f"role {role}:{entry}")
                path = ROOT / "roles" / role / "tasks" / f"{entry}.yml"
                out += actions(yaml.safe_load(path.read_text()), path.parent)
        for key in ("ansible.builtin.import_tasks", "ansible.builtin.include_tasks"):
            if key in task:
                path = base / task[key]
                out.append(f"tasks {path.name}")
                out += actions(yaml.safe_load(path.read_text()), path.parent)
        modules = [k for k in task if k not in TASK_KEYS and not k.startswith(("ansible.builtin.import_",
                                                                                 "ansible.builtin.include_"))]
        out += modules
    return out


def test_status_playbook_takes_no_lock_and_runs_only_the_host_state_read_on_the_host() -> None:
    text = PLAYBOOK.read_text()
    assert "lock.yml" not in text and "dflash_host_lock:" not in text
    (play,) = yaml.safe_load(text)
    assert play["gather_facts"] is False
    ran = actions(play["tasks"], PLAYBOOK.parent)
    roles = {tuple(a.removeprefix("role ").split(":")) for a in ran if a.startswith("role ")}
    assert roles == ROLE_ENTRIES, roles
    modules = [a for a in ran if not a.startswith(("role ", "tasks "))]
    # dflash_host_state (the host_state role's read) is the one task that contacts the host.
    assert modules.count("dflash_host_state") == 1, modules
    assert set(modules) - {"dflash_host_state"} <= CONTROLLER_ONLY, modules
    # Nothing registers a change: every task's module reports changed=false by itself.
    assert "changed_when" not in text


def test_status_playbook_is_listed_where_the_docs_list_the_playbooks() -> None:
    assert "status.yml" in (ROOT / "README.md").read_text()
    assert "playbooks/status.yml" in (ROOT / "docs" / "architecture.md").read_text()
    assert "What runs where: status.yml" in (ROOT / "docs" / "serving.md").read_text()
