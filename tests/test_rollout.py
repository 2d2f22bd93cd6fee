"""One engine unit per replica (dflash_infra.rollout): the names and state folders of the slots, and what a gateway
deploy does to a host's engine units and in which order, decided from host_state."""

from __future__ import annotations

import re
from typing import Any

import pytest

from dflash_infra import rollout

ENV, STATE, LIBEXEC = "/etc/dflash-infra", "/var/lib/dflash-infra", "/usr/local/lib/dflash-infra"
SLOTS = rollout.slots("sglang-qwen.service", ENV, STATE, LIBEXEC)
LEGACY = [{"name": "sglang-qwen.service", "unit": "/etc/systemd/system/sglang-qwen.service"}]


def unit_sha(i: int) -> str:
    return f"{i:x}" * 64


def env_sha(i: int) -> str:
    return f"e{i:x}" * 32


def wanted(count: int, changed: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """The plan's replicas; those in `changed` render another unit than the host has."""
    return [{"index": s["index"], "name": s["name"], "unit": s["unit"], "env_file": s["env_file"],
             "unit_sha256": unit_sha(s["index"] + (1 if s["index"] in changed else 0)),
             "env_sha256": env_sha(s["index"])} for s in SLOTS[:count]]


def entry(sha: str, mode: str) -> dict[str, Any]:
    return {"exists": True, "kind": "file", "sha256": sha, "mode": mode, "owner": "root", "group": "root"}


def host(replicas: int, down: tuple[int, ...] = (), legacy: str = "") -> dict[str, Any]:
    """host_state of a host serving `replicas` replicas as the role leaves them (`down` ones stopped); `legacy`:
    the single-process unit's state ('active', 'enabled' or 'file')."""
    files: dict[str, Any] = {}
    units: dict[str, Any] = {}
    for s in SLOTS[:replicas]:
        files[s["unit"]] = entry(unit_sha(s["index"]), "0644")
        files[s["env_file"]] = entry(env_sha(s["index"]), "0600")
        units[s["name"]] = {"ActiveState": "inactive" if s["index"] in down else "active",
                            "UnitFileState": "enabled"}
    if legacy:
        files[LEGACY[0]["unit"]] = entry("f" * 64, "0644")
        units["sglang-qwen.service"] = {"ActiveState": "active" if legacy == "active" else "inactive",
                                        "UnitFileState": "enabled" if legacy in ("active", "enabled") else "disabled"}
    return {"files": files, "units": units}


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


def test_a_converged_host_is_left_alone() -> None:
    plan = rollout.rollout(host(4), wanted(4), LEGACY, SLOTS)
    assert plan["order"] == [] and plan["migrate"] == [] and plan["retire"] == [] and plan["outage"] == ""
    assert not plan["any"] and [r["action"] for r in plan["replicas"]] == ["keep"] * 4
    assert rollout.summary_lines(plan) == [f"sglang-qwen-r{i}.service: unchanged" for i in range(4)]


def test_a_changed_plan_restarts_the_replicas_one_at_a_time_each_drained_first() -> None:
    plan = rollout.rollout(host(4), wanted(4, changed=(0, 1, 2, 3)), LEGACY, SLOTS)
    assert plan["order"] == [0, 1, 2, 3] and all(r["drain"] for r in plan["replicas"])
    assert plan["outage"] == "" and plan["any"]
    assert rollout.summary_lines(plan)[0] == (
        "sglang-qwen-r0.service: drain from the gateway, restart on the new unit, gate, add back")


def test_a_replica_that_is_down_starts_before_any_running_one_leaves_the_gateway() -> None:
    plan = rollout.rollout(host(4, down=(2,)), wanted(4, changed=(0, 2)), LEGACY, SLOTS)
    assert plan["order"] == [2, 0]
    assert [(r["action"], r["drain"]) for r in plan["replicas"]] == [
        ("restart", True), ("keep", False), ("start", False), ("keep", False)]


def test_a_changed_environment_file_restarts_its_replica_only() -> None:
    state = host(2)
    state["files"][SLOTS[1]["env_file"]]["sha256"] = "0" * 64
    plan = rollout.rollout(state, wanted(2), LEGACY, SLOTS)
    assert plan["order"] == [1] and plan["replicas"][0]["action"] == "keep"


def test_a_single_replica_says_its_outage_up_front() -> None:
    plan = rollout.rollout(host(1), wanted(1, changed=(0,)), LEGACY, SLOTS)
    assert plan["outage"] == ("sglang-qwen-r0.service is the only replica: the endpoint is down while it restarts "
                              "(an outage that one replica cannot avoid)")
    assert rollout.summary_lines(plan)[-1].startswith("outage: sglang-qwen-r0.service is the only replica")
    # Two replicas, one restarting: the other serves.
    assert rollout.rollout(host(2), wanted(2, changed=(0,)), LEGACY, SLOTS)["outage"] == ""
    # One replica restarting while the other is down and starts first: the started one serves.
    assert rollout.rollout(host(2, down=(1,)), wanted(2, changed=(0,)), LEGACY, SLOTS)["outage"] == ""


def test_the_single_process_unit_is_migrated_first_and_its_outage_said() -> None:
    plan = rollout.rollout(host(0, legacy="active"), wanted(4), LEGACY, SLOTS)
    assert plan["migrate"] == [{"name": "sglang-qwen.service", "unit": LEGACY[0]["unit"], "active": True,
                                "enabled": True}]
    assert plan["order"] == [0, 1, 2, 3] and all(r["action"] == "start" for r in plan["replicas"])
    assert plan["outage"].startswith("sglang-qwen.service serves every GPU and must stop before the first replica")
    assert rollout.summary_lines(plan)[0] == (
        "sglang-qwen.service: back up, stop and disable (the single-process unit; replicas replace it)")
    # A unit file left stopped and disabled is still backed up and removed from the way, without an outage.
    left = rollout.rollout(host(4, legacy="file"), wanted(4), LEGACY, SLOTS)
    assert [m["active"] for m in left["migrate"]] == [False] and left["outage"] == "" and left["any"]


def test_replicas_beyond_the_plan_are_retired() -> None:
    plan = rollout.rollout(host(4), wanted(2), LEGACY, SLOTS)
    assert [r["name"] for r in plan["retire"]] == ["sglang-qwen-r2.service", "sglang-qwen-r3.service"]
    assert plan["order"] == [] and plan["any"]
    assert "sglang-qwen-r3.service: drain, stop and disable (beyond the plan's 2 replica(s))" in \
        rollout.summary_lines(plan)


def test_a_replica_disabled_at_boot_is_enabled_without_a_restart() -> None:
    state = host(2)
    state["units"]["sglang-qwen-r1.service"]["UnitFileState"] = "disabled"
    plan = rollout.rollout(state, wanted(2), LEGACY, SLOTS)
    assert plan["order"] == [] and plan["replicas"][1]["enable"] and plan["any"]


@pytest.mark.parametrize(("replicas", "message"), [
    ([], "a gateway plan has at least one replica, found none"),
    (wanted(3)[1:], "expected indexes 0..1 in order, found [1, 2]")])
def test_replicas_out_of_order_or_none_are_refused(replicas: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(rollout.RolloutError, match=re.escape(message)):
        rollout.rollout(host(0), replicas, LEGACY, SLOTS)
