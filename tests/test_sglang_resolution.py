"""Every engine argv the planner renders passes SGLang 0.5.23's OWN resolution rules for the card it will run on.

`ServerArgs.resolve_once()` and `check_server_args()` of the pinned release run on each argv in the parser
environment (tools/sglang_resolve.py), the platform faked from the card's profile: the groups' expected hardware
(pro6000: sm_120, 97887 MiB; eval: sm_86, 49140 MiB) and the cards of the device runs (tests/fixtures/nvidia: an
H100, an H200). The argvs are the examples' plans, the production and lab inventories' plans made by the real play
(playbooks/plan.yml, offline), and the catalogue's models planned on each device card. A test fails when SGLang
refuses an argv, or silently resolves a value the planner set to another (attention backends, page size, draft
tokens, context length, TP, ...), or picks on its own what the plan table says it would pick.
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from dflash_infra import catalogue, parsers
from dflash_infra.planner import plan_dict
from helpers import ROOT, ansible_environment, tool
from sglang_real import resolve

pytestmark = pytest.mark.sglang_parser

VERSION = "0.5.23"
EXAMPLES = ROOT / "examples"
NVIDIA = ROOT / "tests" / "fixtures" / "nvidia"
MODEL_FLAGS = ("--model-path", "--speculative-draft-model-path")
# The flags whose values the plan table compares with SGLang's own pick (planning/sizing.py: engine_picks).
PICK_FLAGS = {"mem_fraction_static": "--mem-fraction-static", "max_running_requests": "--max-running-requests",
              "cuda_graph_max_bs_decode": "--cuda-graph-max-bs-decode"}


def group_profile(group: str) -> dict[str, Any]:
    hardware = yaml.safe_load((ROOT / "group_vars" / f"{group}.yml").read_text())["dflash_expected_hardware"]
    return {"name": hardware["gpu_name"], "compute_cap": hardware["compute_cap"],
            "memory_total_mib": hardware["memory_total_mib"]}


def device_gpus(run: str) -> list[dict[str, Any]]:
    """The GPUs of a device run, as the project's parser reads its nvidia-smi capture."""
    gpus: list[dict[str, Any]] = parsers.parse_file("gpus", NVIDIA / run / "query-gpu-header.csv")
    return [{k: g[k] for k in ("index", "name", "memory_total_mib", "compute_cap")} for g in gpus]


def argvs_of(plan: dict[str, Any]) -> list[list[str]]:
    """The engine command lines a plan starts: one per replica behind a gateway, else the one."""
    assert plan["errors"] == [], plan["errors"]
    return [r["args"] for r in plan["replicas"]] or [plan["args"]]


def models_of(argv: list[str]) -> dict[str, Any]:
    """Each model path of the argv with the catalogue's config.json of the model it names."""
    return {argv[i + 1]: catalogue.config(Path(argv[i + 1]).name) for i, w in enumerate(argv) if w in MODEL_FLAGS}


