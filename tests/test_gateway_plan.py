"""The planner behind the SGLang Model Gateway: one engine per TP group (own GPUs, own port, no --dp-size) and the
gateway's argv, from a `gateway` section; its mistakes are errors naming the setting. The argvs against the real
parsers: tests/test_gateway_real_parser.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dflash_infra.planner import plan_dict, plan_table
from dflash_infra.planning import gateway

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def planned(name: str = "pro6000", gateway: Any = None, **serve: Any) -> dict[str, Any]:
    request = yaml.safe_load((EXAMPLES / f"{name}.yml").read_text())
    if gateway is not None:
        request["gateway"] = gateway
    request["serve"] = {**request["serve"], **serve}
    return plan_dict(request, EXAMPLES)


def test_without_a_gateway_the_plan_is_one_process_with_dp_size() -> None:
    plan = planned()
    assert plan["replicas"] == [] and plan["gateway"] == {}
    assert plan["args"][plan["args"].index("--dp-size") + 1] == "4"


def test_behind_a_gateway_each_tp_group_is_its_own_engine_on_loopback() -> None:
    plan = planned(gateway={})
    assert plan["errors"] == [] and (plan["tp_size"], plan["dp_size"]) == (2, 4)
    replicas = plan["replicas"]
    assert [(r["index"], r["gpu_ids"], r["cuda_visible_devices"], r["port"]) for r in replicas] == [
        (0, [0, 1], "0,1", 30001), (1, [2, 3], "2,3", 30002), (2, [4, 5], "4,5", 30003), (3, [6, 7], "6,7", 30004)]
    for r in replicas:
        argv = r["args"]
        assert "--dp-size" not in argv and argv[argv.index("--tp-size") + 1] == "2"
        assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == str(r["port"])
        assert [a for a in argv if a not in ("--port", str(r["port"]))] == \
            [a for a in replicas[0]["args"] if a not in ("--port", "30001")]
    assert plan["args"] == replicas[0]["args"]  # what the installed engine's flags are checked against
    gw = plan["gateway"]
    assert (gw["host"], gw["port"]) == ("0.0.0.0", 30000)
    assert gw["args"][:5] == ["--host", "0.0.0.0", "--port", "30000", "--worker-urls"]
    assert gw["args"][5:9] == [r["url"] for r in replicas]
    assert gw["args"][gw["args"].index("--policy") + 1] == "cache_aware"
    assert not any("key" in a for a in gw["args"])
    # smg's drain settle is no flag: it reaches smg-launch through the unit's environment (1 s, not smg's 5 s).
    assert gw["environment"] == {"SMG_DRAIN_SETTLE_SECS": "1"} and not any("settle" in a for a in gw["args"])
    table = plan_table(plan)
    assert "replica 3: GPUs 6,7 at http://127.0.0.1:30004" in table
    assert "gateway argv: smg launch --host 0.0.0.0 --port 30000 --worker-urls http://127.0.0.1:30001 " in table


def test_replicas_another_hosts_gateway_fronts_listen_where_it_reaches_them() -> None:
    plan = planned(gateway={"remote": True, "worker_host": "0.0.0.0", "worker_address": "ct201.internal"})
    assert plan["errors"] == []
    replicas = plan["replicas"]
    assert [(r["host"], r["url"], r["local_url"]) for r in replicas[:2]] == [
        ("0.0.0.0", "http://ct201.internal:30001", "http://127.0.0.1:30001"),
        ("0.0.0.0", "http://ct201.internal:30002", "http://127.0.0.1:30002")]
    assert replicas[0]["args"][replicas[0]["args"].index("--host") + 1] == "0.0.0.0"
    assert plan["gateway"]["workers"] == [r["url"] for r in replicas]
    # Its table names the gateway that fronts them, not an smg argv of its own (it runs none).
    table = plan_table(plan)
    assert "gateway argv" not in table and ("gateway: another host's, which fronts these replicas at "
                                            "http://ct201.internal:30001, http://ct201.internal:30002, ") in table
    assert "gateway argv: smg launch --host" in plan_table(planned(gateway={}))
    # The lab's shape: the container's own address, which is also what the gateway reaches.
    lab = planned(gateway={"remote": True, "worker_host": "127.0.201.1", "worker_address": "127.0.201.1"})
    assert lab["errors"] == [] and lab["replicas"][0]["url"] == lab["replicas"][0]["local_url"] == \
        "http://127.0.201.1:30001"


@pytest.mark.parametrize(("settings", "error"), [
    ({"worker_host": "0.0.0.0"}, "gateway.worker_host: 0.0.0.0 is not a loopback address"),
    ({"worker_address": "ct201.internal"}, "gateway.worker_address: 'ct201.internal' is only for replicas"),
    ({"remote": True, "worker_host": "0.0.0.0"}, "gateway.worker_address: the replicas of a remote gateway need"),
    ({"remote": True, "worker_host": "0.0.0.0", "worker_address": "http://ct201:1"}, "gateway.worker_address: the"),
    ({"remote": "yes"}, "gateway.remote: expected true or false, found 'yes'"),
])
def test_replicas_beyond_loopback_are_only_those_of_a_remote_gateway(settings: dict[str, Any], error: str) -> None:
    plan = planned(gateway=settings)
    assert any(e.startswith(error) for e in plan["errors"]), plan["errors"]


def test_a_gateway_fronts_other_hosts_replicas_after_its_own() -> None:
    section = planned(gateway={})["gateway"]
    more = gateway.with_workers(section, ["http://ct201.internal:30001", section["workers"][0]])
    assert more["workers"] == [*section["workers"], "http://ct201.internal:30001"]
    at = more["args"].index("--worker-urls") + 1
    assert more["args"][at:at + 5] == more["workers"] and more["args"][at + 5] == "--policy"
    assert {k: v for k, v in more.items() if k not in ("args", "workers")} == \
        {k: v for k, v in section.items() if k not in ("args", "workers")}
    assert gateway.with_workers(section, []) == section and gateway.with_workers({}, ["http://x:1"]) == {}


def test_the_eval_host_is_one_replica_behind_its_gateway() -> None:
    plan = planned("eval", gateway={"worker_base_port": 40000}, host="127.0.0.1", port=8080)
    assert plan["errors"] == [] and [r["gpu_ids"] for r in plan["replicas"]] == [[0, 1]]
    assert plan["gateway"]["args"][:6] == ["--host", "127.0.0.1", "--port", "8080", "--worker-urls",
                                           "http://127.0.0.1:40000"]


@pytest.mark.parametrize(("gateway", "serve", "error"), [
    ({"weights": 2}, {}, "gateway.weights: unknown setting; known: worker_host, worker_base_port"),
    ({"policy": "fastest"}, {}, "gateway.policy: 'fastest' is not one of smg's policies (random, round_robin"),
    ({"worker_host": "0.0.0.0"}, {}, "gateway.worker_host: 0.0.0.0 is not a loopback address"),
    ({"worker_host": "ct200"}, {}, "gateway.worker_host: expected an IP address, found 'ct200'"),
    ({"worker_base_port": 70000}, {}, "gateway.worker_base_port: expected a TCP port (1-65535), found 70000"),
    ({"retry_max_retries": 0}, {}, "gateway.retry_max_retries: expected a whole number >= 1, found 0"),
    ({"drain_settle_secs": 0}, {}, "gateway.drain_settle_secs: expected a whole number >= 1, found 0"),
    ({"health_check_endpoint": "health"}, {}, "gateway.health_check_endpoint: expected one of the engine's health "
     "routes (/health, /health_generate), found 'health'"),
    ({"health_check_endpoint": "/no-such-path"}, {}, "gateway.health_check_endpoint: expected one of the engine's "
     "health routes (/health, /health_generate), found '/no-such-path': smg 1.13 keeps routing to a worker whose "
     "health check fails"),
    ({"worker_base_port": 29997}, {}, "gateway: replica 3's port 30000 is also the gateway's port"),
    ({"worker_base_port": 65534}, {}, "gateway: replica 2's port would be 65536, beyond 65535"),
    ({"prometheus_port": 30002}, {}, "gateway: replica 1's port 30002 is also the gateway's metrics port"),
    ("yes", {}, "gateway: expected a mapping of settings, found str"),
    ({}, {"host": "ct200.internal"}, "serve: the gateway's endpoint needs an IP address and a port"),
])
def test_a_gateway_setting_that_cannot_work_is_an_error_naming_it(gateway: Any, serve: dict, error: str) -> None:
    plan = planned(gateway=gateway, **serve)
    assert any(e.startswith(error) for e in plan["errors"]), plan["errors"]
    assert plan["replicas"] == [] and plan["args"] == []
