"""One engine unit per replica (dflash_infra.rollout): the names and state folders of the slots, and what a gateway
deploy does to a host's engine units and in which order, decided from host_state."""

from __future__ import annotations

import re
from typing import Any

import pytest

from dflash_infra import rollout, serving

ENV, STATE, LIBEXEC = "/etc/dflash-infra", "/var/lib/dflash-infra", "/usr/local/lib/dflash-infra"
SLOTS = rollout.slots("sglang-qwen.service", ENV, STATE, LIBEXEC)
LEGACY = [{"name": "sglang-qwen.service", "unit": "/etc/systemd/system/sglang-qwen.service"}]


def wanted(count: int) -> list[dict[str, Any]]:
    """The plan's replicas as rollout takes them."""
    return [{"index": s["index"], "name": s["name"], "url": f"http://127.0.0.1:{30001 + s['index']}"}
            for s in SLOTS[:count]]


def host(replicas: int, down: tuple[int, ...] = (), legacy: str = "") -> dict[str, Any]:
    """host_state of a host serving `replicas` replicas as the role leaves them (`down` ones stopped); `legacy`:
    the single-process unit's state ('active', 'enabled', or 'file': stopped and disabled, as a migration leaves it)."""
    units: dict[str, Any] = {}
    for s in SLOTS[:replicas]:
        units[s["name"]] = {"ActiveState": "inactive" if s["index"] in down else "active",
                            "UnitFileState": "enabled"}
    if legacy:
        units["sglang-qwen.service"] = {"ActiveState": "active" if legacy == "active" else "inactive",
                                        "UnitFileState": "enabled" if legacy in ("active", "enabled") else "disabled"}
    return {"files": {}, "units": units}


def test_the_slots_are_named_by_index_each_with_its_own_state_folder() -> None:
    assert len(SLOTS) == rollout.MAX_REPLICAS == 8
    r2 = SLOTS[2]
    assert (r2["name"], r2["unit"], r2["env_file"]) == (
        "sglang-qwen-r2.service", "/etc/systemd/system/sglang-qwen-r2.service", f"{ENV}/sglang-qwen-r2.env")
    assert (r2["state_dir"], r2["record"], r2["last_good"]) == (
        f"{STATE}/sglang-qwen-r2", f"{STATE}/sglang-qwen-r2/deployment.json", f"{STATE}/sglang-qwen-r2/units/last-good")
    assert r2["sglang_ready"] == f"{LIBEXEC}/sglang-ready"  # the helpers are shared
    assert len({s["state_dir"] for s in SLOTS}) == 8 and STATE not in {s["state_dir"] for s in SLOTS}


@pytest.mark.parametrize(("name", "index", "message"), [
    ("sglang qwen", 0, "ending in .service, found 'sglang qwen'"),
    ("sglang-qwen.service", 8, "replica index: expected 0-7, found 8"),
    ("sglang-qwen.service", True, "replica index: expected 0-7, found True")])
def test_a_replica_unit_that_cannot_be_named_is_refused(name: str, index: Any, message: str) -> None:
    with pytest.raises(rollout.RolloutError, match=re.escape(message)):
        rollout.replica_unit(name, index)


def test_running_replicas_take_their_turn_in_index_order_and_nothing_else_is_touched() -> None:
    plan = rollout.rollout(host(4), wanted(4), LEGACY, SLOTS)
    assert plan["order"] == [0, 1, 2, 3] and [r["action"] for r in plan["replicas"]] == ["roll"] * 4
    assert plan["migrate"] == [] and plan["retire"] == [] and plan["outage"] == "" and plan["single_outage"] == ""
    assert plan["replicas"][2]["url"] == "http://127.0.0.1:30003"
    assert rollout.summary_lines(plan)[0] == (
        "sglang-qwen-r0.service: when its unit changed: drain from the gateway, restart, gate, add back")


def test_a_replica_that_is_down_starts_before_any_running_one_leaves_the_gateway() -> None:
    plan = rollout.rollout(host(4, down=(2,)), wanted(4), LEGACY, SLOTS)
    assert plan["order"] == [2, 0, 1, 3]
    assert [r["action"] for r in plan["replicas"]] == ["roll", "roll", "start", "roll"]
    assert rollout.summary_lines(plan)[0] == "sglang-qwen-r2.service: start (not running)"


def test_a_single_replica_says_its_outage() -> None:
    plan = rollout.rollout(host(1), wanted(1), LEGACY, SLOTS)
    assert plan["single_outage"] == ("sglang-qwen-r0.service is the only replica: the endpoint is down while it "
                                     "restarts (an outage that one replica cannot avoid)")
    assert rollout.rollout(host(2), wanted(2), LEGACY, SLOTS)["single_outage"] == ""
    # Behind a gateway that also fronts another host's replicas, one replica restarting is no outage.
    assert rollout.rollout(host(1), wanted(1), LEGACY, SLOTS, shared=True)["single_outage"] == ""


