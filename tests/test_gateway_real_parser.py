"""The planner's gateway topology against the REAL parsers: the gateway's argv through smg 1.13.0's own
`parse_router_args` (the pinned release, installed from its lab lock with hashes required into a cached venv), and
every replica's engine argv through SGLang's. Nothing is mocked."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dflash_infra.planner import plan_dict
from dflash_infra.planning import gateway
from sglang_real import check_argvs

pytestmark = pytest.mark.smg_parser

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"

# Reads a JSON list of argvs on stdin; prints, per argv, smg's RouterArgs or the parser's error.
PARSE = """
import contextlib, dataclasses, io, json, sys
from smg.launch_router import parse_router_args
from smg.router_args import COMMON_POLICY_CHOICES
out = []
for argv in json.load(sys.stdin):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parsed = parse_router_args(argv)
        out.append({"ok": True, "args": dataclasses.asdict(parsed)})
    except SystemExit as exc:
        out.append({"ok": False, "code": exc.code, "error": err.getvalue()})
print(json.dumps({"results": out, "policies": COMMON_POLICY_CHOICES}, default=str))
"""


def parse(python: Path, argvs: list[list[str]]) -> dict[str, Any]:
    proc = subprocess.run([str(python), "-c", PARSE], input=json.dumps(argvs), capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def gateway_plan(**settings: Any) -> dict[str, Any]:
    request = yaml.safe_load((EXAMPLES / "pro6000.yml").read_text())
    request["gateway"] = settings
    result = plan_dict(request, EXAMPLES)
    assert result["errors"] == [], result["errors"]
    return result


def test_the_gateways_argv_is_taken_by_smg_as_planned(smg_python: Path) -> None:
    plan = gateway_plan()
    parsed = parse(smg_python, [plan["gateway"]["args"]])
    [result] = parsed["results"]
    assert result["ok"], result
    args = result["args"]
    assert (args["host"], args["port"]) == ("0.0.0.0", 30000)
    assert args["worker_urls"] == [r["url"] for r in plan["replicas"]] == [
        "http://127.0.0.1:30001", "http://127.0.0.1:30002", "http://127.0.0.1:30003", "http://127.0.0.1:30004"]
    # Every setting the planner spells lands in smg's field of the same name.
    for key, _flag in gateway.FLAGS:
        assert args[key] == plan["gateway"]["settings"][key], key
    assert args["api_key"] is None and args["control_plane_api_keys"] == []  # keys never enter the argv
    assert tuple(parsed["policies"]) == gateway.POLICIES


def test_smgs_parser_refuses_what_it_does_not_know(smg_python: Path) -> None:
    plan = gateway_plan()
    bad = [plan["gateway"]["args"] + ["--no-such-flag"], ["--policy", "fastest"]]
    results = parse(smg_python, bad)["results"]
    assert [r["ok"] for r in results] == [False, False]
    assert "unrecognized arguments: --no-such-flag" in results[0]["error"]
    assert "invalid choice: 'fastest'" in results[1]["error"]


def test_every_replicas_engine_argv_is_one_tp_group_on_its_own_port_for_the_real_sglang() -> None:
    plan = gateway_plan(worker_base_port=31000)
    argvs = [r["args"] for r in plan["replicas"]]
    assert all("--dp-size" not in argv for argv in argvs)
    for replica, result in zip(plan["replicas"], check_argvs("0.5.23", argvs), strict=True):
        assert result["ok"], result["error"]
        ns = result["namespace"]  # the options the argv gave: no dp_size, so the engine's own 1
        assert (ns["host"], ns["port"], ns["tp_size"]) == ("127.0.0.1", replica["port"], 2) and "dp_size" not in ns
    assert [r["cuda_visible_devices"] for r in plan["replicas"]] == ["0,1", "2,3", "4,5", "6,7"]
    assert [r["port"] for r in plan["replicas"]] == [31000, 31001, 31002, 31003]


def test_a_gateway_fronting_another_hosts_replicas_is_taken_by_smg_and_those_replicas_by_sglang(
        smg_python: Path) -> None:
    """Two hosts, one endpoint: ct200's gateway with ct201's replicas after its own (with_workers), and ct201's
    replicas planned remote (every interface, reached by the inventory's name)."""
    remote = gateway_plan(remote=True, worker_host="0.0.0.0", worker_address="ct201.internal")
    urls = [r["url"] for r in remote["replicas"]]
    section = gateway.with_workers(gateway_plan()["gateway"], urls)
    [result] = parse(smg_python, [section["args"]])["results"]
    assert result["ok"], result
    assert result["args"]["worker_urls"] == section["workers"] == [
        *(f"http://127.0.0.1:{30001 + i}" for i in range(4)), *(f"http://ct201.internal:{30001 + i}" for i in range(4))]
    assert result["args"]["policy"] == "cache_aware"
    for checked in check_argvs("0.5.23", [r["args"] for r in remote["replicas"]]):
        assert checked["ok"] and checked["namespace"]["host"] == "0.0.0.0", checked
