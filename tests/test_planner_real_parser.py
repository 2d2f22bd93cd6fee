"""Every command line the planner renders is accepted by the REAL argument parser of that SGLang release.

Runs the parsers from the cached environment (tools/sglang_parser_env.sh); nothing is mocked.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dflash_infra import engine
from dflash_infra.planner import plan_dict
from sglang_real import check_argvs

pytestmark = pytest.mark.sglang_parser

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ENGINE_FLAGS = {"--mamba-radix-cache-strategy": "extra_buffer", "--cuda-graph-bs-decode": [1, 2, 4, 8],
                "--disable-overlap-schedule": True, "--max-total-tokens": "64k"}
H200 = [{"index": 0, "name": "NVIDIA H200", "memory_total_mib": 143771, "compute_cap": "9.0"}]


def rendered(version: str) -> dict[str, list[str]]:
    argvs = {}
    for name in ("pro6000", "eval"):
        req = yaml.safe_load((EXAMPLES / f"{name}.yml").read_text())
        req["sglang_version"] = version
        argvs[name] = req
    h200 = dict(argvs["pro6000"], gpus=H200)
    argvs["h200"] = h200
    no_spec = dict(argvs["pro6000"], speculative={"algorithm": "none"})
    no_spec.pop("draft")
    argvs["pro6000-no-spec"] = no_spec
    # Engine flags the planner has no setting for (overrides.engine_flags), as a canary candidate tries them.
    argvs["pro6000-engine-flags"] = dict(argvs["pro6000"], overrides={"engine_flags": ENGINE_FLAGS})
    out = {}
    for name, req in argvs.items():
        result = plan_dict(req, EXAMPLES)
        assert result["errors"] == [], (name, result["errors"])
        out[name] = result["args"]
    return out


@pytest.mark.parametrize("version", engine.supported_releases())
def test_real_parser_accepts_every_planned_argv(version: str) -> None:
    argvs = rendered(version)
    results = check_argvs(version, list(argvs.values()))
    for (name, argv), result in zip(argvs.items(), results, strict=True):
        assert result["ok"], f"SGLang {version} rejected the {name} plan: {result['error']}\n{argv}"
        ns = result["namespace"]
        assert ns["tp_size"] == int(argv[argv.index("--tp-size") + 1])
        assert abs(ns["mem_fraction_static"] - float(argv[argv.index("--mem-fraction-static") + 1])) < 1e-9
    flags = results[list(argvs).index("pro6000-engine-flags")]["namespace"]
    assert (flags["mamba_radix_cache_strategy"], flags["cuda_graph_bs_decode"], flags["disable_overlap_schedule"],
            flags["max_total_tokens"]) == ("extra_buffer", [1, 2, 4, 8], True, 64000)


def test_flags_removed_in_0523_are_rejected_by_it() -> None:
    # The old spellings an operator might copy from a 0.5.11-era command line.
    base = ["--model-path", "/root/models/Qwen3.6-27B"]
    removed = [["--speculative-dflash-draft-window-size", "16"], ["--cuda-graph-max-bs", "32"],
               ["--mamba-scheduler-strategy", "auto"]]
    results = check_argvs("0.5.23", [base + r for r in removed])
    for flag, result in zip(removed, results, strict=True):
        assert not result["ok"], f"0.5.23 accepted {flag[0]}"
    # And the planner's renderer never emits them: they are hidden or absent in the 0.5.23 table.
    table = engine.flag_table("0.5.23")
    assert not any(table.accepts(f[0]) for f in removed)