def test_the_single_process_unit_is_migrated_first_and_its_outage_said() -> None:
    plan = rollout.rollout(host(0, legacy="active"), wanted(4), LEGACY, SLOTS)
    assert plan["migrate"] == [{"name": "sglang-qwen.service", "unit": LEGACY[0]["unit"], "active": True,
                                "enabled": True}]
    assert plan["order"] == [0, 1, 2, 3] and all(r["action"] == "start" for r in plan["replicas"])
    assert plan["outage"].startswith("sglang-qwen.service serves every GPU and must stop before the first replica")
    assert plan["single_outage"] == ""
    assert rollout.summary_lines(plan)[0] == (
        "sglang-qwen.service: back up, stop and disable (the single-process unit; replicas replace it)")
    assert rollout.summary_lines(plan)[-1].startswith("outage: sglang-qwen.service serves every GPU")
    # Enabled at boot but stopped: still stopped and disabled, without an outage.
    enabled = rollout.rollout(host(4, legacy="enabled"), wanted(4), LEGACY, SLOTS)
    assert [m["enabled"] for m in enabled["migrate"]] == [True] and enabled["outage"] == ""
    # Stopped and disabled, as the migration leaves it (its file kept as the backup): left alone.
    assert rollout.rollout(host(4, legacy="file"), wanted(4), LEGACY, SLOTS)["migrate"] == []


def test_replicas_beyond_the_plan_are_retired_with_the_url_the_gateway_knows_them_by() -> None:
    urls = rollout.state_inputs(SLOTS, {})["urls"]
    plan = rollout.rollout(host(4), wanted(2), LEGACY, SLOTS, urls)
    assert [(r["name"], r["url"]) for r in plan["retire"]] == [
        ("sglang-qwen-r2.service", "http://127.0.0.1:30003"), ("sglang-qwen-r3.service", "http://127.0.0.1:30004")]
    assert plan["order"] == [0, 1]
    assert "sglang-qwen-r3.service: drain, stop and disable (beyond the plan's 2 replica(s))" in \
        rollout.summary_lines(plan)
    assert rollout.present_units(host(4), ["smg-gateway.service", *[s["name"] for s in SLOTS]]) == [
        f"sglang-qwen-r{i}.service" for i in range(4)]


def test_host_state_reads_every_slot_where_the_gateway_reaches_it() -> None:
    inputs = rollout.state_inputs(SLOTS, {"worker_host": "127.0.200.1", "worker_base_port": 31000})
    assert inputs["units"] == [s["name"] for s in SLOTS]
    assert inputs["ports"] == [31000 + i for i in range(8)] + [29000]
    assert inputs["health"][7] == {"url": "http://127.0.200.1:31007/health", "timeout": 3}
    assert {"path": f"{STATE}/sglang-qwen-r5", "children": True} in inputs["files"]
    assert {"path": SLOTS[5]["unit"]} in inputs["files"] and len(inputs["files"]) == 24


def test_a_host_another_gateway_fronts_reads_its_replicas_itself_and_is_drained_by_their_remote_url() -> None:
    inputs = rollout.state_inputs(SLOTS, {"remote": True, "worker_host": "0.0.0.0", "worker_address": "ct201.internal"})
    assert inputs["urls"][1] == "http://ct201.internal:30002"  # the gateway's name for it: drained and retired by it
    assert inputs["health"][1] == {"url": "http://127.0.0.1:30002/health", "timeout": 3}  # read on the host itself


FRONTED = {"ct200": "ct200", "ct201": "ct200", "ct129": "ct129"}


@pytest.mark.parametrize(("host", "gateway_host", "play", "through", "problem"), [
    ("ct200", "ct200", ["ct200", "ct201"], True, ""),
    ("ct201", "ct200", ["ct200", "ct201"], True, ""),
    ("ct129", "ct129", ["ct129"], True, ""),
    ("ct129", "ct129", ["ct129"], False, ""),
    ("ct200", "ct200", ["ct200"], True,
     "ct200: its gateway also fronts the replicas of ct201, not in this run; run with -l ct200,ct201"),
    ("ct201", "ct200", ["ct201"], True,
     "ct201: its replicas are served by ct200's gateway, which is not in this run; run with -l ct200,ct201"),
    ("ct201", "ct300", ["ct201"], True, "ct201: dflash_gateway_host 'ct300' is not a container of the inventory"),
    ("ct129", "ct201", ["ct129", "ct201"], True,
     "ct129: dflash_gateway_host is ct201, whose own replicas are fronted by ct200"),
    ("ct201", "ct200", ["ct200", "ct201"], False,
     "ct201: dflash_gateway_host is ct200, but ct201 serves without the gateway"),
])
def test_a_serving_group_of_several_hosts_is_deployed_together(host: str, gateway_host: str, play: list[str],
                                                               through: bool, problem: str) -> None:
    found = rollout.gateway_topology(host, gateway_host, FRONTED, play, through)
    assert (found[0] if found else "").startswith(problem) and len(found) <= 1, found


@pytest.mark.parametrize(("host", "play", "scope", "problem"), [
    # The benchmark measures the endpoint where it is: the gateway's host, alone if need be.
    ("ct200", ["ct200"], "measure", ""),
    ("ct201", ["ct200", "ct201"], "measure",
     "ct201: its replicas are served by ct200's gateway, which is the endpoint to measure; run with -l ct200"),
    # A canary only on a serving group of one host: its promotion rolls that host's replicas alone.
    ("ct129", ["ct129"], "canary", ""),
    ("ct200", ["ct200", "ct201"], "canary",
     "ct200: its endpoint is served by the replicas of ct200, ct201 behind ct200's gateway; a canary's promotion "
     "would leave the other hosts' replicas on the baseline"),
    ("ct201", ["ct201"], "canary", "ct201: its endpoint is served by the replicas of ct200, ct201"),
    ("ct129", ["ct129"], "rollout",
     "ct129: dflash_run_scope: expected one of deploy, measure, canary, found 'rollout'"),
])
def test_what_a_run_does_decides_which_hosts_of_a_serving_group_it_needs(host: str, play: list[str], scope: str,
                                                                        problem: str) -> None:
    found = rollout.gateway_topology(host, FRONTED[host], FRONTED, play, True, scope)
    assert (found[0] if found else "").startswith(problem) and len(found) <= 1, found