def played_plans(inventory: str, limit: str) -> dict[str, dict[str, Any]]:
    """host -> the plan playbooks/plan.yml makes offline for an inventory (its group_vars as the deploy reads them)."""
    env = {**ansible_environment(), "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
    proc = subprocess.run([tool("ansible-playbook"), "-i", f"inventory/{inventory}", "playbooks/plan.yml", "-l", limit,
                           "-e", "dflash_plan_offline=true"], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    plans = {}
    for play in json.loads(proc.stdout)["plays"]:
        for task in play["tasks"]:
            for host, result in task["hosts"].items():
                plan = (result.get("ansible_facts") or {}).get("serving_plan_current")
                if plan:
                    plans[host] = plan
    return plans


GROUP_OF = {"ct200": "pro6000", "ct129": "eval"}


@cache
def cases() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """name -> (plan, card profile) for every plan the check covers."""
    out: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for name in ("pro6000", "eval"):
        request = yaml.safe_load((EXAMPLES / f"{name}.yml").read_text())
        out[f"example {name}"] = (plan_dict(request, EXAMPLES), dict(request["gpus"][0]))
    for inventory in ("production", "lab"):
        for host, plan in played_plans(inventory, "pro6000,eval").items():
            out[f"{inventory} {host}"] = (plan, group_profile(GROUP_OF[host]))
    request = yaml.safe_load((EXAMPLES / "pro6000.yml").read_text())
    h200 = device_gpus("h200-device-run")
    out["device H200"] = (plan_dict(dict(request, gpus=h200), EXAMPLES), h200[0])
    # One H100 does not hold the request at block 16; the block the planner's refusal names does (test_planner.py).
    h100 = device_gpus("h100-device-run")
    smaller = dict(request, gpus=h100, speculative=dict(request["speculative"], block_size=6))
    out["device H100, block 6"] = (plan_dict(smaller, EXAMPLES), h100[0])
    return out


def profile(card: dict[str, Any]) -> dict[str, Any]:
    return {"compute_cap": str(card["compute_cap"]), "memory_total_mib": int(card["memory_total_mib"])}


def without(argv: list[str], flags: list[str]) -> list[str]:
    """The argv without these flags and their values."""
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in flags:
            skip = True
        else:
            out.append(word)
    return out


@cache
def resolved() -> list[tuple[str, list[str], dict[str, Any], dict[str, Any]]]:
    """(case, argv, plan, result) for every argv of every case, and a second result for the argv without the flags
    of the plan's engine picks (the settings SGLang then chooses itself), in one resolver run."""
    rows, checks = [], []
    for name, (plan, card) in cases().items():
        for argv in argvs_of(plan):
            rows.append((name, argv, plan))
            checks.append({"argv": argv, "gpu": profile(card), "models": models_of(argv)})
            bare = without(argv, [PICK_FLAGS[k] for k in plan["engine_picks"]])
            checks.append({"argv": bare, "gpu": profile(card), "models": models_of(argv)})
    results = resolve(VERSION, checks)
    return [(name, argv, plan, {"planned": results[2 * i], "bare": results[2 * i + 1]})
            for i, (name, argv, plan) in enumerate(rows)]


def test_the_check_covers_every_group_example_and_device_card() -> None:
    names = {row[0] for row in resolved()}
    assert names == {"example pro6000", "example eval", "production ct200", "production ct129", "lab ct200",
                     "lab ct129", "device H200", "device H100, block 6"}
    # Behind the gateway each replica is its own engine: ct200's four argvs are resolved one by one.
    assert sum(1 for row in resolved() if row[0] == "production ct200") == 4


def test_sglang_resolves_every_planned_argv_without_error() -> None:
    for name, argv, _plan, result in resolved():
        planned = result["planned"]
        assert planned["ok"], f"{name}: SGLang {VERSION} refused at {planned['stage']}: {planned['error']}\n{argv}"


def test_sglang_changes_no_value_the_planner_set() -> None:
    """Every option the argv gives resolves to the value given: attention backends, page size, draft tokens and
    window, context length, TP, memory fraction, ... (`changed` is every given option whose value moved)."""
    for name, _argv, _plan, result in resolved():
        assert result["planned"]["changed"] == {}, f"{name}: SGLang resolved {result['planned']['changed']}"


def test_the_plan_table_says_what_sglang_would_pick_on_that_card() -> None:
    """planning/sizing.py's engine_picks (the plan table's sglang.* rows) against SGLang's own choice for the
    same argv without the plan's flag."""
    for name, _argv, plan, result in resolved():
        bare = result["bare"]
        assert bare["ok"], f"{name}: {bare['error']}"
        picks = plan["engine_picks"]
        found = {"mem_fraction_static": bare["picked"]["mem_fraction_static"],
                 "max_running_requests": bare["picked"].get("max_running_requests"),
                 "cuda_graph_max_bs_decode": bare["picked"]["cuda_graph_config"]["decode"]["max_bs"]}
        for key, pick in picks.items():
            if key == "mem_fraction_static":
                assert abs(pick["sglang"] - found[key]) < 5e-5, (name, key, pick, found[key])
            else:
                assert pick["sglang"] == found[key], (name, key, pick, found[key])


def test_what_sglang_picks_where_the_plan_is_silent() -> None:
    """The settings the argv leaves to SGLang, as it resolves them: the hybrid target's linear attention on triton,
    the mamba radix cache's extra buffer (speculative decoding needs it), page size 1, overlap scheduling on; and
    prefill CUDA graphs on (the breakable backend), which the field has seen crash with DFLASH on sm_120
    (sglang#35437): the load gate after each restart is what catches it (docs/serving.md)."""
    for name, _argv, _plan, result in resolved():
        picked = result["planned"]["picked"]
        assert picked["linear_attn_backend"] == "triton", name
        assert picked["mamba_radix_cache_strategy"] == "extra_buffer", name
        assert picked["page_size"] == 1 and picked["disable_overlap_schedule"] is False, name
        assert picked["speculative_num_draft_tokens"] == int(_argv[_argv.index("--speculative-dflash-block-size") + 1])
        assert picked["cuda_graph_config"]["prefill"]["backend"] == "breakable", name


PRO6000_BARE = ["--model-path", "/root/models/Qwen3.6-27B", "--tp-size", "2", "--speculative-algorithm", "DFLASH",
                "--speculative-draft-model-path", "/root/models/Qwen3.6-27B-DFlash",
                "--speculative-dflash-block-size", "16"]


@cache
def tool_checks() -> list[dict[str, Any]]:
    """The tool's own proofs, in one run: unfaked, two cards, a DFLASH rule, the drafter as SGLang loads it."""
    models = models_of(PRO6000_BARE)
    no_type = {**models, "/root/models/Qwen3.6-27B-DFlash": {
        k: v for k, v in models["/root/models/Qwen3.6-27B-DFlash"].items() if k != "model_type"}}
    pro6000, a6000 = profile(group_profile("pro6000")), profile(group_profile("eval"))
    return resolve(VERSION, [
        {"argv": PRO6000_BARE, "gpu": pro6000, "models": models, "fake": False},
        {"argv": PRO6000_BARE, "gpu": pro6000, "models": models},
        {"argv": PRO6000_BARE, "gpu": a6000, "models": models},
        {"argv": [*PRO6000_BARE, "--speculative-num-draft-tokens", "8"], "gpu": pro6000, "models": models},
        {"argv": PRO6000_BARE, "gpu": pro6000, "models": no_type},
        {"argv": [*PRO6000_BARE, "--no-such-flag"], "gpu": pro6000, "models": models},
    ])


def test_unfaked_sglang_refuses_this_cpu_so_the_fake_is_what_takes_effect() -> None:
    unfaked, faked = tool_checks()[:2]
    assert not unfaked["ok"] and unfaked["stage"] == "resolve" and unfaked["patched"] == {}
    assert "No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is available" in unfaked["error"]
    assert faked["ok"], faked["error"]
    # Every patch point of tools/sglang_resolve.py took effect somewhere.
    assert set(faked["patched"]) == {
        "sglang.srt.runtime_context.override_platform", "sglang.srt.utils.common.is_cuda",
        "sglang.srt.utils.common.get_device", "sglang.srt.utils.common.get_device_memory_capacity",
        "sglang.srt.utils.common.get_device_sm", "torch.cuda.get_device_capability", "torch.version.cuda"}
    assert all(count >= 1 for count in faked["patched"].values()), faked["patched"]


def test_two_cards_get_sglangs_different_picks() -> None:
    _, pro6000, a6000 = tool_checks()[:3]
    assert (pro6000["platform"]["device_sm"], a6000["platform"]["device_sm"]) == (120, 86)
    assert (pro6000["picked"]["chunked_prefill_size"], a6000["picked"]["chunked_prefill_size"]) == (8192, 4096)
    decode = [r["picked"]["cuda_graph_config"]["decode"]["max_bs"] for r in (pro6000, a6000)]
    assert decode == [256, 32]
    assert abs(pro6000["picked"]["mem_fraction_static"] - 0.7925) < 1e-4
    assert abs(a6000["picked"]["mem_fraction_static"] - 0.7861) < 1e-4
    assert pro6000["picked"]["max_running_requests"] == 48  # DFLASH's default when unset


def test_sglangs_own_dflash_rule_and_model_loading_refuse() -> None:
    mismatch, no_type, unknown = tool_checks()[3:]
    assert not mismatch["ok"] and mismatch["stage"] == "resolve"
    assert "Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set but they differ. " \
           "For DFLASH they must match." in mismatch["error"]
    # The drafter without `model_type`: SGLang's AutoConfig refuses it (the model checks refuse it first).
    assert not no_type["ok"]
    assert no_type["error"] == ("ValueError: Unrecognized model in /root/models/Qwen3.6-27B-DFlash. Should have a "
                                "`model_type` key in its config.json.")
    assert not unknown["ok"] and unknown["stage"] == "parse" and "unrecognized arguments: --no-such-flag" in \
        unknown["error"]


def test_the_committed_drafter_config_loads_as_sglang_loads_it() -> None:
    faked = tool_checks()[1]
    assert faked["ok"] and faked["given"]["speculative_draft_model_path"] == "/root/models/Qwen3.6-27B-DFlash"
    assert os.path.basename(faked["given"]["model_path"]) == "Qwen3.6-27B"