def test_a_replica_runs_from_the_plan_with_its_own_argv_gpus_and_address() -> None:
    plan = {"tp_size": 2, "dp_size": 4, "args": ["--port", "30001"], "gpu_ids": list(range(8)),
            "serve": {"host": "0.0.0.0", "port": 30000, "served_model_name": "Qwen3.6-27B"},
            "replicas": [{"index": i, "gpu_ids": [2 * i, 2 * i + 1], "host": "127.0.0.1", "port": 30001 + i,
                          "url": f"http://127.0.0.1:{30001 + i}", "args": ["--port", str(30001 + i)]}
                         for i in range(4)]}
    one = rollout.replica_plan(plan, 3)
    assert (one["args"], one["gpu_ids"], one["dp_size"], one["tp_size"]) == (["--port", "30004"], [6, 7], 1, 2)
    assert one["serve"] == {"host": "127.0.0.1", "port": 30004, "served_model_name": "Qwen3.6-27B", "tls": False}
    assert plan["gpu_ids"] == list(range(8)) and plan["serve"]["port"] == 30000  # the plan itself is unchanged
    assert [w["name"] for w in rollout.wanted(plan, "sglang-qwen.service")] == [
        f"sglang-qwen-r{i}.service" for i in range(4)]
    with pytest.raises(rollout.RolloutError, match=re.escape("replica 4: the plan has 4 replica(s)")):
        rollout.replica_plan(plan, 4)


@pytest.mark.parametrize(("replicas", "message"), [
    ([], "a gateway plan has at least one replica, found none"),
    (wanted(3)[1:], "expected indexes 0..1 in order, found [1, 2]")])
def test_replicas_out_of_order_or_none_are_refused(replicas: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(rollout.RolloutError, match=re.escape(message)):
        rollout.rollout(host(0), replicas, LEGACY, SLOTS)


def test_each_replica_makes_the_shared_parts_once_and_restarts_for_a_new_launcher() -> None:
    """Behind the gateway the sglang_service role takes one turn per replica in one run, all decided from the
    host_state read before the first: the account, shared folders and helpers are made by the first turn only,
    and every replica restarts when the launcher (its ExecStart runs it) is not this one."""
    from dflash_infra import serving

    slots = rollout.slots("sglang-qwen.service", "/etc/dflash-infra", "/var/lib/dflash-infra",
                          "/usr/local/lib/dflash-infra", 2)
    helpers = {"sglang-launch": "a" * 64, "sglang-ready": "b" * 64, "verify-unit": "c" * 64}
    account = {"user": "sglang", "group": "sglang", "home": "/var/lib/sglang"}
    fresh: dict[str, object] = {"files": {}, "accounts": {}, "units": {}}
    first = serving.service_todo(fresh, slots[0], slots[0]["name"], account, helpers)
    assert first["group"] and first["user"] and first["launcher"]
    assert first["helpers"] == list(helpers) and "/usr/local/lib/dflash-infra" in [d["path"] for d in first["dirs"]]
    done = serving.service_done({}, first, slots[0])
    second = serving.service_todo(fresh, slots[1], slots[1]["name"], account, helpers, done)
    assert not second["group"] and not second["user"] and second["helpers"] == []
    # Its own state folders are still to make; the shared helper and secrets folders are not.
    assert [d["path"] for d in second["dirs"]] == ["/var/lib/dflash-infra/sglang-qwen-r1",
                                                    "/var/lib/dflash-infra/sglang-qwen-r1/units"]
    assert second["launcher"]  # a new launcher restarts every replica, whoever copied it
    assert serving.service_done(done, second, slots[1])["helpers"] == done["helpers"]


def _converged_host(slot: dict[str, Any], helpers: dict[str, str], unit_sha: str) -> dict[str, Any]:
    """host_state of a host on which replica `slot` was deployed, gated and recorded, and still serves."""
    from dflash_infra import serving

    def file(sha: str, mode: str) -> dict[str, Any]:
        return {"exists": True, "kind": "file", "sha256": sha, "mode": mode, "owner": "root", "group": "root"}

    files: dict[str, Any] = {slot[key]: {"exists": True, "kind": "dir", "mode": mode, "owner": "root", "group": "root"}
                             for key, mode in serving.SERVICE_DIRS}
    files.update({f"{slot['libexec_dir']}/{name}": file(sha, "0755") for name, sha in helpers.items()})
    files[slot["unit"]] = file(unit_sha, "0644")
    # The secrets file: compared on the host with what the deploy would write (host_state's secrets), never hashed.
    files[slot["env_file"]] = {**file("", "0600"), "matches": True}
    del files[slot["env_file"]]["sha256"]
    files[slot["record"]] = {**file("f" * 64, "0644"), "json": {
        "unit_sha256": unit_sha, "deployed_at": "2026-12-02T16:00:00+00:00",
        "gates": {"state": "ready", "detail": "generated 16 tokens", "unit": {"InvocationID": "inv-1"}}}}
    return {"files": files,
            "accounts": {"groups": {"sglang": {"gid": 990}},
                         "users": {"sglang": {"home": "/var/lib/sglang", "shell": "/usr/sbin/nologin", "gid": 990}}},
            "units": {slot["name"]: {"ActiveState": "active", "UnitFileState": "enabled", "InvocationID": "inv-1"}},
            "health": {"http://127.0.0.1:30001/health": {"status": 200}}}


def test_a_replica_takes_no_turn_only_when_a_turn_would_do_nothing() -> None:
    """serving.service_converged, which lets a converged replica skip its turn of the rollout, says no to every
    single difference a full turn would act on: the unit or its secrets file, a helper, boot, a restart outside
    the deploy (another InvocationID), /health not 200, a record of another unit."""
    import copy

    from dflash_infra import serving

    slot = SLOTS[0]
    helpers = {"sglang-launch": "a" * 64, "sglang-ready": "b" * 64, "verify-unit": "c" * 64}
    account = {"user": "sglang", "group": "sglang", "home": "/var/lib/sglang"}
    unit_sha, url = "1" * 64, "http://127.0.0.1:30001"
    host = _converged_host(slot, helpers, unit_sha)

    def converged(state: dict[str, Any], unit: str = unit_sha) -> bool:
        return serving.service_converged(state, slot, slot["name"], account, helpers, unit, url)

    assert converged(host)
    assert serving.serves_as_recorded(host, host["files"][slot["record"]]["json"], slot["name"], url)
    assert not converged(host, unit="9" * 64)  # the plan renders another unit
    changes = {
        "a byte of the unit on the host": lambda s: s["files"][slot["unit"]].update(sha256="0" * 64),
        "the secrets file readable by others": lambda s: s["files"][slot["env_file"]].update(mode="0644"),
        "another API key (the host's comparison)": lambda s: s["files"][slot["env_file"]].update(matches=False),
        "a helper changed": lambda s: s["files"][f"{slot['libexec_dir']}/sglang-ready"].update(sha256="0" * 64),
        "not started at boot": lambda s: s["units"][slot["name"]].update(UnitFileState="disabled"),
        "restarted outside the deploy": lambda s: s["units"][slot["name"]].update(InvocationID="inv-2"),
        "not running": lambda s: s["units"][slot["name"]].update(ActiveState="failed"),
        "/health not 200": lambda s: s["health"].update({f"{url}/health": {"status": 503}}),
        "a record of another unit": lambda s: s["files"][slot["record"]]["json"].update(unit_sha256="0" * 64),
        "no record": lambda s: s["files"].pop(slot["record"]),
        "the service account gone": lambda s: s["accounts"]["users"].pop("sglang"),
    }
    for what, change in changes.items():
        state = copy.deepcopy(host)
        change(state)
        assert not converged(state), what
    # TLS files left over (worker TLS off, a run that died before the serve stage removed them) take no turn: the
    # serve stage removes them after its gates (rollout.tls_leftovers). Files it would write (TLS on) take one.
    leftover = copy.deepcopy(host)
    leftover["files"][slot["tls_cert"]] = {"exists": True, "kind": "file", "mode": "0600", "owner": "root",
                                           "group": "root", "matches": False}
    assert converged(leftover)
    assert not serving.service_converged(leftover, slot, slot["name"], account, helpers, unit_sha, url, True)
    # Why an engine the run did not restart is gated again, said where its gates are shown (after an automatic
    # rollback the engine it started is a process no record names).
    record = host["files"][slot["record"]]["json"]
    assert serving.not_as_recorded(host, record, slot["name"], url) == ""
    restored = copy.deepcopy(host)
    restored["units"][slot["name"]]["InvocationID"] = "inv-2"
    assert serving.not_as_recorded(restored, record, slot["name"], url) == (
        "the running engine is invocation inv-2, the record names inv-1 (a rollback or systemd started it since)")
    assert serving.not_as_recorded(host, None, slot["name"], url) == "no deployment record names the running engine"
    unhealthy = copy.deepcopy(host)
    unhealthy["health"][f"{url}/health"] = {"status": 503}
    assert serving.not_as_recorded(unhealthy, record, slot["name"], url) == (
        "its /health answered 503 when the host was read")


def test_the_turns_are_the_running_replicas_and_the_converged_keep_their_record_in_the_summary() -> None:
    plan = {"serve": {"host": "127.0.0.1", "port": 30000}, "args": [], "gpu_ids": list(range(4)),
            "replicas": [{"index": i, "host": "127.0.0.1", "port": 30001 + i, "url": f"http://127.0.0.1:{30001 + i}",
                          "gpu_ids": [2 * i, 2 * i + 1], "args": ["--tp-size", "2"]} for i in range(2)]}
    state: dict[str, Any] = {"units": {SLOTS[1]["name"]: {"ActiveState": "active"}}, "files": {
        SLOTS[1]["record"]: {"exists": True, "kind": "file", "json": {
            "deployed_at": "2026-12-02T16:00:00+00:00", "gates": {"state": "ready"}}}}}
    decided = rollout.rollout(state, rollout.wanted(plan, "sglang-qwen.service"), LEGACY, SLOTS)
    turns = rollout.turns(decided, SLOTS, plan)
    assert [(t["index"], t["name"], t["plan"]["gpu_ids"]) for t in turns] == [(1, "sglang-qwen-r1.service", [2, 3])]
    assert turns[0]["paths"] == SLOTS[1] and turns[0]["plan"]["serve"]["port"] == 30002
    notes = rollout.converged_notes(state, [1], decided, SLOTS, plan)
    assert notes == [{"index": 1, "name": "sglang-qwen-r1.service", "url": "http://127.0.0.1:30002", "action": "roll",
                      "would": "", "gpu_ids": [2, 3], "restarted": False, "drained": False,
                      "gates": {"state": "ready"}, "deployed_at": "2026-12-02T16:00:00+00:00", "load": None}]


def _record_state(records: dict[str, Any], snapshots: tuple[str, ...] = ()) -> dict[str, Any]:
    files = {path: {"path": path, "exists": True, "json": doc} for path, doc in records.items()}
    for snapshot in snapshots:  # as host_state lists a units folder's children
        folder, _, name = snapshot.rpartition("/")
        files.setdefault(folder, {"path": folder, "exists": True, "kind": "dir", "children": {}})
        files[folder]["children"][name] = {"path": snapshot, "exists": True, "kind": "dir"}
    return {"files": files}


def test_an_on_demand_rollback_takes_the_replicas_whose_record_names_a_previous_deployment() -> None:
    all_slots = rollout.slots("sglang-qwen.service", "/etc/dflash", "/var/lib/dflash-infra", "/usr/local/libexec")
    urls = [f"http://127.0.0.1:{30001 + i}" for i in range(len(all_slots))]
    versions = "/root/models/.dflash-versions"
    previous = {"deployed_at": "2026-12-01T10:00:00", "unit_backup": "/var/lib/x/units/20261201-deployed",
                "unit_sha256": "ab" * 32,
                "models": {"target": {"path": f"{versions}/T/00aa", "manifest_sha256": "00aa" * 16},
                           "draft": {"path": f"{versions}/D/11bb", "manifest_sha256": "11bb" * 16}}}
    state = _record_state({
        all_slots[0]["record"]: {"deployed_at": "2026-12-02T09:00:00", "previous": previous},
        all_slots[1]["record"]: {"deployed_at": "2026-12-02T09:01:00", "previous": None},  # a first deployment
        all_slots[3]["record"]: {"deployed_at": "2026-12-02T09:03:00", "previous": previous}},
        snapshots=(previous["unit_backup"],))
    every = rollout.rollback_turns(state, all_slots, urls)
    assert every["problems"] == [] and [t["index"] for t in every["turns"]] == [0, 3]
    assert every["turns"][1] == {"index": 3, "name": "sglang-qwen-r3.service", "url": "http://127.0.0.1:30004",
                                 "from_url": "http://127.0.0.1:30004",
                                 "from": "2026-12-02T09:03:00", "to": "2026-12-01T10:00:00",
                                 "to_unit": "/var/lib/x/units/20261201-deployed", "to_unit_sha256": "ab" * 32,
                                 "to_models": previous["models"]}
    # The model versions they go back to, with the catalogue's names and configured paths (checked, then in use).
    catalogue = {"target": {"name": "T", "path": "/root/models/T"}, "draft": {"name": "D", "path": "/root/models/D"}}
    assert rollout.rollback_models([t["to_models"] for t in every["turns"]] + [{}], catalogue) == [
        {"name": "T", "path": "/root/models/T", "folder": f"{versions}/T/00aa", "manifest_sha256": "00aa" * 16},
        {"name": "D", "path": "/root/models/D", "folder": f"{versions}/D/11bb", "manifest_sha256": "11bb" * 16}]
    assert every["lines"][0] == ("sglang-qwen-r0.service: back from the deployment of 2026-12-02T09:00:00 to that of "
                                 "2026-12-01T10:00:00 (/var/lib/x/units/20261201-deployed)")
    # Asked for by index: only those; one with nothing to go back to is refused, naming what was found.
    assert [t["index"] for t in rollout.rollback_turns(state, all_slots, urls, [3])["turns"]] == [3]
    # The replicas a run restarted, exactly (the load gate through the gateway failed): none restarted is none back,
    # not every replica with a record (a gateway-only restart, or only another host's replicas restarted).
    assert rollout.rollback_turns(state, all_slots, urls, [], exactly=True) == {"turns": [], "problems": [],
                                                                                 "lines": []}
    assert [t["index"] for t in rollout.rollback_turns(state, all_slots, urls, [0], True)["turns"]] == [0]
    asked = rollout.rollback_turns(state, all_slots, urls, [1, 2, 9, "x"])
    assert asked["turns"] == [] and asked["problems"] == [
        "dflash_rollback_replicas: expected replica indices 0-7, found 9",
        "dflash_rollback_replicas: expected replica indices 0-7, found 'x'",
        "sglang-qwen-r1.service: expected a deployment record naming a previous deployment to go back to, found a "
        "record of 2026-12-02T09:01:00 that names no previous deployment with a unit snapshot; nothing to roll back to",
        "sglang-qwen-r2.service: expected a deployment record naming a previous deployment to go back to, found no "
        "deployment record; nothing to roll back to"]
    # A record naming a snapshot that is gone: refused (restoring nothing would stop the replica), not skipped.
    gone = _record_state({all_slots[0]["record"]: {"deployed_at": "2026-12-02T09:00:00", "previous": previous}})
    assert rollout.rollback_turns(gone, all_slots, urls)["problems"] == [
        "sglang-qwen-r0.service: expected the unit snapshot of its previous deployment at "
        "/var/lib/x/units/20261201-deployed, found nothing there; nothing to roll back to (its record names a "
        "snapshot that was removed)"]
    assert rollout.rollback_turns({}, all_slots, urls)["problems"] == [
        "no replica has a previous deployment to go back to (deployment.json's `previous` with a unit snapshot): "
        "nothing to roll back"]


def gateway_read(urls: list[str], status: int | None = 200) -> dict[str, Any]:
    """host_state's read of the gateway (module_utils/dflash_state/health.gateway_workers) routing to `urls`."""
    return {"asked": True, "url": "http://127.0.0.1:30000", "status": status,
            "error": "" if status else "[Errno 111] Connection refused",
            "workers": [{"url": u, "id": f"id-{i}", "status": "ready", "healthy": True} for i, u in enumerate(urls)]}


KEY_FILE = "/etc/dflash-infra/smg-gateway/api-key"
PEER = "https://ct201.lab:30001"


def test_a_replica_left_out_of_the_gateway_by_a_dead_run_goes_back_with_its_own_key() -> None:
    urls = [w["url"] for w in wanted(4)]
    state = {**host(4), "gateway": gateway_read([urls[0], urls[2], urls[3], PEER])}
    plan = rollout.rollout(state, wanted(4), LEGACY, SLOTS)
    out = rollout.reconcile(state, [*urls, PEER], plan, SLOTS, KEY_FILE)
    assert out["read"] is True and out["remove"] == []
    assert out["add"] == [{"url": urls[1], "name": "sglang-qwen-r1.service",
                           "env_file": f"{ENV}/sglang-qwen-r1.env", "key_file": None}]
    assert out["lines"] == [f"sglang-qwen-r1.service ({urls[1]}) is a worker of the plan the gateway does not route "
                            "to: added back once ready"]
    checked = rollout.reconcile(state, [*urls, PEER], plan, SLOTS, KEY_FILE, check=True)
    assert checked["add"] == out["add"] and checked["lines"] == [
        f"sglang-qwen-r1.service ({urls[1]}) is a worker of the plan the gateway does not route to: would be added "
        "back once ready (check mode)"]


def test_another_hosts_replica_goes_back_with_the_endpoints_key_and_a_worker_beyond_the_plan_is_removed() -> None:
    urls = [w["url"] for w in wanted(2)]
    stale = "http://127.0.0.1:30009"
    state = {**host(2), "gateway": gateway_read([*urls, stale])}
    out = rollout.reconcile(state, [*urls, PEER + "/"], rollout.rollout(state, wanted(2), LEGACY, SLOTS), SLOTS,
                            KEY_FILE)
    assert out["add"] == [{"url": PEER, "name": PEER, "env_file": None, "key_file": KEY_FILE}]
    assert out["remove"] == [stale]
    assert out["lines"][1] == f"{stale} is routed to but not a worker of the plan: removed"


def test_a_complete_gateway_and_the_replicas_this_run_rolled_or_retires_are_left_to_their_own_steps() -> None:
    urls = [w["url"] for w in wanted(4)]
    complete = {**host(4), "gateway": gateway_read(urls)}
    assert rollout.reconcile(complete, urls, rollout.rollout(complete, wanted(4), LEGACY, SLOTS), SLOTS,
                             KEY_FILE) == {"read": True, "add": [], "remove": [], "lines": []}
    # r1 missing at the read and rolled by this run's turn (which adds it back); r3 beyond a plan of 3, retired.
    state = {**host(4), "gateway": gateway_read([urls[0], urls[2], urls[3]])}
    plan = rollout.rollout(state, wanted(3), LEGACY, SLOTS, [w["url"] for w in wanted(8)])
    notes = [{"url": urls[1], "would": "roll"}, {"url": urls[0], "would": ""}]
    assert rollout.reconcile(state, urls[:3], plan, SLOTS, KEY_FILE, notes)["lines"] == []
    # A replica of a host it fronts, retired by that host's own rollout in this run: that retirement's.
    peer_retired = {**complete, "gateway": gateway_read([*urls, PEER])}
    peer_plan = {"replicas": [], "retire": [{"url": PEER}]}
    assert rollout.reconcile(peer_retired, urls, rollout.rollout(complete, wanted(4), LEGACY, SLOTS), SLOTS, KEY_FILE,
                             peers=[peer_plan])["remove"] == []


def test_a_gateway_not_read_is_left_to_its_own_start_and_said_so() -> None:
    assert rollout.reconcile(host(2), [], rollout.rollout(host(2), wanted(2), LEGACY, SLOTS), SLOTS,
                             KEY_FILE)["lines"] == []
    down = {**host(2), "gateway": gateway_read([], status=None)}
    out = rollout.reconcile(down, [w["url"] for w in wanted(2)], rollout.rollout(down, wanted(2), LEGACY, SLOTS),
                            SLOTS, KEY_FILE)
    assert (out["read"], out["add"], out["remove"]) == (False, [], [])
    assert out["lines"] == ["its workers were not read (http://127.0.0.1:30000/workers: [Errno 111] Connection "
                            "refused); a gateway that starts in this run registers every worker of its command line"]
    # An answer that is not a list of workers is not read as "routes to nothing" (which would add every replica).
    garbled = {**host(2), "gateway": {**gateway_read([]), "error": "GET /workers answered 200: {'workers': 'x'}"}}
    out = rollout.reconcile(garbled, [w["url"] for w in wanted(2)],
                            rollout.rollout(garbled, wanted(2), LEGACY, SLOTS), SLOTS, KEY_FILE)
    assert (out["read"], out["add"], out["remove"]) == (False, [], []), out
    assert "answered 200: {'workers': 'x'}" in out["lines"][0]


def test_the_check_before_a_rollback_takes_every_version_any_replica_goes_back_to() -> None:
    """Replicas can go back to different versions of a model (one rolled back alone earlier): the check before
    anything stops takes each, and a model the catalogue no longer has by its folder; promote takes one per model."""
    versions = "/root/models/.dflash-versions"
    catalogue = {"target": {"name": "T", "path": "/root/models/T"}}
    r0 = {"target": {"path": f"{versions}/T/00aa", "manifest_sha256": "00aa" * 16},
          "draft": {"path": f"{versions}/D/11bb", "manifest_sha256": "11bb" * 16}}
    r1 = {"target": {"path": f"{versions}/T/22cc", "manifest_sha256": "22cc" * 16}}
    assert rollout.rollback_models([r0, r1, r0], catalogue) == [
        {"name": "T", "path": "/root/models/T", "folder": f"{versions}/T/00aa", "manifest_sha256": "00aa" * 16}]
    assert rollout.rollback_models([r0, r1, r0], catalogue, every=True) == [
        {"name": "T", "path": "/root/models/T", "folder": f"{versions}/T/00aa", "manifest_sha256": "00aa" * 16},
        {"name": "draft", "path": f"{versions}/D/11bb", "folder": f"{versions}/D/11bb", "manifest_sha256": "11bb" * 16},
        {"name": "T", "path": "/root/models/T", "folder": f"{versions}/T/22cc", "manifest_sha256": "22cc" * 16}]
    assert rollout.rollback_models([{"target": "not a mapping"}, {}], catalogue, every=True) == []


def test_a_replicas_snapshot_that_is_gone_or_changed_is_named_before_any_replica_drains() -> None:
    turn = {"name": "sglang-qwen-r2.service", "to_unit": "/var/lib/x/units/20261201-deployed",
            "to_unit_sha256": "ab" * 32}
    good = {"exists": True, "isreg": True, "checksum": "ab" * 32}
    results = [{"item": turn, "stat": good},
               {"item": {**turn, "name": "sglang-qwen-r3.service"}, "stat": {"exists": False}},
               {"item": {**turn, "name": "sglang-qwen-r4.service"}, "stat": {**good, "isreg": False, "isdir": True}},
               {"item": {**turn, "name": "sglang-qwen-r5.service"}, "stat": {**good, "checksum": "cd" * 32}},
               {"item": {**turn, "name": "sglang-qwen-r6.service", "to_unit_sha256": None}, "stat": good}]
    assert rollout.snapshot_problems(results) == [
        "sglang-qwen-r3.service (/var/lib/x/units/20261201-deployed/sglang-qwen-r3.service): no such file",
        "sglang-qwen-r4.service (/var/lib/x/units/20261201-deployed/sglang-qwen-r4.service): something that is not "
        "a file",
        "sglang-qwen-r5.service (/var/lib/x/units/20261201-deployed/sglang-qwen-r5.service): a unit with sha256 "
        f"{'cd' * 8}, where the record names {'ab' * 8} (it changed after the snapshot was taken)"]


def test_an_on_demand_rollback_to_https_needs_the_certificate_and_key_its_unit_loads() -> None:
    """A previous deployment that served HTTPS (its record's plan.serve.tls) loads the replica's certificate and key
    as credentials of its unit: once a deployment without HTTPS passed its gates they are removed, and going back is
    refused naming them (systemd would not start the unit); with them there, or to a deployment without HTTPS, it
    goes."""
    all_slots = rollout.slots("sglang-qwen.service", "/etc/dflash", "/var/lib/dflash-infra", "/usr/local/libexec")
    urls = [f"https://127.0.0.1:{30001 + i}" for i in range(len(all_slots))]
    slot = all_slots[0]
    https = {"deployed_at": "2026-12-01T10:00:00", "unit_backup": "/var/lib/x/units/20261201-deployed",
             "plan": {"serve": {"host": "127.0.0.1", "port": 30001, "tls": True}}}
    records = {slot["record"]: {"deployed_at": "2026-12-02T09:00:00", "previous": https}}
    state = _record_state(records, snapshots=(https["unit_backup"],))
    refused = rollout.rollback_turns(state, all_slots, urls)
    assert refused["turns"] == [] and refused["problems"] == [
        f"sglang-qwen-r0.service: expected the TLS certificate and key that the unit of its previous deployment "
        f"(2026-12-01T10:00:00) loads, found {slot['tls_cert']}, {slot['tls_key']} gone (removed when a deployment "
        "without HTTPS passed its gates; to serve HTTPS again, deploy with dflash_worker_tls enabled)"]
    # The key alone still there: the certificate is named.
    state["files"]["/etc/dflash"] = {"path": "/etc/dflash", "exists": True, "kind": "dir",
                                     "children": {"sglang-qwen-r0.tls-key": {"path": slot["tls_key"], "exists": True}}}
    assert slot["tls_key"] not in rollout.rollback_turns(state, all_slots, urls)["problems"][0]
    assert slot["tls_cert"] in rollout.rollback_turns(state, all_slots, urls)["problems"][0]
    state["files"]["/etc/dflash"]["children"]["sglang-qwen-r0.tls-cert"] = {"path": slot["tls_cert"], "exists": True}
    back = rollout.rollback_turns(state, all_slots, urls)
    assert back["problems"] == [] and [t["index"] for t in back["turns"]] == [0]
    # Back to a deployment without HTTPS: its files are not needed.
    plain = _record_state({slot["record"]: {"deployed_at": "2026-12-02T09:00:00",
                                            "previous": {**https, "plan": {"serve": {"tls": False}}}}},
                          snapshots=(https["unit_backup"],))
    assert rollout.rollback_turns(plain, all_slots, urls)["problems"] == []
    assert serving.engine_tls_problem(plain, slot, None) == "" and serving.engine_tls_problem(plain, slot, "yes") == ""


def test_a_turn_that_switches_tls_drains_where_the_replica_is_served_now_and_adds_it_back_where_it_will_be() -> None:
    """The gateway reaches a replica at the scheme of its recorded deployment: a deploy that turns TLS on or off
    drains the old URL (the new one is not in the gateway yet) and adds the replica back at the new one; a failed
    gate's rollback and an on-demand rollback add it back where the deployment they go back to serves."""
    state = host(2)
    for slot, tls in ((SLOTS[0], True), (SLOTS[1], False)):
        state["files"][slot["record"]] = {"path": slot["record"], "exists": True,
                                          "json": {"deployed_at": "2026-12-02T09:00:00",
                                                   "plan": {"serve": {"port": 30001 + slot["index"], "tls": tls}}}}
    plan = rollout.rollout(state, wanted(2), LEGACY, SLOTS)
    assert [(r["from_url"], r["url"]) for r in plan["replicas"]] == [
        ("https://127.0.0.1:30001", "http://127.0.0.1:30001"), ("http://127.0.0.1:30002", "http://127.0.0.1:30002")]
    # No record (a replica not deployed yet) or one from before TLS: as planned, and plain HTTP.
    assert rollout.served_url("https://ct201:30001", None) == "https://ct201:30001"
    assert rollout.served_url("https://ct201:30001", {"plan": {"serve": {"port": 30001}}}) == "http://ct201:30001"
    assert rollout.served_url("", {"plan": {"serve": {"tls": True}}}) == ""
    # Back on demand from plain HTTP to an HTTPS deployment (its files still there).
    previous = {"deployed_at": "2026-12-01T10:00:00", "unit_backup": "/var/lib/x/units/20261201-deployed",
                "plan": {"serve": {"port": 30001, "tls": True}}}
    records = {SLOTS[0]["record"]: {"deployed_at": "2026-12-02T09:00:00", "previous": previous,
                                    "plan": {"serve": {"port": 30001, "tls": False}}}}
    back = _record_state(records, snapshots=(previous["unit_backup"],))
    back["files"][ENV] = {"path": ENV, "exists": True, "kind": "dir", "children": {
        name: {"path": f"{ENV}/{name}", "exists": True}
        for name in ("sglang-qwen-r0.tls-cert", "sglang-qwen-r0.tls-key")}}
    turns = rollout.rollback_turns(back, SLOTS, ["http://127.0.0.1:30001"], [0])
    assert turns["problems"] == [] and (turns["turns"][0]["from_url"], turns["turns"][0]["url"]) == (
        "http://127.0.0.1:30001", "https://127.0.0.1:30001")


def test_the_tls_files_of_replicas_that_serve_without_https_now_are_removed_after_the_gates() -> None:
    """rollout.tls_leftovers: the certificate and key still on the host of each replica whose plan serves without
    HTTPS (the serve stage removes them once every gate passed); a replica serving HTTPS keeps its own."""
    def file(path: str) -> dict[str, Any]:
        return {"path": path, "exists": True, "kind": "file", "mode": "0600", "owner": "root", "group": "root"}

    held = [SLOTS[0]["tls_cert"], SLOTS[0]["tls_key"], SLOTS[1]["tls_key"], SLOTS[2]["tls_cert"], SLOTS[2]["tls_key"]]
    state = {"files": {path: file(path) for path in held}}
    plan = {"replicas": [{"index": 0, "tls": False}, {"index": 1}, {"index": 2, "tls": True}, {"index": 3}]}
    assert rollout.tls_leftovers(state, SLOTS, plan) == [SLOTS[0]["tls_cert"], SLOTS[0]["tls_key"], SLOTS[1]["tls_key"]]
    assert rollout.tls_leftovers({"files": {}}, SLOTS, plan) == []
    assert rollout.tls_leftovers(state, SLOTS, {"replicas": []}) == []
